"""What every limiter and executor offers, the errors they raise, and the parts they share.

A *limiter* caps how many calls are in flight at once (a concurrency cap, optionally paced to a
request rate). It hands out :class:`Permit` objects: ``release(permit)`` gives back exactly that
permit, and ``release()`` with no argument gives back one the calling thread (or task, or process)
holds. Releasing a permit that was never acquired, or twice, raises :class:`PermitError` instead of
silently raising the cap, which is the first fault of the seed design.

An *executor* runs ``fn(*args, **kwargs)`` under a limiter and returns its result or raises its
exception, with its type, to the caller (the shape of the seed design's ``ExecutionWorker``).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


class PermitError(RuntimeError):
    """A release of a permit that this holder did not acquire (never, or already released)."""


class LimitMismatchError(ValueError):
    """A named limiter already exists with another limit (or rate, or lease); it is not reused."""


class LeaseExpiredWarning(RuntimeWarning):
    """A permit's lease ran out before it was released; the permit had already been reclaimed."""


@dataclass(frozen=True)
class Permit:
    """One unit of the cap, held from ``acquire`` to ``release``.

    ``token`` identifies it to the limiter; ``holder`` says who acquired it (thread, task or
    process) so that ``release()`` without an argument can find it; ``acquired_at`` is the
    limiter's monotonic clock when the permit was granted.
    """

    token: str
    holder: str
    acquired_at: float
    limiter: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@runtime_checkable
class Limiter(Protocol):
    """A concurrency cap. Every reference limiter in :mod:`mocksandbox.ratelimit` is one."""

    @property
    def limit(self) -> int:
        """Permits that may be held at once."""
        ...

    @property
    def in_flight(self) -> int:
        """Permits held right now."""
        ...

    def acquire(self, timeout: float | None = None) -> Permit:
        """Wait for a permit (at most ``timeout`` seconds, then :class:`TimeoutError`)."""
        ...

    def release(self, permit: Permit | None = None) -> None:
        """Give back ``permit`` (or one the caller holds); :class:`PermitError` if not held."""
        ...

    async def acquire_async(self, timeout: float | None = None) -> Permit:
        """:meth:`acquire` for coroutines: waits without blocking the event loop."""
        ...

    def __enter__(self) -> Permit: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    async def __aenter__(self) -> Permit: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


@runtime_checkable
class Executor(Protocol):
    """Runs a callable under a limiter: the shape of the seed design's ``ExecutionWorker``.

    The result comes back as ``fn`` returned it; an exception ``fn`` raised comes back raised,
    with its type (never logged and turned into ``None``).
    """

    def execute(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...


# -- helpers shared by the reference limiters ----------------------------------------------------

#: Permits entered with ``with limiter:`` / ``async with limiter:``, per limiter, per context.
#: A context variable: each thread and each asyncio task sees its own stack.
_ENTERED: contextvars.ContextVar[dict[str, tuple[Permit, ...]]] = contextvars.ContextVar(
    "mocksandbox_ratelimit_entered"
)
_instance_ids = itertools.count(1)


def current_holder() -> str:
    """Who is asking: the asyncio task when inside one, else the thread (with the process)."""
    import os

    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    if task is not None:
        return f"{os.getpid()}:task:{id(task)}"
    return f"{os.getpid()}:thread:{threading.get_ident()}"


class PermitIssuer:
    """The permit bookkeeping the in-process limiters share: numbered tokens, the held table,
    and each grant's start slot from the pacer. Callers serialise access (a lock, or one loop)."""

    name: str
    _clock: Callable[[], float]
    _pacer: Pacer
    _tokens: Iterator[int]
    _held: dict[str, Permit]

    def _grant(self, holder: str) -> Permit:
        permit = Permit(
            f"{self.name}-{next(self._tokens)}",
            holder,
            self._clock(),
            self.name,
            {"start_at": self._pacer.reserve()},
        )
        self._held[permit.token] = permit
        return permit


class ContextManagerMixin:
    """``with``/``async with`` on top of ``acquire``/``acquire_async``/``release``.

    The permit taken on entry is the one released on exit, even when several are nested or
    another thread uses the same limiter at the same time.
    """

    _context_key: str

    def acquire(self, timeout: float | None = None) -> Permit:
        raise NotImplementedError

    async def acquire_async(self, timeout: float | None = None) -> Permit:
        raise NotImplementedError

    def release(self, permit: Permit | None = None) -> None:
        raise NotImplementedError

    def _key(self) -> str:
        key = getattr(self, "_context_key", None)
        if key is None:
            key = f"limiter-{next(_instance_ids)}"
            self._context_key = key
        return key

    def _push(self, permit: Permit) -> None:
        entered = dict(_ENTERED.get({}))
        key = self._key()
        entered[key] = (*entered.get(key, ()), permit)
        _ENTERED.set(entered)

    def _pop(self) -> Permit:
        entered = dict(_ENTERED.get({}))
        key = self._key()
        stack = entered.get(key, ())
        if not stack:
            raise PermitError("__exit__ without a matching __enter__ in this thread/task")
        entered[key] = stack[:-1]
        _ENTERED.set(entered)
        return stack[-1]

    def __enter__(self) -> Permit:
        permit = self.acquire()
        self._push(permit)
        return permit

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release(self._pop())

    async def __aenter__(self) -> Permit:
        permit = await self.acquire_async()
        self._push(permit)
        return permit

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release(self._pop())


async def acquire_in_thread(acquire: Callable[[], Permit], release: Callable[[Permit], None]) -> Permit:
    """Run a blocking ``acquire`` in a worker thread, safe against cancellation.

    If the awaiting task is cancelled (or times out) while the thread is still waiting, the
    permit the thread obtains later is released at once instead of leaking.
    """
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, acquire)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:

        def give_back(done: asyncio.Future[Permit]) -> None:
            if not done.cancelled() and done.exception() is None:
                release(done.result())

        future.add_done_callback(give_back)
        raise


class Pacer:
    """Requests-per-second pacing on top of a concurrency cap: starts at least ``1/rate`` apart.

    ``reserve()`` is called when a permit is granted (in grant order, under the limiter's lock)
    and returns the monotonic time at which the holder may start; the holder waits until then.
    With ``burst`` > 1, that many starts may happen back to back after an idle spell.
    """

    def __init__(
        self, rate: float | None, burst: int = 1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate is not None and rate <= 0:
            raise ValueError("rate must be positive (requests per second) or None")
        if burst < 1:
            raise ValueError("burst must be at least 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._next = float("-inf")

    @property
    def interval(self) -> float:
        return 0.0 if self.rate is None else 1.0 / self.rate

    def reserve(self) -> float:
        """The earliest start for the next holder (GCRA: a virtual schedule one interval apart)."""
        now = self._clock()
        if self.rate is None:
            return now
        start = max(now, self._next - (self.burst - 1) * self.interval)
        self._next = max(self._next, start) + self.interval
        return start


def wait_until(start_at: float, clock: Callable[[], float], sleep: Callable[[float], None]) -> None:
    """Sleep until ``clock()`` reaches ``start_at`` (pacing)."""
    delay = start_at - clock()
    if delay > 0:
        sleep(delay)


async def wait_until_async(start_at: float, clock: Callable[[], float]) -> None:
    delay = start_at - clock()
    if delay > 0:
        await asyncio.sleep(delay)


def check_limit(limit: int) -> int:
    """Validate a limit."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be a positive integer, not {limit!r}")
    return limit
