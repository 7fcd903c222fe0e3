"""No code from a browser page: requests must name this server, and pages must be its own.

The server runs what it is sent, as its user (root on most sandboxes). A web page the user happens
to visit can reach it in two ways, and this layer, outermost of all, closes both:

* **DNS rebinding.** A name of the attacker's (``evil.example``) first resolves to the attacker's
  server, then to 127.0.0.1: the page's requests to ``http://evil.example:8080/run_code`` are
  same-origin in the browser's eyes and reach this server with ``Host: evil.example:8080``. So the
  ``Host`` must be a loopback name or address, the configured host, or a name allowed with
  ``--allow-host``.
* **Cross-origin requests that need no preflight** (a ``fetch`` with a body of no content type is
  parsed as JSON, as SandboxFusion parses it). Browsers send ``Origin`` with them, so a request
  whose ``Origin`` is not one of the allowed hosts is refused too.

Clients that are not browsers send no ``Origin`` and name the address they connect to, so verl,
``requests``, the SDK, curl, the fixtures and the contract suite are unaffected. Refusals are 403
with a ``detail`` that says how to allow the host; they are not journaled (they never reached the
sandbox), but each refused host is reported once on stderr.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from mocksandbox.settings import Settings

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

#: Names that always mean this machine (RFC 6761: ``localhost`` and every name under it).
_LOOPBACK_NAMES = ("localhost",)


def split_host(host_header: str) -> str:
    """The host name or address of a ``Host`` header value (``[::1]:8080`` -> ``::1``), lowercase,
    without a trailing dot."""
    value = host_header.strip().lower()
    if value.startswith("["):
        value = value[1 : value.find("]")] if "]" in value else value[1:]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


@functools.lru_cache(maxsize=256)
def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address) can only mean this machine. (Cached: every request
    asks, and ``ipaddress`` parsing was a few percent of a short request's CPU.)"""
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


@dataclass(frozen=True)
class HostPolicy:
    """Which ``Host`` and ``Origin`` values the server answers."""

    #: Names and addresses allowed beside the loopback ones (the configured host, ``--allow-host``).
    #: An entry ``*.example.com`` allows every name under ``example.com``.
    allowed: frozenset[str] = field(default_factory=frozenset)
    #: Answer every host and origin (behind a proxy that checks them itself).
    allow_any: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> HostPolicy:
        names = {split_host(name) for name in settings.allowed_hosts}
        if settings.host:
            names.add(split_host(settings.host))
        return cls(frozenset(names), settings.allow_any_host)

    def allows_host(self, host: str) -> bool:
        if self.allow_any or is_loopback_host(host) or host in self.allowed:
            return True
        return any(entry.startswith("*.") and host.endswith(entry[1:]) for entry in self.allowed)

    def refusal(self, host_header: str | None, origin: str | None) -> str | None:
        """Why a request with these headers is refused, or ``None`` when it is answered."""
        if self.allow_any:
            return None
        if host_header:
            host = split_host(host_header)
            if not self.allows_host(host):
                return (
                    f"Host {host_header!r} is not allowed: mocksandbox runs code, so it answers only "
                    f"requests for loopback names and addresses (localhost, 127.0.0.1, [::1]), its "
                    f"configured host and hosts given with --allow-host. If you reach it by this "
                    f"name on purpose, start it with --allow-host {host} (or, behind a proxy that "
                    f"checks hosts itself, --allow-any-host)."
                )
        if origin is not None:
            parts = urlsplit(origin.strip())
            origin_host = (parts.hostname or "").rstrip(".")
            if parts.scheme not in ("http", "https") or not self.allows_host(origin_host):
                return (
                    f"Origin {origin!r} is not allowed: mocksandbox runs code, so it does not answer "
                    f"web pages from other sites. Pages served from a loopback address, its "
                    f"configured host or a host given with --allow-host are answered; start it with "
                    f"--allow-host NAME to allow a page's host (or --allow-any-host behind a proxy)."
                )
        return None


class HostGuard:
    """WSGI middleware answering 403 to requests the :class:`HostPolicy` refuses."""

    def __init__(self, app: WSGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy
        self._reported: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        reason = self.policy.refusal(environ.get("HTTP_HOST"), environ.get("HTTP_ORIGIN"))
        if reason is None:
            return self.app(environ, start_response)
        self._report(reason)
        body = json.dumps({"detail": reason}, separators=(",", ":")).encode()
        start_response(
            "403 Forbidden",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
        )
        return [body]

    def _report(self, reason: str) -> None:
        with self._lock:
            if reason in self._reported or len(self._reported) > 100:
                return
            self._reported.add(reason)
        print(f"mocksandbox: refused a request. {reason}", file=sys.stderr, flush=True)
