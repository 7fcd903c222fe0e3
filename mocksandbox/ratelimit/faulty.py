"""Deliberately faulty limiters and executors: one per fault in ``../shared/contract/ratelimit.md``.

They exist so that you can see what ``mocksandbox stress`` catches, and how it says so. Each
factory takes the limit (as ``--limiter``/``--executor pkg.mod:factory`` factories do)::

    mocksandbox stress --url URL --limit 3 --mode threads --requests 60 \\
        --executor mocksandbox.ratelimit.faulty:seed_execution_worker --json out.json

====  ===========================================  ==================================================
fault  factory                                      what the harness reports
====  ===========================================  ==================================================
1     ``release_without_acquire`` (also the seed)  ``max_in_flight`` above the limit; permits grew
                                                   (post-run probe); ``in_flight_after`` negative
2     ``swallowing_executor`` (also the seed)      ``errors.swallowed`` > 0: failures came back None
3     ``first_limit_wins`` (also the seed)         ``limit_conflict``: a second pool asking for N+1
                                                   silently got the first pool's N
4     ``concurrency_only`` (also the seed)         with ``--rate``: ``peak_rate`` above the rate
5     ``no_lease_process_limiter``                 with ``--kill-holders``: ``permits_leaked``
6     ``hold_through_retries`` (also the seed)     ``permit_idle_fraction``: permits held in sleeps
7     ``disabled_global_limit``                    every call fails with ``AttributeError`` from the
                                                   executor; no request reaches the server
====  ===========================================  ==================================================

``seed_execution_worker`` is the seed's ``ExecutionWorker``/``TokenBucketWorker`` pair as written,
in threads (its acquire fails every fourth call, as a ``ray.get`` on a busy actor times out);
``seed_ray_execution_pool`` is the same code on Ray.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, TypeVar

from mocksandbox.ratelimit.base import Permit
from mocksandbox.ratelimit.thread import FairLimiter

T = TypeVar("T")
logger = logging.getLogger(__name__)

#: Named singletons of the faulty registries (``get_if_exists`` semantics). ``reset()`` clears them.
_SEED_BUCKETS: dict[str, SeedTokenBucket] = {}
_FIRST_WINS: dict[str, FairLimiter] = {}
_REGISTRY_LOCK = threading.Lock()


def reset() -> None:
    """Forget the faulty singletons (between tests)."""
    with _REGISTRY_LOCK:
        _SEED_BUCKETS.clear()
        _FIRST_WINS.clear()


class AcquireFailed(TimeoutError):
    """The seed's ``ray.get(acquire.remote())`` failing (a timeout, an interrupted wait)."""


class SeedTokenBucket:
    """The seed's ``TokenBucketWorker``, in one process: an unbounded semaphore and a counter.

    ``acquire`` is serialised (the seed's concurrency group of size 1); ``release`` is not
    checked against anything, so every unmatched release adds a permit for good (fault 1).
    ``fail_every=k`` makes every k-th acquire fail before taking a permit.
    """

    def __init__(self, rate_limit: int, fail_every: int | None = None) -> None:
        self.rate_limit = rate_limit
        self.current_count = 0
        self._semaphore = threading.Semaphore(rate_limit)
        self._acquire_group = threading.Lock()
        self._fail_every = fail_every
        self._calls = 0

    def acquire(self) -> None:
        with self._acquire_group:
            self._calls += 1
            if self._fail_every and self._calls % self._fail_every == 0:
                raise AcquireFailed(f"acquire #{self._calls} failed (simulated ray.get timeout)")
            self._semaphore.acquire()
            self.current_count += 1

    def release(self) -> None:
        self._semaphore.release()
        self.current_count -= 1

    def get_current_count(self) -> int:
        return self.current_count


class SeedExecutionWorker:
    """The seed's ``ExecutionWorker.execute``, line for line (faults 1, 2, 3, 4, 6 and 7)."""

    def __init__(
        self,
        enable_global_rate_limit: bool = True,
        rate_limit: int = 10,
        fail_every: int | None = None,
        name: str = "rate-limiter",
    ) -> None:
        self.rate_limit = rate_limit
        self.rate_limit_worker = (
            self._init_rate_limit(rate_limit, fail_every, name) if enable_global_rate_limit else None
        )

    @staticmethod
    def _init_rate_limit(rate_limit: int, fail_every: int | None, name: str) -> SeedTokenBucket:
        # TokenBucketWorker.options(name="rate-limiter", get_if_exists=True).remote(rate_limit)
        with _REGISTRY_LOCK:
            if name not in _SEED_BUCKETS:
                _SEED_BUCKETS[name] = SeedTokenBucket(rate_limit, fail_every)
            return _SEED_BUCKETS[name]

    def execute(self, fn: Callable[..., T], *fn_args: Any, **fn_kwargs: Any) -> T | None:
        with ExitStack() as stack:
            stack.callback(self.rate_limit_worker.release)  # type: ignore[union-attr]
            self.rate_limit_worker.acquire()  # type: ignore[union-attr]
            try:
                return fn(*fn_args, **fn_kwargs)
            except Exception as e:
                logger.warning(f"Error when executing code: {e}")
        return None

    @property
    def in_flight(self) -> int | None:
        worker = self.rate_limit_worker
        return None if worker is None else worker.get_current_count()


def seed_execution_worker(limit: int) -> SeedExecutionWorker:
    """The seed as written; its acquire fails every fourth call (faults 1-4, 6)."""
    return SeedExecutionWorker(rate_limit=limit, fail_every=4)


# -- one fault at a time ----------------------------------------------------------------------------


class ReleaseWithoutAcquire:
    """Fault 1 alone: the release is registered before the acquire; exceptions do propagate."""

    def __init__(self, limit: int, fail_every: int = 4) -> None:
        self.bucket = SeedTokenBucket(limit, fail_every)
        self.limit = limit

    def execute(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with ExitStack() as stack:
            stack.callback(self.bucket.release)
            self.bucket.acquire()
            return fn(*args, **kwargs)

    @property
    def in_flight(self) -> int:
        return self.bucket.get_current_count()


def release_without_acquire(limit: int) -> ReleaseWithoutAcquire:
    return ReleaseWithoutAcquire(limit)


class SwallowingExecutor:
    """Fault 2 alone: a correct FIFO limiter, but a failing call comes back ``None`` with a warning."""

    def __init__(self, limit: int) -> None:
        self.limiter = FairLimiter(limit, name="swallowing")
        self.limit = limit

    def execute(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        with self.limiter:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                logger.warning("Error when executing code: %s", exc)
                return None

    @property
    def in_flight(self) -> int:
        return self.limiter.in_flight


def swallowing_executor(limit: int) -> SwallowingExecutor:
    return SwallowingExecutor(limit)


class FirstLimitWins:
    """Fault 3 alone: a named singleton that keeps the first limit it was created with.

    It reports the limit it was *asked* for (as the seed's ``ExecutionWorker`` keeps its
    ``rate_limit`` argument), while the permits come from the first one.
    """

    def __init__(self, limit: int, name: str = "rate-limiter") -> None:
        with _REGISTRY_LOCK:
            if name not in _FIRST_WINS:
                _FIRST_WINS[name] = FairLimiter(limit, name=name)
            self._shared = _FIRST_WINS[name]
        self.limit = limit
        self.name = name

    @property
    def in_flight(self) -> int:
        return self._shared.in_flight

    def acquire(self, timeout: float | None = None) -> Permit:
        return self._shared.acquire(timeout)

    def release(self, permit: Permit | None = None) -> None:
        self._shared.release(permit)

    async def acquire_async(self, timeout: float | None = None) -> Permit:
        return await self._shared.acquire_async(timeout)


def first_limit_wins(limit: int) -> FirstLimitWins:
    return FirstLimitWins(limit)


def concurrency_only(limit: int, rate: float | None = None) -> FairLimiter:
    """Fault 4 alone: accepts a requests-per-second ``rate`` and ignores it."""
    return FairLimiter(limit, name="concurrency-only")


class NoLeaseProcessLimiter:
    """Fault 5 alone: a semaphore shared by processes, with no lease: a dead holder's permit is lost."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._semaphore = multiprocessing.get_context("spawn").BoundedSemaphore(limit)

    def acquire(self, timeout: float | None = None) -> None:
        if not self._semaphore.acquire(timeout=timeout):
            raise TimeoutError("no permit")

    def release(self, permit: object = None) -> None:
        self._semaphore.release()

    @property
    def in_flight(self) -> int:
        return self.limit - self._semaphore.get_value()


def no_lease_process_limiter(limit: int) -> NoLeaseProcessLimiter:
    return NoLeaseProcessLimiter(limit)


class HoldThroughRetries:
    """Fault 6 alone: a correct limiter held around the whole client call, back-off sleeps included."""

    def __init__(self, limit: int) -> None:
        self.limiter = FairLimiter(limit, name="hold-through-retries")
        self.limit = limit

    def execute(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self.limiter:
            return fn(*args, **kwargs)

    @property
    def in_flight(self) -> int:
        return self.limiter.in_flight


def hold_through_retries(limit: int) -> HoldThroughRetries:
    return HoldThroughRetries(limit)


def disabled_global_limit(limit: int) -> SeedExecutionWorker:
    """Fault 7: the seed with ``enable_global_rate_limit=False``: every call raises AttributeError."""
    return SeedExecutionWorker(enable_global_rate_limit=False, rate_limit=limit)


# -- the seed on Ray ----------------------------------------------------------------------------------


def seed_ray_execution_pool(limit: int, num_workers: int | None = None) -> Any:
    """The seed's Ray code as written: a ``TokenBucketWorker`` singleton and an ``ExecutionWorker`` actor.

    Returns the actor handle (``execute.remote(fn, ...)``), as the seed's ``init_execution_pool``
    does; the harness drives such handles directly.
    """
    import ray

    worker = ray.remote(SeedRayExecutionWorker)
    return worker.options(max_concurrency=num_workers or 4 * limit, num_cpus=0).remote(rate_limit=limit)


_TOKEN_BUCKET_CLASS: Any = None


def _seed_ray_token_bucket() -> Any:
    """``@ray.remote(concurrency_groups={"acquire": 1, "release": 10}) class TokenBucketWorker``."""
    global _TOKEN_BUCKET_CLASS
    if _TOKEN_BUCKET_CLASS is None:
        import ray

        class TokenBucketWorker:
            def __init__(self, rate_limit: int) -> None:
                self.rate_limit = rate_limit
                self.current_count = 0
                self._semaphore = threading.Semaphore(rate_limit)

            @ray.method(concurrency_group="acquire")  # type: ignore[untyped-decorator,unused-ignore]
            def acquire(self) -> None:
                self._semaphore.acquire()
                self.current_count += 1

            @ray.method(concurrency_group="release")  # type: ignore[untyped-decorator,unused-ignore]
            def release(self) -> None:
                self._semaphore.release()
                self.current_count -= 1

            def get_current_count(self) -> int:
                return self.current_count

        _TOKEN_BUCKET_CLASS = ray.remote(concurrency_groups={"acquire": 1, "release": 10})(TokenBucketWorker)
    return _TOKEN_BUCKET_CLASS


class SeedRayExecutionWorker:
    """The seed's ``ExecutionWorker`` for Ray, line for line (run it as a threaded actor)."""

    def __init__(self, enable_global_rate_limit: bool = True, rate_limit: int = 10) -> None:
        self.rate_limit_worker = self._init_rate_limit(rate_limit) if enable_global_rate_limit else None

    def _init_rate_limit(self, rate_limit: int) -> Any:
        return (
            _seed_ray_token_bucket()
            .options(name="rate-limiter", get_if_exists=True, num_cpus=0)
            .remote(rate_limit)
        )

    def execute(self, fn: Callable[..., T], *fn_args: Any, **fn_kwargs: Any) -> T | None:
        import ray

        with ExitStack() as stack:
            stack.callback(self.rate_limit_worker.release.remote)  # type: ignore[union-attr]
            ray.get(self.rate_limit_worker.acquire.remote())  # type: ignore[union-attr]
            try:
                return fn(*fn_args, **fn_kwargs)
            except Exception as e:
                logger.warning(f"Error when executing code: {e}")
        return None

    def get_current_count(self) -> int:
        import ray

        return int(ray.get(self.rate_limit_worker.get_current_count.remote()))  # type: ignore[union-attr]
