"""The kernel pool with fake kernels (no processes): warm and cold, refills, one use per kernel, close."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from mocksandbox.jupyter.kernel import Kernel, KernelError
from mocksandbox.jupyter.pool import KernelPool


class FakeProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.alive = True

    def is_alive(self) -> bool:
        return self.alive

    def kill(self) -> None:
        self.alive = False


class FakeKernel:
    def __init__(self, pid: int) -> None:
        self.process = FakeProcess(pid)
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.process.kill()


class Starter:
    """Makes fake kernels; ``gate`` (when set) holds every start until it is opened."""

    def __init__(self) -> None:
        self.made: list[FakeKernel] = []
        self.gate: threading.Event | None = None
        self.fail_with: Exception | None = None
        self._pids = itertools.count(100)
        self._lock = threading.Lock()
        self.deadlines: list[float] = []

    def __call__(self, deadline: float) -> Kernel:
        self.deadlines.append(deadline)
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail_with is not None:
            raise self.fail_with
        with self._lock:
            kernel = FakeKernel(next(self._pids))
            self.made.append(kernel)
        return cast(Kernel, kernel)


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.005)


@pytest.fixture
def starter() -> Starter:
    return Starter()


@pytest.fixture
def pool(starter: Starter) -> Iterator[KernelPool]:
    pool = KernelPool(starter, size=2, startup_timeout=30)
    yield pool
    pool.close()


def ready(pool: KernelPool) -> int:
    return pool.stats()["ready"]


def test_first_request_is_cold_then_the_pool_fills(pool: KernelPool, starter: Starter) -> None:
    kernel, warm = pool.acquire(time.monotonic() + 10)
    assert not warm
    wait_until(lambda: ready(pool) == 2)
    again, warm = pool.acquire(time.monotonic() + 10)
    assert warm and again is not kernel
    wait_until(lambda: ready(pool) == 2)  # its replacement started at once
    assert pool.stats() | {"ready": 0} == {
        "warm": 1, "cold": 1, "started": 3, "start_failures": 0, "ready": 0, "starting": 0, "busy": 2,
    }  # fmt: skip


def test_warm_makes_kernels_before_any_request(pool: KernelPool) -> None:
    pool.warm()
    wait_until(lambda: ready(pool) == 2)
    _, warm = pool.acquire(time.monotonic() + 10)
    assert warm


def test_a_kernel_serves_one_request_and_is_closed_after(pool: KernelPool, starter: Starter) -> None:
    pool.warm()
    wait_until(lambda: ready(pool) == 2)
    seen = set()
    for _ in range(6):
        kernel, _ = pool.acquire(time.monotonic() + 10)
        assert id(kernel) not in seen
        seen.add(id(kernel))
        pool.release(kernel)
        wait_until(lambda k=kernel: cast(Any, k).closed)
    assert pool.stats()["busy"] == 0


def test_size_zero_starts_every_kernel_in_the_request(starter: Starter) -> None:
    pool = KernelPool(starter, size=0, startup_timeout=30)
    try:
        for _ in range(3):
            kernel, warm = pool.acquire(time.monotonic() + 10)
            assert not warm
            pool.release(kernel)
        assert len(starter.made) == 3
        assert pool.stats()["started"] == 0  # nothing in the background
    finally:
        pool.close()


def test_cold_start_is_bounded_by_the_request_deadline(starter: Starter) -> None:
    pool = KernelPool(starter, size=0, startup_timeout=30)
    try:
        deadline = time.monotonic() + 2
        pool.acquire(deadline)
        assert starter.deadlines[-1] == deadline
    finally:
        pool.close()


def test_dead_ready_kernels_are_skipped(pool: KernelPool, starter: Starter) -> None:
    pool.warm()
    wait_until(lambda: ready(pool) == 2)
    dead = starter.made[:2]
    for kernel in dead:
        kernel.process.alive = False  # killed from outside while waiting
    kernel, warm = pool.acquire(time.monotonic() + 10)
    assert not warm and kernel not in [cast(Kernel, k) for k in dead]
    wait_until(lambda: all(k.closed for k in dead))


def test_failed_background_starts_are_counted_and_not_retried_at_once() -> None:
    now = [1000.0]
    starter = Starter()
    starter.fail_with = KernelError("no ipykernel")
    pool = KernelPool(starter, size=2, startup_timeout=30, clock=lambda: now[0])
    try:
        pool.warm()
        wait_until(lambda: pool.stats()["start_failures"] == 2)
        pool.warm()  # still in the quiet period: no new attempts
        time.sleep(0.05)
        assert len(starter.deadlines) == 2
        with pytest.raises(KernelError, match="no ipykernel"):  # a request reports the error
            pool.acquire(now[0] + 10)
        now[0] += 60
        starter.fail_with = None
        pool.warm()
        wait_until(lambda: ready(pool) == 2)
    finally:
        pool.close()


def test_concurrent_requests_never_share_a_kernel(pool: KernelPool) -> None:
    pool.warm()
    wait_until(lambda: ready(pool) == 2)
    got: list[Any] = []
    lock = threading.Lock()

    def take() -> None:
        kernel, _ = pool.acquire(time.monotonic() + 10)
        with lock:
            got.append(kernel)

    threads = [threading.Thread(target=take) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(got) == 12
    assert len({id(kernel) for kernel in got}) == 12
    assert pool.stats()["warm"] + pool.stats()["cold"] == 12


def test_close_kills_ready_busy_and_starting_kernels(starter: Starter) -> None:
    killed_pending: list[bool] = []
    pool = KernelPool(starter, size=2, startup_timeout=30, kill_pending=lambda: killed_pending.append(True))
    pool.warm()
    wait_until(lambda: ready(pool) == 2)
    starter.gate = threading.Event()  # the replacement is stuck starting
    busy, _ = pool.acquire(time.monotonic() + 10)
    wait_until(lambda: pool.stats()["starting"] == 1)
    [ready_kernel] = [k for k in starter.made[:2] if k is not cast(Any, busy)]

    closer = threading.Thread(target=pool.close)
    closer.start()
    wait_until(lambda: killed_pending == [True])
    starter.gate.set()  # the stuck start finishes after the close: its kernel is closed at once
    closer.join(10)
    assert ready_kernel.closed
    assert not cast(Any, busy).process.alive
    assert all(kernel.closed for kernel in starter.made if kernel is not cast(Any, busy))
    with pytest.raises(KernelError, match="closed"):
        pool.acquire(time.monotonic() + 10)


def test_reset_stats(pool: KernelPool) -> None:
    kernel, _ = pool.acquire(time.monotonic() + 10)
    pool.release(kernel)
    pool.reset_stats()
    assert pool.stats()["cold"] == 0 and pool.stats()["warm"] == 0
