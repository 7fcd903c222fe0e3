"""POST /run_jupyter (contract §3), when the target has it."""

from __future__ import annotations

import pytest
from contract_support import Target, b64, check_command_result, check_validation_error

# Running cells needs the target's kernel side (the mock's `jupyter` extra); its 422s do not.
pytestmark = pytest.mark.needs_endpoint("/run_jupyter")

CELL_KEYS = ["stdout", "stderr", "display", "error"]
RESPONSE_KEYS = ["status", "message", "driver", "cells", "executor_pod_name", "files"]


def run_jupyter(target: Target, **body: object) -> dict:
    reply = target.post("/run_jupyter", body, timeout=180)
    assert reply.status_code == 200, reply.text[:300]
    answer = reply.json()
    assert list(answer) == RESPONSE_KEYS
    assert answer["status"] in ("Success", "Failed", "SandboxError")
    if answer["driver"] is not None:
        check_command_result(answer["driver"], "driver")
    for cell in answer["cells"]:
        assert list(cell) == CELL_KEYS
    return answer


@pytest.mark.needs_jupyter_kernel
def test_cells_run_in_order_in_one_kernel(target: Target) -> None:
    answer = run_jupyter(target, cells=["x = 2", "x * 21", 'print("hi")'])
    assert answer["status"] == "Success" and answer["message"] == ""
    assert answer["driver"]["status"] == "Finished"
    assert answer["driver"]["stdout"].startswith("config: ")
    first, second, third = answer["cells"]
    assert first == {"stdout": "", "stderr": "", "display": [], "error": []}
    assert second["display"] == [{"text/plain": "42"}]
    assert third["stdout"] == "hi\n"


@pytest.mark.needs_jupyter_kernel
def test_a_raising_cell_is_still_success(target: Target) -> None:
    answer = run_jupyter(target, cells=['raise RuntimeError("error message")', "1 + 1"])
    assert answer["status"] == "Success"
    (error,) = answer["cells"][0]["error"]
    assert (error["ename"], error["evalue"]) == ("RuntimeError", "error message")
    assert isinstance(error["traceback"], list) and all(isinstance(line, str) for line in error["traceback"])


@pytest.mark.needs_jupyter_kernel
def test_each_request_gets_a_fresh_namespace(target: Target) -> None:
    run_jupyter(target, cells=["leftover = 1"])
    answer = run_jupyter(target, cells=["leftover"])
    assert answer["cells"][0]["error"][0]["ename"] == "NameError"


@pytest.mark.needs_jupyter_kernel
def test_files_and_fetch_files(target: Target) -> None:
    answer = run_jupyter(
        target,
        cells=['print(open("in.txt").read())', 'open("o.txt", "w").write("jupyter out")'],
        files={"in.txt": b64(b"jfile")},
        fetch_files=["o.txt"],
    )
    assert answer["cells"][0]["stdout"] == "jfile\n"
    assert answer["files"] == {"o.txt": b64(b"jupyter out")}


def test_only_python3_kernels(target: Target) -> None:
    reply = target.post("/run_jupyter", {"cells": ["1"], "kernel": "julia"})
    check_validation_error(reply, [("literal_error", ["body", "kernel"])])


def test_missing_cells(target: Target) -> None:
    check_validation_error(target.post("/run_jupyter", {}), [("missing", ["body", "cells"])])


@pytest.mark.needs_jupyter_kernel
def test_total_timeout_fails_with_no_cells(target: Target) -> None:
    # SandboxFusion gives the driver total_timeout + 10 s; -9.5 makes that half a second.
    answer = run_jupyter(target, cells=["import time; time.sleep(30)"], total_timeout=-9.5)
    assert answer["status"] == "Failed" and answer["cells"] == []
    assert answer["driver"]["status"] == "TimeLimitExceeded"
