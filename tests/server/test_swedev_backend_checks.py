"""``--swedev-backend`` that cannot run the tests (issue 17): ``mocksandbox serve`` probes the backend
at start-up and refuses to start with one line saying why; a scoring run whose tests could not run
answers 500 with a ``detail`` that says so, never a silent 0.0.

The backends: a port nobody listens on, a web server whose ``/v1/ping`` is a 404 (pytest-httpserver),
and this project's own mock, with an interpreter that has pytest (``sys.executable``) or a fresh venv's
interpreter that has not.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import visible_dirs
from pytest_httpserver import HTTPServer

from mocksandbox.core import MockSandbox
from mocksandbox.serving.single import ServerThread, running_server
from mocksandbox.sessions import BackendError, InstanceRegistry
from mocksandbox.sessions.scripted import diff_block
from mocksandbox.settings import load_settings

PAGEKIT = next(i for i in InstanceRegistry.from_paths([]).all() if i.instance_id == "acme__pagekit-17")
HINT = (
    "point --swedev-backend-python at the interpreter of its sandbox runtime, "
    "e.g. /root/miniconda3/envs/sandbox-runtime/bin/python"
)


@pytest.fixture(scope="module")
def backend() -> Iterator[ServerThread]:
    """A SandboxFusion to run on: the mock itself, whose runs' Python is this venv's (the
    interpreter the tests name as its sandbox runtime's): its runs see it, wherever it lives (a
    clone under /tmp, which runs otherwise find empty)."""
    with running_server(load_settings(overrides={"port": 0, "python": sys.executable})) as srv:
        yield srv


@pytest.fixture(scope="module")
def python_without_pytest() -> Iterator[str]:
    """A fresh venv's interpreter: this project's Python, without pytest (where worlds see it)."""
    with visible_dirs.python_without_pytest() as python:
        yield python


def _serve_refused(*args: str) -> str:
    """Run ``mocksandbox serve`` expecting a refusal: exit code 2, nothing on stdout, one line on
    stderr (answered without its ``mocksandbox: `` prefix)."""
    done = subprocess.run(
        [sys.executable, "-m", "mocksandbox.cli", "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("mocksandbox: "), done.stderr
    return done.stderr[len("mocksandbox: ") : -1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_serve_refuses_a_backend_that_does_not_answer() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    assert _serve_refused("--swedev-backend", url) == (
        f"--swedev-backend {url}: GET {url}/v1/ping failed ([Errno 111] Connection refused); "
        "start SandboxFusion there or fix the URL"
    )


def test_serve_refuses_a_backend_whose_ping_is_not_pong(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/v1/ping").respond_with_data("no such page", status=404)
    url = httpserver.url_for("/").rstrip("/")
    assert _serve_refused("--swedev-backend", f"{url}/run_code") == (
        f"--swedev-backend {url}: GET {url}/v1/ping answered 404 'no such page', not \"pong\"; "
        "give the base URL of a SandboxFusion (the one that serves /run_code)"
    )


def test_serve_refuses_a_backend_python_without_pytest(
    backend: ServerThread, python_without_pytest: str
) -> None:
    line = _serve_refused("--swedev-backend", backend.url, "--swedev-backend-python", python_without_pytest)
    assert line == (
        f"--swedev-backend {backend.url}: {python_without_pytest} there has no pytest "
        f"(No module named pytest); {HINT}"
    )


def test_serve_refuses_a_backend_python_that_does_not_run(backend: ServerThread, tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere" / "python")
    line = _serve_refused("--swedev-backend", backend.url, "--swedev-backend-python", missing)
    assert line == (
        f"--swedev-backend {backend.url}: {missing} does not run there ({missing}: No such file or "
        f"directory); {HINT}"
    )


def test_serve_starts_on_a_backend_that_runs_pytest(backend: ServerThread) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            *("-m", "mocksandbox.cli", "serve", "--port", "0"),
            *("--swedev-backend", backend.url, "--swedev-backend-python", sys.executable),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = ""
        while "press Ctrl-C" not in banner:
            line = proc.stdout.readline()
            assert line, f"the server did not start: {banner!r} {proc.communicate(timeout=30)[1]!r}"
            banner += line
        assert re.search(
            rf"^  swedev backend: tests run with {re.escape(sys.executable)} \(Python 3\.\d+\.\d+, "
            r"pytest \d+\.\d+\S*\)$",
            banner,
            re.MULTILINE,
        ), banner
        assert f"runs remote {backend.url}/run_code" in banner
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_scoring_where_pytest_is_missing_answers_500_not_zero(
    backend: ServerThread, python_without_pytest: str
) -> None:
    """The probe skipped (the core API, not ``mocksandbox serve``): the gold patch, scored where the
    interpreter has no pytest, is a 500 whose ``detail`` names the cause, from both endpoints."""
    settings = load_settings(
        overrides={
            "port": 0,
            "swedev_backend": backend.url,
            "swedev_backend_python": python_without_pytest,
        }
    )
    box = MockSandbox.create(settings)
    adapter = ServerThread(box, "127.0.0.1", 0).start()
    http = requests.Session()
    http.trust_env = False
    try:
        with pytest.raises(BackendError, match="there has no pytest"):
            box.sessions.check_backend(timeout=30)
        sid = http.post(f"{adapter.url}/start_instance", json={"instance_id": PAGEKIT.instance_id}).json()[
            "sid"
        ]
        answer = http.post(
            f"{adapter.url}/process_action", json={"sid": sid, "content": diff_block(PAGEKIT.patch)}
        ).json()
        assert "apply_patch" in answer["content"]
        for path, body in [("/postprocess", {"sid": sid}), ("/compute_reward", {"sid": int(sid)})]:
            reply = http.post(f"{adapter.url}{path}", json=body, timeout=120)
            assert reply.status_code == 500, (path, reply.text)
            assert reply.headers["Content-Type"] == "application/json"
            detail = reply.json()["detail"]
            assert list(reply.json()) == ["detail"]
            assert detail.startswith(
                f"session {sid}: instance {PAGEKIT.instance_id}: cannot score: none of its 3 FAIL_TO_PASS "
                f"and 8 PASS_TO_PASS tests reported a result: {python_without_pytest} has no pytest "
                "(No module named pytest); install pytest for it, or point --python "
                "(--swedev-backend-python with a backend) at an interpreter that has it. "
                "The test output ends: '"
            ), detail
            assert detail.endswith(f"{python_without_pytest}: No module named pytest'"), detail
        listed = http.get(f"{adapter.url}/_mock/sessions/{sid}").json()
        assert listed["state"] == "finished" and listed["result"] is None  # no 0.0 recorded
    finally:
        http.close()
        adapter.stop()
        box.close()
