"""The reference limiters and pools, without the harness: caps, order, errors, leaks, leases."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import pickle
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from mocksandbox.ratelimit import (
    AsyncioLimiter,
    Executor,
    FairLimiter,
    Limiter,
    LimitMismatchError,
    Permit,
    PermitError,
    ProcessLimiter,
    RetryPolicy,
    ThreadExecutionPool,
    drop_shared_limiter,
    init_execution_pool,
    run_limited,
    shared_limiter,
)
from mocksandbox.ratelimit.base import Pacer


def _max_concurrency(limiter: FairLimiter, threads: int = 10, rounds: int = 5) -> int:
    current = peak = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal current, peak
        for _ in range(rounds):
            with limiter:
                with lock:
                    current += 1
                    peak = max(peak, current)
                time.sleep(0.002)
                with lock:
                    current -= 1

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return peak


def test_reference_limiters_satisfy_the_protocol() -> None:
    process = ProcessLimiter(2, f"proto-{uuid.uuid4().hex[:8]}")
    try:
        for limiter in (FairLimiter(2), AsyncioLimiter(2), process):
            assert isinstance(limiter, Limiter)
            assert limiter.limit == 2
            assert limiter.in_flight == 0
    finally:
        process.unlink()
    assert isinstance(ThreadExecutionPool(1), Executor)


def test_fair_limiter_holds_the_cap_and_returns_every_permit() -> None:
    limiter = FairLimiter(3)
    assert _max_concurrency(limiter) <= 3
    assert limiter.in_flight == 0


def test_fair_limiter_serves_waiters_in_arrival_order() -> None:
    limiter = FairLimiter(1)
    held = limiter.acquire()
    order: list[int] = []

    def waiter(i: int) -> None:
        with limiter:
            order.append(i)

    threads = []
    for i in range(6):
        thread = threading.Thread(target=waiter, args=(i,))
        thread.start()
        threads.append(thread)
        while limiter.waiting < i + 1:  # each waiter is queued before the next one starts
            time.sleep(0.001)
    limiter.release(held)
    for thread in threads:
        thread.join()
    assert order == list(range(6))


def test_release_without_acquire_or_twice_is_refused() -> None:
    limiter = FairLimiter(2)
    with pytest.raises(PermitError, match="without a permit"):
        limiter.release()
    permit = limiter.acquire()
    limiter.release(permit)
    with pytest.raises(PermitError, match="not held"):
        limiter.release(permit)
    assert limiter.in_flight == 0


def test_release_without_a_permit_only_releases_the_callers_own() -> None:
    limiter = FairLimiter(2)
    other = limiter.acquire()  # held by this thread
    errors: list[BaseException] = []

    def foreign_release() -> None:
        try:
            limiter.release()  # this thread holds nothing: must not free the main thread's permit
        except PermitError as exc:
            errors.append(exc)

    thread = threading.Thread(target=foreign_release)
    thread.start()
    thread.join()
    assert len(errors) == 1 and limiter.in_flight == 1
    limiter.release(other)


def test_acquire_timeout_leaves_no_waiter_behind() -> None:
    limiter = FairLimiter(1)
    held = limiter.acquire()
    with pytest.raises(TimeoutError):
        limiter.acquire(timeout=0.02)
    assert limiter.waiting == 0
    limiter.release(held)
    assert limiter.in_flight == 0


def test_rate_pacing_spaces_starts_by_at_least_one_interval() -> None:
    limiter = FairLimiter(10, rate=50.0)
    before = time.monotonic()
    starts, scheduled = [], []
    for _ in range(6):
        with limiter as permit:
            starts.append(time.monotonic())
            scheduled.append(permit.extra["start_at"])
    # The schedule is 1/50 s apart, and nobody starts before its slot: so 5 intervals at least.
    assert [b - a for a, b in itertools.pairwise(scheduled)] == pytest.approx([0.02] * 5)
    assert all(start >= slot for start, slot in zip(starts, scheduled, strict=True))
    assert starts[-1] - before >= 5 * 0.02


def test_pacer_allows_a_burst_then_paces() -> None:
    now = [0.0]
    pacer = Pacer(10.0, burst=3, clock=lambda: now[0])
    assert [pacer.reserve() for _ in range(5)] == pytest.approx([0.0, 0.0, 0.0, 0.1, 0.2])


def test_shared_limiter_refuses_another_limit() -> None:
    name = f"shared-{uuid.uuid4().hex[:6]}"
    try:
        first = shared_limiter(name, 3)
        assert shared_limiter(name, 3) is first
        with pytest.raises(LimitMismatchError, match="limit=3"):
            shared_limiter(name, 5)
    finally:
        drop_shared_limiter(name)


def test_async_with_on_fair_and_asyncio_limiters() -> None:
    async def peak(limiter: FairLimiter | AsyncioLimiter) -> int:
        current = top = 0

        async def work() -> None:
            nonlocal current, top
            async with limiter:
                current += 1
                top = max(top, current)
                await asyncio.sleep(0.002)
                current -= 1

        await asyncio.gather(*(work() for _ in range(30)))
        return top

    for limiter in (FairLimiter(3), AsyncioLimiter(3)):
        assert asyncio.run(peak(limiter)) <= 3
        assert limiter.in_flight == 0


def test_asyncio_limiter_cancelled_or_timed_out_waiters_never_keep_a_permit() -> None:
    async def scenario() -> AsyncioLimiter:
        limiter = AsyncioLimiter(2)
        held = [await limiter.acquire_async() for _ in range(2)]
        waiter = asyncio.create_task(limiter.acquire_async())
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        with pytest.raises(TimeoutError):
            await limiter.acquire_async(timeout=0.01)
        # A waiter granted and cancelled in the same tick gives its permit back.
        late = asyncio.create_task(limiter.acquire_async())
        await asyncio.sleep(0)
        limiter.release(held.pop())
        late.cancel()
        await asyncio.gather(late, return_exceptions=True)
        for permit in held:
            limiter.release(permit)
        return limiter

    limiter = asyncio.run(scenario())
    assert limiter.in_flight == 0 and limiter.waiting == 0


def test_asyncio_limiter_blocking_acquire_refuses_to_stall_the_loop() -> None:
    limiter = AsyncioLimiter(1)
    permit = limiter.acquire()  # free: fine
    with pytest.raises(RuntimeError, match="block the event loop"):
        limiter.acquire()
    limiter.release(permit)


def test_fair_limiter_cancelled_async_waiter_hands_the_permit_on() -> None:
    async def scenario() -> FairLimiter:
        limiter = FairLimiter(1)
        held = await limiter.acquire_async()
        waiter = asyncio.create_task(limiter.acquire_async())
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        limiter.release(held)
        async with limiter:
            pass
        return limiter

    assert asyncio.run(scenario()).in_flight == 0


# -- processes ------------------------------------------------------------------------------------


@pytest.fixture
def process_limiter_name() -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:10]}"
    yield name
    ProcessLimiter.unlink_name(name)


def _hold(limiter: ProcessLimiter, seconds: float, stamps: object) -> None:
    with limiter:
        start = time.time()
        time.sleep(seconds)
        stamps.put((start, time.time()))  # type: ignore[attr-defined]


def _die_holding(limiter: ProcessLimiter, ready: object) -> None:
    limiter.acquire()
    ready.put(os.getpid())  # type: ignore[attr-defined]
    os._exit(9)


def test_process_limiter_caps_processes_and_reclaims_a_dead_holders_permit(
    process_limiter_name: str,
) -> None:
    from mocksandbox.stress.analysis import max_overlap

    context = multiprocessing.get_context("forkserver")
    limiter = ProcessLimiter(2, process_limiter_name)
    stamps = context.SimpleQueue()
    children = [context.Process(target=_hold, args=(limiter, 0.15, stamps)) for _ in range(5)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
    windows = [stamps.get() for _ in range(5)]
    assert max_overlap(windows) <= 2
    assert limiter.in_flight == 0

    ready = context.SimpleQueue()
    victim = context.Process(target=_die_holding, args=(limiter, ready))
    victim.start()
    victim.join(timeout=60)
    assert victim.exitcode == 9 and not ready.empty()
    assert [h["alive"] for h in limiter.holders()] == [False]
    # Both permits are available again: the dead process's one is taken back.
    first, second = limiter.acquire(timeout=5), limiter.acquire(timeout=5)
    assert limiter.in_flight == 2 and limiter.reclaimed == 1
    limiter.release(first)
    limiter.release(second)


def test_process_limiter_refuses_another_limit_and_pickles_by_name(process_limiter_name: str) -> None:
    limiter = ProcessLimiter(3, process_limiter_name)
    with pytest.raises(LimitMismatchError, match="limit=3"):
        ProcessLimiter(4, process_limiter_name)
    twin = pickle.loads(pickle.dumps(limiter))
    permit = twin.acquire()
    assert limiter.in_flight == 1
    with pytest.raises(PermitError):
        limiter.release(Permit("x-999", "nobody", 0.0))
    twin.release(permit)
    assert limiter.in_flight == 0
    with pytest.raises(PermitError, match="without a permit"):
        limiter.release()


def test_process_limiter_timeout_and_fifo_between_threads(process_limiter_name: str) -> None:
    limiter = ProcessLimiter(1, process_limiter_name)
    held = limiter.acquire()
    with pytest.raises(TimeoutError):
        limiter.acquire(timeout=0.05)
    assert limiter.waiting == 0
    order: list[int] = []

    def waiter(i: int) -> None:
        permit = limiter.acquire(timeout=10)
        order.append(i)
        limiter.release(permit)

    threads = []
    for i in range(4):
        thread = threading.Thread(target=waiter, args=(i,))
        thread.start()
        threads.append(thread)
        while limiter.waiting < i + 1:
            time.sleep(0.001)
    limiter.release(held)
    for thread in threads:
        thread.join()
    assert order == [0, 1, 2, 3]


# -- pools ----------------------------------------------------------------------------------------


class Boom(ValueError):
    pass


def _explode() -> None:
    raise Boom("compile error")


def test_rotten_execution_in_a_thread_pool_raises_the_error_and_frees_the_permit() -> None:
    limiter = FairLimiter(2)
    with ThreadExecutionPool(4, limiter) as pool:
        with pytest.raises(Boom, match="compile error"):
            pool.execute(_explode)
        assert pool.execute(lambda x: x * 2, 21) == 42
        assert limiter.in_flight == 0


def test_run_limited_releases_the_permit_during_back_off() -> None:
    limiter = FairLimiter(1)
    seen_during_sleep: list[int] = []
    attempts = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise TimeoutError("504")
        return "ok"

    def sleep(seconds: float) -> None:
        seen_during_sleep.append(limiter.in_flight)

    policy = RetryPolicy((TimeoutError,), sleeps=(0.5, 1.0))
    assert run_limited(limiter, flaky, retry=policy, sleep=sleep) == "ok"
    assert seen_during_sleep == [0, 0] and limiter.in_flight == 0

    def always_504() -> None:
        raise TimeoutError("504 again")

    with pytest.raises(TimeoutError, match="504 again"):  # out of attempts: the error reaches the caller
        run_limited(limiter, always_504, retry=policy, sleep=sleep)
    assert limiter.in_flight == 0


def test_init_execution_pool_without_a_global_limit_still_runs_calls() -> None:
    pool = init_execution_pool(2, enable_global_rate_limit=False)
    try:
        assert pool.execute(sum, [1, 2, 3]) == 6
        assert pool.limit is None
    finally:
        pool.close()


def test_init_execution_pool_shares_one_limiter_per_name_and_refuses_another_limit() -> None:
    name = f"pool-{uuid.uuid4().hex[:6]}"
    first = init_execution_pool(2, rate_limit=3, name=name)
    second = init_execution_pool(2, rate_limit=3, name=name)
    try:
        assert first.limiter is second.limiter
        with pytest.raises(LimitMismatchError):
            init_execution_pool(2, rate_limit=5, name=name)
    finally:
        first.close()
        second.close()
        drop_shared_limiter(name)
