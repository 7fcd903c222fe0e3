"""Record through the real proxy against a live server on loopback, then replay with it stopped.

The upstream is the mock itself (a SandboxFusion stand-in on a free loopback port); the proxy is
the one ``mocksandbox record`` serves; the replaying server is a real mock server. Nothing asserts
on wall-clock durations: replay timing is checked through the server's injectable ``sleep``.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import recording, replaying

from mocksandbox.extras import jupyter_missing
from mocksandbox.recording.cassette import CassetteWriter, Exchange, RecordedRequest, read_cassette
from mocksandbox.recording.replay import CassetteMiss, has_toolchain
from mocksandbox.serving.single import ServerThread, running_server
from mocksandbox.sessions import InstanceRegistry
from mocksandbox.sessions.scripted import diff_block, function_call
from mocksandbox.settings import load_settings

CPP = '#include <cstdio>\nint main() { std::puts("from c++"); return 0; }\n'
LACKED = next(
    (
        lang
        for lang in ("scala", "kotlin_script", "swift", "julia", "lean", "racket", "verilog")
        if not has_toolchain(lang)
    ),
    None,
)


@dataclass(frozen=True)
class Seen:
    """What a client got: the parts recording must not change and replay must reproduce."""

    status: int
    content_type: str | None
    body: bytes

    @classmethod
    def of(cls, reply: requests.Response) -> Seen:
        return cls(reply.status_code, reply.headers.get("Content-Type"), reply.content)


def _run_code_requests() -> list[dict[str, Any]]:
    requests_ = [
        {"code": "print('hello')", "language": "python"},
        {"code": "echo out; echo err >&2; exit 3", "language": "bash"},
        {
            "code": "import sys\nprint(sys.stdin.read()[::-1])\nopen('out.txt', 'w').write(open('in.txt').read())",
            "language": "python",
            "stdin": "abc",
            "files": {"in.txt": base64.b64encode(b"file body").decode()},
            "fetch_files": ["out.txt"],
        },
        {"language": "python"},  # a 422: recorded and replayed like any answer
    ]
    if shutil.which("g++"):
        requests_.append({"code": CPP, "language": "cpp"})
    return requests_


def _session_episode(base: str, http: requests.Session) -> list[Seen]:
    """A whole swedev episode, as verl drives it: start, actions (sid as a string, then as an int),
    reward, postprocess. The sid used is the one the server answered."""
    instance = InstanceRegistry.from_paths([]).all()[0]
    seen = []
    start = http.post(
        f"{base}/start_instance", json={"instance_hash": str(instance.instance_hash)}, timeout=120
    )
    seen.append(Seen.of(start))
    sid = start.json()["sid"]
    for sid_value, content in (
        (sid, function_call("execute_bash", command="ls")),
        (int(sid), diff_block(instance.patch)),
    ):
        seen.append(
            Seen.of(
                http.post(f"{base}/process_action", json={"sid": sid_value, "content": content}, timeout=300)
            )
        )
    seen.append(Seen.of(http.post(f"{base}/compute_reward", json={"sid": int(sid)}, timeout=600)))
    seen.append(Seen.of(http.post(f"{base}/postprocess", json={"sid": sid}, timeout=120)))
    return seen


def _everything(base: str, http: requests.Session) -> list[Seen]:
    """Every kind of request the issue names, in one fixed order."""
    seen = [Seen.of(http.get(f"{base}/v1/ping", timeout=30))]
    seen += [Seen.of(http.post(f"{base}/run_code", json=body, timeout=120)) for body in _run_code_requests()]
    seen.append(
        Seen.of(
            http.post(f"{base}/run_jupyter", json={"cells": ["x = 2", "x * 21", "print('hi')"]}, timeout=120)
        )
    )
    completion = (
        "```python\ndef count_vowels(text):\n    return sum(ch in 'aeiou' for ch in text.lower())\n```"
    )
    seen.append(
        Seen.of(
            http.post(
                f"{base}/submit",
                json={"dataset": "mbpp", "id": 11, "config": {}, "completion": completion},
                timeout=120,
            )
        )
    )
    seen.append(Seen.of(http.get(f"{base}/no/such/path", timeout=30)))
    seen += _session_episode(base, http)
    return seen


def test_record_every_endpoint_then_replay_with_the_upstream_stopped(
    tmp_path: Path, http: requests.Session
) -> None:
    if jupyter_missing(load_settings(overrides={"port": 0}).python):
        pytest.skip("needs the jupyter extra in the server's interpreter (for /run_jupyter)")
    cassette = tmp_path / "deployment.jsonl"
    with running_server(load_settings(overrides={"port": 0, "pod_name": None})) as live:
        with recording(live.url, cassette) as proxy:
            through_proxy = _everything(proxy, http)
        # Recording never changes what the client gets: where the upstream answers the same bytes
        # every time, asking it directly gives what the proxy gave.
        assert Seen.of(http.get(f"{live.url}/v1/ping", timeout=30)) == through_proxy[0]
        not_found = 1 + len(_run_code_requests()) + 2  # after ping, /run_code, /run_jupyter, /submit
        assert Seen.of(http.get(f"{live.url}/no/such/path", timeout=30)) == through_proxy[not_found]
        unmatched = http.post(f"{live.url}/run_code", json={"language": "python"}, timeout=30)
        assert Seen.of(unmatched) in through_proxy
    with pytest.raises(requests.ConnectionError):
        http.get(f"{live.url}/v1/ping", timeout=5)

    statuses = [seen.status for seen in through_proxy]
    assert statuses.count(422) == 1 and statuses.count(404) == 1 and statuses.count(200) == len(statuses) - 2
    episode = through_proxy[-5:]
    assert json.loads(episode[3].body)["reward"] == 1.0  # the gold patch solved it
    exchanges = read_cassette(cassette)
    assert len(exchanges) == len(through_proxy)
    # Each line holds exactly what the client got (for a body whose bytes the JSON does not give
    # back, as text), and the upstream's identity.
    assert [Seen(e.status, dict(e.headers).get("Content-Type"), e.body) for e in exchanges] == through_proxy
    assert {e.upstream["url"] for e in exchanges} == {live.url}
    assert all(e.duration > 0 for e in exchanges)

    with replaying(cassette, "strict") as replay:
        replayed = _everything(replay.url, http)
        entries = replay.sandbox.requests()
    assert replayed == through_proxy
    assert [e.replayed for e in entries] == [f"deployment.jsonl:{n}" for n in range(1, len(exchanges) + 1)]


def test_recordings_of_one_request_replay_in_order_then_the_last_repeats(
    upstream: ServerThread, tmp_path: Path, http: requests.Session
) -> None:
    cassette = tmp_path / "random.jsonl"
    body = {"code": "import uuid; print(uuid.uuid4())", "language": "python"}
    with recording(upstream.url, cassette) as proxy:
        recorded = [http.post(f"{proxy}/run_code", json=body, timeout=60).content for _ in range(3)]
    assert len(set(recorded)) == 3

    with replaying(cassette) as replay:
        answers = [http.post(f"{replay.url}/run_code", json=body, timeout=60).content for _ in range(4)]
        assert answers == [*recorded, recorded[-1]]
        # A reset starts the order again; a request spelled differently (a default made explicit,
        # an unknown field, keys in another order) is the same request to the sandbox.
        replay.sandbox.reset()
        same = {"run_timeout": 10, "language": "python", "code": body["code"], "unknown_field": 1}
        assert http.post(f"{replay.url}/run_code", json=same, timeout=60).content == recorded[0]


def test_strict_names_the_nearest_recording_and_what_differs(
    upstream: ServerThread, tmp_path: Path, http: requests.Session
) -> None:
    cassette = tmp_path / "strict.jsonl"
    with recording(upstream.url, cassette) as proxy:
        http.post(f"{proxy}/run_code", json={"code": "print('a')", "language": "python"}, timeout=60)
        http.post(
            f"{proxy}/run_code", json={"code": "print(1 + 1)", "language": "python", "stdin": "x"}, timeout=60
        )
        http.post(f"{proxy}/run_code", json={"code": "echo 1", "language": "bash"}, timeout=60)

    with replaying(cassette, "strict") as replay:
        miss = http.post(
            f"{replay.url}/run_code",
            json={"code": "print(1 + 2)", "language": "python", "stdin": "x"},
            timeout=60,
        )
        errors = replay.sandbox.take_errors()
        other_path = http.post(f"{replay.url}/run_jupyter", json={"cells": ["1"]}, timeout=60)
    assert miss.status_code == 404
    detail = miss.json()["detail"]
    assert detail.startswith("mocksandbox replay (strict): no recording in ")
    assert "matches POST /run_code (python) (3 recordings)." in detail
    assert "Nearest: strict.jsonl:2 POST /run_code (python), which differs in:" in detail
    assert "  code: sent 'print(1 + 2)', recorded 'print(1 + 1)' (first difference at character 10)" in detail
    assert "stdin" not in detail  # the same in both
    # The same message reaches the test that sent the request (the pytest fixture re-raises it).
    assert [type(e.exception) for e in errors] == [CassetteMiss]
    assert str(errors[0].exception) == detail
    assert other_path.status_code == 404
    assert "path: sent '/run_jupyter', recorded '/run_code'" in other_path.json()["detail"]


def test_fallback_runs_unmatched_requests_here(
    upstream: ServerThread, tmp_path: Path, http: requests.Session
) -> None:
    cassette = tmp_path / "fallback.jsonl"
    recorded_body = {"code": "print('recorded')", "language": "python"}
    with recording(upstream.url, cassette) as proxy:
        recorded = http.post(f"{proxy}/run_code", json=recorded_body, timeout=60).content

    with replaying(cassette, "fallback") as replay:
        again = http.post(f"{replay.url}/run_code", json=recorded_body, timeout=60)
        local = http.post(
            f"{replay.url}/run_code", json={"code": "print(6 * 7)", "language": "python"}, timeout=60
        )
        entries = replay.sandbox.requests(path="/run_code")
    assert again.content == recorded
    assert local.status_code == 200 and local.json()["run_result"]["stdout"] == "42\n"
    assert [e.replayed for e in entries] == ["fallback.jsonl:1", None]


def _deployment_answer(stdout: str) -> bytes:
    """A /run_code answer as a deployment that has the toolchain gives it."""
    result = {"status": "Finished", "execution_time": 0.8, "return_code": 0, "stdout": stdout, "stderr": ""}
    answer = {
        "status": "Success",
        "message": "",
        "compile_result": None,
        "run_result": result,
        "executor_pod_name": None,
        "files": {},
    }
    return json.dumps(answer, separators=(",", ":")).encode()


@pytest.mark.skipif(LACKED is None, reason="this host has every toolchain the test could use as missing")
def test_prefer_local_runs_what_this_host_has_and_replays_the_rest(
    upstream: ServerThread, tmp_path: Path, http: requests.Session
) -> None:
    assert LACKED is not None
    cassette = tmp_path / "hybrid.jsonl"
    python_body = {"code": "import uuid; print(uuid.uuid4())", "language": "python"}
    with recording(upstream.url, cassette) as proxy:
        recorded_python = http.post(f"{proxy}/run_code", json=python_body, timeout=60).json()
    # The other language's line, as recorded from a deployment that has its toolchain (this host
    # cannot record it: that is the point).
    lacked_body = {"code": "say hello", "language": LACKED}
    CassetteWriter(cassette, None).append(
        Exchange(
            RecordedRequest("POST", "/run_code", "", json.dumps(lacked_body).encode(), "application/json"),
            200,
            (("Content-Type", "application/json"),),
            _deployment_answer(f"hello from {LACKED}\n"),
            duration=0.8,
        )
    )

    with replaying(cassette, "prefer-local") as replay:
        python = http.post(f"{replay.url}/run_code", json=python_body, timeout=60).json()
        lacked = http.post(f"{replay.url}/run_code", json=lacked_body, timeout=60)
        unrecorded = http.post(
            f"{replay.url}/run_code", json={"code": "other", "language": LACKED}, timeout=60
        )
        ping = http.get(f"{replay.url}/v1/ping", timeout=30)  # no language, not recorded: runs here
        entries = replay.sandbox.requests()
        replay.sandbox.take_errors()
    # Python ran here (another random id than the recording's), the lacked language was replayed.
    assert python["status"] == "Success"
    assert python["run_result"]["stdout"] != recorded_python["run_result"]["stdout"]
    assert lacked.content == _deployment_answer(f"hello from {LACKED}\n")
    assert unrecorded.status_code == 404
    assert f"and this host has no toolchain for {LACKED}" in unrecorded.json()["detail"]
    assert "  code: sent 'other', recorded 'say hello'" in unrecorded.json()["detail"]
    assert ping.json() == "pong"
    assert [e.replayed for e in entries] == [None, "hybrid.jsonl:2", None, None]
    # Beside the answer: it is a recording, not a run (a divergence note; the body is untouched).
    assert [len(e.divergences) for e in entries] == [0, 1, 0, 0]
    assert entries[1].divergences[0].startswith(f"toolchain: {LACKED} has no toolchain here: answered from")


def test_faults_cap_journal_and_timing_apply_to_replayed_requests(
    upstream: ServerThread, tmp_path: Path, http: requests.Session
) -> None:
    cassette = tmp_path / "timed.jsonl"
    body = {"code": "print('slow')", "language": "python"}
    with recording(upstream.url, cassette) as proxy:
        recorded = http.post(f"{proxy}/run_code", json=body, timeout=60).content
    # Say the deployment took 30 s (the injected sleep below never waits).
    line = json.loads(cassette.read_text())
    line["duration"] = 30.0
    cassette.write_text(json.dumps(line) + "\n")

    with replaying(cassette, "strict", replay_timing=True) as replay:
        box = replay.sandbox
        slept: list[float] = []
        release = threading.Event()

        def held_sleep(seconds: float) -> None:
            slept.append(seconds)
            release.wait(30)

        box.sleep = held_sleep
        box.add_fault(
            match={"path": "/run_code"}, action={"type": "status", "status": 503}, schedule={"first": 1}
        )
        faulted = http.post(f"{replay.url}/run_code", json=body, timeout=60)
        box.set_capacity(max_in_flight=1)
        held: list[requests.Response] = []
        first = threading.Thread(target=lambda: held.append(http_post(replay.url, body)))
        first.start()
        assert _wait(lambda: len(slept) == 1)
        over_cap = http_post(replay.url, body)
        release.set()
        first.join(30)
        entries = box.requests(path="/run_code")
    assert faulted.status_code == 503
    assert over_cap.status_code == 429
    assert held[0].content == recorded
    # Held for the recorded 30 s less the time the layer itself took.
    assert len(slept) == 1 and 29.0 < slept[0] <= 30.0
    assert [(e.status, e.replayed, e.outcome) for e in entries] == [
        (503, None, "answered"),  # the fault answered before the cassette was asked
        (200, "timed.jsonl:1", "answered"),
        (429, None, "rejected"),
    ]


def http_post(base: str, body: dict[str, Any]) -> requests.Response:
    with requests.Session() as session:
        session.trust_env = False
        return session.post(f"{base}/run_code", json=body, timeout=60)


def _wait(condition: Any, timeout: float = 30.0) -> bool:
    """Poll ``condition`` until it holds (or ``timeout`` passes): for state another thread sets."""
    pause = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return True
        pause.wait(0.01)
    return bool(condition())


def test_redacted_fields_are_never_stored_and_still_match(
    upstream: ServerThread, tmp_path: Path, http: requests.Session
) -> None:
    cassette = tmp_path / "redacted.jsonl"
    body = {"code": "print('x')", "language": "python", "api_key": "s3cret-token"}
    with recording(upstream.url, cassette, redact=("api_key",)) as proxy:
        recorded = http.post(f"{proxy}/run_code", json=body, timeout=60)
    assert "s3cret-token" not in cassette.read_text()
    (exchange,) = read_cassette(cassette)
    assert json.loads(exchange.request.body)["api_key"] == "[REDACTED]"
    assert exchange.redacted == ("api_key",)
    with replaying(cassette) as replay:
        again = http.post(f"{replay.url}/run_code", json={**body, "api_key": "another-token"}, timeout=60)
    assert again.status_code == 200 and again.content == recorded.content


def test_an_upstream_that_drops_the_connection_drops_the_clients_and_nothing_is_recorded(
    upstream: ServerThread, tmp_path: Path, http: requests.Session
) -> None:
    cassette = tmp_path / "dropped.jsonl"
    upstream.sandbox.add_fault(match={"path": "/run_code"}, action={"type": "reset"}, schedule={"first": 1})
    try:
        with recording(upstream.url, cassette) as proxy:
            with pytest.raises(requests.ConnectionError):
                http.post(f"{proxy}/run_code", json={"code": "print(1)", "language": "python"}, timeout=60)
            after = http.post(
                f"{proxy}/run_code", json={"code": "print(1)", "language": "python"}, timeout=60
            )
    finally:
        upstream.sandbox.reset()
    assert after.status_code == 200
    assert [e.status for e in read_cassette(cassette)] == [200]


def _raw_exchange(url: str, request: bytes) -> bytes:
    """``request`` sent as it is on a new connection; everything the server sends back until it
    closes the connection (or 10 s pass: a hang fails the test, it does not stall the suite)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


@pytest.mark.parametrize("through", ["recorder", "mock"])
def test_every_client_is_answered_connection_close_http_1_0_and_chunked_bodies(
    upstream: ServerThread, tmp_path: Path, through: str
) -> None:
    """urllib (``Connection: close``), http.client, a raw HTTP/1.0 request and a chunked body:
    each gets its answer at once, through ``mocksandbox record`` and from the mock itself."""
    import http.client
    import urllib.request
    from urllib.parse import urlsplit

    cassette = tmp_path / "clients.jsonl"
    with recording(upstream.url, cassette) if through == "recorder" else _nothing(upstream.url) as url:
        assert urllib.request.urlopen(f"{url}/v1/ping", timeout=10).read() == b'"pong"'
        parts = urlsplit(url)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
        connection.request("GET", "/v1/ping", headers={"Connection": "close"})
        assert connection.getresponse().read() == b'"pong"'
        connection.close()
        old = _raw_exchange(url, b"GET /v1/ping HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        assert old.startswith(b"HTTP/1.") and old.endswith(b'"pong"'), old
        body = json.dumps({"code": "print(6 * 7)", "language": "python"}).encode()
        chunked = (
            b"POST /run_code HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            + f"{len(body[:10]):x}\r\n".encode() + body[:10] + b"\r\n"
            + f"{len(body[10:]):x}\r\n".encode() + body[10:] + b"\r\n0\r\n\r\n"
        )  # fmt: skip
        answer = _raw_exchange(url, chunked)
        assert answer.startswith(b"HTTP/1.1 200") and b'"stdout":"42\\n"' in answer, answer
    if through == "recorder":
        assert [e.request.path for e in read_cassette(cassette)] == ["/v1/ping"] * 3 + ["/run_code"]


@contextmanager
def _nothing(url: str) -> Iterator[str]:
    yield url
