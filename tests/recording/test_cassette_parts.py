"""The parts under the proxy and the replaying server: the cassette format and its writer across
processes, request matching, and the replay turn counted by the control state across processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from mocksandbox.control.shared import ControlStateServer
from mocksandbox.control.state import ControlState, IncomingRequest, LocalControlState
from mocksandbox.recording.cassette import CassetteWriter, Exchange, RecordedRequest, read_cassette
from mocksandbox.recording.matching import differences, request_view

# -- the format -------------------------------------------------------------------------------------


def _exchange(body: bytes, answer: bytes, run: str | None = "r") -> Exchange:
    request = RecordedRequest("POST", "/run_code", "", body, "application/json")
    return Exchange(request, 200, (("Content-Type", "application/json"),), answer, 0.5, run=run)


@pytest.mark.parametrize(
    ("answer", "stored_as"),
    [
        (b'{"status":"Success","x":"\xc3\xa9"}', "json"),  # as SandboxFusion encodes: readable JSON
        (b'{"status": "Success"}', "text"),  # another encoder's spacing: kept byte for byte
        (b'{"a":1.0000000000000001e0}', "text"),  # a number JSON would not give back as sent
        (b"\xff\xfe not utf-8", "base64"),
        (b"", "text"),
    ],
)
def test_answers_come_back_byte_for_byte(tmp_path: Path, answer: bytes, stored_as: str) -> None:
    path = tmp_path / "c.jsonl"
    CassetteWriter(path, None).append(_exchange(b'{"code":"print(1)","language":"python"}', answer))
    assert stored_as in json.loads(path.read_text())["response"]
    (exchange,) = read_cassette(path)
    assert exchange.body == answer
    assert exchange.source == "c.jsonl:1"


_WRITER = """
import sys
from mocksandbox.recording.cassette import CassetteWriter, Exchange, RecordedRequest
writer = CassetteWriter(sys.argv[1], sys.argv[2])
for n in range(40):
    body = ('{"code":"print(%d)","language":"python","writer":"%s"}' % (n, sys.argv[3])).encode()
    writer.append(Exchange(RecordedRequest("POST", "/run_code", "", body, None), 200, (), b'"x"' * 2000))
"""


def test_writers_of_one_run_append_and_a_new_run_replaces(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl"
    CassetteWriter(path, "an-old-run").append(_exchange(b'{"old":true}', b"{}", run="an-old-run"))
    # Two processes of one run (two xdist workers) write at once: the first write replaces the old
    # run's line, and no line of either is lost or torn.
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), "run-2", name]) for name in ("a", "b")
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    exchanges = read_cassette(path)
    assert len(exchanges) == 80 and {e.run for e in exchanges} == {"run-2"}
    assert Counter(json.loads(e.request.body)["writer"] for e in exchanges) == {"a": 40, "b": 40}


# -- matching -----------------------------------------------------------------------------------------


def _view(path: str, body: object) -> dict[str, object]:
    return request_view(RecordedRequest("POST", path, "", json.dumps(body).encode(), "application/json"))


def test_requests_match_as_the_sandbox_sees_them() -> None:
    plain = _view("/run_code", {"code": "print(1)", "language": "python"})
    assert plain == _view("/run_code", {"language": "python", "code": "print(1)", "run_timeout": 10, "x": 1})
    assert plain == _view("/run_code", {"code": "print(1)", "language": "python", "run_timeout": "10"})
    assert plain != _view("/run_code", {"code": "print(1)", "language": "python", "run_timeout": 5})
    assert plain != _view("/run_code", {"code": "print(1)", "language": "python", "stdin": ""})
    # A swedev sid travels as an int or a string; a temp name differs on every run.
    assert _view("/process_action", {"sid": 12, "content": "x"}) == _view(
        "/process_action", {"sid": "12", "content": "x"}
    )
    assert _view("/run_code", {"code": "open('/tmp/tmpab12cd34/f')", "language": "python"}) == _view(
        "/run_code", {"code": "open('/tmp/tmpzz99yy00/f')", "language": "python"}
    )
    # A body that does not validate is compared as sent (its 422 quotes it).
    assert _view("/run_code", {"language": "python"}) != _view("/run_code", {"language": "python", "x": 1})
    other_type = RecordedRequest("POST", "/run_code", "", b"code=1", "application/x-www-form-urlencoded")
    assert request_view(other_type)["content_type"] == "application/x-www-form-urlencoded"


def test_differences_are_named_field_by_field() -> None:
    sent = _view("/run_code", {"code": "print(2)", "language": "python", "files": {"a": "eA=="}})
    recorded = _view("/run_code", {"code": "print(1)", "language": "python"})
    assert [(d.field, d.sent, d.recorded) for d in differences(sent, recorded)] == [
        ("code", "print(2)", "print(1)"),
        ("files", {"a": "eA=="}, {}),
    ]
    assert differences(sent, recorded)[0].describe() == (
        "code: sent 'print(2)', recorded 'print(1)' (first difference at character 6)"
    )


# -- the replay turn, counted by the control state --------------------------------------------------------


def test_turns_are_exact_under_concurrency_and_restart_after_a_reset(state: ControlState) -> None:
    labels = ["c.jsonl:1", "c.jsonl:4", "c.jsonl:9"]
    turns: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(10):
            admission = state.admit(IncomingRequest("POST", "/run_code", "", b"{}", "c"))
            turn = state.next_replay(admission.entry_id, "key", labels)
            state.finish(admission.entry_id, 200, b"{}")
            with lock:
                turns.append(turn)

    threads = [threading.Thread(target=take) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Counter(turns) == {0: 1, 1: 1, 2: 58}
    assert Counter(e.replayed for e in state.entries()) == {"c.jsonl:1": 1, "c.jsonl:4": 1, "c.jsonl:9": 58}
    assert state.next_replay(None, "another key", labels) == 0
    state.reset([], state.capacity())
    assert state.next_replay(None, "key", labels) == 0


_TAKER = """
import sys
from mocksandbox.control.shared import RemoteControlState
state = RemoteControlState(sys.argv[1])
print(",".join(str(state.next_replay(None, "key", ["a", "b", "c", "d"])) for _ in range(30)))
state.close()
"""


def test_two_processes_share_one_order() -> None:
    """Two worker processes replaying one request: each recording is used once, in order, in all."""
    local = LocalControlState()
    server = ControlStateServer(local)
    try:
        takers = [
            subprocess.Popen([sys.executable, "-c", _TAKER, server.path], stdout=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        outputs = [taker.communicate(timeout=120)[0] for taker in takers]
    finally:
        server.close()
    turns = [int(t) for out in outputs for t in out.strip().split(",")]
    assert Counter(turns) == {0: 1, 1: 1, 2: 1, 3: 57}
