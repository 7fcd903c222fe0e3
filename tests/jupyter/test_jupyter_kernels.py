"""/run_jupyter on real IPython kernels (processes talking over Unix sockets; no TCP, no HTTP).

What is checked: outputs as SandboxFusion shapes them, that no state passes from one request to the
next, that forked kernels look like spawned ones, timeouts and dying kernels, and that no kernel
process outlives the pool. Nothing here asserts on wall-clock durations.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from mocksandbox.jupyter.models import RunJupyterRequest, RunJupyterResponse
from mocksandbox.jupyter.service import JupyterService
from mocksandbox.models import CommandRunStatus, RunStatus
from mocksandbox.settings import Settings

pytest.importorskip("ipykernel", reason="the jupyter extra is not installed")


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.01)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(scope="module")
def service() -> Iterator[JupyterService]:
    service = JupyterService(Settings(pod_name=None, jupyter_pool_size=2))
    service.warm()
    yield service
    service.close()


def run(service: JupyterService, cells: list[str], **fields: Any) -> RunJupyterResponse:
    return service.run_jupyter(RunJupyterRequest.model_validate({"cells": cells, **fields}))


# -- outputs ----------------------------------------------------------------------------------------


def test_contract_example(service: JupyterService) -> None:
    response = run(service, ["x = 2", "x * 21", 'print("hi")'])
    assert response.status == RunStatus.Success
    assert [cell.model_dump() for cell in response.cells] == [
        {"stdout": "", "stderr": "", "display": [], "error": []},
        {"stdout": "", "stderr": "", "display": [{"text/plain": "42"}], "error": []},
        {"stdout": "hi\n", "stderr": "", "display": [], "error": []},
    ]
    driver = response.driver
    assert driver is not None
    assert (driver.status, driver.return_code, driver.stderr) == (CommandRunStatus.Finished, 0, "")
    assert driver.stdout == (
        'config: \n{\n  "kernel": "python3",\n  "cells": [\n    "x = 2",\n    "x * 21",\n    "print(\\"hi\\")"\n'
        '  ],\n  "cell_timeout": 0.0,\n  "total_timeout": 45.0\n}\n'
    )


def test_errors_do_not_stop_later_cells_and_count_like_sandboxfusion(service: JupyterService) -> None:
    cells = [
        "a = 123",
        "a",
        "print(a)",
        'import sys; sys.stderr.write("stderr message")',
        'raise RuntimeError("error message")',
        "a + 1",
    ]
    response = run(service, cells)
    assert response.status == RunStatus.Success
    assert response.cells[3].stderr == "stderr message"
    assert response.cells[3].display == [{"text/plain": "14"}]
    [error] = response.cells[4].error
    assert list(error) == ["traceback", "ename", "evalue"]
    assert (error["ename"], error["evalue"]) == ("RuntimeError", "error message")
    assert any("\x1b[" in line for line in error["traceback"])  # coloured, as there
    assert any("In[6]" in line for line in error["traceback"])  # the contract's numbering
    assert response.cells[5].display == [{"text/plain": "124"}]


def test_files_and_fetch_files(service: JupyterService) -> None:
    response = run(
        service,
        ['print(open("in.txt").read())', 'open("o.txt","w").write("jupyter out")'],
        files={"in.txt": "amZpbGU="},
        fetch_files=["o.txt", "missing.txt"],
    )
    assert [cell.stdout for cell in response.cells] == ["jfile\n", ""]
    assert response.cells[1].display == [{"text/plain": "11"}]
    assert response.files == {"o.txt": "anVweXRlciBvdXQ="}


def test_files_can_be_imported_from_the_working_directory(service: JupyterService) -> None:
    helper = base64.b64encode(b"ANSWER = 42\n").decode()
    response = run(
        service, ["import helper_module; helper_module.ANSWER"], files={"helper_module.py": helper}
    )
    assert response.cells[0].display == [{"text/plain": "42"}]


def test_displays_subprocess_output_and_stdin(service: JupyterService) -> None:
    response = run(
        service,
        [
            "from IPython.display import display, clear_output\ndisplay('first')\nclear_output()\ndisplay({'k': 1})",
            # ipykernel forwards what a child writes to descriptor 1 from a watcher thread, so it
            # can reach the kernel's stream after the cell ends (in SandboxFusion too: it waits for
            # idle the same way). The pause lets that thread, already woken by the data, forward it.
            "import subprocess, time\n"
            "rc = subprocess.run(['echo', 'from a child'], check=True).returncode\n"
            "time.sleep(0.5)\n"
            "rc",
            "input()",
        ],
    )
    assert response.cells[0].display == [{"text/plain": "{'k': 1}"}]
    assert response.cells[1].stdout == "from a child\n"
    assert response.cells[1].display == [{"text/plain": "0"}]
    assert response.cells[2].error[0]["ename"] == "StdinNotImplementedError"  # no stdin, as there


def test_non_ascii_and_empty_cells(service: JupyterService) -> None:
    response = run(service, ["print('héllo ✓')", "", "# only a comment"])
    assert [cell.stdout for cell in response.cells] == ["héllo ✓\n", "", ""]
    assert response.driver is not None and "\"print('h\\u00e9llo \\u2713')\"" in (
        response.driver.stdout or ""
    )


# -- no state between requests --------------------------------------------------------------------


def test_nothing_carries_over_to_the_next_request(service: JupyterService, tmp_path: Path) -> None:
    # A module of the test's own: no kernel imports it at start-up (a stdlib one may be, by the
    # kernel's own imports: IPython's prompt_toolkit imports colorsys).
    (tmp_path / "mocksandbox_leaked_module.py").write_text("VALUE = 1\n")
    polluter = [
        "leaked_variable = 'from the last request'",
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import mocksandbox_leaked_module",
        "import json, builtins, random",
        "json.MARKER = 'patched'; builtins.leaked_builtin = 1; random.seed(1234)",
        f"import os, sys; os.chdir({str(tmp_path)!r}); os.environ['LEAKED_ENV'] = '1'; sys.path.append('/leaked')",
        "def helper(): return 1",
        "import os; os.getpid()",
    ]
    probe = [
        "'leaked_variable' in dir() or 'helper' in dir()",
        "import sys; 'mocksandbox_leaked_module' in sys.modules",
        "import json, builtins; hasattr(json, 'MARKER') or hasattr(builtins, 'leaked_builtin')",
        f"import os, sys; os.getcwd() == {str(tmp_path)!r} or 'LEAKED_ENV' in os.environ or '/leaked' in sys.path",
        "import random; random.seed(1234); a = random.random(); random.seed(1234); a == random.random()",
        "import os; os.getpid()",
        "raise ValueError('which cell?')",
    ]
    first = run(service, polluter)
    assert all(not cell.error for cell in first.cells), first.cells
    old_pid = int(first.cells[-1].display[0]["text/plain"])
    for _ in range(3):  # warm kernels (the pool's) and their replacements alike
        second = run(service, probe)
        assert [cell.display[0]["text/plain"] for cell in second.cells[:4]] == ["False"] * 4
        assert second.cells[4].display == [{"text/plain": "True"}]  # random still works
        new_pid = int(second.cells[5].display[0]["text/plain"])
        assert new_pid != old_pid
        assert any("In[8]" in line for line in second.cells[6].error[0]["traceback"])  # counts from 1 again
        old_pid = new_pid


def test_used_kernels_are_killed(service: JupyterService) -> None:
    pid = int(run(service, ["import os; os.getpid()"]).cells[0].display[0]["text/plain"])
    wait_until(lambda: gone(pid))


def test_concurrent_requests_do_not_mix(service: JupyterService) -> None:
    answers: dict[int, Any] = {}

    def one(n: int) -> None:
        response = run(service, [f"n = {n}", "import time; time.sleep(0.05)", "print(n * 10)"])
        answers[n] = response.cells[2].stdout

    threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == {n: f"{n * 10}\n" for n in range(4)}


def test_requests_use_the_pool(service: JupyterService) -> None:
    wait_until(lambda: service.stats()["ready"] == 2)
    before = service.stats()["warm"]
    run(service, ["1"])
    assert service.stats()["warm"] == before + 1


# -- forked kernels look like spawned ones --------------------------------------------------------

_PORTRAIT = (
    "import sys, os, json\n"
    "print(json.dumps({'path': sys.path, 'argv0': os.path.basename(sys.argv[0]), 'name': __name__,"
    " 'exe': sys.executable, 'env': sorted(os.environ), 'in_workdir': os.listdir('.') == ['f.txt'],"
    " 'parent_env': os.environ.get('JPY_PARENT_PID') == str(os.getppid())}))"
)


def test_a_forked_kernel_looks_like_a_spawned_one() -> None:
    portraits = {}
    for launcher in ("fork", "spawn"):
        service = JupyterService(Settings(pod_name=None, jupyter_launcher=launcher, jupyter_pool_size=0))
        try:
            response = run(service, [_PORTRAIT, "raise KeyError('k')"], files={"f.txt": "eA=="})
        finally:
            service.close()
        assert response.status == RunStatus.Success
        portraits[launcher] = json.loads(response.cells[0].stdout)
        assert any("In[3]" in line for line in response.cells[1].error[0]["traceback"])
    assert portraits["fork"] == portraits["spawn"]
    assert portraits["fork"]["argv0"] == "ipykernel_launcher.py"
    assert portraits["fork"]["in_workdir"] and portraits["fork"]["parent_env"]


# -- time limits and dying kernels --------------------------------------------------------------------


def test_total_timeout_fails_with_a_timed_out_driver_and_kills_the_kernel(
    service: JupyterService, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    # total_timeout + 10 s is the budget, as in SandboxFusion: -7 leaves 3 s. The cell must start
    # (and write its pid) within it: a warm kernel, and more than half a second on a loaded machine.
    wait_until(lambda: service.stats()["ready"] >= 1)
    response = run(
        service,
        [
            f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(30)",
            "print('never')",
        ],
        total_timeout=-7,
        fetch_files=["x"],
    )
    assert response.status == RunStatus.Failed
    assert (response.message, response.cells, response.files) == ("", [], {})
    driver = response.driver
    assert driver is not None
    assert (driver.status, driver.return_code, driver.stdout, driver.stderr) == (
        CommandRunStatus.TimeLimitExceeded,
        None,
        "",
        "",
    )
    wait_until(lambda: pid_file.exists() and pid_file.read_text() != "")
    wait_until(lambda: gone(int(pid_file.read_text())))


def test_a_dying_kernel_fails_the_request(service: JupyterService) -> None:
    response = run(service, ["print('before')", "import os; os._exit(3)", "print('after')"])
    assert response.status == RunStatus.Failed
    assert response.cells == []
    assert response.driver is not None and response.driver.return_code == 1
    assert "DeadKernelError" in (response.driver.stderr or "")
    assert run(service, ["'still serving'"]).cells[0].display == [{"text/plain": "'still serving'"}]


@pytest.mark.slow
def test_contract_timeout_example_takes_total_timeout_plus_ten(service: JupyterService) -> None:
    response = run(service, ["import time; time.sleep(30)"], total_timeout=1)
    assert response.status == RunStatus.Failed
    assert response.driver is not None and response.driver.status == CommandRunStatus.TimeLimitExceeded
    assert response.driver.execution_time is not None and response.driver.execution_time >= 11


# -- nothing outlives the pool ------------------------------------------------------------------------


def _processes_under(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in process.info["cmdline"] or []) and not gone(process.pid):
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.mark.parametrize("launcher", ["fork", "spawn"])
def test_close_leaves_no_kernel_process(launcher: str) -> None:
    service = JupyterService(Settings(pod_name=None, jupyter_launcher=launcher, jupyter_pool_size=2))
    service.warm()
    wait_until(lambda: service.stats()["ready"] == 2)
    response = run(service, ["import subprocess; p = subprocess.Popen(['sleep', '60']); p.pid"])
    child = int(response.cells[0].display[0]["text/plain"])
    runtime_root = str(service.runtime_root)
    pids = service.live_kernel_pids()
    assert len(pids) >= 2
    assert _processes_under(runtime_root)  # kernels (and the fork server) carry the marker
    service.close()
    assert service.live_kernel_pids() == []
    assert all(gone(pid) for pid in [*pids, child])
    assert _processes_under(runtime_root) == []
    assert not Path(runtime_root).exists()


def test_a_flood_of_output_is_capped() -> None:
    service = JupyterService(Settings(pod_name=None, jupyter_pool_size=0, max_output_bytes=4096))
    try:
        response = run(service, ["for i in range(20000): print(i)", "print('next cell')"])
    finally:
        service.close()
    assert len(response.cells[0].stdout) == 4096
    assert response.cells[0].stdout.startswith("0\n1\n2\n")
    assert response.cells[1].stdout == "next cell\n"


# -- ending a kernel's processes ---------------------------------------------------------------------


def test_kill_tree_returns_once_its_processes_exited_not_once_someone_reaped_them(tmp_path: Path) -> None:
    """A killed process that is not ours stays a zombie until its parent reaps it, which for a
    kernel's orphans is an init that may reap late or never: ``kill_tree`` is done once it exited."""
    import subprocess
    import sys

    from mocksandbox.jupyter.kernel import kill_tree

    # A parent that never reaps: its child, once killed, stays a zombie while the parent lives.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    time.sleep(600)\n    os._exit(0)\n"
            "print(pid, flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        done = threading.Event()
        killer = threading.Thread(target=lambda: (kill_tree(child, timeout=300), done.set()), daemon=True)
        killer.start()
        # (Waiting for the reaping would take the whole 300 s: the parent reaps nothing.)
        assert done.wait(120), "kill_tree waited for a zombie to be reaped"
        assert child.status() == psutil.STATUS_ZOMBIE  # exited, and not reaped by anyone
    finally:
        parent.kill()
        parent.wait()
