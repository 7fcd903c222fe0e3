"""One job through the subject, as the caller sees it: stamps, what came back, what was raised.

This is the integration the harness trusts for a *limiter* (acquire, one attempt, release in
``finally``, back off without the permit); an *executor* brings its own integration, and the
harness only watches what reaches the caller.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor as FuturesExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from mocksandbox.stress.subject import Subject
from mocksandbox.stress.workload import (
    RETRY_STATUSES,
    Attempt,
    CallResult,
    CallSpec,
    ProgramFailed,
    SandboxCallError,
    SandboxHTTPError,
    probe_hold,
    sandbox_attempt,
    sandbox_call,
)

JobKind = Literal["call", "probe"]


@dataclass(frozen=True)
class Job:
    kind: JobKind
    index: int
    spec: CallSpec | None = None
    seconds: float = 0.0
    #: Run through this subject instead of the driver's (the limit conflict check's second pool).
    subject: Subject | None = None


@dataclass
class Outcome:
    """What happened to one job, seen from the caller. Times are ``time.time()`` stamps."""

    kind: JobKind
    index: int
    requested: float
    finished: float = 0.0
    #: When the call first got its permit (limiter) or its function started (executor).
    granted: float | None = None
    #: Permit windows as the harness saw them (per attempt for a limiter, the call for an executor).
    holds: list[tuple[float, float]] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    program: tuple[float, float] | None = None
    planned_failure: bool = False
    #: ``ok``: a CallResult came back; ``raised``; ``returned``: something else came back (swallowed).
    result: Literal["ok", "raised", "returned"] = "ok"
    error_type: str | None = None
    error_message: str | None = None
    #: ``sandbox``: a SandboxCallError from the call; ``foreign``: raised by the limiter/executor.
    origin: Literal["sandbox", "foreign"] | None = None
    returned: str | None = None
    release_error: str | None = None
    worker: str = ""

    @property
    def planned_failure_typed(self) -> bool:
        return self.result == "raised" and self.error_type == _qualname(ProgramFailed)


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _worker() -> str:
    return f"{os.getpid()}:{threading.current_thread().name}"


def _absorb(outcome: Outcome, call: CallResult | None, hold: bool) -> None:
    if call is None:
        return
    outcome.attempts = list(call.attempts)
    if call.program_start is not None and call.program_end is not None:
        outcome.program = (call.program_start, call.program_end)
    if hold:
        end = call.fn_end or (call.attempts[-1].end if call.attempts else call.fn_start)
        outcome.holds.append((call.fn_start, end))
        if outcome.granted is None:
            outcome.granted = call.fn_start


def _record_error(outcome: Outcome, exc: BaseException, hold: bool) -> None:
    # ProgramFailed raised through Ray arrives as a class deriving from both RayTaskError and
    # ProgramFailed; name the user-visible type, and check it with isinstance.
    if isinstance(exc, ProgramFailed):
        cls: type = ProgramFailed
    elif isinstance(exc, SandboxCallError):
        cls = next(c for c in type(exc).__mro__ if issubclass(c, SandboxCallError))
    else:
        cls = type(exc)
    outcome.result = "raised"
    outcome.error_type = _qualname(cls)
    outcome.error_message = str(exc)[:300]
    outcome.origin = "sandbox" if isinstance(exc, SandboxCallError) else "foreign"
    if isinstance(exc, SandboxCallError):
        _absorb(outcome, exc.call, hold)  # a failed call still ran: count its stamps


def _record_return(outcome: Outcome, value: Any, hold: bool) -> None:
    if isinstance(value, CallResult):
        outcome.result = "ok"
        _absorb(outcome, value, hold)
    else:
        outcome.result = "returned"
        outcome.returned = repr(value)[:100]


def _retry_delay(exc: BaseException, attempt: int, sleeps: tuple[float, ...]) -> float | None:
    if isinstance(exc, SandboxHTTPError) and exc.status in RETRY_STATUSES and attempt < len(sleeps):
        return sleeps[attempt]
    return None


def run_job(subject: Subject, job: Job, sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """Run ``job`` through ``subject`` in this thread."""
    subject = job.subject or subject
    outcome = Outcome(job.kind, job.index, time.time(), worker=_worker())
    if job.spec is not None:
        outcome.planned_failure = job.spec.planned_failure
    try:
        if subject.kind == "executor":
            _execute(subject, job, outcome)
        else:
            _limited(subject, job, outcome, sleep)
    finally:
        outcome.finished = time.time()
    return outcome


def _execute(subject: Subject, job: Job, outcome: Outcome) -> None:
    try:
        if job.kind == "probe":
            window = subject.execute(probe_hold, job.seconds)
            if isinstance(window, tuple):
                outcome.holds.append(window)
                outcome.granted = window[0]
            else:
                outcome.result, outcome.returned = "returned", repr(window)[:100]
            return
        fn = sandbox_attempt if subject.retries_outside_permit else sandbox_call
        value = subject.execute(fn, job.spec)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        _record_error(outcome, exc, hold=True)
        return
    _record_return(outcome, value, hold=True)


def _limited(subject: Subject, job: Job, outcome: Outcome, sleep: Callable[[float], None]) -> None:
    spec = job.spec
    attempt = 0
    call: CallResult | None = None
    while True:
        try:
            permit = subject.acquire()
        except Exception as exc:
            _record_error(outcome, exc, hold=False)
            return
        granted = time.time()
        if outcome.granted is None:
            outcome.granted = granted
        error: BaseException | None = None
        try:
            if job.kind == "probe":
                probe_hold(job.seconds)
            else:
                assert spec is not None
                call = sandbox_attempt(spec, call)
        except Exception as exc:
            error = exc
        finally:
            released = time.time()
            outcome.holds.append((granted, released))
            try:
                subject.release(permit)
            except Exception as exc:
                outcome.release_error = f"{type(exc).__name__}: {exc}"[:300]
        if error is None:
            _absorb(outcome, call, hold=False)
            return
        delay = _retry_delay(error, attempt, spec.retry_sleeps) if spec is not None else None
        if delay is None:
            _record_error(outcome, error, hold=False)
            return
        if isinstance(error, SandboxCallError):
            call = error.call
        sleep(delay)  # back off without the permit
        attempt += 1


async def run_job_async(subject: Subject, job: Job, threads: FuturesExecutor) -> Outcome:
    """Run ``job`` through ``subject`` from a coroutine; blocking HTTP goes to ``threads``."""
    subject = job.subject or subject
    loop = asyncio.get_running_loop()
    outcome = Outcome(job.kind, job.index, time.time(), worker=_worker())
    if job.spec is not None:
        outcome.planned_failure = job.spec.planned_failure
    try:
        if subject.kind == "executor":
            try:
                if job.kind == "probe":
                    value: Any = await subject.execute_async(probe_hold, job.seconds)
                    if isinstance(value, tuple):
                        outcome.holds.append(value)
                        outcome.granted = value[0]
                    return outcome
                fn = sandbox_attempt if subject.retries_outside_permit else sandbox_call
                value = await subject.execute_async(fn, job.spec)
            except Exception as exc:
                _record_error(outcome, exc, hold=True)
                return outcome
            _record_return(outcome, value, hold=True)
            return outcome
        spec = job.spec
        attempt = 0
        call: CallResult | None = None
        while True:
            try:
                permit = await subject.acquire_async()
            except Exception as exc:
                _record_error(outcome, exc, hold=False)
                return outcome
            granted = time.time()
            if outcome.granted is None:
                outcome.granted = granted
            error: BaseException | None = None
            try:
                if job.kind == "probe":
                    await asyncio.sleep(job.seconds)
                else:
                    assert spec is not None
                    call = await loop.run_in_executor(threads, sandbox_attempt, spec, call)
            except Exception as exc:
                error = exc
            finally:
                outcome.holds.append((granted, time.time()))
                try:
                    await subject.release_async(permit)
                except Exception as exc:
                    outcome.release_error = f"{type(exc).__name__}: {exc}"[:300]
            if error is None:
                _absorb(outcome, call, hold=False)
                return outcome
            delay = _retry_delay(error, attempt, spec.retry_sleeps) if spec is not None else None
            if delay is None:
                _record_error(outcome, error, hold=False)
                return outcome
            if isinstance(error, SandboxCallError):
                call = error.call
            await asyncio.sleep(delay)
            attempt += 1
    finally:
        outcome.finished = time.time()
