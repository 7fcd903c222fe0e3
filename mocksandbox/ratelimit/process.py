"""A limiter shared by the processes of one machine: a small table in a shared file, under a file lock.

Why it survives its holders: the table records, for every permit and every waiter, the process
(pid and start time, so a reused pid is not mistaken for the holder) and thread that holds or wants
it. The file lock is ``flock``, which the kernel drops when a process dies, so a process killed
inside the critical section cannot wedge the others. When a waiter finds no free permit it checks
the holders: permits of dead processes (zombies included) are taken back. Waiters are served in
ticket order (FIFO across processes), and a dead waiter is skipped.

Waiting is polling (0.5 ms growing to 5 ms): simple and robust, at the cost of a few milliseconds of
hand-over latency. The file lives in ``/dev/shm`` where there is one (memory, not disk).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from mocksandbox.ratelimit.base import (
    ContextManagerMixin,
    LimitMismatchError,
    Permit,
    PermitError,
    acquire_in_thread,
    check_limit,
    wait_until,
)

_MAGIC = b"MSBXLIM1"
# magic, limit, max_waiters, waiters' high-water mark, rate (0: none), pacing schedule (monotonic),
# next token, next ticket
_HEADER = struct.Struct("<8siiiddqq")
# token (0: free), pid, thread id, process start time, acquired at (monotonic)
_SLOT = struct.Struct("<qiqdd")
# ticket (0: empty), pid, thread id, process start time
_WAITER = struct.Struct("<qiqd")
_POLL_MIN, _POLL_MAX = 0.0005, 0.005


def _default_directory() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def _process_start(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return -1.0


def _alive(pid: int, started: float) -> bool:
    """Whether the process that took the entry still runs (not a zombie, not a reused pid)."""
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ProcessLimiter(ContextManagerMixin):
    """At most ``limit`` permits held at once by all the processes of this machine using ``name``.

    Pass the object to child processes (it pickles as its name and re-opens the table there), or
    construct it with the same ``name`` anywhere on the machine. Constructing it with another
    ``limit`` or ``rate`` for an existing name raises :class:`LimitMismatchError`. Permits of a
    process that died are reclaimed by the next waiter that needs one. :meth:`unlink` removes the
    table when no one needs it any more.
    """

    def __init__(
        self,
        limit: int,
        name: str = "default",
        *,
        rate: float | None = None,
        directory: str | os.PathLike[str] | None = None,
        max_waiters: int = 1024,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._limit = check_limit(limit)
        if rate is not None and rate <= 0:
            raise ValueError("rate must be positive (requests per second) or None")
        if "/" in name or not name:
            raise ValueError(f"invalid limiter name {name!r}")
        self.name = name
        self.rate = rate
        self.path = Path(directory or _default_directory()) / f"mocksandbox-limiter-{name}"
        self._requested_waiters = max_waiters
        self._clock = clock
        self._sleep = sleep
        self._open()

    # -- file and mapping ----------------------------------------------------------------------

    def _open(self) -> None:
        self._pid = os.getpid()
        self._my_start = _process_start(self._pid)
        #: Permits of dead processes this process took back (for reports and tests).
        self.reclaimed = 0
        self._thread_lock = threading.Lock()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                size = os.fstat(fd).st_size
                if size == 0:
                    self._max_waiters = self._requested_waiters
                    os.ftruncate(fd, self._size(self._limit, self._max_waiters))
                    header = _HEADER.pack(
                        _MAGIC, self._limit, self._max_waiters, 0, self.rate or 0.0, float("-inf"), 1, 1
                    )
                    os.pwrite(fd, header, 0)
                else:
                    raw = os.pread(fd, _HEADER.size, 0)
                    magic, limit, max_waiters, _high, rate, *_ = _HEADER.unpack(raw)
                    if magic != _MAGIC:
                        raise ValueError(f"{self.path} is not a mocksandbox limiter table")
                    if limit != self._limit or (rate or None) != self.rate:
                        raise LimitMismatchError(
                            f"process limiter {self.name!r} exists with limit={limit}, "
                            f"rate={rate or None}; asked for limit={self._limit}, rate={self.rate}. "
                            f"Use another name, or ProcessLimiter.unlink_name({self.name!r}) when no "
                            "process uses it."
                        )
                    self._max_waiters = max_waiters
                self._map = mmap.mmap(fd, self._size(self._limit, self._max_waiters))
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    @staticmethod
    def _size(limit: int, max_waiters: int) -> int:
        return _HEADER.size + limit * _SLOT.size + max_waiters * _WAITER.size

    def _ensure_process(self) -> None:
        # After fork the descriptor is shared with the parent, and flock would not exclude us.
        if os.getpid() != self._pid:
            self._open()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._ensure_process()
        with self._thread_lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_attach, (self._limit, self.name, self.rate, str(self.path.parent), self._max_waiters))

    def close(self) -> None:
        """Unmap and close this process's view of the table (others are unaffected)."""
        if getattr(self, "_map", None) is not None and os.getpid() == self._pid:
            self._map.close()
            os.close(self._fd)
            self._map = None  # type: ignore[assignment]

    def unlink(self) -> None:
        """Remove the table file (processes that have it open keep using their mapping)."""
        self.path.unlink(missing_ok=True)

    @staticmethod
    def unlink_name(name: str, directory: str | os.PathLike[str] | None = None) -> None:
        (Path(directory or _default_directory()) / f"mocksandbox-limiter-{name}").unlink(missing_ok=True)

    # -- table access (under the lock) -----------------------------------------------------------

    def _header(self) -> list[Any]:
        return list(_HEADER.unpack_from(self._map, 0))

    def _set_header(self, fields: list[Any]) -> None:
        _HEADER.pack_into(self._map, 0, *fields)

    def _slot_offset(self, i: int) -> int:
        return _HEADER.size + i * _SLOT.size

    def _waiter_offset(self, i: int) -> int:
        return _HEADER.size + self._limit * _SLOT.size + i * _WAITER.size

    def _slots(self) -> list[tuple[int, int, int, float, float]]:
        return [_SLOT.unpack_from(self._map, self._slot_offset(i)) for i in range(self._limit)]

    def _reclaim_dead(self) -> None:
        """Free the slots of holders whose process is gone."""
        for i, (token, pid, _tid, started, _at) in enumerate(self._slots()):
            if token and not _alive(pid, started):
                _SLOT.pack_into(self._map, self._slot_offset(i), 0, 0, 0, 0.0, 0.0)
                self.reclaimed += 1

    def _free_slot(self, reclaim: bool) -> int | None:
        """A free slot; with ``reclaim``, taking back dead holders' slots when none is free."""
        for _ in range(2 if reclaim else 1):
            for i, (token, *_rest) in enumerate(self._slots()):
                if token == 0:
                    return i
            if reclaim:
                self._reclaim_dead()
        return None

    def _take(self, slot: int, tid: int) -> Permit:
        header = self._header()
        now = self._clock()
        start_at = now
        if self.rate:
            start_at = max(now, header[5])
            header[5] = start_at + 1.0 / self.rate
        token = header[6]
        header[6] = token + 1
        self._set_header(header)
        _SLOT.pack_into(self._map, self._slot_offset(slot), token, self._pid, tid, self._my_start, now)
        return Permit(f"{self.name}-{token}", f"{self._pid}:{tid}", now, self.name, {"start_at": start_at})

    def _waiters(self) -> list[tuple[int, int, int, int, float]]:
        """Queued waiters as (ticket, index, pid, thread, start), scanning up to the high-water mark."""
        high = self._header()[3]
        found = []
        offset = self._waiter_offset(0)
        for i, (ticket, pid, tid, started) in enumerate(
            _WAITER.iter_unpack(self._map[offset : offset + high * _WAITER.size])
        ):
            if ticket:
                found.append((ticket, i, pid, tid, started))
        return found

    def _register(self, tid: int) -> tuple[int, int]:
        header = self._header()
        for i in range(self._max_waiters):
            if _WAITER.unpack_from(self._map, self._waiter_offset(i))[0] == 0:
                ticket = header[7]
                _WAITER.pack_into(self._map, self._waiter_offset(i), ticket, self._pid, tid, self._my_start)
                header[7] = ticket + 1
                header[3] = max(header[3], i + 1)
                self._set_header(header)
                return ticket, i
        raise RuntimeError(f"process limiter {self.name!r}: more than {self._max_waiters} waiters")

    def _unregister(self, index: int) -> None:
        _WAITER.pack_into(self._map, self._waiter_offset(index), 0, 0, 0, 0.0)
        header = self._header()
        high = header[3]
        while high and _WAITER.unpack_from(self._map, self._waiter_offset(high - 1))[0] == 0:
            high -= 1
        if high != header[3]:
            header[3] = high
            self._set_header(header)

    def _first_in_line(self, ticket: int) -> bool:
        """Whether no live waiter holds an earlier ticket (dead ones are cleared on the way)."""
        for other, index, pid, _tid, started in sorted(self._waiters()):
            if other >= ticket:
                return True
            if _alive(pid, started):
                return False
            self._unregister(index)
        return True

    # -- the protocol --------------------------------------------------------------------------

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_flight(self) -> int:
        """Permits held by live processes (those of dead ones are reclaimed first)."""
        with self._locked():
            self._reclaim_dead()
            return sum(1 for slot in self._slots() if slot[0])

    @property
    def waiting(self) -> int:
        with self._locked():
            return len(self._waiters())

    def acquire(self, timeout: float | None = None) -> Permit:
        tid = threading.get_native_id()
        deadline = None if timeout is None else self._clock() + timeout
        ticket: int | None = None
        index = -1
        delay = _POLL_MIN
        while True:
            with self._locked():
                if ticket is None:
                    if not self._waiters():
                        slot = self._free_slot(reclaim=True)
                        if slot is not None:
                            permit = self._take(slot, tid)
                            break
                    ticket, index = self._register(tid)
                elif self._first_in_line(ticket):
                    slot = self._free_slot(reclaim=True)
                    if slot is not None:
                        self._unregister(index)
                        permit = self._take(slot, tid)
                        break
                if deadline is not None and self._clock() >= deadline:
                    self._unregister(index)
                    raise TimeoutError(f"no permit of {self.name!r} within {timeout} s")
            self._sleep(delay)
            delay = min(delay * 2, _POLL_MAX)
        wait_until(permit.extra["start_at"], self._clock, self._sleep)
        return permit

    async def acquire_async(self, timeout: float | None = None) -> Permit:
        return await acquire_in_thread(lambda: self.acquire(timeout), self.release)

    def release(self, permit: Permit | None = None) -> None:
        tid = threading.get_native_id()
        with self._locked():
            for i, (token, pid, slot_tid, _started, _at) in enumerate(self._slots()):
                if token == 0 or pid != self._pid:
                    continue
                if (permit is not None and permit.token == f"{self.name}-{token}") or (
                    permit is None and slot_tid == tid
                ):
                    _SLOT.pack_into(self._map, self._slot_offset(i), 0, 0, 0, 0.0, 0.0)
                    return
        if permit is None:
            raise PermitError(
                f"release() without a permit: thread {tid} of process {self._pid} holds none from "
                f"process limiter {self.name!r}"
            )
        raise PermitError(
            f"permit {permit.token!r} is not held by process {self._pid} from {self.name!r} "
            "(released twice, never acquired, or acquired by another process)"
        )

    def holders(self) -> list[dict[str, Any]]:
        """Who holds the permits now: pid, thread id, and whether the process still runs."""
        with self._locked():
            return [
                {"pid": pid, "thread": tid, "alive": _alive(pid, started), "acquired_at": at}
                for token, pid, tid, started, at in self._slots()
                if token
            ]

    def __repr__(self) -> str:
        return f"ProcessLimiter(limit={self._limit}, name={self.name!r}, path={str(self.path)!r})"


def _attach(limit: int, name: str, rate: float | None, directory: str, max_waiters: int) -> ProcessLimiter:
    return ProcessLimiter(limit, name, rate=rate, directory=directory, max_waiters=max_waiters)
