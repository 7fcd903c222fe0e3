"""One ``/run_code`` call, and what can go wrong on the way (as typed exceptions).

:func:`run_code_call` runs in an execution-pool worker (a thread, or a Ray actor): its argument and
its result are small picklable values, and every failure of the *service* (an HTTP error status,
a refused or dropped connection, no answer in time, an answer that is not SandboxFusion's JSON)
raises a :class:`SandboxAPIError` subclass, which the pool hands back to the caller with its type.
A program that fails is not an API failure: SandboxFusion answers it with HTTP 200 and a status in
the body, and it comes back as a :class:`RunOutcome`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests


def run_code_url(url: str) -> str:
    """The ``/run_code`` endpoint of ``url``: a base URL gets ``/run_code``; a full one is kept."""
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        return urlunsplit(parts._replace(path="/run_code"))
    return url


@dataclass(frozen=True)
class SandboxCall:
    """What to send: the body of one ``/run_code`` request and the client's own timeout."""

    url: str
    code: str
    language: str = "python"
    run_timeout: float = 30.0
    compile_timeout: float = 10.0
    memory_limit_mb: int = 1024
    request_timeout: float = 50.0
    stdin: str | None = None

    def body(self) -> dict[str, Any]:
        # The payload verl's client sends (verl/utils/reward_score/sandbox_fusion/utils.py).
        return {
            "compile_timeout": self.compile_timeout,
            "run_timeout": self.run_timeout,
            "code": self.code,
            "stdin": self.stdin,
            "memory_limit_MB": self.memory_limit_mb,
            "language": self.language,
            "files": {},
            "fetch_files": [],
        }


@dataclass(frozen=True)
class RunOutcome:
    """A ``/run_code`` answer (HTTP 200), flattened: top-level status, compile step, run step."""

    status: str
    message: str = ""
    compile_status: str | None = None
    compile_return_code: int | None = None
    compile_stdout: str = ""
    compile_stderr: str = ""
    run_status: str | None = None
    return_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    execution_time: float | None = None
    latency_s: float = 0.0

    @classmethod
    def from_response(cls, body: Any, latency_s: float = 0.0) -> RunOutcome:
        """Read SandboxFusion's ``RunCodeResponse``; :class:`ValueError` if it is not one."""
        if not isinstance(body, dict) or body.get("status") not in ("Success", "Failed", "SandboxError"):
            raise ValueError("not a /run_code answer (no Success/Failed/SandboxError status)")
        compile_result = body.get("compile_result") or {}
        run_result = body.get("run_result") or {}
        if not isinstance(compile_result, dict) or not isinstance(run_result, dict):
            raise ValueError("compile_result/run_result are not objects")
        return cls(
            status=body["status"],
            message=str(body.get("message") or ""),
            compile_status=compile_result.get("status"),
            compile_return_code=compile_result.get("return_code"),
            compile_stdout=compile_result.get("stdout") or "",
            compile_stderr=compile_result.get("stderr") or "",
            run_status=run_result.get("status"),
            return_code=run_result.get("return_code"),
            stdout=run_result.get("stdout") or "",
            stderr=run_result.get("stderr") or "",
            execution_time=run_result.get("execution_time"),
            latency_s=latency_s,
        )


class SandboxAPIError(Exception):
    """The sandbox service failed to answer the call (the program may or may not have run).

    Subclasses keep their constructor arguments in ``args`` so that they pickle (Ray hands them
    back from its workers with their type).
    """

    url: str = ""

    def describe(self) -> str:
        """A short phrase for a model to read (no URL)."""
        return "the sandbox failed"

    def __str__(self) -> str:
        return f"{self.describe()} ({self.url})"


class SandboxHTTPError(SandboxAPIError):
    """An HTTP error status (429 from a gateway, 5xx, 422 for a request it rejects, ...)."""

    def __init__(self, url: str, status: int, detail: str = "", retry_after: str | None = None) -> None:
        super().__init__(url, status, detail, retry_after)
        self.url, self.status, self.detail, self.retry_after = url, status, detail, retry_after

    def describe(self) -> str:
        try:
            reason = HTTPStatus(self.status).phrase
        except ValueError:
            reason = ""
        text = f"HTTP {self.status} {reason}".rstrip()
        extras = []
        if self.retry_after:
            extras.append(f"retry after {self.retry_after} s")
        if self.detail and self.detail != reason:
            extras.append(self.detail)
        return text + (f" ({'; '.join(extras)})" if extras else "")


class SandboxConnectionError(SandboxAPIError):
    """No connection, or the connection was dropped before an answer came."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(url, reason)
        self.url, self.reason = url, reason

    def describe(self) -> str:
        return f"could not reach the sandbox ({self.reason})"


class SandboxNoAnswer(SandboxAPIError):
    """Connected, but no answer within the client's request timeout."""

    def __init__(self, url: str, timeout: float) -> None:
        super().__init__(url, timeout)
        self.url, self.timeout = url, timeout

    def describe(self) -> str:
        return f"the sandbox did not answer within {seconds(self.timeout)}"


class SandboxBadResponse(SandboxAPIError):
    """An answer that is not SandboxFusion's JSON (truncated, not JSON, another shape)."""

    def __init__(self, url: str, reason: str, snippet: str = "") -> None:
        super().__init__(url, reason, snippet)
        self.url, self.reason, self.snippet = url, reason, snippet

    def describe(self) -> str:
        return f"the sandbox's answer could not be read ({self.reason})"


def seconds(value: float) -> str:
    """``30 s``, ``0.5 s``: a duration as a model reads it."""
    return f"{value:g} s"


def _detail(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return text[:200]
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return str(body["detail"])[:200]
    if isinstance(body, dict) and isinstance(body.get("detail"), list) and body["detail"]:
        first = body["detail"][0]
        if isinstance(first, dict):
            loc = ".".join(str(p) for p in first.get("loc", []) if p != "body")
            return f"{loc}: {first.get('msg', '')}"[:200]
    return json.dumps(body)[:200]


def _connection_reason(exc: BaseException) -> str:
    text = repr(exc)
    for needle, reason in (
        ("ConnectionRefused", "connection refused"),
        ("Connection refused", "connection refused"),
        ("ConnectionReset", "connection reset"),
        ("RemoteDisconnected", "connection closed without an answer"),
        ("BrokenPipe", "connection broken"),
        ("NameResolution", "host name not found"),
        ("Failed to resolve", "host name not found"),
    ):
        if needle in text:
            return reason
    return "connection failed"


def run_code_call(call: SandboxCall) -> RunOutcome:
    """POST ``call`` to ``/run_code``: the outcome of the program, or a :class:`SandboxAPIError`."""
    started = time.monotonic()
    try:
        response = requests.post(call.url, json=call.body(), timeout=call.request_timeout)
    except requests.ConnectTimeout as exc:
        raise SandboxConnectionError(
            call.url, f"no connection within {seconds(call.request_timeout)}"
        ) from exc
    except requests.Timeout as exc:
        raise SandboxNoAnswer(call.url, call.request_timeout) from exc
    except requests.ConnectionError as exc:
        raise SandboxConnectionError(call.url, _connection_reason(exc)) from exc
    except requests.RequestException as exc:  # a truncated body (ChunkedEncodingError), ...
        raise SandboxBadResponse(call.url, type(exc).__name__) from exc
    latency = time.monotonic() - started
    if response.status_code != 200:
        raise SandboxHTTPError(
            call.url, response.status_code, _detail(response), response.headers.get("Retry-After")
        )
    try:
        body = response.json()
    except ValueError:
        raise SandboxBadResponse(call.url, "not JSON", response.text[:200]) from None
    try:
        return RunOutcome.from_response(body, latency)
    except ValueError as exc:
        raise SandboxBadResponse(call.url, str(exc), response.text[:200]) from None


class RetryOn:
    """A picklable retry predicate: these HTTP statuses, and optionally connection failures."""

    def __init__(self, statuses: tuple[int, ...] = (), connection_errors: bool = False) -> None:
        self.statuses = statuses
        self.connection_errors = connection_errors

    def __call__(self, exc: BaseException) -> bool:
        if isinstance(exc, SandboxHTTPError):
            return exc.status in self.statuses
        return self.connection_errors and isinstance(exc, SandboxConnectionError)

    def __repr__(self) -> str:
        return f"RetryOn(statuses={self.statuses}, connection_errors={self.connection_errors})"
