"""Limiters you can trust, one protocol for all of them, and execution pools built on them.

=====================  ============================================================================
``FairLimiter``        threads (and coroutines on any loop) in one process; FIFO, no barging
``AsyncioLimiter``     coroutines on one event loop; FIFO; cancellation never leaks a permit
``ProcessLimiter``     the processes of one machine; a shared table under ``flock``; a dead
                       holder's permits are reclaimed
``RayLimiter``         a Ray cluster; a named singleton actor with leased permit tokens
``init_execution_pool``  the seed design's pool (threads or a Ray actor), without its faults
=====================  ============================================================================

Every limiter has ``acquire(timeout=None) -> Permit``, ``release(permit=None)``,
``await acquire_async()``, ``with``/``async with``, ``limit`` and ``in_flight``; all take an
optional ``rate`` (requests per second) paced on top of the cap. ``mocksandbox.ratelimit.faulty``
holds deliberately broken ones, to see what ``mocksandbox stress`` catches. Ray is imported only
when ``RayLimiter`` or a Ray pool is used (``pip install 'mocksandbox[ray]'``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mocksandbox.ratelimit.aio import AsyncioLimiter
from mocksandbox.ratelimit.base import (
    Executor,
    LeaseExpiredWarning,
    Limiter,
    LimitMismatchError,
    Permit,
    PermitError,
)
from mocksandbox.ratelimit.pool import (
    PoolMode,
    RayExecutionPool,
    RetryPolicy,
    ThreadExecutionPool,
    init_execution_pool,
    run_limited,
)
from mocksandbox.ratelimit.process import ProcessLimiter
from mocksandbox.ratelimit.thread import FairLimiter, drop_shared_limiter, shared_limiter

if TYPE_CHECKING:
    from mocksandbox.ratelimit.ray_limiter import RayLimiter

__all__ = [
    "AsyncioLimiter",
    "Executor",
    "FairLimiter",
    "LeaseExpiredWarning",
    "LimitMismatchError",
    "Limiter",
    "Permit",
    "PermitError",
    "PoolMode",
    "ProcessLimiter",
    "RayExecutionPool",
    "RayLimiter",
    "RetryPolicy",
    "ThreadExecutionPool",
    "drop_shared_limiter",
    "init_execution_pool",
    "run_limited",
    "shared_limiter",
]


def __getattr__(name: str) -> Any:
    if name == "RayLimiter":  # imports ray: only on demand
        from mocksandbox.ratelimit.ray_limiter import RayLimiter

        return RayLimiter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
