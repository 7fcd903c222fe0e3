"""What one stress request does: a program that stamps its own start and end, sent over HTTP.

Everything here is module-level and picklable: it runs in threads, in worker processes and in Ray
workers alike. Failures are raised with types the harness can check at the caller:
:class:`ProgramFailed` for a planned failing program, :class:`SandboxHTTPError` for a non-200
answer, :class:`SandboxUnavailable` for no answer at all. Each carries the stamps of the call
(``exc.call``), so in-flight figures count failed calls too.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import requests

#: Workload names: short programs, programs that sleep a known time, programs that fail,
#: programs behind a gateway that answers 504 to some first attempts (the client retries 504 as
#: verl's does), and bare ``GET /v1/ping`` (the harness's own ceiling).
WORKLOADS = ("short", "sleep", "fail", "gateway", "ping")
STAMP = re.compile(r"MSBX-STAMP (\d+) ([0-9.e+-]+) ([0-9.e+-]+)")
#: Statuses the client retries (verl's ``check_correctness`` retries 504 only).
RETRY_STATUSES = (504,)


class SandboxCallError(Exception):
    """A call that reached (or tried to reach) the sandbox and did not succeed."""

    def __init__(self, message: str, call: CallResult | None = None) -> None:
        super().__init__(message)
        self.call = call


class ProgramFailed(SandboxCallError):
    """The program ran and failed (a planned failure of the ``fail`` workload or ``--failure-rate``)."""


class SandboxHTTPError(SandboxCallError):
    """The sandbox (or a gateway in front of it) answered a status other than 200."""

    def __init__(self, message: str, status: int, call: CallResult | None = None) -> None:
        super().__init__(message, call)
        self.status = status


class SandboxReportedError(SandboxCallError):
    """HTTP 200 with ``status: SandboxError``: the sandbox could not run the program."""


class SandboxUnavailable(SandboxCallError):
    """No answer: connection refused or reset, a timeout, or a body that is not JSON."""


def is_gateway_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is an HTTP 504 (for ``RetryPolicy(is_gateway_timeout, ...)``)."""
    return isinstance(exc, SandboxHTTPError) and exc.status in RETRY_STATUSES


@dataclass
class Attempt:
    """One HTTP request: when it left, when its answer was in, the status (``None``: no answer)."""

    start: float
    end: float
    status: int | None


@dataclass
class CallResult:
    """A call's stamps (``time.time()``): the function's own window, each attempt, the program's."""

    index: int
    fn_start: float
    fn_end: float = 0.0
    attempts: list[Attempt] = field(default_factory=list)
    program_start: float | None = None
    program_end: float | None = None
    worker: str = ""


@dataclass(frozen=True)
class CallSpec:
    """Everything a worker needs to make request ``index``."""

    url: str
    index: int
    workload: str
    program: str | None
    planned_failure: bool
    timeout: float
    retry_sleeps: tuple[float, ...] = (1.0, 2.0)


def build_program(workload: str, index: int, sleep_seconds: float, fail: bool) -> str | None:
    """The Python program request ``index`` runs (``None`` for ``ping``)."""
    if workload == "ping":
        return None
    lines = [f"# MSBX-REQ-{index};", "import time as _t", "_s = _t.time()"]
    if workload == "sleep":
        lines.append(f"_t.sleep({float(sleep_seconds)!r})")
    else:
        lines.append("_x = sum(range(1000))")
    lines.append(f"print('MSBX-STAMP {index}', repr(_s), repr(_t.time()))")
    if fail:
        lines.append(f"raise SystemExit('planned failure of request {index}')")
    return "\n".join(lines) + "\n"


_local = threading.local()


def _session() -> requests.Session:
    # One keep-alive session per thread (and so per process).
    session: requests.Session | None = getattr(_local, "session", None)
    if session is None or getattr(_local, "pid", None) != os.getpid():
        session = requests.Session()
        _local.session, _local.pid = session, os.getpid()
    return session


def _worker_name() -> str:
    return f"{os.getpid()}:{threading.current_thread().name}"


def sandbox_attempt(spec: CallSpec, call: CallResult | None = None) -> CallResult:
    """One HTTP request for ``spec``; the result, or a typed :class:`SandboxCallError`."""
    call = call or CallResult(spec.index, time.time(), worker=_worker_name())
    start = time.time()
    try:
        if spec.program is None:
            response = _session().get(f"{spec.url}/v1/ping", timeout=spec.timeout)
        else:
            response = _session().post(
                f"{spec.url}/run_code",
                json={"code": spec.program, "language": "python"},
                timeout=spec.timeout,
            )
    except requests.RequestException as exc:
        call.attempts.append(Attempt(start, time.time(), None))
        call.fn_end = time.time()
        raise SandboxUnavailable(f"request {spec.index}: {type(exc).__name__}: {exc}", call) from None
    call.attempts.append(Attempt(start, time.time(), response.status_code))
    call.fn_end = time.time()
    if response.status_code != 200:
        raise SandboxHTTPError(
            f"request {spec.index}: HTTP {response.status_code}", response.status_code, call
        )
    if spec.program is None:
        return call
    try:
        body: Any = response.json()
    except ValueError:
        raise SandboxUnavailable(f"request {spec.index}: the answer is not JSON", call) from None
    run = (body.get("run_result") or {}) if isinstance(body, dict) else {}
    match = STAMP.search(str(run.get("stdout") or ""))
    if match:
        call.program_start, call.program_end = float(match.group(2)), float(match.group(3))
    status = body.get("status") if isinstance(body, dict) else None
    if status == "Success":
        return call
    if status == "Failed":
        raise ProgramFailed(
            f"request {spec.index}: program failed (return code {run.get('return_code')})", call
        )
    raise SandboxReportedError(f"request {spec.index}: sandbox status {status!r}", call)


def sandbox_call(spec: CallSpec) -> CallResult:
    """The client as verl's is: one call, retrying HTTP 504 after ``retry_sleeps`` (1 s, then 2 s).

    The back-off sleeps happen inside this function, so whatever permit wraps the call is held
    through them (the sixth fault, when an executor wraps the whole client).
    """
    call = CallResult(spec.index, time.time(), worker=_worker_name())
    for attempt in range(len(spec.retry_sleeps) + 1):
        try:
            return sandbox_attempt(spec, call)
        except SandboxHTTPError as exc:
            if exc.status not in RETRY_STATUSES or attempt >= len(spec.retry_sleeps):
                raise
            time.sleep(spec.retry_sleeps[attempt])
            call.fn_end = time.time()
    raise AssertionError("unreachable")  # pragma: no cover


def probe_hold(seconds: float) -> tuple[float, float]:
    """Hold for ``seconds`` and return the window: what the capacity probe runs under the limiter."""
    start = time.time()
    time.sleep(seconds)
    return start, time.time()
