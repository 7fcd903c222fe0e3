"""/run_jupyter answers with a fake pool and fake kernels (no processes): every outcome's shape."""

from __future__ import annotations

import ast
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mocksandbox.jupyter.kernel import DeadlineExceeded, KernelDied, KernelError
from mocksandbox.jupyter.models import CellRunResult, RunJupyterRequest
from mocksandbox.jupyter.service import JupyterService, driver_budget, driver_log
from mocksandbox.models import CommandRunStatus, RunStatus
from mocksandbox.settings import Settings


class FakeKernel:
    """Runs cells by echoing them; ``fail_at`` makes the n-th cell raise the given exception."""

    def __init__(self, fail_at: tuple[int, BaseException] | None = None) -> None:
        self.cwd: str | None = None
        self.cells: list[str] = []
        self.deadlines: list[float] = []
        self.fail_at = fail_at

    def run_setup(self, code: str, deadline: float) -> None:
        self.cwd = ast.literal_eval(code[code.index("chdir(") + 6 : -1])

    def run_cell(self, code: str, deadline: float) -> CellRunResult:
        self.deadlines.append(deadline)
        if self.fail_at is not None and self.fail_at[0] == len(self.cells):
            raise self.fail_at[1]
        self.cells.append(code)
        if code.startswith("write "):
            assert self.cwd is not None
            Path(self.cwd, code.split()[1]).write_text("written")
        return CellRunResult(stdout=code, stderr="", display=[], error=[])


class FakePool:
    def __init__(self, kernel: FakeKernel | None = None, error: Exception | None = None) -> None:
        self.kernel = kernel or FakeKernel()
        self.error = error
        self.acquired = 0
        self.released: list[Any] = []
        self.closed = False

    def acquire(self, deadline: float) -> tuple[Any, bool]:
        self.acquired += 1
        if self.error is not None:
            raise self.error
        return self.kernel, True

    def release(self, kernel: Any) -> None:
        self.released.append(kernel)

    def warm(self) -> None:
        pass

    def stats(self) -> dict[str, int]:
        return {"acquired": self.acquired}

    def reset_stats(self) -> None:
        self.acquired = 0

    def close(self) -> None:
        self.closed = True


def service_with(pool: FakePool, tmp_path: Path, **settings: Any) -> JupyterService:
    return JupyterService(
        Settings(pod_name="pod-7", tmp_root=str(tmp_path), **settings), pool_factory=lambda: pool
    )


def request(**fields: Any) -> RunJupyterRequest:
    return RunJupyterRequest.model_validate({"cells": ["a", "b"], **fields})


def test_success_shape(tmp_path: Path) -> None:
    pool = FakePool()
    response = service_with(pool, tmp_path).run_jupyter(request())
    assert response.status == RunStatus.Success
    assert response.message == ""
    assert response.executor_pod_name == "pod-7"
    assert [cell.stdout for cell in response.cells] == ["a", "b"]
    driver = response.driver
    assert driver is not None
    assert (driver.status, driver.return_code, driver.stderr) == (CommandRunStatus.Finished, 0, "")
    assert driver.stdout == driver_log(request())
    assert isinstance(driver.execution_time, float)
    assert pool.released == [pool.kernel]


def test_driver_log_is_config_and_indented_json() -> None:
    assert driver_log(request(cells=["x = 2"], cell_timeout=1.5)) == (
        'config: \n{\n  "kernel": "python3",\n  "cells": [\n    "x = 2"\n  ],\n'
        '  "cell_timeout": 1.5,\n  "total_timeout": 45.0\n}\n'
    )


def test_files_are_restored_and_fetched_and_the_workdir_removed(tmp_path: Path) -> None:
    pool = FakePool()
    response = service_with(pool, tmp_path).run_jupyter(
        request(
            cells=["write out.txt"],
            files={"in/data.txt": "aGk="},
            fetch_files=["out.txt", "in/data.txt", "nope"],
        )
    )
    assert response.files == {"out.txt": "d3JpdHRlbg==", "in/data.txt": "aGk="}
    assert pool.kernel.cwd is not None and not os.path.exists(pool.kernel.cwd)
    assert os.path.dirname(pool.kernel.cwd) == str(tmp_path)


def test_time_out_mid_cell_is_failed_with_a_timed_out_driver_and_no_cells(tmp_path: Path) -> None:
    pool = FakePool(FakeKernel(fail_at=(1, DeadlineExceeded("late"))))
    response = service_with(pool, tmp_path).run_jupyter(request(fetch_files=["x"]))
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
    assert pool.released == [pool.kernel]  # and the pool kills it


def test_deadline_is_total_timeout_plus_ten(tmp_path: Path) -> None:
    pool = FakePool()
    service = service_with(pool, tmp_path)
    before = time.monotonic()
    service.run_jupyter(request(total_timeout=5))
    assert before + 15 <= pool.kernel.deadlines[0] <= time.monotonic() + 15


def test_no_time_at_all_fails_without_taking_a_kernel(tmp_path: Path) -> None:
    pool = FakePool()
    response = service_with(pool, tmp_path).run_jupyter(request(total_timeout=-10))
    assert response.status == RunStatus.Failed
    assert response.driver is not None and response.driver.status == CommandRunStatus.TimeLimitExceeded
    assert pool.acquired == 0


def test_kernel_death_is_failed_with_the_driver_failing(tmp_path: Path) -> None:
    pool = FakePool(FakeKernel(fail_at=(0, KernelDied("Kernel died"))))
    response = service_with(pool, tmp_path).run_jupyter(request())
    assert response.status == RunStatus.Failed
    assert response.cells == []
    driver = response.driver
    assert driver is not None
    assert (driver.status, driver.return_code) == (CommandRunStatus.Finished, 1)
    assert driver.stdout == driver_log(request())
    assert driver.stderr == "nbclient.exceptions.DeadKernelError: Kernel died\n"


def test_bad_base64_is_a_sandbox_error(tmp_path: Path) -> None:
    pool = FakePool()
    response = service_with(pool, tmp_path).run_jupyter(request(cells=["print(1)"], files={"a": "abcde"}))
    assert response.status == RunStatus.SandboxError
    assert response.message == (
        "exception on running jupyter print(1): Invalid base64-encoded string: number of data characters (5) "
        "cannot be 1 more than a multiple of 4 None"
    )
    assert (response.driver, response.cells, response.files) == (None, [], {})
    assert pool.acquired == 0


def test_kernel_start_failure_is_a_sandbox_error_with_the_first_100_characters(tmp_path: Path) -> None:
    pool = FakePool(error=KernelError("cannot import ipykernel"))
    cells = ["x" * 60, "y" * 60]
    response = service_with(pool, tmp_path).run_jupyter(request(cells=cells))
    assert response.status == RunStatus.SandboxError
    code_repr = ("x" * 60 + "\n" + "y" * 60)[:100]
    assert response.message == f"exception on running jupyter {code_repr}: cannot import ipykernel None"


@pytest.mark.parametrize(
    ("total_timeout", "cap", "budget"),
    [
        (45.0, 3600.0, 55.0),
        (-9.5, 3600.0, 0.5),
        (1e9, 3600.0, 3600.0),
        (math.inf, 60.0, 60.0),
        (math.nan, 60.0, 60.0),
    ],
)
def test_driver_budget(total_timeout: float, cap: float, budget: float) -> None:
    assert driver_budget(total_timeout, cap) == budget


def test_lifecycle_with_a_fake_pool(tmp_path: Path) -> None:
    pool = FakePool()
    service = service_with(pool, tmp_path)
    assert service.stats() == {}  # nothing created before first use
    service.run_jupyter(request())
    assert service.stats() == {"acquired": 1}
    service.reset()
    assert service.stats() == {"acquired": 0}
    service.close()
    service.close()
    assert pool.closed
    response = service.run_jupyter(request())
    assert response.status == RunStatus.SandboxError
    assert "closed" in response.message


@pytest.fixture
def short_tmp_path() -> Iterator[Path]:
    """A temp dir with a path short enough for kernels' runtime dirs (Unix socket paths)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="rt-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_runtime_dirs_of_killed_servers_are_reclaimed_and_live_ones_kept(short_tmp_path: Path) -> None:
    """A server killed with SIGKILL leaves its kernels' runtime dir; the next one removes it, but
    never the dir of a server that lives (it holds the lock of its ``.owner`` file)."""
    import fcntl
    import subprocess
    import sys

    tmp_path = short_tmp_path

    from mocksandbox.jupyter.service import _runtime_root, reclaim_stale_runtime_roots

    holder = subprocess.Popen(
        [sys.executable, "-c", "from mocksandbox.jupyter.service import _runtime_root\nimport sys\n"
         f"root, _ = _runtime_root({str(tmp_path)!r}); print(root, flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None
    live = Path(holder.stdout.readline().strip())
    assert live.parent == tmp_path
    killed = tmp_path / "mocksandbox-jupyter-killed"
    (killed / "k1").mkdir(parents=True)
    (killed / ".owner").touch()  # its lock went with its process
    unknown = tmp_path / "mocksandbox-jupyter-noowner"  # whose? not ours to remove
    unknown.mkdir()
    try:
        assert reclaim_stale_runtime_roots(str(tmp_path)) == [str(killed)]
        assert live.is_dir() and unknown.is_dir() and not killed.exists()
        mine, owner = _runtime_root(str(tmp_path))
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(os.open(mine / ".owner", os.O_RDWR), fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(owner)
    finally:
        holder.kill()
        holder.wait()
    assert str(live) in reclaim_stale_runtime_roots(str(tmp_path))
