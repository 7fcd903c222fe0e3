"""The commands as a user runs them: ``mocksandbox record``, ``serve --replay`` (with two worker
processes) and the drift check ``mocksandbox contract --cassette``, as real processes on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from conftest import cli_server, recording

from mocksandbox.recording.cassette import read_cassette
from mocksandbox.serving.single import ServerThread
from mocksandbox.sessions import InstanceRegistry
from mocksandbox.sessions.scripted import function_call

pytestmark = pytest.mark.slow

NO_PROXY = {"http": "", "https": ""}
UUID_PROGRAM = {"code": "import uuid; print(uuid.uuid4())", "language": "python"}


def _post(base: str, path: str, body: object) -> requests.Response:
    # A new connection per request: worker processes share the listening socket, not connections.
    return requests.post(base + path, json=body, timeout=120, proxies=NO_PROXY)


def test_record_command_then_serve_replay_with_two_workers(upstream: ServerThread, tmp_path: Path) -> None:
    cassette = tmp_path / "recorded.jsonl"
    cassette.write_text("an older recording's line, replaced by this run\n")
    with cli_server(
        "record", "--upstream", upstream.url, "--cassette", str(cassette), "--port", "0"
    ) as proxy:
        assert f"  upstream: {upstream.url}\n" in proxy.banner
        recorded = [
            _post(proxy.url, "/run_code", UUID_PROGRAM).json()["run_result"]["stdout"] for _ in range(3)
        ]
        bash = _post(proxy.url, "/run_code", {"code": "echo from bash", "language": "bash"}).content
    assert len(set(recorded)) == 3
    assert len(read_cassette(cassette)) == 4

    with cli_server("serve", "--port", "0", "--workers", "2", "--replay", str(cassette)) as served:
        assert f"  replay: {cassette}, 4 recordings (strict)\n" in served.banner
        # Eight at once over new connections, so that both workers serve: the recordings of one
        # request are each used once, in all, then the last repeats.
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: _post(served.url, "/run_code", UUID_PROGRAM), range(8)))
        assert _post(served.url, "/run_code", {"code": "echo from bash", "language": "bash"}).content == bash
        journal = requests.get(f"{served.url}/_mock/journal", timeout=30, proxies=NO_PROXY).json()["entries"]
    stdouts = Counter(answer.json()["run_result"]["stdout"] for answer in answers)
    assert stdouts == {recorded[0]: 1, recorded[1]: 1, recorded[2]: 6}
    assert Counter(e["replayed"] for e in journal) == {
        "recorded.jsonl:1": 1,
        "recorded.jsonl:2": 1,
        "recorded.jsonl:3": 6,
        "recorded.jsonl:4": 1,
    }
    assert all(e["worker"] in ("worker-1", "worker-2") for e in journal)


def test_serve_refuses_a_cassette_it_cannot_read(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "mocksandbox.cli", "serve", "--port", "0", "--replay", str(missing)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"mocksandbox: cannot read cassette {missing}" in done.stderr


def _drift(cassette: Path, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mocksandbox.cli", "contract", "--cassette", str(cassette), "--url", url],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_PROXY": "127.0.0.1"},
    )


def test_drift_check_passes_unchanged_and_finds_planted_differences(
    upstream: ServerThread, tmp_path: Path
) -> None:
    cassette = tmp_path / "deterministic.jsonl"
    instance = InstanceRegistry.from_paths([]).all()[0]
    with recording(upstream.url, cassette) as proxy:
        _post(proxy, "/run_code", {"code": "print('hello')", "language": "python"})
        _post(proxy, "/run_code", {"code": "echo out; exit 3", "language": "bash"})
        _post(proxy, "/run_code", {"language": "python"})
        # A swedev episode: the deployment gives another sid when asked again; the check follows it.
        sid = _post(proxy, "/start_instance", {"instance_hash": str(instance.instance_hash)}).json()["sid"]
        _post(
            proxy,
            "/process_action",
            {"sid": sid, "content": function_call("execute_bash", command="echo hi")},
        )
        _post(proxy, "/postprocess", {"sid": int(sid)})

    unchanged = _drift(cassette, upstream.url)
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    assert (
        unchanged.stdout.strip().splitlines()[-1] == "6/6 recorded exchanges answered as recorded; 0 changed"
    )

    # Planted: a recorded output edited, and the deployment now failing the bash program.
    lines = cassette.read_text().splitlines()
    first = json.loads(lines[0])
    first["response"]["json"]["run_result"]["stdout"] = "hullo\n"
    cassette.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    upstream.sandbox.add_fault(
        match={"path": "/run_code", "language": "bash"}, action={"type": "status", "status": 503}
    )
    try:
        changed = _drift(cassette, upstream.url)
    finally:
        upstream.sandbox.reset()
    assert changed.returncode == 1, changed.stdout + changed.stderr
    table = changed.stdout.strip().splitlines()
    assert table[-1] == "4/6 recorded exchanges answered as recorded; 2 changed"
    rows = [line.split() for line in table[1:-1]]
    assert [
        "deterministic.jsonl:1",
        "POST",
        "/run_code",
        "(python)",
        "run_result.stdout",
        "'hullo\\n'",
        "'hello\\n'",
    ] in rows
    assert any(
        row[:5] == ["deterministic.jsonl:2", "POST", "/run_code", "(bash)", "http_status"]
        and row[5:7] == ["200", "503"]
        for row in rows
    )
