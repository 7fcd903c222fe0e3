"""The control state of a worker pool, held by its master, with a fast path in the workers.

Most requests need nothing from the control state but a journal id in arrival order and a place
under the cap; those come from :class:`~mocksandbox.control.counters.SharedCounters`, which every
worker maps. A worker then *tells* the master what happened (the request as it arrived, its answer,
the in-flight changes), one way, on a socket of its own (a channel), and does not wait.
Only what needs the master's objects goes the long way, as a call that waits for its answer: an
admission while fault rules are in force (their schedules count in one place) or while over-cap
requests queue for a slot; and every read.

Why this is exact: the counters are changed under one lock by every process, so ids, the in-flight
count and its peak are what one process would give; fault decisions and queueing happen in the
master only. Every read first *drains* the channels
(:meth:`~mocksandbox.control.shared.ControlStateServer.drain`): a worker sends what it tells before
it answers its client, so whatever a client saw answered before it asked is in the
journal when it reads. A reset starts a new epoch; what a worker tells of an older one is dropped.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mocksandbox.control.counters import InFlightChange, SharedCounters
from mocksandbox.control.state import Admission, CapacityPolicy, IncomingRequest, LocalControlState
from mocksandbox.faults import FaultRule, FaultSpec
from mocksandbox.journal import InFlight, JournalEntry

#: How long a request queued for a slot sleeps at most before it looks again: a worker's leave is
#: counted at once but told to the master a moment later, so the master's wake-up is a hint.
_QUEUE_POLL_S = 0.05


class SharedInFlight(InFlight):
    """The in-flight count in :class:`SharedCounters` (exact across processes), and its timeline
    here, assembled from the changes every process makes (each stamped inside the counters' lock,
    so time order is the order in which they happened)."""

    def __init__(self, counters: SharedCounters, timeline_limit: int = 100_000) -> None:
        self.counters = counters
        super().__init__(timeline_limit)

    def enter(self, cap: int | None = None, wait: float | None = 0.0) -> bool:
        deadline = None if wait is None else time.monotonic() + wait
        with self._cond:  # looked at and waited on under it: a leave told meanwhile wakes us
            while True:
                change = self.counters.enter(cap)
                if change is not None:
                    self.record(change)
                    return True
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(_QUEUE_POLL_S if remaining is None else min(remaining, _QUEUE_POLL_S))

    def leave(self) -> None:
        self.record(self.counters.leave())

    def record(self, change: InFlightChange) -> None:
        """A change of the count, made here or in a worker; wakes requests queued for a slot."""
        with self._cond:
            point = (change.at - self._origin, change.in_flight)
            timeline = self.timeline
            if not timeline or timeline[-1][0] <= point[0]:
                timeline.append(point)
            else:  # told by a worker after a later change made elsewhere
                index = len(timeline)
                while index > 0 and timeline[index - 1][0] > point[0]:
                    index -= 1
                if len(timeline) == timeline.maxlen:
                    timeline.popleft()
                    index = max(0, index - 1)
                timeline.insert(index, point)
            self._cond.notify_all()

    def snapshot(self) -> dict[str, Any]:
        counts = self.counters.snapshot()
        return {"in_flight": counts.in_flight, "max_in_flight": counts.max_in_flight}

    def peak_since(self, since: float) -> tuple[float, int, int]:
        with self._cond:
            self.current = self.counters.snapshot().in_flight
        return super().peak_since(since)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


class PooledControlState(LocalControlState):
    """The master's control state: a :class:`LocalControlState` whose ids and in-flight count live
    in ``counters`` (shared with the workers), fed by what the workers tell (:meth:`told`)."""

    def __init__(
        self,
        journal_limit: int = 10_000,
        capacity: CapacityPolicy | None = None,
        directory: str | None = None,
    ) -> None:
        super().__init__(journal_limit, capacity)
        # A directory of its own, private: the counters are the server's business only.
        self._directory = Path(tempfile.mkdtemp(prefix="mocksandbox-counters-", dir=directory))
        counters = self.counters = SharedCounters.create(str(self._directory / "counters"))
        self.shared_in_flight = SharedInFlight(counters)
        self.in_flight = self.shared_in_flight
        self.epoch = counters.snapshot().epoch
        #: Reads call this first: the server sets it to drain what workers told and it has not read.
        self.drain: Callable[[], None] = lambda: None
        #: Held while a told message is applied and during a reset (a reset must not interleave).
        self.feed_lock = threading.RLock()
        self._open_fast_path()

    # -- what workers tell, one way -------------------------------------------------------------

    def told(self, message: tuple[Any, ...]) -> None:
        """Apply one message a worker sent (see :mod:`mocksandbox.control.shared`); the caller
        holds :attr:`feed_lock`."""
        kind, epoch = message[0], message[1]
        if epoch is not None and epoch != self.epoch:
            return  # a request admitted before the last reset, which forgot it
        if kind == "begin":
            _, _, at, entry_id, method, path, query, body, client, worker, change = message
            self.journal.begin(method, path, query, body, client, worker, entry_id=entry_id, at=at)
            if change is not None:
                self.shared_in_flight.record(InFlightChange(*change))
        elif kind == "finish":
            _, _, at, entry_id, status, response, outcome, change, divergences = message
            self.journal.finish_id(entry_id, status, response, outcome, at, divergences)
            if change is not None:
                self.shared_in_flight.record(InFlightChange(*change))
        elif kind == "leave":
            self.shared_in_flight.record(InFlightChange(*message[3]))

    # -- the slow path: admissions that need the master ------------------------------------------

    def admit(
        self, request: IncomingRequest, permit: Callable[[int, CapacityPolicy], bool] | None = None
    ) -> Admission:
        entry_id, _ = self.counters.next_id()
        entry = self.journal.begin(
            request.method,
            request.path,
            request.query,
            request.body,
            request.client,
            request.worker,
            entry_id=entry_id,
            at=time.monotonic(),
        )
        return self._decide(entry, request, permit)

    # -- what opens and closes the fast path ----------------------------------------------------

    def _open_fast_path(self) -> None:
        """Workers admit by themselves unless a fault rule is in force or over-cap requests queue."""
        policy = self._capacity
        fast = not self.faults.rules() and not self.queueing
        self.counters.configure(fast, policy.max_in_flight, policy.retry_after_s)

    @property
    def queueing(self) -> bool:
        """Whether over-cap requests wait in this process for a slot (``overload: queue``)."""
        return self._capacity.max_in_flight is not None and self._capacity.wait_seconds() != 0.0

    def _close_fast_path(self, policy: CapacityPolicy) -> None:
        self.counters.configure(False, policy.max_in_flight, policy.retry_after_s)

    def add_faults(self, specs: list[FaultSpec]) -> list[FaultRule]:
        # Closed first: no request may be admitted past a rule that is already in force.
        self._close_fast_path(self._capacity)
        try:
            return super().add_faults(specs)
        finally:
            self._open_fast_path()

    def remove_fault(self, rule_id: str) -> bool:
        removed = super().remove_fault(rule_id)
        self._open_fast_path()
        return removed

    def clear_faults(self) -> list[str]:
        removed = super().clear_faults()
        self._open_fast_path()
        return removed

    def set_capacity(self, policy: CapacityPolicy) -> None:
        self._close_fast_path(policy)
        super().set_capacity(policy)
        self._open_fast_path()
        self.shared_in_flight.wake()  # a higher cap lets queued requests in

    # -- reads: what the workers told first -----------------------------------------------------

    def entries(self) -> list[JournalEntry]:
        self.drain()
        return super().entries()

    def stats(self) -> dict[str, Any]:
        self.drain()
        return super().stats()

    def timeline(self) -> list[tuple[float, int]]:
        self.drain()
        return super().timeline()

    def live_view(self, after: int, pending: list[int], since: float, limit: int = 200) -> dict[str, Any]:
        self.drain()
        return super().live_view(after, pending, since, limit)

    def entry(self, entry_id: int) -> JournalEntry | None:
        self.drain()
        return super().entry(entry_id)

    def next_replay(self, entry_id: int | None, key: str, labels: list[str]) -> int:
        self.drain()  # the entry to mark may still be on its way
        return super().next_replay(entry_id, key, labels)

    def note_event(self, text: str, worker: str | None = None) -> None:
        """Journal something that happened to the pool (a worker replaced), in the journal's order."""
        entry_id, _ = self.counters.next_id()
        self.journal.note_event(text, worker, entry_id=entry_id)

    def close(self) -> None:
        """Unmap and remove the counters (workers that still map them keep their copy's pages)."""
        self.counters.close()
        shutil.rmtree(self._directory, ignore_errors=True)

    def reset(self, faults: list[FaultSpec], capacity: CapacityPolicy) -> None:
        with self.feed_lock:
            self.drain()
            self._close_fast_path(capacity)
            self.epoch = self.counters.reset()
            super().reset(faults, capacity)
            self._open_fast_path()
            self.shared_in_flight.wake()
