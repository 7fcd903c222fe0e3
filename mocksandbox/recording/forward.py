"""Forward one request to an upstream deployment and bring back its answer exactly as sent.

The answer's body is read raw (``decode_content=False``): a gzipped answer stays gzipped, with its
``Content-Encoding``, so what the client gets through a recording proxy is what the upstream sent.
No end-to-end header is added that the client did not send (``requests``' session defaults are
cleared), so the upstream cannot answer differently because a proxy sat between.

Each request goes on a new upstream connection (``Connection: close``, a hop-by-hop header the
proxy may set): SandboxFusion closes a connection after a 500 from an uncaught exception, and a
request sent on such a connection before the close is seen would fail with a reset that the
client, on its own connection to the proxy, never caused. A retry would hide real resets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import requests
from urllib3.exceptions import NewConnectionError

#: Headers that belong to one connection, not to the message (RFC 9110 §7.6.1), plus those the
#: forwarding side recomputes (``Host``, ``Content-Length``) or that name the server, not the answer.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
#: Answer headers the serving side writes itself (werkzeug adds both to every answer).
SERVER_OWN = frozenset({"date", "server"})


class UpstreamUnreachable(ConnectionError):
    """No connection to the upstream could be made: nothing was sent, nothing to record."""


class UpstreamDropped(ConnectionError):
    """The upstream took the request and then closed or reset the connection without an answer."""


@dataclass(frozen=True)
class UpstreamAnswer:
    """The upstream's answer as received."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    #: Seconds from sending the request to the answer's last byte.
    duration: float
    #: The upstream's ``Server`` header (part of its identity in the cassette).
    server: str | None


def request_headers(environ: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The end-to-end headers of a WSGI request, as the client sent them."""
    headers: list[tuple[str, str]] = []
    if environ.get("CONTENT_TYPE"):
        headers.append(("Content-Type", str(environ["CONTENT_TYPE"])))
    for key, value in environ.items():
        if key.startswith("HTTP_") and key not in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"):
            name = key[5:].replace("_", "-").title()
            if name.lower() not in HOP_BY_HOP:
                headers.append((name, str(value)))
    return headers


def raw_target(environ: Mapping[str, Any]) -> str:
    """The request target as the client wrote it (path and query), percent-encoding kept."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return str(raw)
    path = quote(str(environ.get("PATH_INFO", "/")).encode("latin-1").decode("utf-8", "replace"))
    query = environ.get("QUERY_STRING")
    return f"{path}?{query}" if query else path


class Forwarder:
    """Sends requests to one upstream base URL; thread-safe (one ``requests`` session per thread,
    so that each keeps its own connections alive)."""

    def __init__(self, upstream: str, connect_timeout: float = 10.0, read_timeout: float = 3600.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.timeout = (connect_timeout, read_timeout)
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers.clear()  # no User-Agent, Accept or Accept-Encoding the client did not send
            self._local.session = session
        return session

    def forward(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> UpstreamAnswer:
        """Send ``method target`` with ``headers`` and ``body``; the answer as received.

        Raises :class:`UpstreamUnreachable` when no connection could be made and
        :class:`UpstreamDropped` when the upstream went away without answering.
        """
        url = self.upstream + (target if target.startswith("/") else "/" + target)
        started = time.monotonic()
        try:
            reply = self._session().request(
                method,
                url,
                data=body,
                headers={**dict(headers), "Connection": "close"},
                stream=True,
                allow_redirects=False,
                timeout=self.timeout,
            )
        except requests.RequestException as exc:
            if _never_connected(exc):
                raise UpstreamUnreachable(f"cannot reach {self.upstream}: {exc}") from None
            raise UpstreamDropped(f"{self.upstream} did not answer: {exc}") from None
        try:
            content = reply.raw.read(decode_content=False)
        except Exception as exc:  # urllib3's protocol and read errors: the connection broke
            raise UpstreamDropped(f"{self.upstream} broke off its answer: {exc}") from None
        finally:
            reply.close()
        duration = time.monotonic() - started
        kept = tuple(
            (str(name), str(value))
            for name, value in reply.raw.headers.items()
            if name.lower() not in HOP_BY_HOP and name.lower() not in SERVER_OWN
        )
        return UpstreamAnswer(reply.status_code, kept, content, duration, reply.headers.get("Server"))

    def close(self) -> None:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is not None:
            session.close()


def _never_connected(exc: BaseException) -> bool:
    if isinstance(exc, requests.ConnectTimeout):
        return True
    seen: BaseException | None = exc
    while seen is not None:
        for arg in seen.args:
            if isinstance(getattr(arg, "reason", None), NewConnectionError) or isinstance(
                arg, NewConnectionError
            ):
                return True
        seen = seen.__cause__ or seen.__context__
    return False
