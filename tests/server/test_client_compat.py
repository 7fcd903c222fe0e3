"""Real clients against a real mock server on a loopback port.

* the official ``sandbox-fusion`` client (PyPI, 0.3.x): endpoint via ``set_endpoint``, the ``endpoint``
  argument and the ``SANDBOX_FUSION_ENDPOINT`` variable; sync and async ``run_code``;
* verl's ``check_correctness`` (``verl/utils/reward_score/sandbox_fusion/utils.py``), loaded by file
  path from verl's wheel installed apart (``.venv/test-vendor``, see the Makefile) so that
  ``verl/__init__.py`` (numpy, torch, ray) never runs;
* 64 requests at once over real sockets: no cross-talk, and all of them in flight together.

Nothing here asserts on wall-clock durations.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import requests

from mocksandbox.serving.single import ServerThread, running_server
from mocksandbox.serving.workers import PoolControl, WorkerPool
from mocksandbox.settings import Settings

sandbox_fusion = pytest.importorskip("sandbox_fusion", reason="the sandbox-fusion client is not installed")
from sandbox_fusion import (  # noqa: E402
    CommandRunStatus,
    RunCodeRequest,
    RunStatus,
    SummaryMapping,
    run_code,
    run_code_async,
    summary_run_code_result,
)

_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


# The loopback-only environment and sf_endpoint come from tests/server/conftest.py.
pytestmark = pytest.mark.usefixtures("loopback_only")


@pytest.fixture(
    scope="module",
    params=[(1, "auto"), (2, "auto"), (1, "none")],
    ids=["one-process", "two-workers", "isolation-none"],
)
def server(request: pytest.FixtureRequest) -> Iterator[ServerThread | PoolControl]:
    """Every client test against a one-process server and against ``serve --workers 2``, with the
    default isolation (lite where this host allows it), and against one with isolation none."""
    workers, isolation = request.param
    settings = Settings(pod_name=None, isolation=isolation)
    if workers == 1:
        with running_server(settings) as single:
            yield single
        return
    pool = PoolControl(WorkerPool(settings.replace(workers=2, port=0), 2)).start()
    try:
        yield pool
    finally:
        pool.close()


# -- a. the official sandbox-fusion client --------------------------------------------------------


def test_sandbox_fusion_success(sf_endpoint: str) -> None:
    resp = run_code(RunCodeRequest(code="print('hello')", language="python"), max_attempts=1)
    assert resp.status == RunStatus.Success
    assert resp.message == ""
    assert resp.compile_result is None
    assert resp.run_result is not None
    assert resp.run_result.status == CommandRunStatus.Finished
    assert resp.run_result.return_code == 0
    assert resp.run_result.stdout == "hello\n"
    assert resp.run_result.stderr == ""
    assert isinstance(resp.run_result.execution_time, float)
    assert resp.files == {}
    assert summary_run_code_result(resp, SummaryMapping()) == RunStatus.Success


def test_sandbox_fusion_stdin_and_files(sf_endpoint: str) -> None:
    code = (
        "a = input()\n"
        "print(a.upper(), open('data/in.txt').read())\n"
        "open('out.txt', 'w').write('written by code')\n"
    )
    request = RunCodeRequest(
        code=code,
        language="python",
        stdin="hello\n",
        files={"data/in.txt": base64.b64encode(b"uploaded").decode(), "skip.txt": None},
        fetch_files=["out.txt", "missing.txt"],
    )
    resp = run_code(request, max_attempts=1)
    assert resp.status == RunStatus.Success
    assert resp.run_result is not None
    assert resp.run_result.stdout == "HELLO uploaded\n"
    assert resp.files == {"out.txt": base64.b64encode(b"written by code").decode()}


@pytest.mark.parametrize(
    ("code", "return_code", "stderr_part"),
    [
        ("raise ValueError('boom')", 1, "ValueError: boom"),
        ("import sys\nprint('before exit')\nsys.exit(3)", 3, ""),
        ("def f(:\n    pass", 1, "SyntaxError"),
    ],
    ids=["exception", "exit-3", "syntax-error"],
)
def test_sandbox_fusion_failure(sf_endpoint: str, code: str, return_code: int, stderr_part: str) -> None:
    resp = run_code(RunCodeRequest(code=code, language="python"), max_attempts=1)
    assert resp.status == RunStatus.Failed
    assert resp.message == ""
    assert resp.compile_result is None
    assert resp.run_result is not None
    assert resp.run_result.status == CommandRunStatus.Finished
    assert resp.run_result.return_code == return_code
    assert stderr_part in (resp.run_result.stderr or "")
    mapping = SummaryMapping(RunFailed="RunFailed", RunTimeout="RunTimeout")
    assert summary_run_code_result(resp, mapping) == "RunFailed"


def test_sandbox_fusion_timeout(sf_endpoint: str) -> None:
    code = "import time\nprint('started', flush=True)\ntime.sleep(30)"
    # 3 s, not 0.5: Python must start and print 'started' before the timeout, on a loaded machine too.
    resp = run_code(RunCodeRequest(code=code, language="python", run_timeout=3), max_attempts=1)
    assert resp.status == RunStatus.Failed
    assert resp.message == ""
    assert resp.run_result is not None
    assert resp.run_result.status == CommandRunStatus.TimeLimitExceeded
    assert resp.run_result.return_code is None
    assert resp.run_result.stdout == "started\n"
    mapping = SummaryMapping(RunFailed="RunFailed", RunTimeout="RunTimeout")
    assert summary_run_code_result(resp, mapping) == "RunTimeout"


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_sandbox_fusion_compile_error(sf_endpoint: str) -> None:
    resp = run_code(RunCodeRequest(code="int main() { return x; }", language="cpp"), max_attempts=1)
    assert resp.status == RunStatus.Failed
    assert resp.run_result is None
    assert resp.compile_result is not None
    assert resp.compile_result.status == CommandRunStatus.Finished
    assert resp.compile_result.return_code != 0
    assert "error" in (resp.compile_result.stderr or "")
    assert summary_run_code_result(resp, SummaryMapping(CompileFailed="CompileFailed")) == "CompileFailed"


def test_sandbox_fusion_raises_on_sandbox_error(sf_endpoint: str) -> None:
    # `sql` is in the language enum but has no runner: HTTP 200 with status SandboxError, which the
    # client turns into an exception (after its retries; one attempt here).
    with pytest.raises(Exception, match=r"Sandbox responded with error: exception on running code select 1;"):
        run_code(RunCodeRequest(code="select 1;", language="sql"), max_attempts=1)


def test_sandbox_fusion_client_only_language_is_422(sf_endpoint: str) -> None:
    # The client's Literal allows `python2`, `gtest`, `react`; the server's enum does not.
    with pytest.raises(Exception, match=r"Faas api responded with code 422: .*literal_error"):
        run_code(RunCodeRequest(code="print 1", language="python2"), max_attempts=1)


def test_sandbox_fusion_endpoint_argument(server: ServerThread | PoolControl) -> None:
    resp = run_code(RunCodeRequest(code="print(6 * 7)", language="python"), endpoint=server.url)
    assert resp.status == RunStatus.Success
    assert resp.run_result is not None
    assert resp.run_result.stdout == "42\n"


def test_sandbox_fusion_async_client(server: ServerThread | PoolControl) -> None:
    async def main() -> list[Any]:
        requests_ = [RunCodeRequest(code=f"print({i})", language="python") for i in range(4)]
        return await asyncio.gather(
            *(run_code_async(r, endpoint=server.url, max_attempts=1) for r in requests_)
        )

    responses = asyncio.run(main())
    assert [r.status for r in responses] == [RunStatus.Success] * 4
    assert [r.run_result.stdout for r in responses] == [f"{i}\n" for i in range(4)]


def test_sandbox_fusion_endpoint_from_environment(server: ServerThread | PoolControl) -> None:
    # SANDBOX_FUSION_ENDPOINT is read when the client is imported, so use a fresh interpreter.
    env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARIABLES}
    env["SANDBOX_FUSION_ENDPOINT"] = server.url
    env.pop("SANDBOX_FUSION_DATASET_ENDPOINT", None)
    script = (
        "import json, sandbox_fusion as sf\n"
        "r = sf.run_code(sf.RunCodeRequest(code='print(123)', language='python'), max_attempts=1)\n"
        "print(json.dumps({'status': r.status.value, 'stdout': r.run_result.stdout}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == {"status": "Success", "stdout": "123\n"}


# -- b. verl's check_correctness ------------------------------------------------------------------

_HEAVY_MODULES = ("torch", "ray", "numpy", "transformers", "verl")


#: Where `make test` puts verl's wheel (``pip install --no-deps --target``): apart from the venv, so
#: that pip never sees verl's missing dependencies; ``MOCKSANDBOX_TEST_VENDOR`` names another place.
TEST_VENDOR = Path(
    os.environ.get("MOCKSANDBOX_TEST_VENDOR") or Path(__file__).resolve().parents[2] / ".venv" / "test-vendor"
)


def _verl_package_dir() -> Path | None:
    """verl's package directory: the test-only install, else one installed in this environment."""
    if (TEST_VENDOR / "verl" / "__init__.py").is_file():
        return TEST_VENDOR / "verl"
    spec = importlib.util.find_spec("verl")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _load_verl_sandbox_utils() -> ModuleType:
    """``verl.utils.reward_score.sandbox_fusion.utils`` from verl's wheel, without ``verl``'s
    package ``__init__`` (which imports numpy, torch and ray). The module itself needs only the
    standard library and ``requests``."""
    package = _verl_package_dir()
    if package is None:
        pytest.skip(f"verl is not installed (pip install --no-deps --target {TEST_VENDOR} verl==0.9.1)")
    path = package / "utils/reward_score/sandbox_fusion/utils.py"
    if not path.is_file():
        pytest.skip(f"this verl has no {path.relative_to(path.parents[3])}")
    before = set(sys.modules)
    module_spec = importlib.util.spec_from_file_location("_verl_sandbox_fusion_utils", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except ImportError as exc:
        pytest.skip(f"verl's sandbox_fusion/utils.py needs more than light deps here: {exc}")
    pulled = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in _HEAVY_MODULES)
    assert not pulled, f"loading verl's sandbox client imported heavy modules: {pulled}"
    return module


@pytest.fixture(scope="module")
def verl_utils() -> ModuleType:
    return _load_verl_sandbox_utils()


@pytest.fixture
def run_code_url(server: ServerThread | PoolControl) -> str:
    return server.url + "/run_code"


SQUARE = "n = int(input())\nprint(n * n)\n"


def test_verl_correct_code(verl_utils: ModuleType, run_code_url: str) -> None:
    in_outs = {"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0"]}
    code = "a, b = map(int, input().split())\nprint(a + b)\n"
    results, metadata = verl_utils.check_correctness(
        sandbox_fusion_url=run_code_url, in_outs=in_outs, generation=code, timeout=10, language="python"
    )
    assert results == [True, True, True]
    assert [m["status"] for m in metadata] == ["success"] * 3
    assert [m["api_status"] for m in metadata] == ["Success"] * 3
    assert [m["stdout"] for m in metadata] == ["3\n", "7\n", "0\n"]


def test_verl_100_parallel_cases_correct(verl_utils: ModuleType, run_code_url: str) -> None:
    in_outs = {"inputs": [f"{i}\n" for i in range(100)], "outputs": [f"{i * i}\n" for i in range(100)]}
    results, metadata = verl_utils.check_correctness(
        sandbox_fusion_url=run_code_url, in_outs=in_outs, generation=SQUARE, timeout=10, language="python"
    )
    assert results == [True] * 100, [m.get("api_request_error") or m["status"] for m in metadata]
    # Each case got its own answer back, in order.
    assert [m["stdout"] for m in metadata] == [f"{i * i}\n" for i in range(100)]


def test_verl_100_parallel_cases_wrong(verl_utils: ModuleType, run_code_url: str) -> None:
    # Even n: right; odd n: wrong answer; n % 10 == 3: AssertionError (runtime error, -2).
    code = "n = int(input())\nassert n % 10 != 3\nprint(n * n + n % 2)\n"
    in_outs = {"inputs": [f"{i}\n" for i in range(100)], "outputs": [f"{i * i}\n" for i in range(100)]}
    results, metadata = verl_utils.check_correctness(
        sandbox_fusion_url=run_code_url, in_outs=in_outs, generation=code, timeout=10, language="python"
    )
    expected = [-2 if i % 10 == 3 else (i % 2 == 0) for i in range(100)]
    assert results == expected
    assert all(m["api_request_error"] is None for m in metadata)
    assert {m["status"] for m in metadata} == {"success", "wrong_answer", "runtime_error"}


def test_verl_timeout(verl_utils: ModuleType, run_code_url: str) -> None:
    code = "import time\ntime.sleep(30)\n"
    results, metadata = verl_utils.check_correctness(
        sandbox_fusion_url=run_code_url,
        in_outs={"inputs": ["\n"], "outputs": ["x"]},
        generation=code,
        timeout=1,
        language="python",
    )
    assert results == [-3]
    assert metadata[0]["status"] == "timeout"
    assert metadata[0]["run_status"] == "TimeLimitExceeded"


def test_verl_sandbox_error_is_minus_one(verl_utils: ModuleType, run_code_url: str) -> None:
    results, metadata = verl_utils.check_correctness(
        sandbox_fusion_url=run_code_url,
        in_outs={"inputs": [""], "outputs": ["1"]},
        generation="select 1;",
        timeout=5,
        language="sql",
    )
    assert results == [-1]
    assert metadata[0]["status"] == "sandbox_error"
    assert metadata[0]["api_request_error"] is None


def test_verl_function_call_mode(verl_utils: ModuleType, run_code_url: str) -> None:
    # With fn_name, verl wraps the code: arguments arrive as JSON lines on stdin.
    code = "class Solution:\n    def add(self, a, b):\n        return a + b\n"
    in_outs = {"inputs": ["1\n2", "[1]\n[2, 3]"], "outputs": ["3", "[1, 2, 3]"], "fn_name": "add"}
    results, _ = verl_utils.check_correctness(
        sandbox_fusion_url=run_code_url, in_outs=in_outs, generation=code, timeout=10, language="python"
    )
    assert results == [True, True]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_verl_compile_error(verl_utils: ModuleType, run_code_url: str) -> None:
    results, metadata = verl_utils.check_correctness(
        sandbox_fusion_url=run_code_url,
        in_outs={"inputs": ["1\n", "2\n"], "outputs": ["1", "2"]},
        generation="int main() { return x; }",
        timeout=10,
        language="cpp",
    )
    assert results == [-4, -4]
    assert metadata[0]["compile_status"] == "Finished"
    assert "error" in metadata[0]["compile_stderr"]


# -- c. 64 requests at once over real sockets -----------------------------------------------------

PARALLEL = 64
MIN_OVERLAP = 32

# Each program prints its nonce, then meets the others at a file barrier (every program drops a
# marker file and waits until PARALLEL markers exist, or a deadline passes), then sleeps 0.2 s.
# A plain 0.2 s sleep is not enough to show concurrency on a 2-core machine: 64 Python start-ups
# cost ~30 ms of CPU each, so they spread over ~1 s and at most ~12 programs overlap however
# parallel the server is. The barrier makes the overlap a property of the server: if it ran fewer
# than PARALLEL programs at once, the programs would wait out the deadline and say so.
BARRIER_PROGRAM = """\
import os, time
start = time.time()
print("NONCE {nonce}", flush=True)
open(os.path.join({barrier!r}, "{nonce}"), "w").close()
deadline = time.monotonic() + {deadline}
while len(os.listdir({barrier!r})) < {parties} and time.monotonic() < deadline:
    time.sleep(0.005)
seen = len(os.listdir({barrier!r}))
time.sleep(0.2)
print("SEEN", seen)
print("STAMPS", start, time.time())
"""


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    current = best = 0
    for _, delta in events:  # at equal times the end (-1) sorts first: touching is not overlapping
        current += delta
        best = max(best, current)
    return best


def test_64_parallel_requests_no_crosstalk_and_in_flight_together(
    server: ServerThread | PoolControl, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if request.node.callspec.id != "isolation-none":
        pytest.skip("the programs meet in a dir of the host, which runs in worlds of their own cannot share")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    start_gate = threading.Barrier(PARALLEL)

    def one(_: int) -> tuple[str, requests.Response]:
        nonce = uuid.uuid4().hex
        code = BARRIER_PROGRAM.format(nonce=nonce, barrier=str(barrier), parties=PARALLEL, deadline=20)
        start_gate.wait(timeout=30)  # fire all requests at once
        with requests.Session() as session:
            session.trust_env = False
            response = session.post(
                server.url + "/run_code",
                json={"code": code, "language": "python", "run_timeout": 40},
                timeout=120,
            )
        return nonce, response

    with concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        answers = list(pool.map(one, range(PARALLEL)))

    intervals = []
    seen = []
    for nonce, response in answers:
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["status"] == "Success", body
        stdout = body["run_result"]["stdout"]
        lines = stdout.splitlines()
        # Its own nonce and nobody else's.
        assert lines[0] == f"NONCE {nonce}", stdout
        assert stdout.count("NONCE") == 1, stdout
        seen.append(int(lines[1].split()[1]))
        start, end = map(float, lines[2].split()[1:])
        intervals.append((start, end))

    assert len({n for n, _ in answers}) == PARALLEL
    assert sorted(os.listdir(barrier)) == sorted(n for n, _ in answers)
    overlap = _max_overlap(intervals)
    assert overlap >= MIN_OVERLAP, f"only {overlap} programs ran at once (barrier counts: {sorted(seen)})"
    # Every program saw all the others' markers while it was still running.
    assert min(seen) == PARALLEL, sorted(seen)


def test_max_overlap_helper() -> None:
    assert _max_overlap([(0, 1), (1, 2)]) == 1
    assert _max_overlap([(0, 2), (1, 3), (1.5, 1.6)]) == 3
    assert _max_overlap([]) == 0
