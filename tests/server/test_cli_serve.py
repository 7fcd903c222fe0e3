"""`mocksandbox serve` as a user runs it: a real process, a real port, Ctrl-C to stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[callable]:
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mocksandbox.cli", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.search(r"serving on (http://\S+)", first)
        assert match, f"no URL in {first!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
        return proc, match.group(1)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_with_a_cap_then_stop_on_ctrl_c(serve) -> None:
    proc, url = serve("--max-in-flight", "3")
    slow = {"code": "import time\ntime.sleep(1)\nprint('done')", "language": "python"}
    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda _: requests.post(url + "/run_code", json=slow, timeout=60), range(12)))
    statuses = [r.status_code for r in replies]
    assert 429 in statuses and 200 in statuses
    assert all(r.headers.get("Retry-After") for r in replies if r.status_code == 429)
    stats = requests.get(url + "/_mock/stats").json()
    assert stats["max_in_flight"] <= 3
    requests.post(url + "/_mock/reset").raise_for_status()
    assert requests.get(url + "/_mock/stats").json()["max_in_flight"] == 0

    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "stopping" in out


def test_serve_with_a_fault_file(serve, tmp_path: Path) -> None:
    faults = tmp_path / "faults.yaml"
    faults.write_text("faults:\n  - action: {type: status, status: 503}\n    schedule: {first: 1}\n")
    proc, url = serve("--faults", str(faults))
    body = {"code": "print(1)", "language": "python"}
    assert requests.post(url + "/run_code", json=body).status_code == 503
    assert requests.post(url + "/run_code", json=body).status_code == 200
    proc.terminate()
    assert proc.wait(timeout=30) == 0


def test_bad_fault_file_is_a_clear_error(tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text('[{"action": {"type": "explode"}}]')
    done = subprocess.run(
        [sys.executable, "-m", "mocksandbox.cli", "serve", "--port", "0", "--faults", str(faults)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "faults.json" in done.stderr and "explode" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["serve", "doctor"])
@pytest.mark.parametrize("python", ["old", "missing"])
def test_a_python_the_runs_cannot_start_on_is_a_clear_error(
    tmp_path: Path, python: str, command: str
) -> None:
    """The setting ``python`` (``serve --python``) naming an interpreter too old for the launcher
    (one that says it is 3.6.15, as pyenv's does) or none at all: ``serve`` does not start and
    ``doctor`` proves nothing; each says why, and shows no traceback. ``serve`` used to start and
    answer every run -9, or to fail with a traceback; ``doctor`` showed one."""
    path = tmp_path / "python3.6"
    if python == "old":
        path.write_text("#!/bin/sh\necho 3 6 15\n")
        path.chmod(0o755)
    argv = ["serve", "--port", "0", "--python", str(path)] if command == "serve" else ["doctor"]
    done = subprocess.run(
        [sys.executable, "-m", "mocksandbox.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MOCKSANDBOX_PYTHON": str(path)},
    )
    assert done.returncode == 2, done
    assert done.stderr.startswith("mocksandbox: "), done.stderr
    if python == "old":
        assert f"{path} is Python 3.6.15: runs need CPython 3.7 or later" in done.stderr
    else:
        assert f"cannot start the launcher with {path}" in done.stderr
    assert "Traceback" not in done.stderr


def test_non_loopback_bind_warns_loudly() -> None:
    # 192.0.2.1 (TEST-NET-1) is on no interface here: the warning comes first, then a clean
    # "cannot listen" error; nothing ever listens beyond loopback.
    done = subprocess.run(
        [sys.executable, "-m", "mocksandbox.cli", "serve", "--host", "192.0.2.1", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "WARNING: binding 192.0.2.1" in done.stderr
    assert done.returncode == 2
    assert "cannot listen on 192.0.2.1" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_settings_are_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("max_output_bytes = 'lots'\n")
    done = subprocess.run(
        [sys.executable, "-m", "mocksandbox.cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "max_output_bytes" in done.stderr
    assert "Traceback" not in done.stderr


def _post_as(url: str, host: str, origin: str | None = None) -> requests.Response:
    headers = {"Host": host, **({"Origin": origin} if origin else {})}
    return requests.post(url + "/run_code", json={"code": "print(1)", "language": "python"}, headers=headers)


def test_serve_answers_allowed_hosts_only(serve) -> None:
    proc, url = serve("--allow-host", "sandbox.test", "--allow-host", "*.nodes.test")
    port = url.rsplit(":", 1)[1]
    assert _post_as(url, f"sandbox.test:{port}").status_code == 200
    assert _post_as(url, f"n1.nodes.test:{port}").status_code == 200
    refused = _post_as(url, f"evil.example:{port}")
    assert refused.status_code == 403
    assert "--allow-host evil.example" in refused.json()["detail"]
    assert _post_as(url, f"127.0.0.1:{port}", origin="http://evil.example").status_code == 403
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert "refused a request. Host 'evil.example:" in err  # the operator sees why


def test_serve_allow_any_host_warns(serve) -> None:
    proc, url = serve("--allow-any-host")
    port = url.rsplit(":", 1)[1]
    assert _post_as(url, f"evil.example:{port}", origin="http://evil.example").status_code == 200
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert "WARNING: --allow-any-host" in err
