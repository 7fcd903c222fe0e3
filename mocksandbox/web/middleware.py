"""The outermost WSGI layer: journal, concurrency cap and faults, around the Flask app.

Sitting outside Flask means faulted and rejected answers are journaled like real ones, and a
fault can do what no view can: answer before the body is read, reset the connection, or send a
body slowly. Control paths (``/_mock/...``) pass straight through and are never journaled.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import Any

from mocksandbox import divergence
from mocksandbox.control.state import IncomingRequest
from mocksandbox.core import MockSandbox
from mocksandbox.faults import (
    CloseAction,
    FaultDecision,
    MalformedJsonAction,
    ResetAction,
    SandboxErrorAction,
    SlowBodyAction,
    StatusAction,
    TruncateAction,
)
from mocksandbox.models import RunCodeResponse, RunStatus

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
CONTROL_PREFIX = "/_mock/"


class DropConnection(BaseException):
    """Raised through the WSGI stack to make the server drop the connection without answering.

    A ``BaseException`` so that Flask and werkzeug do not turn it into a 500 on the way out; the
    server's request handler catches it and closes (``mode="close"``) or resets (``"reset"``).
    """

    def __init__(self, mode: str) -> None:
        super().__init__(mode)
        self.mode = mode


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class _Answer:
    """A complete answer held in memory before it is sent (or altered by a fault)."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status = status
        self.headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        self.body = body

    @classmethod
    def json(cls, status: int, content: Any, headers: dict[str, str] | None = None) -> _Answer:
        if isinstance(content, str) and not content.startswith(("{", "[", '"')):
            body, ctype = content.encode(), "text/plain; charset=utf-8"
        else:
            text = content if isinstance(content, str) else json.dumps(content, separators=(",", ":"))
            body, ctype = text.encode(), "application/json"
        return cls(status, [("Content-Type", ctype), *(headers or {}).items()], body)

    def send(self, start_response: StartResponse, body: Iterable[bytes] | None = None) -> Iterable[bytes]:
        start_response(
            f"{self.status} {_reason(self.status)}", [*self.headers, ("Content-Length", str(len(self.body)))]
        )
        return body if body is not None else [self.body]


def read_body_once(environ: dict[str, Any]) -> bytes:
    """The request body, read once and put back, with its true length, for the layers below.

    A request has a body only with a ``Content-Length`` or a chunked one (the server dechunks it
    and says so with ``wsgi.input_terminated``). Without either there is none: reading "to the
    end" would wait for a client that sent ``Connection: close`` (urllib, HTTP/1.0) to close a
    connection it keeps open for the answer."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or -1)
    except ValueError:
        length = -1
    stream = environ["wsgi.input"]
    if length >= 0:
        raw: bytes = stream.read(length) if length > 0 else b""
    elif environ.get("wsgi.input_terminated"):
        raw = stream.read()
    else:
        raw = b""
    environ["wsgi.input"] = io.BytesIO(raw)
    environ["CONTENT_LENGTH"] = str(len(raw))
    return raw


class MockLayer:
    """WSGI middleware applying the sandbox's journal, cap and faults to every API request."""

    def __init__(self, app: WSGIApp, sandbox: MockSandbox) -> None:
        self.app = app
        self.sandbox = sandbox

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith(CONTROL_PREFIX) or path == CONTROL_PREFIX.rstrip("/"):
            return self.app(environ, start_response)

        raw = read_body_once(environ)
        box = self.sandbox
        control = box.control
        admission = control.admit(
            IncomingRequest(
                environ.get("REQUEST_METHOD", "GET"),
                path,
                environ.get("QUERY_STRING", ""),
                raw,
                f"{environ.get('REMOTE_ADDR', '')}:{environ.get('REMOTE_PORT', '')}",
                box.worker_name,
            )
        )
        entry_id = admission.entry_id
        environ["mocksandbox.entry_id"] = entry_id  # a replayed answer marks its entry (recording/layer.py)
        if not admission.admitted:
            answer = _Answer.json(
                429,
                {"detail": "Too Many Requests"},
                {"Retry-After": _seconds_header(admission.retry_after_s)},
            )
            control.finish(entry_id, 429, answer.body, outcome="rejected", leave=False)
            return answer.send(start_response)

        try:
            with divergence.collecting() as notes, divergence.output_mode(admission.decision.output_mode):
                answer, chunks = self._answer(environ, admission.decision)
        except DropConnection:
            control.finish(entry_id, None, None, outcome="dropped")
            raise
        except BaseException:
            control.leave(entry_id)
            raise
        diverged = tuple(notes)
        if chunks is None:
            control.finish(entry_id, answer.status, answer.body, divergences=diverged)
            return answer.send(start_response)
        # A slow body keeps the request in flight until its last chunk is out.
        control.finish(entry_id, answer.status, answer.body, leave=False, divergences=diverged)
        return answer.send(start_response, _closing(chunks, lambda: control.leave(entry_id)))

    def _answer(
        self, environ: dict[str, Any], decision: FaultDecision
    ) -> tuple[_Answer, Iterator[bytes] | None]:
        box = self.sandbox
        action = decision.action
        if decision.delay_seconds:
            box.sleep(decision.delay_seconds)

        if isinstance(action, StatusAction):
            headers = dict(action.headers)
            if action.retry_after is not None:
                headers["Retry-After"] = _seconds_header(action.retry_after)
            content = action.body if action.body is not None else {"detail": _reason(action.status)}
            return _Answer.json(action.status, content, headers), None
        if isinstance(action, SandboxErrorAction):
            response = RunCodeResponse(
                status=RunStatus.SandboxError, message=action.message, executor_pod_name=box.settings.pod_name
            )
            return _Answer.json(200, response.model_dump(mode="json")), None
        if isinstance(action, MalformedJsonAction):
            return _Answer(200, [("Content-Type", "application/json")], action.body.encode()), None
        if isinstance(action, ResetAction | CloseAction):
            raise DropConnection(action.type)

        answer = self._call_app(environ)
        if isinstance(action, TruncateAction):
            answer.body = answer.body[: int(len(answer.body) * action.fraction)]
        elif isinstance(action, SlowBodyAction):
            return answer, _slow_chunks(answer.body, action.chunk_bytes, action.interval_seconds, box.sleep)
        return answer, None

    def _call_app(self, environ: dict[str, Any]) -> _Answer:
        captured: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            captured["status"] = int(status.split(" ", 1)[0])
            captured["headers"] = headers
            return lambda data: None

        iterable = self.app(environ, start_response)
        try:
            body = b"".join(iterable)
        finally:
            close = getattr(iterable, "close", None)
            if close is not None:
                close()
        return _Answer(captured["status"], captured["headers"], body)


def _seconds_header(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


def _slow_chunks(body: bytes, size: int, interval: float, sleep: Callable[[float], None]) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        if start:
            sleep(interval)
        yield body[start : start + size]


def _closing(chunks: Iterator[bytes], on_close: Callable[[], None]) -> Iterator[bytes]:
    try:
        yield from chunks
    finally:
        on_close()
