"""A server that lives under a process budget (a container's or a CI job's ``pids.max``) survives
fork bombs: the runs after one, and the runs beside several, are answered right.

The server runs as ``mocksandbox serve`` in a pids cgroup of its own whose ``pids.max`` (400) is
smaller than the per-run default (512), as a container or a systemd unit would place it. Before the
budget was split at start-up, one fork bomb filled the server's own cgroup: the next runs came back
as a made-up ``Finished -9`` because the launcher could not fork, and they kept failing for as long
as the bomb's zombies, handed to the machine's init, waited to be reaped.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_process import (
    ServeProcess,
    kill_and_remove,
    make_test_cgroup,
    start_serve,
    stop_serve_leaving_nothing,
)

pytestmark = pytest.mark.slow

#: The budget the server is given: smaller than the per-run default of 512.
SERVER_PIDS_MAX = 400
PYTHON_FORK_BOMB = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n"
#: Each copy starts two more in the background and waits for neither: the shell's classic.
BASH_FORK_BOMB = "b(){ b | b & }; b; sleep 5"


@pytest.fixture
def budget_server(tmp_path: Path) -> Iterator[ServeProcess]:
    """``mocksandbox serve`` inside a pids cgroup capped at :data:`SERVER_PIDS_MAX`, its runs' temp
    dirs in ``tmp_path/runs``; the cgroup is removed afterwards with all it holds."""
    group = make_test_cgroup("pids", "budget", lambda g: (g / "pids.max").write_text(str(SERVER_PIDS_MAX)))
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    try:
        server = start_serve(cgroup=group, runs_dir=runs_dir)
        try:
            yield server
        finally:
            stop_serve_leaving_nothing(server)
    finally:
        kill_and_remove(group)


def _assert_ordinary(answer: dict[str, object], expected: str) -> None:
    run_result = answer["run_result"]
    assert answer["status"] == "Success", answer
    assert isinstance(run_result, dict) and run_result["stdout"] == expected, answer


def _assert_nothing_left(server: ServeProcess) -> None:
    """No process of any run is left or still charged, and no temp dir: the server is up."""
    parent = server.runs_parent()
    deadline = time.monotonic() + 15  # returns once drained; a loaded machine reaps slowly
    while int((parent / "pids.current").read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert int((parent / "pids.current").read_text()) == 0, "a run's processes are still charged"
    assert server.runs_left() == []
    assert server.process.poll() is None
    _assert_ordinary(server.run("print(6*7)"), "42\n")


def test_banner_states_the_budget(budget_server: ServeProcess) -> None:
    (line,) = [line for line in budget_server.banner if "process budget:" in line]
    assert f"{SERVER_PIDS_MAX} (cgroup v1 pids.max of /" in line, line
    (confinement,) = [line for line in budget_server.banner if "confinement:" in line]
    per_run = int(confinement.split("pids.max=", 1)[1].split(",", 1)[0])
    assert per_run < SERVER_PIDS_MAX // 4, confinement
    runs_total = int((budget_server.runs_parent() / "pids.max").read_text())
    assert runs_total < SERVER_PIDS_MAX - 32, "the server keeps a reserve for its own threads"


def test_fork_bombs_then_ordinary_runs(budget_server: ServeProcess) -> None:
    """20 rounds: a fork bomb (python, then bash, alternately), then an ordinary run."""
    for round_number in range(20):
        if round_number % 2:
            bomb = budget_server.run(BASH_FORK_BOMB, "bash", run_timeout=1)
        else:
            bomb = budget_server.run(PYTHON_FORK_BOMB, run_timeout=1)
        # Whatever the bomb got, it is never a made-up exit of a program that did not start.
        assert bomb["status"] in ("Failed", "Success"), bomb
        _assert_ordinary(budget_server.run(f"print({round_number} * 7)"), f"{round_number * 7}\n")
        _assert_ordinary(budget_server.run(f"echo round {round_number}", "bash"), f"round {round_number}\n")
    _assert_nothing_left(budget_server)


def test_ordinary_runs_beside_concurrent_fork_bombs(budget_server: ServeProcess) -> None:
    """Four fork bombs at once while sixteen ordinary runs go on: every ordinary run is right."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        bombs = [
            pool.submit(
                budget_server.run,
                *((PYTHON_FORK_BOMB, "python") if i % 2 else (BASH_FORK_BOMB, "bash")),
                run_timeout=2,
            )
            for i in range(4)
        ]
        time.sleep(0.5)  # the bombs are at their budget before the ordinary runs arrive
        ordinary = [pool.submit(budget_server.run, f"print({i} + 1000)") for i in range(16)]
        for i, future in enumerate(ordinary):
            _assert_ordinary(future.result(), f"{i + 1000}\n")
        for future in bombs:
            assert future.result()["status"] in ("Failed", "Success")
    _assert_nothing_left(budget_server)
