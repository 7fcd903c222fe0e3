"""A FIFO-fair limiter for coroutines on one asyncio event loop."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable

from mocksandbox.ratelimit.base import (
    ContextManagerMixin,
    Pacer,
    Permit,
    PermitError,
    PermitIssuer,
    check_limit,
    current_holder,
    wait_until_async,
)


class AsyncioLimiter(PermitIssuer, ContextManagerMixin):
    """At most ``limit`` permits held at once among the coroutines of one event loop, FIFO.

    No locks: everything happens on the loop that first waited on it (using it from another loop
    raises :class:`RuntimeError`). A cancelled or timed-out waiter never keeps a permit. The
    blocking :meth:`acquire` only succeeds when a permit is free right now (blocking would stall
    the loop); coroutines use ``async with limiter`` or ``await limiter.acquire_async()``.
    """

    def __init__(
        self,
        limit: int,
        *,
        rate: float | None = None,
        burst: int = 1,
        name: str = "asyncio",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = check_limit(limit)
        self.name = name
        self.rate = rate
        self._clock = clock
        self._pacer = Pacer(rate, burst, clock)
        self._held: dict[str, Permit] = {}
        self._waiters: deque[tuple[asyncio.Future[Permit], str]] = deque()
        self._tokens = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_flight(self) -> int:
        return len(self._held)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None or self._loop.is_closed():
            self._loop, self._thread = loop, threading.get_ident()
        elif self._loop is not loop:
            raise RuntimeError(f"AsyncioLimiter {self.name!r} is bound to another event loop")
        return loop

    async def acquire_async(self, timeout: float | None = None) -> Permit:
        loop = self._bind()
        holder = current_holder()
        if not self._waiters and len(self._held) < self._limit:
            permit = self._grant(holder)
        else:
            future: asyncio.Future[Permit] = loop.create_future()
            entry = (future, holder)
            self._waiters.append(entry)
            try:
                permit = await asyncio.wait_for(future, timeout)
            except (asyncio.CancelledError, TimeoutError):
                if entry in self._waiters:
                    self._waiters.remove(entry)
                elif future.done() and not future.cancelled():
                    self.release(future.result())  # granted, then cancelled before resuming
                raise
        await wait_until_async(permit.extra["start_at"], self._clock)
        return permit

    def acquire(self, timeout: float | None = None) -> Permit:
        if not self._waiters and len(self._held) < self._limit:
            return self._grant(current_holder())
        raise RuntimeError(
            f"AsyncioLimiter {self.name!r} is full: waiting here would block the event loop; use "
            "`async with limiter` or `await limiter.acquire_async()` (or FairLimiter from threads)"
        )

    def release(self, permit: Permit | None = None) -> None:
        if self._loop is not None and self._thread not in (None, threading.get_ident()):
            if self._loop.is_closed():
                raise RuntimeError(f"AsyncioLimiter {self.name!r}: its event loop is closed")
            if permit is None:
                raise PermitError("release() from another thread needs the permit to release")
            self._loop.call_soon_threadsafe(self.release, permit)
            return
        if permit is None:
            holder = current_holder()
            mine = [p for p in self._held.values() if p.holder == holder]
            if not mine:
                raise PermitError(
                    f"release() without a permit: {holder} holds none from {self.name!r} (an acquire "
                    "that failed, or a release registered before the acquire returned?)"
                )
            permit = mine[-1]
        elif self._held.get(permit.token) is not permit:
            raise PermitError(f"permit {permit.token!r} is not held from {self.name!r}")
        del self._held[permit.token]
        while self._waiters and len(self._held) < self._limit:
            future, holder = self._waiters.popleft()
            if future.done():  # cancelled while queued and not yet removed
                continue
            future.set_result(self._grant(holder))

    def __repr__(self) -> str:
        return f"AsyncioLimiter(limit={self._limit}, in_flight={self.in_flight}, name={self.name!r})"
