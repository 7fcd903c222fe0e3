"""The WSGI layer that answers from a cassette (or records through to a deployment).

It sits inside the journal, cap and fault layer (so those apply to replayed requests as to any
other) and outside the ``/run_code`` fast path (so that path never answers a request the cassette
should). What it does depends on ``sandbox.cassette``: ``None`` passes everything on; a
:class:`~mocksandbox.recording.replay.CassettePlayer` replays; a
:class:`~mocksandbox.recording.recorder.Recorder` forwards to its upstream and records (the pytest
plugin's ``--mocksandbox-record URL``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from mocksandbox import divergence
from mocksandbox.recording.cassette import RecordedRequest
from mocksandbox.recording.forward import UpstreamDropped, UpstreamUnreachable, raw_target, request_headers
from mocksandbox.recording.recorder import Recorder, Reply
from mocksandbox.recording.replay import CassetteMiss, CassettePlayer, Miss, has_toolchain, request_language

if TYPE_CHECKING:
    from mocksandbox.core import MockSandbox

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

CONTROL_PREFIX = "/_mock"
#: Where the journal layer leaves the id of the request's journal entry (to mark it replayed).
ENTRY_ID_KEY = "mocksandbox.entry_id"
#: Status of an answer to a request that must be replayed and matches no recording.
MISS_STATUS = 404


def send(reply: Reply, start_response: StartResponse) -> list[bytes]:
    """Send ``reply`` as it is, with its own length."""
    try:
        phrase = HTTPStatus(reply.status).phrase
    except ValueError:
        phrase = "Unknown"
    headers = [(k, v) for k, v in reply.headers if k.lower() != "content-length"]
    start_response(f"{reply.status} {phrase}", [*headers, ("Content-Length", str(len(reply.body)))])
    return [reply.body]


def json_reply(status: int, content: Any) -> Reply:
    body = json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
    return Reply(status, (("Content-Type", "application/json"),), body)


def recorded_request(environ: dict[str, Any], raw: bytes) -> RecordedRequest:
    return RecordedRequest(
        str(environ.get("REQUEST_METHOD", "GET")).upper(),
        str(environ.get("PATH_INFO", "/")),
        str(environ.get("QUERY_STRING", "")),
        raw,
        environ.get("CONTENT_TYPE") or None,
    )


def forward_and_record(recorder: Recorder, environ: dict[str, Any], raw: bytes) -> Reply:
    """One request through ``recorder``; the upstream's answer, or a 502 saying it is unreachable.

    An upstream that drops the connection makes this one drop too (as the client would have seen).
    """
    from mocksandbox.web.middleware import DropConnection

    try:
        return recorder.record(recorded_request(environ, raw), raw_target(environ), request_headers(environ))
    except UpstreamUnreachable as exc:
        return json_reply(502, {"detail": f"mocksandbox record: {exc}"})
    except UpstreamDropped:
        raise DropConnection("close") from None


class CassetteLayer:
    """WSGI middleware: replay or record according to ``sandbox.cassette``."""

    def __init__(
        self, app: WSGIApp, sandbox: MockSandbox, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.app = app
        self.sandbox = sandbox
        self._clock = clock

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        handler = self.sandbox.cassette
        if handler is None or str(environ.get("PATH_INFO", "")).startswith(CONTROL_PREFIX):
            return self.app(environ, start_response)
        started = self._clock()
        from mocksandbox.web.middleware import read_body_once  # (imports this module's importers)

        raw = read_body_once(environ)
        if isinstance(handler, Recorder):
            return send(forward_and_record(handler, environ, raw), start_response)
        return self._replay(handler, environ, raw, started, start_response)

    def _replay(
        self,
        player: CassettePlayer,
        environ: dict[str, Any],
        raw: bytes,
        started: float,
        start_response: StartResponse,
    ) -> Iterable[bytes]:
        request = recorded_request(environ, raw)
        decision = player.decide(request)
        if decision is None:
            return self.app(environ, start_response)
        box = self.sandbox
        if isinstance(decision, Miss):
            box.record_error(request.path, CassetteMiss(decision.message))
            return send(json_reply(MISS_STATUS, {"detail": decision.message}), start_response)
        # The control state picks the turn (exact across worker processes) and marks the journal.
        turn = box.control.next_replay(environ.get(ENTRY_ID_KEY), decision.key, decision.labels)
        exchange = decision.exchanges[turn]
        language = request_language(request)
        if language is not None and not has_toolchain(language):
            divergence.note(
                divergence.TOOLCHAIN,
                f"{language} has no toolchain here: answered from the recording {exchange.source} "
                f"(SandboxFusion's answer to this request when it was recorded, not a run)",
            )
        if player.timing:
            remaining = exchange.duration - (self._clock() - started)
            if remaining > 0:
                box.sleep(remaining)
        return send(Reply(exchange.status, exchange.headers, exchange.body), start_response)
