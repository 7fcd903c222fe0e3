"""The engine under a memory budget: every program is the OOM killer's first choice, and runs that
together outgrow what the runs may use are OOM-killed among themselves."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from pathlib import Path

import pytest

from mocksandbox import divergence
from mocksandbox.core import MockSandbox
from mocksandbox.execution import confinement as confinement_module
from mocksandbox.execution.budget import MIB, MemoryBudget
from mocksandbox.execution.confinement import CgroupConfinement
from mocksandbox.execution.engine import ExecutionEngine
from mocksandbox.models import RunCodeRequest, RunStatus

needs_cgroups = pytest.mark.skipif(
    not CgroupConfinement.available(),
    reason="cgroup v1 pids/memory/freezer controllers are not writable here",
)

#: Forks ``children`` processes that each touch 60 MB and sleep: each is small, all together not.
HOG = (
    "import os, time\n"
    "for _ in range({children}):\n"
    "    if os.fork() == 0:\n"
    "        data = b'\\x01' * (60 << 20)\n"
    "        time.sleep(60)\n"
    "        os._exit(0)\n"
    "time.sleep(60)\n"
)


def _oom_score_adj(pid: int | str = "self") -> str:
    return Path(f"/proc/{pid}/oom_score_adj").read_text().strip()


@pytest.mark.parametrize("language", ["python", "bash"])
def test_every_program_is_the_oom_killers_first_choice(sandbox: MockSandbox, language: str) -> None:
    """Its own score, its children's, and the relay's (its parent) are 1000; the server's is not
    touched. Under every confinement, process groups included (where no cgroup caps memory)."""
    if language == "python":
        code = (
            "import os, subprocess\n"
            "print(open('/proc/self/oom_score_adj').read().strip())\n"
            "print(subprocess.run(['cat', '/proc/self/oom_score_adj'], capture_output=True, text=True).stdout.strip())\n"
        )
    else:
        code = "cat /proc/self/oom_score_adj\n(cat /proc/self/oom_score_adj)\n"
    server_before = _oom_score_adj()
    answer = sandbox.engine.run_code(RunCodeRequest(code=code, language=language))
    assert answer.status == RunStatus.Success, answer
    assert answer.run_result is not None and answer.run_result.stdout.split() == ["1000", "1000"]
    assert _oom_score_adj() == server_before
    assert _oom_score_adj(sandbox.engine.runner.launcher.pid) == server_before  # type: ignore[attr-defined]


def _oom_kills(memory_cgroup: Path) -> int:
    """How many processes of this v1 memory cgroup the OOM killer took."""
    fields = (memory_cgroup / "memory.oom_control").read_text().split()
    return int(fields[fields.index("oom_kill") + 1])


@pytest.fixture
def small_engine(budgeted_engine: Callable[..., ExecutionEngine]) -> ExecutionEngine:
    """All runs together may use 256 MiB (as if the server's own cgroup left that for them), one
    run 200 MiB."""
    budget = MemoryBudget(binding=None, server_reserve=0, runs_total=256 * MIB, per_run=200 * MIB)
    return budgeted_engine(memory_budget=budget)


@needs_cgroups
def test_the_runs_parent_is_capped_at_the_runs_total_and_each_run_at_its_share(tmp_path: Path) -> None:
    budget = MemoryBudget(binding=None, server_reserve=0, runs_total=300 * MIB, per_run=200 * MIB)
    confinement = CgroupConfinement(512, 4096, memory_budget=budget)
    try:
        parent = confinement._parents["memory"]
        assert int((parent / "memory.limit_in_bytes").read_text()) == 300 * MIB
        run = parent / "run-1"  # the first jail (run-0 proved that groups can be made)
        jail = confinement.new_jail()
        assert int((run / "memory.limit_in_bytes").read_text()) == 200 * MIB
        assert "memory=200 MiB" in confinement.describe()
        if (parent / "memory.memsw.limit_in_bytes").exists():  # no swapping past the cap
            assert int((parent / "memory.memsw.limit_in_bytes").read_text()) == 300 * MIB
            assert int((run / "memory.memsw.limit_in_bytes").read_text()) == 200 * MIB
        jail.close()
    finally:
        confinement.close()


@needs_cgroups
def test_memory_limits_are_raised_and_lowered_in_an_order_the_kernel_accepts() -> None:
    """``memsw`` may never be below the plain limit: raising writes it first, lowering last."""
    budget = MemoryBudget(binding=None, server_reserve=0, runs_total=300 * MIB, per_run=200 * MIB)
    confinement = CgroupConfinement(512, 4096, memory_budget=budget)
    try:
        parent = confinement._parents["memory"]
        for limit in (900 * MIB, 100 * MIB, 500 * MIB):
            confinement_module._set_memory_limit(parent, limit)
            assert int((parent / "memory.limit_in_bytes").read_text()) == limit
            if (parent / "memory.memsw.limit_in_bytes").exists():
                assert int((parent / "memory.memsw.limit_in_bytes").read_text()) == limit
    finally:
        confinement.close()


@needs_cgroups
def test_runs_that_together_outgrow_the_runs_total_are_killed_among_themselves(
    small_engine: ExecutionEngine,
) -> None:
    """Two runs of three 60 MB children each: each fits its own 200 MiB, together they do not fit
    256 MiB. The OOM happens in the runs' parent, the hogs end, and the next run is answered right."""
    parent = small_engine.runner.confinement._parents["memory"]  # type: ignore[attr-defined]
    # The hogs sleep until run_timeout: 6 s (not 3) for both runs to start and touch their memory,
    # so that the OOM happens before the timeout on a loaded machine too.
    request = RunCodeRequest(code=HOG.format(children=3), language="python", run_timeout=6)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        answers = list(pool.map(small_engine.run_code, [request, request]))
    for answer in answers:
        assert answer.status == RunStatus.Failed, answer
    # The runs' parent reached its cap (and never went past it); the OOM killer's victims were
    # the runs' processes (the kernel counts a kill in the victim's cgroup).
    assert int((parent / "memory.max_usage_in_bytes").read_text()) == 256 * MIB
    assert sum(_oom_kills(run) for run in parent.glob("run-*")) >= 1
    answer = small_engine.run_code(RunCodeRequest(code="print(6*7)", language="python"))
    assert answer.run_result is not None and answer.run_result.stdout == "42\n"


#: Grows to ``megabytes`` MiB in steps of 8 MiB (pages written, so that they count), then holds it.
GROWER = (
    "import time\n"
    "chunks = []\n"
    "for _ in range({megabytes} // 8):\n"
    "    chunks.append(b'\\x01' * (8 << 20))\n"
    "    time.sleep(0.02)\n"
    "time.sleep({hold})\n"
    "print('held')\n"
)


def _run_noting(engine: ExecutionEngine, request: RunCodeRequest) -> tuple[object, list[str]]:
    """``engine.run_code(request)`` and the divergence notes it made (as the web layer collects them)."""
    with divergence.collecting() as notes:
        answer = engine.run_code(request)
    return answer, list(notes)


@needs_cgroups
def test_a_run_killed_by_the_shared_budget_says_so_and_one_killed_at_its_own_limit_does_not(
    small_engine: ExecutionEngine,
) -> None:
    """Two programs growing to 160 MiB each: each fits its own 200 MiB, together they pass the
    256 MiB of all runs. One is killed (-9) and its answer carries a divergence note (SandboxFusion
    would have left it to the host's OOM killer); the other holds and ends well. A program past its
    own 200 MiB is killed too, with no such note."""
    request = RunCodeRequest(code=GROWER.format(megabytes=160, hold=4), language="python", run_timeout=20)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(lambda r: _run_noting(small_engine, r), [request, request]))
    killed = [(answer, notes) for answer, notes in done if answer.run_result.return_code == -9]  # type: ignore[attr-defined]
    assert len(killed) >= 1, done
    for _, notes in killed:
        assert [note.split(":")[0] for note in notes] == [divergence.MEMORY_BUDGET], notes
        assert "all runs together" in notes[0] and "OOM killer" in notes[0]
    for answer, notes in done:
        if answer.run_result.return_code != -9:  # type: ignore[attr-defined]
            assert answer.run_result.stdout == "held\n" and notes == [], (answer, notes)  # type: ignore[attr-defined]
    alone = RunCodeRequest(code=GROWER.format(megabytes=400, hold=0), language="python", run_timeout=20)
    answer, notes = _run_noting(small_engine, alone)
    assert answer.run_result.return_code == -9 and notes == [], (answer, notes)  # type: ignore[attr-defined]
