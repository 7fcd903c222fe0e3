"""Output mode ``sandboxfusion`` against SandboxFusion's own answers, and the divergence notes of
the default mode.

``fixtures/cassettes/sandboxfusion-output-469de08.jsonl.gz`` holds SandboxFusion 469de08's answers
(through ``mocksandbox record``, uvicorn on uvloop as its image runs it, without
``PYTHONUNBUFFERED``) to programs writing 100 KB to 1 MB to stdout or stderr in one write or in
``print`` lines, each sent three times (``fixtures/cassettes/send_output_cases.py``). With
``output_mode: sandboxfusion`` the mock must give the same status and return code, and a stream of
the same length where SandboxFusion gave it whole, or a cut one within its spread (a few percent;
the reader's last read can add up to one 256 KiB chunk, as SandboxFusion's can). With the default
mode, it gives the whole output, and a divergence note exactly where SandboxFusion cut.

What the host would move is pinned, and tested on other hosts' settings: the send buffer of the
program's end of its sockets is SandboxFusion's (the default of ``net.core.wmem_default``, a global
setting this test must not change: sockets made as on hosts with other defaults stand in for it).
What stays the program's own: the size of its writes, which is its Python's. ``print`` lines reach
the socket in 8190-byte writes on SandboxFusion's Python 3.10 (and 3.11.7, 3.12.1), in 8199- and
8200-byte ones on CPython 3.13 (TextIOWrapper since the gh-119506 fix), so SandboxFusion's reader
stops past 128 KiB at 139230 on the one and at 131199 on the other: the mock, whose programs run on
the host's Python, is held to the first write past 128 KiB of that Python.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from mocksandbox import divergence
from mocksandbox.core import MockSandbox
from mocksandbox.divergence import SANDBOXFUSION_READER_PAUSE_BYTES
from mocksandbox.execution.process import _SANDBOXFUSION_READ_CHUNK as SANDBOXFUSION_READ_CHUNK
from mocksandbox.execution.process import SANDBOXFUSION_SEND_BUFFER
from mocksandbox.models import RunCodeRequest
from mocksandbox.recording.cassette import read_cassette
from mocksandbox.settings import load_settings

CASSETTE = Path(__file__).parents[2] / "fixtures" / "cassettes" / "sandboxfusion-output-469de08.jsonl.gz"


def _recorded_cases() -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each request of the cassette, with the run results SandboxFusion answered it with."""
    cases: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for exchange in read_cassette(CASSETTE):
        body = json.loads(exchange.request.body)
        answer = json.loads(exchange.body)["run_result"]
        cases.setdefault(body["code"], (body, []))[1].append(answer)
    return list(cases.values())


CASES = _recorded_cases()


def _case_id(case: tuple[dict[str, Any], list[dict[str, Any]]]) -> str:
    code = case[0]["code"]
    stream = "stderr" if "stderr" in code else "stdout"
    many = "range(" in code
    size = code.split("range(" if many else "* ")[1].split(")")[0]
    return f"{stream}-{'lines' if many else 'write'}-{size}"


@pytest.fixture(scope="module", params=["fork", "spawn"])
def sandboxes(request: pytest.FixtureRequest) -> Iterator[dict[str, MockSandbox]]:
    made = {
        mode: MockSandbox.create(
            load_settings(overrides={"port": 0, "output_mode": mode, "exec_mode": request.param})
        )
        for mode in ("sandboxfusion", "complete")
    }
    yield made
    for box in made.values():
        box.close()


def test_the_cassette_holds_every_kind_of_answer() -> None:
    statuses = {
        (answer["status"], len(answer["stdout"]) + len(answer["stderr"])) for _, a in CASES for answer in a
    }
    assert ("Finished", 100000) in statuses and ("Finished", 219264) in statuses
    assert {status for status, _ in statuses} == {"Finished", "TimeLimitExceeded"}
    assert len(CASES) == 14 and all(len(answers) == 3 for _, answers in CASES)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_sandboxfusion_mode_answers_as_sandboxfusion(
    case: tuple[dict[str, Any], list[dict[str, Any]]], sandboxes: dict[str, MockSandbox]
) -> None:
    _answers_as_recorded(sandboxes["sandboxfusion"], case)


#: Default socket buffers of other hosts (``net.core.wmem_default`` and ``rmem_default``; Linux's
#: default is 212992): with either, the sockets' own defaults moved where the mode cut and stalled.
OTHER_HOSTS_BUFFERS = {"small": 32 * 1024, "large": 1024 * 1024}
#: The recorded cases that tell: one write cut and Finished, one stalled, print lines cut and
#: Finished, stalled, and stalled line by line.
TELLING_CASES = (
    "stdout-write-300000",
    "stdout-write-1000000",
    "stdout-lines-30000",
    "stdout-lines-200000",
    "stderr-lines-14000",
)
_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33  # Linux's; not in Python's socket module


def _set_buffer(sock: socket.socket, option: int, force: int, size: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, size // 2)  # the kernel doubles it
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, option, size // 2)  # up to net.core.*mem_max


@pytest.fixture(params=list(OTHER_HOSTS_BUFFERS), ids=lambda name: f"host-buffers-{name}")
def other_host_buffers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Sockets made during the test start with another host's default buffers.

    ``net.core.wmem_default`` is global on older kernels and read-only in a network namespace of
    one's own on newer ones, so a test cannot change it for its own run only; what it sets is the
    buffers a new socket starts with, so new sockets that start with other buffers are that host."""
    size = OTHER_HOSTS_BUFFERS[request.param]
    made = socket.socketpair

    def socketpair(*args: Any, **kwargs: Any) -> tuple[socket.socket, socket.socket]:
        pair = made(*args, **kwargs)
        for sock in pair:
            _set_buffer(sock, socket.SO_SNDBUF, _SO_SNDBUFFORCE, size)
            _set_buffer(sock, socket.SO_RCVBUF, _SO_RCVBUFFORCE, size)
        return pair

    monkeypatch.setattr(socket, "socketpair", socketpair)
    probe, other = socket.socketpair()
    with probe, other:
        assert probe.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) != SANDBOXFUSION_SEND_BUFFER
    return size


@pytest.fixture(scope="module")
def forking_sandbox() -> Iterator[MockSandbox]:
    box = MockSandbox.create(
        load_settings(overrides={"port": 0, "output_mode": "sandboxfusion", "exec_mode": "fork"})
    )
    yield box
    box.close()


def test_the_programs_sockets_have_sandboxfusions_send_buffer_whatever_the_hosts(
    forking_sandbox: MockSandbox, other_host_buffers: int
) -> None:
    _needs_a_settable_send_buffer()
    code = (
        "import socket\n"
        "sizes = []\n"
        "for fd in (1, 2):\n"
        "    sock = socket.socket(fileno=fd)\n"
        "    sizes.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))\n"
        "    sock.detach()\n"
        "print(*sizes)\n"
    )
    body = {"code": code, "language": "python", "run_timeout": 5}
    result = forking_sandbox.engine.run_code(RunCodeRequest.model_validate(body)).run_result
    assert result is not None and result.status.value == "Finished", result
    assert result.stdout.split() == [str(SANDBOXFUSION_SEND_BUFFER)] * 2


@pytest.mark.parametrize("case", [c for c in CASES if _case_id(c) in TELLING_CASES], ids=_case_id)
def test_sandboxfusion_mode_answers_as_recorded_whatever_the_hosts_socket_buffers(
    case: tuple[dict[str, Any], list[dict[str, Any]]], forking_sandbox: MockSandbox, other_host_buffers: int
) -> None:
    _needs_a_settable_send_buffer()
    _answers_as_recorded(forking_sandbox, case)


def _needs_a_settable_send_buffer() -> None:
    """SANDBOXFUSION_SEND_BUFFER can be had: as root, or within ``net.core.wmem_max``."""
    wmem_max = int(Path("/proc/sys/net/core/wmem_max").read_text())
    if os.geteuid() != 0 and wmem_max * 2 < SANDBOXFUSION_SEND_BUFFER:
        pytest.skip(
            f"net.core.wmem_max is {wmem_max}: a send buffer of {SANDBOXFUSION_SEND_BUFFER} needs root"
        )


def _answers_as_recorded(box: MockSandbox, case: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    """The case's answer in output mode ``sandboxfusion`` is one SandboxFusion gives.

    Where SandboxFusion cut a stream, its reader's last read took what had piled up, and so does
    the mock's; the kernel queues one large write in pieces (about 36 KiB on Linux 6.x), and a
    reader that wakes while a write's pieces are still coming in takes fewer of them. Every
    answer must be a cut past 128 KiB, never the whole stream; the cut must reach SandboxFusion's
    own (within a few percent) in one of three answers at most: on a loaded machine one answer
    now and then is cut a piece early (182720 where SandboxFusion gave 219264), as SandboxFusion's
    would be if its reader woke that early."""
    misses = []
    for _ in range(3):
        miss = _one_answer_as_recorded(box, case)
        if miss is None:
            return
        misses.append(miss)
    raise AssertionError(f"three answers cut earlier than SandboxFusion's: {misses}")


def _one_answer_as_recorded(
    box: MockSandbox, case: tuple[dict[str, Any], list[dict[str, Any]]]
) -> str | None:
    """Check one answer (see :func:`_answers_as_recorded`); ``None``, or how its cut came earlier
    than SandboxFusion's."""
    body, recorded = case
    with divergence.collecting() as notes:
        result = box.engine.run_code(RunCodeRequest.model_validate(body)).run_result
    assert result is not None
    assert notes == []  # it answers as SandboxFusion does: nothing to say
    said = (
        f"return code {result.return_code}, {len(result.stdout)} bytes of stdout, stderr"
        f" {result.stderr[-2000:]!r}, {result.execution_time} s"
    )
    assert result.status.value == recorded[0]["status"] and {a["status"] for a in recorded} == {
        recorded[0]["status"]
    }, said
    assert result.return_code == recorded[0]["return_code"]
    early = None
    for stream in ("stdout", "stderr"):
        lengths = [len(answer[stream]) for answer in recorded]
        got = len(getattr(result, stream))
        written = _written(body["code"], stream)
        if all(length == written for length in lengths):
            assert got == written, (stream, got, lengths)
        else:
            # SandboxFusion's own answers vary here (its reader's last read before the pause takes
            # what has piled up: up to 256 KiB past 128 KiB, as its recordings show), and so do the
            # mock's: the answer must be one its reader can give, never the whole stream. Its
            # least is the first of the program's writes to end past 128 KiB: the program's
            # Python decides where that is (see the module's docstring).
            least = min(
                min(lengths) * 0.95, _first_write_past_the_pause(box.settings.python, body["code"], stream)
            )
            most = SANDBOXFUSION_READER_PAUSE_BYTES + SANDBOXFUSION_READ_CHUNK
            assert SANDBOXFUSION_READER_PAUSE_BYTES < got <= max(max(lengths) * 1.05, most), (
                stream,
                got,
                lengths,
            )
            assert got < written or written <= most, (stream, got, written)
            if got < least:
                early = f"{stream}: {got} bytes, SandboxFusion's {lengths}"
    return early


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_complete_mode_keeps_everything_and_says_where_sandboxfusion_cut(
    case: tuple[dict[str, Any], list[dict[str, Any]]], sandboxes: dict[str, MockSandbox]
) -> None:
    body, recorded = case
    # The recorded run_timeout (1 s) is SandboxFusion's cut-off; here the point is that nothing is
    # cut, and 200000 line-buffered writes can take longer than 1 s on a loaded 2-core CI machine.
    body = {**body, "run_timeout": 30}
    with divergence.collecting() as notes:
        result = sandboxes["complete"].engine.run_code(RunCodeRequest.model_validate(body)).run_result
    assert result is not None and result.status.value == "Finished" and result.return_code == 0, result.status
    cut_there = False
    for stream in ("stdout", "stderr"):
        written = _written(body["code"], stream)
        assert len(getattr(result, stream)) == written
        cut_there |= any(len(answer[stream]) != written for answer in recorded)
    timed_out_there = recorded[0]["status"] != "Finished"
    assert bool(notes) == (cut_there or timed_out_there), notes
    assert all(note.startswith("output: ") for note in notes)


#: Runs a case's program with ``stream`` on a raw stream that notes the size of each write it is
#: given, set up as CPython's start-up sets up that stream (stdout block-buffered, stderr
#: line-buffered); prints the sizes.
_WRITE_SIZES = """
import io, sys
name, code = sys.argv[1], sys.argv[2]
sizes = []
class Raw(io.RawIOBase):
    def writable(self):
        return True
    def write(self, data):
        sizes.append(len(data))
        return len(data)
stream = io.TextIOWrapper(io.BufferedWriter(Raw()), encoding="utf-8", newline="\\n", line_buffering=name == "stderr")
setattr(sys, name, stream)
exec(code)
stream.flush()
print(*sizes, file=sys.__stdout__)
"""


@cache
def _first_write_past_the_pause(python: str, code: str, stream: str) -> int:
    """Where SandboxFusion's reader stops at the earliest when ``python`` runs ``code``: the end of
    the first write to ``stream`` that takes it past 128 KiB (the kernel keeps a write of a
    ``print`` loop's size whole in the socket, and a read takes whole writes)."""
    sizes = subprocess.run(
        [python, "-c", _WRITE_SIZES, stream, code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    total = 0
    for size in map(int, sizes):
        total += size
        if total > SANDBOXFUSION_READER_PAUSE_BYTES:
            return total
    return total


def _written(code: str, stream: str) -> int:
    """Bytes the case's program writes to ``stream``."""
    if f"sys.{stream}" not in code:
        return 0
    if "range(" in code:
        return int(code.split("range(")[1].split(")")[0]) * 10
    return int(code.split("* ")[1].split(")")[0])
