"""How many runs start at once: at most ``slots`` runs in their first ``starting_s`` seconds, the
others waiting their turn, first come first served (:class:`RunGate`).

Why. A run's cost is mostly its start and its end: a relay forks a warm interpreter, the program
copies the pages it writes, its exit tears its page tables down. Sixteen such runs at once on two
cores interleave all of that, and each process finds its pages evicted from the caches by the
fifteen others; the same runs a core at a time find them warm. Measured on a 2-core VM, verl-like
runs, a new connection per request at concurrency 16: about 7% less CPU a run with two starting at
once (four: 5%), and a verl reward batch (64 requests at once) 11% faster with 19% less CPU a run.

What it does not change. SandboxFusion runs every request at once, and so, past their start, does
the mock: a run counts as starting for ``starting_s`` (20 ms by default) only, so that one that
sleeps, waits for input or computes for long holds its place no longer than that; every run waiting
gets a place at least every ``starting_s / slots``. A run's timeout starts with the run, not with the
wait (``ProcessRunner``), and nothing in an answer tells a waited run from another. Turned off with
``starting_runs: 0``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable


class RunGate:
    """At most ``slots`` runs starting at once; a run starts when it has a place, and holds it until
    it ends or ``starting_s`` have passed. Waiting runs take places in the order they came.

    ``enter()`` waits for a place and returns a ticket; ``leave(ticket)`` gives the place back (a
    no-op once the run has held it for ``starting_s``). Thread-safe; nothing to reset (a ticket
    lives as long as its run)."""

    def __init__(self, slots: int, starting_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if slots < 1:
            raise ValueError(f"a run gate needs at least one place, not {slots}")
        self.slots = slots
        self.starting_s = starting_s
        self._clock = clock
        self._lock = threading.Lock()
        #: The runs holding a place: ticket -> when it entered, in the order they entered.
        self._starting: dict[int, float] = {}
        #: The runs waiting, first come first: each waits on its own lock, released for its turn.
        self._queue: deque[threading.Lock] = deque()
        self._tickets = itertools.count(1)

    @property
    def waiting(self) -> int:
        """How many runs are waiting for a place."""
        return len(self._queue)

    @property
    def starting(self) -> int:
        """How many runs hold a place (as of the last enter or leave)."""
        return len(self._starting)

    def describe(self) -> str:
        """``2 at once, each for its first 20 ms``."""
        return f"{self.slots} at once, each for its first {self.starting_s * 1000:g} ms"

    def enter(self) -> int:
        """Wait for a place; the ticket to give back to :meth:`leave`."""
        with self._lock:
            now = self._clock()
            self._let_grow(now)
            if not self._queue and len(self._starting) < self.slots:
                return self._admit(now)
            turn = threading.Lock()
            turn.acquire()
            self._queue.append(turn)
        try:
            return self._wait_for_turn(turn)
        except BaseException:  # (interrupted: its turn must not hold the queue up)
            with self._lock:
                if turn in self._queue:
                    first = self._queue[0] is turn
                    self._queue.remove(turn)
                    if first:
                        self._wake_first()
            raise

    def _wait_for_turn(self, turn: threading.Lock) -> int:
        while True:
            with self._lock:
                now = self._clock()
                self._let_grow(now)
                if self._queue[0] is not turn:
                    timeout = -1.0  # (until it is first: see _wake_first)
                elif len(self._starting) < self.slots:
                    self._queue.popleft()
                    ticket = self._admit(now)
                    self._wake_first()  # (the next may have a place too, or must time its wait)
                    return ticket
                else:  # until a place is given back, or the oldest run has started long enough
                    oldest = next(iter(self._starting.values()))
                    timeout = oldest + self.starting_s - now
            turn.acquire(timeout=timeout)  # (released by _wake_first, before or while it waits)

    def leave(self, ticket: int) -> None:
        """The run is over: its place, if it still held one, goes to the first run waiting."""
        with self._lock:
            if self._starting.pop(ticket, None) is not None:
                self._wake_first()

    def _admit(self, now: float) -> int:
        ticket = next(self._tickets)
        self._starting[ticket] = now
        return ticket

    def _let_grow(self, now: float) -> None:
        """Runs that have started long enough give their places up (oldest first)."""
        starting = self._starting
        while starting:
            ticket, since = next(iter(starting.items()))
            if since + self.starting_s > now:
                return
            del starting[ticket]

    def _wake_first(self) -> None:
        if self._queue:
            first = self._queue[0]
            if first.locked():
                first.release()
