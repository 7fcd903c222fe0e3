"""A cluster-wide limiter: a named Ray actor holding leased permits, and its client.

What it fixes in the seed design's ``TokenBucketWorker`` (see ``../shared/contract/ratelimit.md``):

* Every permit is a token. ``release`` gives back exactly the token it is handed, and a token it
  never issued (or already took back) raises :class:`PermitError`: an acquire that failed can no
  longer add a permit.
* Asking for an existing name with another limit, rate or lease raises
  :class:`LimitMismatchError` instead of silently handing back the first limiter.
* Permits are leases. The client renews the leases of the permits its process holds every
  ``lease_seconds / 3``; when the process dies, the renewals stop and the permits come back after
  at most ``lease_seconds``.
* Errors come back with their type (``TimeoutError``, ``PermitError``), not as ``RayTaskError``.
* Optional ``rate`` (requests per second) paces the starts on top of the concurrency cap.

Waiters are served in the order their ``acquire`` reached the actor (an async actor: waiting
costs no thread).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
import warnings
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, TypeVar

import ray
from ray.exceptions import RayTaskError

from mocksandbox.ratelimit.base import (
    ContextManagerMixin,
    LeaseExpiredWarning,
    LimitMismatchError,
    Pacer,
    Permit,
    PermitError,
    check_limit,
    current_holder,
)

T = TypeVar("T")
DEFAULT_NAME = "mocksandbox-rate-limiter"


def unwrap_ray_error(exc: BaseException) -> BaseException:
    """The exception raised inside a Ray task or actor method, as it was raised there."""
    cause = getattr(exc, "cause", None)
    if isinstance(exc, RayTaskError) and isinstance(cause, BaseException):
        return cause
    return exc


def ray_get(ref: Any, timeout: float | None = None) -> Any:
    """``ray.get`` that re-raises a remote exception with its own type."""
    try:
        return ray.get(ref, timeout=timeout)
    except RayTaskError as exc:
        raise unwrap_ray_error(exc) from None


@dataclass
class _Lease:
    holder: str
    deadline: float
    granted_seq: int


class LimiterActor:
    """The actor's state (an async actor: one event loop, no locks). Use it through RayLimiter."""

    def __init__(self, limit: int, rate: float | None, lease_seconds: float, name: str) -> None:
        self.limit = limit
        self.rate = rate
        self.lease_seconds = lease_seconds
        self.name = name
        #: Unique per actor instance: tells a singleton from two actors of the same name.
        self.instance = uuid.uuid4().hex
        self._pacer = Pacer(rate)
        self._held: dict[str, _Lease] = {}
        self._waiters: deque[tuple[asyncio.Future[str], str, int]] = deque()
        self._gone: OrderedDict[str, str] = OrderedDict()  # token -> "released" / "expired"
        self._arrivals = 0
        self._grants = 0
        self._expired = 0
        self._rejected_releases = 0
        self._max_in_flight = 0
        self._arrival_order: deque[str] = deque(maxlen=10_000)
        self._grant_order: deque[str] = deque(maxlen=10_000)
        self._reaper: asyncio.Task[None] | None = None

    def config(self) -> dict[str, Any]:
        return {"limit": self.limit, "rate": self.rate, "lease_seconds": self.lease_seconds}

    def in_flight(self) -> int:
        return len(self._held)

    def stats(self) -> dict[str, Any]:
        return {
            **self.config(),
            "name": self.name,
            "instance": self.instance,
            "pid": os.getpid(),
            "in_flight": len(self._held),
            "waiting": len(self._waiters),
            "arrivals": self._arrivals,
            "grants": self._grants,
            "expired": self._expired,
            "rejected_releases": self._rejected_releases,
            "max_in_flight": self._max_in_flight,
            "arrival_order": list(self._arrival_order),
            "grant_order": list(self._grant_order),
            "holders": sorted(lease.holder for lease in self._held.values()),
        }

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        period = max(0.05, min(self.lease_seconds / 4, 1.0))
        while True:
            await asyncio.sleep(period)
            self._reap()

    def _reap(self) -> None:
        now = time.monotonic()
        for token, lease in list(self._held.items()):
            if lease.deadline <= now:
                del self._held[token]
                self._forget(token, "expired")
                self._expired += 1
        self._hand_on()

    def _forget(self, token: str, why: str) -> None:
        self._gone[token] = why
        while len(self._gone) > 100_000:
            self._gone.popitem(last=False)

    def _grant(self, holder: str) -> str:
        token = uuid.uuid4().hex
        self._grants += 1
        self._held[token] = _Lease(holder, time.monotonic() + self.lease_seconds, self._grants)
        self._max_in_flight = max(self._max_in_flight, len(self._held))
        self._grant_order.append(holder)
        return token

    def _hand_on(self) -> None:
        while self._waiters and len(self._held) < self.limit:
            future, holder, _seq = self._waiters.popleft()
            if not future.done():
                future.set_result(self._grant(holder))

    async def acquire(self, holder: str, timeout: float | None) -> tuple[str, float]:
        """A token and the delay (pacing) before its holder may start."""
        self._ensure_reaper()
        self._arrivals += 1
        self._arrival_order.append(holder)
        if not self._waiters and len(self._held) < self.limit:
            token = self._grant(holder)
        else:
            future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            entry = (future, holder, self._arrivals)
            self._waiters.append(entry)
            try:
                token = await asyncio.wait_for(future, timeout)
            except (asyncio.CancelledError, TimeoutError):
                if entry in self._waiters:
                    self._waiters.remove(entry)
                elif future.done() and not future.cancelled():
                    self._release(future.result())
                raise
        start_at = self._pacer.reserve()
        return token, max(0.0, start_at - time.monotonic())

    def _release(self, token: str) -> None:
        if self._held.pop(token, None) is None:
            self._rejected_releases += 1
            why = self._gone.get(token)
            if why == "expired":
                raise LeaseExpiredError(f"permit {token[:8]}… of {self.name!r}: its lease had expired")
            raise PermitError(
                f"permit {token[:8]}… is not held from {self.name!r} "
                f"({'released twice' if why else 'never issued here'})"
            )
        self._forget(token, "released")
        self._hand_on()

    async def release(self, token: str) -> None:
        self._release(token)

    async def renew(self, tokens: list[str]) -> list[str]:
        """Push the leases of ``tokens`` forward; return those that are no longer held."""
        self._ensure_reaper()
        deadline = time.monotonic() + self.lease_seconds
        lost = []
        for token in tokens:
            lease = self._held.get(token)
            if lease is None:
                lost.append(token)
            else:
                lease.deadline = deadline
        return lost


class LeaseExpiredError(PermitError):
    """A release of a permit whose lease had already run out (and was reclaimed)."""


_ACTOR_CLASS: Any = None


def _actor_class() -> Any:
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(LimiterActor)
    return _ACTOR_CLASS


class RayLimiter(ContextManagerMixin):
    """Client of the named limiter actor ``name``: create it, or attach to the existing one.

    ``RayLimiter(3)`` in any process of the cluster (driver, task, actor) reaches the same
    singleton. It pickles as a handle to that actor, so it can be passed to tasks and actors.
    ``namespace`` makes it reachable from other jobs; ``detached=True`` lets it outlive its
    creator (kill it with :meth:`destroy`).
    """

    def __init__(
        self,
        limit: int,
        name: str = DEFAULT_NAME,
        *,
        namespace: str | None = None,
        rate: float | None = None,
        lease_seconds: float = 60.0,
        detached: bool = False,
        _handle: Any = None,
    ) -> None:
        self._limit = check_limit(limit)
        if lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        self.name = name
        self.namespace = namespace
        self.rate = rate
        self.lease_seconds = lease_seconds
        if _handle is None:
            options: dict[str, Any] = {
                "name": name,
                "get_if_exists": True,
                "num_cpus": 0,
                "max_concurrency": 10_000,
            }
            if namespace is not None:
                options["namespace"] = namespace
            if detached:
                options["lifetime"] = "detached"
            _handle = _actor_class().options(**options).remote(limit, rate, lease_seconds, name)
            found = ray_get(_handle.config.remote())
            wanted = {"limit": limit, "rate": rate, "lease_seconds": lease_seconds}
            if found != wanted:
                raise LimitMismatchError(
                    f"Ray limiter {name!r} exists with {found}; asked for {wanted}. Use another "
                    "name, or RayLimiter.destroy() the existing one first."
                )
        self._actor = _handle
        self._lock = threading.Lock()
        self._local: dict[str, Permit] = {}
        self._renewer: threading.Thread | None = None
        self._closed = threading.Event()

    @classmethod
    def attach(cls, name: str = DEFAULT_NAME, namespace: str | None = None) -> RayLimiter:
        """The existing limiter ``name``, with the limit it was created with."""
        handle = ray.get_actor(name, namespace=namespace)
        cfg = ray_get(handle.config.remote())
        return cls(
            cfg["limit"],
            name,
            namespace=namespace,
            rate=cfg["rate"],
            lease_seconds=cfg["lease_seconds"],
            _handle=handle,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _reattach,
            (self._actor, self._limit, self.name, self.namespace, self.rate, self.lease_seconds),
        )

    @property
    def handle(self) -> Any:
        return self._actor

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_flight(self) -> int:
        return int(ray_get(self._actor.in_flight.remote()))

    def stats(self) -> dict[str, Any]:
        return dict(ray_get(self._actor.stats.remote()))

    def _holder(self) -> str:
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "-"
        return f"{node[:8]}:{current_holder()}"

    def _register(self, token: str, delay: float, holder: str) -> Permit:
        permit = Permit(token, holder, time.monotonic(), self.name, {"start_delay": delay})
        with self._lock:
            self._local[token] = permit
            if self._renewer is None or not self._renewer.is_alive():
                self._renewer = threading.Thread(
                    target=self._renew_forever, name=f"lease-renewal-{self.name}", daemon=True
                )
                self._renewer.start()
        return permit

    def acquire(self, timeout: float | None = None) -> Permit:
        holder = self._holder()
        token, delay = ray_get(self._actor.acquire.remote(holder, timeout))
        permit = self._register(token, delay, holder)
        if delay > 0:
            time.sleep(delay)
        return permit

    async def acquire_async(self, timeout: float | None = None) -> Permit:
        holder = self._holder()
        ref = self._actor.acquire.remote(holder, timeout)
        try:
            token, delay = await ref
        except RayTaskError as exc:
            raise unwrap_ray_error(exc) from None
        except asyncio.CancelledError:
            # The actor may still grant it: give it back as soon as it does.
            def give_back() -> None:
                try:
                    token, _delay = ray.get(ref)
                    self._actor.release.remote(token)
                except Exception:
                    pass

            threading.Thread(target=give_back, daemon=True).start()
            raise
        permit = self._register(token, delay, holder)
        if delay > 0:
            await asyncio.sleep(delay)
        return permit

    def release(self, permit: Permit | None = None) -> None:
        with self._lock:
            if permit is None:
                holder = self._holder()
                mine = [p for p in self._local.values() if p.holder == holder]
                if not mine:
                    raise PermitError(
                        f"release() without a permit: {holder} holds none from Ray limiter "
                        f"{self.name!r} (an acquire that failed, or a release registered before it?)"
                    )
                permit = mine[-1]
            if self._local.pop(permit.token, None) is None:
                raise PermitError(f"permit {permit.token[:8]}… is not held by this process")
        try:
            ray_get(self._actor.release.remote(permit.token))
        except LeaseExpiredError as exc:
            warnings.warn(str(exc), LeaseExpiredWarning, stacklevel=2)

    def _renew_forever(self) -> None:
        period = self.lease_seconds / 3
        while not self._closed.wait(period):
            with self._lock:
                tokens = list(self._local)
            if not tokens:
                continue
            try:
                lost = ray_get(self._actor.renew.remote(tokens), timeout=period)
            except Exception:
                continue  # the actor is busy or gone; try again (the lease covers a missed beat)
            for token in lost:
                with self._lock:
                    gone = self._local.pop(token, None)
                if gone is not None:
                    warnings.warn(
                        f"permit {token[:8]}… of {self.name!r} lost its lease",
                        LeaseExpiredWarning,
                        stacklevel=1,
                    )

    def close(self) -> None:
        """Stop renewing leases from this process (held permits then expire)."""
        self._closed.set()

    def destroy(self) -> None:
        """Kill the actor: every holder loses its permits, and the name is free again."""
        self.close()
        ray.kill(self._actor)

    def __repr__(self) -> str:
        return f"RayLimiter(limit={self._limit}, name={self.name!r}, lease_seconds={self.lease_seconds})"


def _reattach(
    handle: Any, limit: int, name: str, namespace: str | None, rate: float | None, lease_seconds: float
) -> RayLimiter:
    return RayLimiter(
        limit, name, namespace=namespace, rate=rate, lease_seconds=lease_seconds, _handle=handle
    )


def start_local_ray(num_cpus: int = 2, **options: Any) -> None:
    """``ray.init`` for a small local instance on loopback: no dashboard, no log forwarding.
    Always a new instance (``address="local"``): without it, ``ray.init`` joins a cluster that
    ``ray start`` began on this machine, if there is one (another program's, or another test's),
    and refuses the ``num_cpus`` given here."""
    settings: dict[str, Any] = {
        "address": "local",
        "num_cpus": num_cpus,
        "include_dashboard": False,
        "log_to_driver": False,
        "_node_ip_address": "127.0.0.1",
        "object_store_memory": 80 * 1024 * 1024,
    }
    settings.update(options)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(**settings)


def node_ids() -> list[str]:
    """Ids of the alive nodes of the connected cluster."""
    return [node["NodeID"] for node in ray.nodes() if node.get("Alive")]
