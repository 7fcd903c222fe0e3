"""A FIFO-fair limiter for threads (and coroutines on any event loop) in one process."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from mocksandbox.ratelimit.base import (
    ContextManagerMixin,
    LimitMismatchError,
    Pacer,
    Permit,
    PermitError,
    PermitIssuer,
    check_limit,
    current_holder,
    wait_until,
    wait_until_async,
)


@dataclass(eq=False)
class _Waiter:
    holder: str
    event: threading.Event | None = None
    future: asyncio.Future[Permit] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    permit: Permit | None = None


class FairLimiter(PermitIssuer, ContextManagerMixin):
    """At most ``limit`` permits held at once, granted strictly in the order they were asked for.

    A released permit is handed straight to the longest waiter (no barging: a newcomer cannot
    overtake the queue, so back-off cannot starve anyone). Thread-safe; coroutines may wait with
    ``await acquire_async()`` / ``async with`` without blocking their loop, on any loop.

    ``rate`` (requests per second) paces the starts on top of the cap: each holder waits, after
    its grant and in grant order, until its slot in a schedule ``1/rate`` apart.
    """

    def __init__(
        self,
        limit: int,
        *,
        rate: float | None = None,
        burst: int = 1,
        name: str = "fair",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._limit = check_limit(limit)
        self.name = name
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._pacer = Pacer(rate, burst, clock)
        self._lock = threading.Lock()
        self._held: dict[str, Permit] = {}
        self._waiters: deque[_Waiter] = deque()
        self._tokens = itertools.count(1)
        self.granted_total = 0

    # -- the protocol --------------------------------------------------------------------------

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._held)

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiters)

    def acquire(self, timeout: float | None = None) -> Permit:
        holder = current_holder()
        with self._lock:
            if not self._waiters and len(self._held) < self._limit:
                permit = self._grant(holder)
                waiter = None
            else:
                waiter = _Waiter(holder, event=threading.Event())
                self._waiters.append(waiter)
        if waiter is not None:
            assert waiter.event is not None
            if not waiter.event.wait(timeout):
                with self._lock:
                    if waiter.permit is None:  # not granted meanwhile: leave the queue
                        self._waiters.remove(waiter)
                        raise TimeoutError(f"no permit of {self.name!r} within {timeout} s")
            assert waiter.permit is not None
            permit = waiter.permit
        wait_until(permit.extra["start_at"], self._clock, self._sleep)
        return permit

    async def acquire_async(self, timeout: float | None = None) -> Permit:
        holder = current_holder()
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._waiters and len(self._held) < self._limit:
                permit: Permit | None = self._grant(holder)
                waiter = None
            else:
                permit = None
                waiter = _Waiter(holder, future=loop.create_future(), loop=loop)
                self._waiters.append(waiter)
        if waiter is not None:
            assert waiter.future is not None
            try:
                permit = await asyncio.wait_for(waiter.future, timeout)
            except (asyncio.CancelledError, TimeoutError):
                with self._lock:
                    granted = waiter.permit
                    if granted is None:
                        self._waiters.remove(waiter)
                future = waiter.future
                if granted is not None and future.done() and not future.cancelled():
                    self.release(granted)  # delivered, then cancelled before we resumed
                # else, if granted: resolve() finds the future cancelled and gives the permit back.
                raise
        assert permit is not None
        await wait_until_async(permit.extra["start_at"], self._clock)
        return permit

    def release(self, permit: Permit | None = None) -> None:
        with self._lock:
            if permit is None:
                permit = self._held_by_caller()
            elif self._held.get(permit.token) is not permit:
                raise PermitError(
                    f"permit {permit.token!r} is not held from {self.name!r} (released twice, or "
                    "never acquired here)"
                )
            del self._held[permit.token]
            handoff = self._next_waiter()
        if handoff is not None:
            self._deliver(*handoff)

    # -- internals -----------------------------------------------------------------------------

    def _held_by_caller(self) -> Permit:
        holder = current_holder()
        for permit in reversed(self._held.values()):
            if permit.holder == holder:
                return permit
        raise PermitError(
            f"release() without a permit: {holder} holds none from {self.name!r} (an acquire that "
            "failed, or a release registered before the acquire returned?)"
        )

    def _grant(self, holder: str) -> Permit:
        self.granted_total += 1
        return super()._grant(holder)

    def _next_waiter(self) -> tuple[_Waiter, Permit] | None:
        """Under the lock: grant the freed permit to the first waiter, if any."""
        if not self._waiters or len(self._held) >= self._limit:
            return None
        waiter = self._waiters.popleft()
        waiter.permit = self._grant(waiter.holder)
        return waiter, waiter.permit

    def _deliver(self, waiter: _Waiter, permit: Permit) -> None:
        if waiter.event is not None:
            waiter.event.set()
            return
        assert waiter.future is not None and waiter.loop is not None
        future = waiter.future

        def resolve() -> None:
            if future.done():  # the waiting task was cancelled or timed out: hand the permit on
                self.release(permit)
            else:
                future.set_result(permit)

        try:
            waiter.loop.call_soon_threadsafe(resolve)
        except RuntimeError:  # that loop is closed: nobody will take this permit
            self.release(permit)

    def __repr__(self) -> str:
        return f"FairLimiter(limit={self._limit}, in_flight={self.in_flight}, name={self.name!r})"


_SHARED: dict[str, FairLimiter] = {}
_SHARED_LOCK = threading.Lock()


def shared_limiter(name: str, limit: int, rate: float | None = None) -> FairLimiter:
    """The process-wide :class:`FairLimiter` called ``name``, created on first use.

    Asking again with another ``limit`` or ``rate`` raises :class:`LimitMismatchError` rather than
    silently handing back the first one (the third fault of the seed design).
    """
    with _SHARED_LOCK:
        existing = _SHARED.get(name)
        if existing is None:
            existing = _SHARED[name] = FairLimiter(limit, rate=rate, name=name)
        elif (existing.limit, existing.rate) != (limit, rate):
            raise LimitMismatchError(
                f"limiter {name!r} exists with limit={existing.limit}, rate={existing.rate}; asked for "
                f"limit={limit}, rate={rate}. Use another name, or drop_shared_limiter({name!r}) first."
            )
        return existing


def drop_shared_limiter(name: str) -> None:
    """Forget the shared limiter ``name`` (holders keep their permits on the old object)."""
    with _SHARED_LOCK:
        _SHARED.pop(name, None)
