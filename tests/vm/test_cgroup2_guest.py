"""The cgroup v2 host as a test shape (issue 50): the engine's hostile suite, the v2 confinement's
tests and the host-shape tests, run as root with default settings in a QEMU guest booting Debian
12's kernel (6.1) with a pure cgroup v2 hierarchy (cpu, memory and pids enabled at the root), in two
shapes (``cg2vm.SUITES``): the server in the root cgroup (``v2-root``), and the server as a systemd
service with ``Delegate=yes`` (``v2-delegate``).

Every guest test is a test here (``test_in_guest``): it passes, fails (with the guest's failure) or
skips (with the guest's reason: where every part is required, ``tests/ci_skips.py`` fails a skip off
its list, the guest's as the host's) as it did there. Beside them, per shape: the guest booted and
ran every test it was given, ``doctor`` said every protection holds, nothing was left behind in
``/tmp``, ``/sys/fs/cgroup``, the mount table or the process table, and the kernel's OOM killer was
never called for the whole machine. Where the guest cannot be made (no QEMU, no Debian 12 kernel,
not root), each test skips saying what to install (and so fails in CI).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator

import pytest
from cg2vm import SUITES, GuestRun, collect_cached, run_suite, select, unavailable_reason

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cg2vm"), pytest.mark.timeout(0)]

RunOf = Callable[[str], GuestRun]


@pytest.fixture(scope="session")
def guest_run(pytestconfig: pytest.Config) -> Iterator[RunOf]:
    """``guest_run(suite)``: the suite's one boot of the guest (made at its first test)."""
    runs: dict[str, GuestRun] = {}
    reason = unavailable_reason(os.environ.get("CG2VM_ROOT", "ext4"))

    def run_of(name: str) -> GuestRun:
        if reason is not None:
            pytest.skip(reason)
        if name not in runs:
            suite = next(s for s in SUITES if s.name == name)
            cache = getattr(pytestconfig, "cache", None)
            runs[name] = run_suite(suite, select(suite, collect_cached(suite.files, cache)))
        return runs[name]

    yield run_of


def _booted(run: GuestRun) -> None:
    if run.error is not None or not run.summary:
        pytest.fail(
            f"the {run.suite.name} guest gave nothing back: {run.error or 'no summary'} "
            f"(script exit status {run.script_status})\n{run.tail()}",
            pytrace=False,
        )


def test_guest_runs_every_test_given(suite: str, guest_run: RunOf, request: pytest.FixtureRequest) -> None:
    run = guest_run(suite)
    # (The boot's timings and memory, for the run's summary: conftest.py prints them.)
    request.node.user_properties.append(("cg2vm", json.dumps(run.facts())))
    _booted(run)
    assert run.summary["root_subtree_control"].split() == ["cpu", "memory", "pids"], run.summary
    assert run.summary["kernel"].startswith("6.1."), run.summary
    missing = sorted(set(run.selection) - set(run.results))
    extra = sorted(set(run.results) - set(run.selection))
    assert run.finished and not missing and not extra, (
        f"the guest's pytest {'finished' if run.finished else 'did not finish'}; not run there: "
        f"{missing}; run there but not listed here (changed since this run collected?): {extra}"
        f"\n{run.tail()}"
    )


def test_doctor_says_every_protection_holds(suite: str, guest_run: RunOf) -> None:
    """On a cgroup v2 host, as root with default settings, every row of ``doctor`` is "yes"."""
    run = guest_run(suite)
    _booted(run)
    doctor = run.summary.get("doctor")
    assert doctor is not None, "doctor did not run in the guest"
    not_yes = {row: holds for row, holds in doctor["rows"].items() if holds != "yes"}
    assert doctor["rows"] and not not_yes and doctor["returncode"] == 0, (
        f'doctor in the {suite} guest: exit status {doctor["returncode"]}, not "yes": {not_yes}\n'
        + doctor["output"]
    )


def test_nothing_is_left_behind(suite: str, guest_run: RunOf) -> None:
    """Once every server has stopped: nothing new in /tmp, /sys/fs/cgroup, the mount table or the
    process table of the guest (after up to 15 s for the kernel to reap)."""
    run = guest_run(suite)
    _booted(run)
    if not run.finished:
        pytest.fail("the guest's pytest did not finish: nothing to check after it", pytrace=False)
    left = {kind: items for kind, items in run.summary["left_behind"].items() if items}
    assert not left, json.dumps(left, indent=1)


def test_the_machine_never_runs_out_of_memory(suite: str, guest_run: RunOf) -> None:
    """The kernel's OOM killer acts in runs' cgroups (``CONSTRAINT_MEMCG``), never for the whole
    guest (``CONSTRAINT_NONE``)."""
    run = guest_run(suite)
    _booted(run)
    global_oom = [
        line for line in run.summary["oom"] if "CONSTRAINT_MEMCG" not in line and "oom-kill:" in line
    ]
    assert not global_oom, "\n".join(run.summary["oom"])


def test_in_guest(guest_test: tuple[str, str | None], guest_run: RunOf) -> None:
    """One test of the guest's run, with the guest's outcome."""
    suite, nodeid = guest_test
    run = guest_run(suite)  # (skips, saying why, where the guest cannot be made)
    if nodeid is None:
        pytest.fail("the guest can be made here, but this run listed no tests for it", pytrace=False)
    if nodeid.startswith("!"):
        pytest.fail(f"the {suite} selection does not collect here: {nodeid[1:]}", pytrace=False)
    result = run.results.get(nodeid)
    if result is None:
        _booted(run)
        pytest.fail(
            f"not run in the {suite} guest (its pytest stopped before it)\n{run.tail()}", pytrace=False
        )
    where = f"in the {suite} guest (kernel {run.summary.get('kernel')}, pure cgroup v2)"
    if result.outcome == "skipped":
        pytest.skip(result.text)  # (the guest's reason as it gave it: tests/ci_skips.py matches it)
    if result.outcome == "xfailed":
        pytest.xfail(result.text)
    if result.outcome in ("failed", "error", "xpassed"):
        pytest.fail(f"{result.outcome} {where}:\n{result.text}", pytrace=False)


def test_a_checkout_under_tmp_comes_live_by_its_own_path() -> None:
    """The guest has a /tmp of its own: a clone there (and its venv) must come live by path, where
    the top-level dir of one under /work comes whole."""
    from cg2vm import live_dirs

    assert live_dirs("/tmp/x", "/tmp/x/.venv") == "tmp/x tmp/x/.venv"
    assert live_dirs("/work/main", "/work/main/.venv") == "work"
    assert live_dirs("/tmp/vmtree", "/work/main/.venv") == "tmp/vmtree work"
