"""Recording: forward each request upstream, hand the answer back untouched, write the exchange."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from mocksandbox.recording.cassette import (
    KEPT_RESPONSE_HEADERS,
    CassetteWriter,
    Exchange,
    RecordedRequest,
    utc_timestamp,
)
from mocksandbox.recording.forward import Forwarder, UpstreamAnswer
from mocksandbox.recording.matching import redact_data


@dataclass(frozen=True)
class Reply:
    """An answer to send: status, headers (``Content-Length`` is added when sent) and body."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


class Recorder:
    """Forwards requests to an upstream and appends every answered exchange to a cassette.

    The client's answer is the upstream's (status, headers that matter, body bytes); only the
    cassette's copy is redacted. A request the upstream never answered (unreachable, dropped) is
    not written: there is nothing to replay.
    """

    def __init__(self, forwarder: Forwarder, writer: CassetteWriter, redact: Iterable[str] = ()) -> None:
        self.forwarder = forwarder
        self.writer = writer
        #: JSON keys (at any depth, in request and answer) and header names never stored.
        self.redact = frozenset(redact)

    @property
    def upstream(self) -> str:
        return self.forwarder.upstream

    def record(self, request: RecordedRequest, target: str, headers: Iterable[tuple[str, str]]) -> Reply:
        """Forward ``request`` (sent as ``target``, the raw path and query, with ``headers``),
        write the exchange, and return the answer for the client.

        Raises :class:`~mocksandbox.recording.forward.UpstreamUnreachable` or
        :class:`~mocksandbox.recording.forward.UpstreamDropped` when there is no answer.
        """
        answer = self.forwarder.forward(request.method, target, headers, request.body)
        self.writer.append(self.exchange(request, answer))
        return Reply(answer.status, answer.headers, answer.body)

    def exchange(self, request: RecordedRequest, answer: UpstreamAnswer) -> Exchange:
        """What the cassette keeps of one exchange (redacted)."""
        request_body, request_redacted = self._redact_body(request.body)
        response_body, response_redacted = self._redact_body(answer.body)
        headers = tuple(
            (name, "[REDACTED]" if name.lower() in {r.lower() for r in self.redact} else value)
            for name, value in answer.headers
            if name.lower() in KEPT_RESPONSE_HEADERS
        )
        redacted = sorted(self.redact) if (request_redacted or response_redacted) else []
        return Exchange(
            RecordedRequest(request.method, request.path, request.query, request_body, request.content_type),
            answer.status,
            headers,
            response_body,
            answer.duration,
            {"url": self.forwarder.upstream, "server": answer.server},
            utc_timestamp(),
            self.writer.run,
            tuple(redacted),
        )

    def _redact_body(self, body: bytes) -> tuple[bytes, bool]:
        if not self.redact or not body:
            return body, False
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            return body, False
        data, changed = redact_data(data, self.redact)
        if not changed:
            return body, False
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode(), True
