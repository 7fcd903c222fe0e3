"""What is under test: a limiter or an executor, however it is shaped, behind one small adapter.

Accepted shapes, so that a user's factory can return what their code really uses:

* a limiter: ``acquire()`` (returning a permit or anything, or nothing) and ``release(permit)``
  or ``release()``; coroutine methods or ``acquire_async`` for asyncio; Ray actor handles whose
  methods have ``.remote`` (``ray.get`` is called for you);
* an executor: ``execute(fn, *args)`` returning the result (sync), a coroutine, or a Ray
  ``ObjectRef`` (``execute.remote``, as the seed's ``init_execution_pool`` returns).

A factory is ``pkg.mod:name`` (or a callable) taking the limit, and ``rate=`` if it accepts it.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["limiter", "executor"]


class FactoryError(ValueError):
    """A ``pkg.mod:factory`` that cannot be imported or called."""


def load_factory(spec: str | Callable[..., Any]) -> Callable[..., Any]:
    """The callable named by ``pkg.mod:attr.path`` (or ``spec`` itself when already callable)."""
    if callable(spec):
        return spec
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise FactoryError(f"{spec!r}: expected 'package.module:factory'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise FactoryError(f"{spec!r}: cannot import {module_name!r}: {exc}") from None
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise FactoryError(f"{spec!r}: {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(obj):
        raise FactoryError(f"{spec!r} is not callable")
    return obj  # type: ignore[no-any-return]


def _accepts_keyword(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def build(factory: Callable[..., Any], limit: int, rate: float | None) -> Any:
    """Call ``factory(limit)``, passing ``rate=`` when given and accepted."""
    if rate is not None and _accepts_keyword(factory, "rate"):
        return factory(limit, rate=rate)
    return factory(limit)


def _is_remote(method: Any) -> bool:
    return hasattr(method, "remote") and not inspect.ismethod(method)


def _call(method: Any, *args: Any) -> Any:
    if _is_remote(method):
        from mocksandbox.ratelimit.ray_limiter import ray_get

        return ray_get(method.remote(*args))
    return method(*args)


def _takes_argument(method: Any) -> bool:
    if _is_remote(method):
        return False  # a Ray actor method: the seed's release() takes none
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


def _unwrap(exc: BaseException) -> BaseException:
    if "ray" not in sys.modules:  # a Ray error needs Ray loaded; do not import it for nothing
        return exc
    from mocksandbox.ratelimit.ray_limiter import unwrap_ray_error

    return unwrap_ray_error(exc)


@dataclass
class Subject:
    """The thing under test and how to drive it. Picklable when ``obj`` is."""

    kind: Kind
    obj: Any
    label: str

    # -- limiter side --------------------------------------------------------------------------

    def acquire(self) -> Any:
        return _call(self.obj.acquire)

    def release(self, permit: Any) -> None:
        release = self.obj.release
        if permit is not None and _takes_argument(release):
            _call(release, permit)
        else:
            _call(release)

    async def acquire_async(self) -> Any:
        obj = self.obj
        if hasattr(obj, "acquire_async"):
            return await obj.acquire_async()
        if inspect.iscoroutinefunction(obj.acquire):
            return await obj.acquire()
        if _is_remote(obj.acquire):
            return await obj.acquire.remote()
        # A blocking acquire: wait in a thread, and give back what it gets if we are cancelled.
        from mocksandbox.ratelimit.base import acquire_in_thread

        return await acquire_in_thread(self.acquire, self.release)

    async def release_async(self, permit: Any) -> None:
        release = self.obj.release
        if inspect.iscoroutinefunction(release):
            if permit is not None and _takes_argument(release):
                await release(permit)
            else:
                await release()
            return
        self.release(permit)

    # -- executor side -------------------------------------------------------------------------

    @property
    def is_ray_handle(self) -> bool:
        return self.kind == "executor" and _is_remote(getattr(self.obj, "execute", None))

    @property
    def retries_outside_permit(self) -> bool:
        """The executor retries failed attempts itself (a ``retry`` policy): give it one attempt."""
        return self.kind == "executor" and getattr(self.obj, "retry", None) is not None

    def execute(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return _call(self.obj.execute, fn, *args)
        except BaseException as exc:
            cause = _unwrap(exc)
            if cause is exc:
                raise
            raise cause from None

    async def execute_async(self, fn: Callable[..., Any], *args: Any) -> Any:
        obj = self.obj
        if hasattr(obj, "execute_async"):
            return await obj.execute_async(fn, *args)
        if inspect.iscoroutinefunction(obj.execute):
            return await obj.execute(fn, *args)
        return await asyncio.get_running_loop().run_in_executor(None, self.execute, fn, *args)

    # -- what it tells about itself ----------------------------------------------------------

    def reported_limit(self) -> int | None:
        for owner in self._owners():
            for name in ("limit", "rate_limit"):
                value = getattr(owner, name, None)
                if isinstance(value, int) and not isinstance(value, bool):
                    return value
        return None

    def in_flight(self) -> int | None:
        """Permits the subject says are held (``None`` when it does not say)."""
        for owner in self._owners():
            for name in ("in_flight", "get_current_count", "current_count"):
                try:
                    value = getattr(owner, name, None)
                    if value is None:
                        continue
                    if callable(value) or _is_remote(value):
                        value = _call(value)
                except Exception:
                    continue
                if isinstance(value, int) and not isinstance(value, bool):
                    return value
        return None

    def lease_seconds(self) -> float | None:
        for owner in self._owners():
            value = getattr(owner, "lease_seconds", None)
            if isinstance(value, int | float):
                return float(value)
        return None

    def _owners(self) -> list[Any]:
        owners = [self.obj]
        for name in ("limiter", "rate_limit_worker", "bucket"):
            inner = getattr(self.obj, name, None)
            if inner is not None:
                owners.append(inner)
        return owners

    def close(self) -> None:
        for name in ("close", "shutdown"):
            method = getattr(self.obj, name, None)
            if callable(method) and not _is_remote(method):
                try:
                    method()
                except Exception:
                    pass
                return
