"""Cassettes: recorded exchanges with a SandboxFusion-compatible deployment, one JSON line each.

A line holds one request and the answer the deployment gave to it::

    {"request": {"method": "POST", "path": "/run_code", "query": "",
                 "content_type": "application/json", "json": {...}},   # or "text" / "base64"
     "response": {"status": 200, "headers": {"Content-Type": "application/json"},
                  "json": {...}},                                     # or "text" / "base64"
     "duration": 0.0312,                  # seconds the deployment took
     "upstream": {"url": "http://...", "server": "uvicorn"},
     "recorded_at": "2025-01-01T12:00:00Z",
     "run": "5f0c...",                     # the recording run that wrote it (see CassetteWriter)
     "redacted": ["api_key"]}              # only when --redact removed something

A response body is stored as ``json`` only when re-encoding that JSON the way SandboxFusion (and
the mock) encode it gives back the exact bytes received; otherwise as ``text`` (UTF-8) or
``base64``: a replayed answer is always byte for byte the recorded one.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: What a redacted value is replaced with.
REDACTED = "[REDACTED]"

#: Answer headers kept in a cassette: the ones a client acts on. Hop-by-hop ones, ``Date``,
#: ``Server`` and ``Content-Length`` are the server's own business (the replaying one sends its own).
KEPT_RESPONSE_HEADERS = frozenset(
    {"content-type", "content-encoding", "retry-after", "location", "allow", "www-authenticate"}
)


class CassetteError(ValueError):
    """A cassette that cannot be read or used; the message names the file and line."""


@dataclass(frozen=True)
class RecordedRequest:
    """A request as it reached the recording proxy (or the replaying server)."""

    method: str
    path: str
    query: str
    body: bytes
    content_type: str | None = None

    def describe(self) -> str:
        """``POST /run_code (python)``: for messages and tables."""
        language = self.json_field("language")
        extra = f" ({language})" if isinstance(language, str) else ""
        query = f"?{self.query}" if self.query else ""
        return f"{self.method} {self.path}{query}{extra}"

    def json_field(self, name: str) -> Any:
        """A top-level field of a JSON object body, or ``None``."""
        if f'"{name}"'.encode() not in self.body:
            return None
        try:
            data = json.loads(self.body)
        except (ValueError, RecursionError):
            return None
        return data.get(name) if isinstance(data, dict) else None


@dataclass(frozen=True)
class Exchange:
    """One recorded request and its answer."""

    request: RecordedRequest
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    duration: float = 0.0
    upstream: Mapping[str, Any] = field(default_factory=dict)
    recorded_at: str = ""
    run: str | None = None
    redacted: tuple[str, ...] = ()
    #: Where it was read from (``cassette.jsonl:12``); empty for one not read from a file.
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        request = self.request
        data: dict[str, Any] = {
            "request": {
                "method": request.method,
                "path": request.path,
                "query": request.query,
                "content_type": request.content_type,
                **_encode_body(request.body, exact=False),
            },
            "response": {
                "status": self.status,
                "headers": dict(self.headers),
                **_encode_body(self.body, exact=True),
            },
            "duration": round(self.duration, 6),
            "upstream": dict(self.upstream),
            "recorded_at": self.recorded_at,
            "run": self.run,
        }
        if self.redacted:
            data["redacted"] = list(self.redacted)
        return data

    @classmethod
    def from_json(cls, data: Any, source: str = "") -> Exchange:
        """An exchange from one parsed cassette line; :class:`CassetteError` if it is not one."""
        try:
            request, response = data["request"], data["response"]
            recorded = RecordedRequest(
                str(request["method"]).upper(),
                str(request["path"]),
                str(request.get("query") or ""),
                _decode_body(request, exact=False),
                request.get("content_type"),
            )
            return cls(
                recorded,
                int(response["status"]),
                tuple((str(k), str(v)) for k, v in (response.get("headers") or {}).items()),
                _decode_body(response, exact=True),
                float(data.get("duration") or 0.0),
                dict(data.get("upstream") or {}),
                str(data.get("recorded_at") or ""),
                data.get("run"),
                tuple(data.get("redacted") or ()),
                source,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CassetteError(f"{source or 'cassette line'}: not a recorded exchange ({exc!r})") from None


def encode_like_sandboxfusion(data: Any) -> bytes:
    """JSON as FastAPI's ``JSONResponse`` (and the mock) encode it: compact, non-ASCII kept."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def _encode_body(body: bytes, exact: bool) -> dict[str, Any]:
    if not body:
        return {"text": ""}
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(body).decode()}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return {"text": text}
    # A request is matched on its meaning, so any JSON is stored as JSON (readable); an answer is
    # replayed byte for byte, so only when its bytes come back from the JSON.
    if not exact:
        return {"json": data}
    try:
        same = encode_like_sandboxfusion(data) == body
    except (ValueError, RecursionError):
        same = False
    return {"json": data} if same else {"text": text}


def _decode_body(part: Mapping[str, Any], exact: bool) -> bytes:
    if "json" in part:
        data = part["json"]
        if exact:
            return encode_like_sandboxfusion(data)
        return json.dumps(data, ensure_ascii=False).encode()
    if "base64" in part:
        return base64.b64decode(part["base64"])
    return str(part.get("text") or "").encode()


def read_cassette(path: str | os.PathLike[str]) -> list[Exchange]:
    """Every exchange of a cassette, in file order (a ``.gz`` one is read compressed);
    :class:`CassetteError` if it cannot be read."""
    file = Path(path)
    try:
        if file.suffix == ".gz":
            import gzip

            text = gzip.decompress(file.read_bytes()).decode("utf-8")
        else:
            text = file.read_text(encoding="utf-8")
    except (OSError, EOFError) as exc:
        reason = getattr(exc, "strerror", None) or exc  # (gzip: BadGzipFile, EOFError)
        raise CassetteError(f"cannot read cassette {file}: {reason}") from None
    except UnicodeDecodeError:
        raise CassetteError(f"cassette {file} is not UTF-8 text") from None
    return list(parse_lines(text.splitlines(), file.name))


def parse_lines(lines: Iterable[str], name: str) -> Iterator[Exchange]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        source = f"{name}:{number}"
        try:
            data = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise CassetteError(f"{source}: not JSON ({exc})") from None
        yield Exchange.from_json(data, source)


def utc_timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class CassetteWriter:
    """Appends exchanges to a cassette, safely from many threads and many processes.

    ``run`` names one recording run (a ``mocksandbox record`` invocation, or one pytest run and all
    its xdist workers). The first exchange a run writes to a cassette that holds another run's
    lines replaces them (re-recording); later ones, from any process of the same run, append. The
    check and the write happen under an exclusive ``flock`` of the cassette itself, so no sidecar
    file is needed and two xdist workers never both truncate. ``run=None`` always appends.
    """

    def __init__(self, path: str | os.PathLike[str], run: str | None) -> None:
        self.path = Path(path)
        self.run = run
        self._lock = threading.Lock()

    def append(self, exchange: Exchange) -> None:
        data = exchange.to_json()
        if self.run is not None:
            data["run"] = self.run  # the writer's run decides what the next run replaces
        line = (json.dumps(data, ensure_ascii=False) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.path, "a+b") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            try:
                if self.run is not None and self._holds_another_run(file):
                    file.truncate(0)
                file.seek(0, os.SEEK_END)
                file.write(line)
                file.flush()
            finally:
                fcntl.flock(file, fcntl.LOCK_UN)

    def _holds_another_run(self, file: Any) -> bool:
        file.seek(0)
        first = file.readline()
        if not first.strip():
            return False
        try:
            return bool(json.loads(first).get("run") != self.run)
        except (ValueError, AttributeError):
            return True  # not a cassette line: ours replaces it
