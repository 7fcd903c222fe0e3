"""The start-up run's tries (issue 50): refused in a world on this host's default shape, and a
proof that can fail: where the run can do the thing, the table says no, with what it did."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mocksandbox.execution import startup_proof
from mocksandbox.execution.engine import create_engine
from mocksandbox.execution.protections import broken, protections
from mocksandbox.execution.startup_proof import StartupProbe
from mocksandbox.execution.world import Isolation, hidden_system_secrets, lite_unavailable_reason
from mocksandbox.settings import load_settings

#: What the start-up run tries by itself (the bounds are read back, the uid proven apart).
TRIED = ("files", "network", "secrets", "seccomp", "processes")

needs_lite = pytest.mark.skipif(lite_unavailable_reason() is not None, reason=str(lite_unavailable_reason()))


def start(tmp_path: Path, **overrides: str):  # type: ignore[no-untyped-def]
    settings = load_settings(overrides={"tmp_root": str(tmp_path), "isolation": "lite", **overrides})
    return create_engine(settings)


def proven(tmp_path: Path, **overrides: str) -> tuple[Any, dict[str, Any], list[Any]]:
    """Start a lite engine (``overrides``: settings), take what its start-up run proved and the
    doctor rows made of it, and close it: ``(engine, proofs, rows)``."""
    engine, confinement, launcher = start(tmp_path, **overrides)
    try:
        proofs = dict(engine.proofs)
        rows = protections(engine.isolation, confinement, proofs)
    finally:
        launcher.close()
        engine.close()
        confinement.close()
    return engine, proofs, rows


@needs_lite
def test_every_try_is_refused_on_this_hosts_default_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The canaries this engine's start-up run made (other servers, in other processes of the suite,
    # make their own in /var/tmp meanwhile: only these are this test's to look for).
    made: list[str] = []
    make_canary = startup_proof._make_canary

    def noting_canary(token: str) -> tuple[str | None, str]:
        path, why = make_canary(token)
        if path is not None:
            made.append(path)
        return path, why

    monkeypatch.setattr(startup_proof, "_make_canary", noting_canary)
    engine, proofs, rows = proven(tmp_path)
    assert {name: proofs[name].outcome for name in TRIED} == dict.fromkeys(TRIED, "refused"), proofs
    assert proofs["process bound"].outcome == "refused", proofs
    assert proofs["memory bound"].outcome == "refused", proofs
    if os.geteuid() != 0 or engine.isolation.run_uid is not None:
        assert proofs["non-root uid"].outcome == "refused", proofs
    for row in rows:
        assert row.holds == "yes", row
        assert "(proven at start: " in row.how or row.name == "scratch bound", row
    assert broken(rows) == []
    # The canary is gone with the run's end, and nothing of it is left behind.
    assert made and not [path for path in made if os.path.lexists(path)], made


@needs_lite
def test_a_proof_fails_where_the_run_can_do_it_and_the_row_says_no(tmp_path: Path) -> None:
    """``run_network: host``: the start-up run's connect to the server's loopback port succeeds."""
    _, proofs, rows = proven(tmp_path, run_network="host")
    assert proofs["network"].outcome == "done", proofs
    network = next(row for row in rows if row.name == "network")
    assert network.holds == "no" and "the start-up run connected to a port" in network.how, network


def test_the_tries_run_outside_a_world_succeed_and_say_so() -> None:
    """The same shell run on the host, as a run with no world would: each try the world refuses
    succeeds here, and the probe says so (a row configured to hold would be "no", a warning)."""
    isolation = Isolation(
        "lite", run_uid=1 << 30, syscall_filter=True, hidden_paths=tuple(hidden_system_secrets())
    )
    with StartupProbe(isolation, None, "python3") as probe:
        done = subprocess.run(["bash", "-c", probe.command()], capture_output=True, text=True, timeout=60)
        proofs = probe.results(done.stdout.splitlines())
    assert proofs["files"].outcome == "done", proofs
    assert proofs["network"].outcome == "done", proofs
    if any(os.path.isfile(path) and os.path.getsize(path) for path in isolation.hidden_paths):
        assert proofs["secrets"].outcome == "done", proofs
    assert proofs["seccomp"].outcome in ("done", "untried"), proofs  # (keyctl may not be in this kernel)
    assert proofs["processes"].outcome == "done", proofs
    rows = protections(isolation, _NoConfinement(), proofs)  # type: ignore[arg-type]
    assert {"files", "network", "processes"} <= {row.name for row in rows if row.broken}, rows


class _NoConfinement:
    name = "process-group"
    max_memory_bytes = 0

    def process_limit(self) -> None:
        return None
