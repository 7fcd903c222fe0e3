"""What CI's machine cannot have: the only skips ``.ci/run`` accepts (``tests/conftest.py`` fails
any other where every part is required).

CI's machine: 2 cores, root, Debian 12 with kernel 6.18, writable cgroup v1 controllers and a
cgroup v2 hierarchy without controllers, no GPU, loopback only (no outside network), the package
registries (PyPI, Debian's apt) through a mirror. ``make test`` installs everything else a test needs
(extras, chromium, the runtime's Python), so a skip for any of it fails there. Each entry: a
regular expression that a skip's reason must match from its start, and why the machine lacks it.
"""

from __future__ import annotations

import os
import re

import pytest

#: ``(reason pattern, why CI's machine cannot have it)``.
ALLOWED: tuple[tuple[str, str], ...] = (
    (
        r"(\S+: )?toolchain binary not on PATH|iverilog is not installed",
        "the languages' toolchains (Go, Java, Node, Rust, ...): `make test` does not install them, "
        "to stay within CI's time (`make runtime` does: `mocksandbox runtime install --all`, as "
        "root); some are on no registry CI's machine reaches (Swift, Icarus Verilog, Lean's lake, "
        "Julia, .NET), as SandboxFusion's image takes them from their vendors' sites",
    ),
    (
        r"runtime library \S+ is not installed in ",
        "SandboxFusion's runtime libraries of the other languages (node_modules, jars, Go sources): "
        "`make test` installs the Python runtime only, as `make serve` does; `make runtime` installs "
        "the rest",
    ),
    (
        r"needs a SandboxFusion tree, its Python and the HTTP plugin",
        "SandboxFusion's own dataset tests: its source is kept outside the project and never "
        "committed (nor a recipe that builds it); they are run by hand against the mock",
    ),
    (
        r"the long generated-input run: set MOCKSANDBOX_FUZZ_LONG=1",
        "not a missing part: an opt-in long run of a test that runs short by default",
    ),
    (
        r"the programs meet in a dir of the host, which runs in worlds of their own cannot share",
        "not a missing part: a client's case that needs runs to share the host's files, which "
        "isolation lite (the default) forbids by design; the same test runs with isolation none",
    ),
    (
        r"a cgroup v1 test on a host without cgroup v1 \(pure cgroup v2\)",
        "not on CI's machine (it has cgroup v1): a guest of tests/vm with pure cgroup v2, where a "
        "test of v1 has nothing to test; a host with v1 that is not writable still fails",
    ),
    (
        r"process-group confinement cannot .*, as the host's root with no world; cgroups can",
        "not a missing part: the engine's hostile suite runs every case under every confinement and "
        "isolation (tests/engine/conftest.py), and a few cases (a fork bomb of the host's root, "
        "memory without a limit, a process that left the session) only cgroups or a world can stop: "
        "the test says so for the combination that, by design, cannot",
    ),
)


def allowed_skip(reason: str) -> str | None:
    """Why CI's machine may skip a test for ``reason`` (``None``: it may not)."""
    reason = reason.removeprefix("Skipped: ")  # (as pytest.skip's reports give it)
    for pattern, why in ALLOWED:
        if re.match(pattern, reason):
            return why
    return None


def everything_required() -> bool:
    """Whether a test that finds an optional part missing fails instead of skipping: under CI
    (``CI``, which CI services set) and under ``.ci/run`` (``MOCKSANDBOX_REQUIRE_ALL=1``), where
    ``make test`` has installed every part and a skip would hide one that did not come."""
    return os.environ.get("MOCKSANDBOX_REQUIRE_ALL") == "1" or bool(os.environ.get("CI"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """Where every part is required (:func:`everything_required`), a skip whose reason is not on
    :data:`ALLOWED` is a failure: a ``skipif`` mark, an ``importorskip`` or a ``pytest.skip`` that
    would hide a missing part, or a protection that did not hold, fails the run instead of passing
    it silently. (A conftest takes this hook by importing it.)"""
    report: pytest.TestReport = yield
    if report.skipped and everything_required() and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
        if allowed_skip(reason) is None:
            report.outcome = "failed"
            report.longrepr = (
                "skipped where every part is required (CI or MOCKSANDBOX_REQUIRE_ALL=1), and not on "
                f"the list of what CI's machine cannot have (tests/ci_skips.py): {reason}"
            )
    return report
