"""The control state's counters in memory that every server process of one machine maps.

What each request needs at admission (a journal id in arrival order, the in-flight count against
the cap, the reset generation) is a handful of integers. With several worker processes, asking the
process that holds the control state for them costs a round trip each way and a thread switch in
both processes; reading and writing them here, in a file that every process maps, under an
exclusive ``flock`` costs a few microseconds. Everything that needs more than integers (the
journal's entries, the fault rules with their counters and random streams, queueing for a slot)
stays with the state's holder (see :mod:`mocksandbox.control.pooled`): :attr:`SharedCounters.fast`
says whether a request may be admitted here at all.

Layout: one record of :data:`_LAYOUT` at offset 0. ``flock`` locks belong to an open file, not a
thread, so each process also holds a thread lock around it.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

# seq, epoch, in_flight, max_in_flight, cap (-1: none), fast (0/1), retry_after_s
_LAYOUT = struct.Struct("=qqqqqqd")
_NO_CAP = -1


class InFlightChange(NamedTuple):
    """One change of the in-flight count: when (a ``time.monotonic()`` reading taken inside the
    lock, so that time order is the order of the changes across processes) and the count after."""

    at: float
    in_flight: int


class FastAdmission(NamedTuple):
    """What :meth:`SharedCounters.admit` decided: the journal id, the reset generation it belongs
    to, when it arrived, whether the cap let it in, and the in-flight change if it did."""

    entry_id: int
    epoch: int
    at: float
    admitted: bool
    retry_after_s: float
    change: InFlightChange | None


@dataclass(frozen=True)
class Snapshot:
    seq: int
    epoch: int
    in_flight: int
    max_in_flight: int
    cap: int | None
    fast: bool
    retry_after_s: float


class SharedCounters:
    """The counters at ``path``, created with :meth:`create` by the state's holder and opened with
    :meth:`open` by each worker. Every method is atomic across processes and threads."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self._map = mmap.mmap(self._fd, _LAYOUT.size)
        self._thread_lock = threading.Lock()

    @classmethod
    def create(cls, path: str) -> SharedCounters:
        """A new file of counters at ``path`` (private to its owner), all zero, nothing fast."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, _LAYOUT.pack(0, 0, 0, 0, _NO_CAP, 0, 1.0))
        finally:
            os.close(fd)
        return cls(path)

    @classmethod
    def open(cls, path: str) -> SharedCounters:
        """The counters a :meth:`create` made at ``path``."""
        return cls(path)

    def close(self) -> None:
        with self._thread_lock:
            if not self._map.closed:
                self._map.close()
                os.close(self._fd)

    # -- the lock -----------------------------------------------------------------------------------

    def _read(self) -> list[int | float]:
        return list(_LAYOUT.unpack_from(self._map))

    def _write(self, values: list[int | float]) -> None:
        _LAYOUT.pack_into(self._map, 0, *values)

    class _Locked:
        def __init__(self, counters: SharedCounters) -> None:
            self.counters = counters

        def __enter__(self) -> list[int | float]:
            counters = self.counters
            counters._thread_lock.acquire()
            try:
                fcntl.flock(counters._fd, fcntl.LOCK_EX)
            except BaseException:
                counters._thread_lock.release()
                raise
            return counters._read()

        def __exit__(self, *exc: object) -> None:
            counters = self.counters
            try:
                fcntl.flock(counters._fd, fcntl.LOCK_UN)
            finally:
                counters._thread_lock.release()

    def _locked(self) -> SharedCounters._Locked:
        """``with self._locked() as values:`` the record, read under the lock; written back with
        :meth:`_write` inside the block."""
        return SharedCounters._Locked(self)

    # -- the request path ---------------------------------------------------------------------------

    def admit(self) -> FastAdmission | None:
        """Admit a request here if the fast path is open: its journal id, and the cap's verdict
        (``reject`` only: queueing needs the state's holder). ``None``: ask the holder instead."""
        with self._locked() as values:
            seq, epoch, in_flight, most, cap, fast, retry = values
            if not fast:
                return None
            seq = int(seq) + 1
            at = time.monotonic()
            if cap != _NO_CAP and in_flight >= cap:
                values[0] = seq
                self._write(values)
                return FastAdmission(seq, int(epoch), at, False, float(retry), None)
            in_flight = int(in_flight) + 1
            self._write([seq, epoch, in_flight, max(int(most), in_flight), cap, fast, retry])
            return FastAdmission(seq, int(epoch), at, True, float(retry), InFlightChange(at, in_flight))

    def next_id(self) -> tuple[int, int]:
        """A journal id for something the holder journals itself: ``(id, epoch)``."""
        with self._locked() as values:
            values[0] = int(values[0]) + 1
            self._write(values)
            return int(values[0]), int(values[1])

    def enter(self, cap: int | None) -> InFlightChange | None:
        """One more request in flight if ``cap`` allows (``None``: no cap); ``None`` when full."""
        with self._locked() as values:
            in_flight = int(values[2])
            if cap is not None and in_flight >= cap:
                return None
            values[2] = in_flight + 1
            values[3] = max(int(values[3]), in_flight + 1)
            self._write(values)
            return InFlightChange(time.monotonic(), in_flight + 1)

    def leave(self) -> InFlightChange:
        """A request leaves the count (never below zero: a reset zeroes it while requests are in
        flight, as one process does)."""
        with self._locked() as values:
            values[2] = max(0, int(values[2]) - 1)
            self._write(values)
            return InFlightChange(time.monotonic(), int(values[2]))

    # -- the holder's side --------------------------------------------------------------------------

    def configure(self, fast: bool, cap: int | None, retry_after_s: float) -> None:
        """Open or close the fast path, and set the cap it applies."""
        with self._locked() as values:
            values[4] = _NO_CAP if cap is None else cap
            values[5] = int(fast)
            values[6] = retry_after_s
            self._write(values)

    def reset(self) -> int:
        """A new generation: ids from 1 again, nothing in flight, no peak; the new epoch."""
        with self._locked() as values:
            epoch = int(values[1]) + 1
            self._write([0, epoch, 0, 0, values[4], values[5], values[6]])
            return epoch

    def snapshot(self) -> Snapshot:
        with self._locked() as values:
            seq, epoch, in_flight, most, cap, fast, retry = values
        return Snapshot(
            int(seq),
            int(epoch),
            int(in_flight),
            int(most),
            None if cap == _NO_CAP else int(cap),
            bool(fast),
            float(retry),
        )
