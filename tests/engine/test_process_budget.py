"""The engine under a process budget: runs that cannot start say why, runs are answered only once
everything they started is reaped, and a cgroup that does not drain is never reused."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mocksandbox.execution import confinement as confinement_module
from mocksandbox.execution.budget import ProcessBudget
from mocksandbox.execution.confinement import CgroupConfinement, own_cgroup_dir
from mocksandbox.execution.engine import ExecutionEngine
from mocksandbox.models import CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus

pytestmark = pytest.mark.skipif(
    not CgroupConfinement.available(),
    reason="cgroup v1 pids/memory/freezer controllers are not writable here",
)


@pytest.fixture
def launcher_cgroup(
    budgeted_engine: Callable[..., ExecutionEngine],
) -> Iterator[tuple[ExecutionEngine, Path]]:
    """A real engine whose launcher (and so every relay it forks) was moved into a pids cgroup of
    its own, whose ``pids.max`` the test sets; moved back and the group removed after it."""
    # Isolation none: lite proves itself with a run at start-up, whose relay (idle, outside the
    # group the test starves) would serve the test's run.
    engine = budgeted_engine(exec_mode="fork", isolation="none")
    launcher = engine.runner.launcher  # type: ignore[attr-defined]
    home = own_cgroup_dir("pids")
    # Not "mocksandbox-*": a server starting meanwhile (another xdist worker's) takes an unlocked
    # group of that name for a dead server's, and removes it.
    group = home / f"test-of-mocksandbox-starved-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(launcher.pid))
        # The launcher keeps the cgroup lock warm by rewriting its pid into its own group: here.
        engine.runner.confinement._warm_procs_file = str(group / "cgroup.procs")  # type: ignore[attr-defined]
        yield engine, group
    finally:
        (group / "pids.max").write_text("max")
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (home / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # gone meanwhile
        group.rmdir()


def _assert_cannot_start(answer: RunCodeResponse, waited: float) -> None:
    assert answer.status == RunStatus.SandboxError
    assert answer.run_result is not None
    # Never a made-up exit of a program that did not start.
    assert answer.run_result.status == CommandRunStatus.Error
    assert answer.run_result.return_code is None
    assert "cannot start the program: no process or memory left in this server's budget" in answer.message
    assert "[Errno 11] Resource temporarily unavailable" in answer.message
    assert "tried " in answer.message  # retried with back-off...
    assert waited < 5, "...within the run's own timeout"
    assert answer.message == answer.run_result.stderr


def test_a_run_with_no_room_for_a_relay_is_a_sandbox_error_naming_the_cause(
    launcher_cgroup: tuple[ExecutionEngine, Path],
) -> None:
    engine, group = launcher_cgroup
    (group / "pids.max").write_text("1")  # the launcher alone: it cannot fork a relay
    started = time.monotonic()
    answer = engine.run_code(RunCodeRequest(code="print(1)", language="python", run_timeout=0.5))
    _assert_cannot_start(answer, time.monotonic() - started)


def test_a_relay_with_no_room_for_its_program_is_a_sandbox_error_naming_the_cause(
    launcher_cgroup: tuple[ExecutionEngine, Path],
) -> None:
    engine, group = launcher_cgroup
    first = engine.run_code(RunCodeRequest(code="print(1)", language="python"))
    assert first.run_result is not None and first.run_result.stdout == "1\n"
    # The launcher and the relay that ran it (now idle): no room for the relay's next program.
    (group / "pids.max").write_text((group / "pids.current").read_text())
    started = time.monotonic()
    answer = engine.run_code(RunCodeRequest(code="print(1)", language="python", run_timeout=0.5))
    _assert_cannot_start(answer, time.monotonic() - started)
    # Room again: the same relays serve the next run.
    (group / "pids.max").write_text("max")
    answer = engine.run_code(RunCodeRequest(code="print(2)", language="python"))
    assert answer.run_result is not None and answer.run_result.stdout == "2\n"


@pytest.fixture
def engine(budgeted_engine: Callable[..., ExecutionEngine]) -> ExecutionEngine:
    return budgeted_engine(ProcessBudget(binding=None, server_reserve=0, runs_total=256, per_run=64))


def test_a_fork_bomb_is_reaped_before_it_is_answered(engine: ExecutionEngine) -> None:
    """When the answer comes, nothing the bomb started is alive or still charged: its orphans went to
    the launcher (their subreaper), not to init, and were reaped as they died."""
    bomb = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n"
    confinement = engine.runner.confinement  # type: ignore[attr-defined]
    parent = confinement._parents["pids"]
    answer = engine.run_code(RunCodeRequest(code=bomb, language="python", run_timeout=1))
    assert answer.run_result is not None
    assert answer.run_result.status == CommandRunStatus.TimeLimitExceeded
    assert int((parent / "pids.current").read_text()) == 0
    assert confinement.retired == 0
    answer = engine.run_code(RunCodeRequest(code="print(6*7)", language="python"))
    assert answer.run_result is not None and answer.run_result.stdout == "42\n"


def test_a_cgroup_that_does_not_drain_is_retired(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task that stays charged (here a zombie whose parent, this test, does not reap it yet) keeps
    its cgroup from being reused."""
    monkeypatch.setattr(confinement_module, "DRAIN_BOUND_S", 0.2)
    budget = ProcessBudget(binding=None, server_reserve=0, runs_total=64, per_run=16)
    confinement = CgroupConfinement(512, 1024, budget)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        jail = confinement.new_jail()
        for procs in jail.procs_files:
            Path(procs).write_text(str(child.pid))
        jail.close()  # kills the child, which stays a zombie of ours: charged, not drained
        assert confinement.retired == 1
        assert confinement.new_jail() is not jail
    finally:
        child.wait()
        confinement.close()
    assert not confinement._parents["pids"].exists()
