"""The stress harness: drive a limiter (or executor) against a sandbox and measure what happened.

A run, in order:

1. check that the target answers, and whether it is the mock (then its ``/_mock/`` figures are used);
2. build the subject from the factory (or the reference limiter for the mode);
3. *limit conflict check*: build a second one asking for ``limit + 1`` and measure how many calls
   it lets in at once; a named singleton that silently keeps the first limit shows up here;
4. optionally kill holders (``kill_holders``): processes or actors that die holding a permit;
5. the run: ``requests`` calls from ``workers`` workers (several times the limit, so that the cap
   is contested), each a program that stamps its own start and end;
6. *capacity probe*: ``limit + 2`` calls that hold for a moment, to measure how many permits the
   subject still hands out (fewer: leaked; more: permits grew); a shortfall is confirmed with
   longer holds before it is believed;
7. figures, verdict, JSON, plot.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from mocksandbox.stress import analysis
from mocksandbox.stress.drivers import AsyncioDriver, DriverError, ProcessDriver, RayDriver, ThreadDriver
from mocksandbox.stress.runner import Job, Outcome
from mocksandbox.stress.subject import FactoryError, Kind, Subject, build, load_factory
from mocksandbox.stress.target import ServerView, Target
from mocksandbox.stress.workload import WORKLOADS, CallSpec, build_program

Mode = Literal["threads", "asyncio", "processes", "ray"]
MODES: tuple[Mode, ...] = ("threads", "asyncio", "processes", "ray")
#: How long each capacity-probe call holds its permit, by mode (Ray and processes start slower).
PROBE_SECONDS = {"threads": 0.15, "asyncio": 0.15, "processes": 0.3, "ray": 1.0}


class ConfigError(ValueError):
    """A stress configuration that cannot run; the message says why."""


@dataclass
class StressConfig:
    """What to run. Only ``url`` and ``limit`` are required."""

    url: str
    limit: int
    mode: Mode = "threads"
    requests: int = 60
    workers: int | None = None
    limiter: str | Callable[..., Any] | None = None
    executor: str | Callable[..., Any] | None = None
    workload: str = "sleep"
    sleep_seconds: float = 0.1
    failure_rate: float = 0.05
    #: Requests per second the service allows (checks pacing; passed to factories that take ``rate``).
    rate: float | None = None
    #: Holders to kill while they hold a permit (processes and ray modes, limiters only).
    kill_holders: int = 0
    #: Share of requests whose first attempt the gateway answers 504 (``gateway`` workload).
    gateway_rate: float = 0.3
    retry_sleeps: tuple[float, ...] = (1.0, 2.0)
    timeout: float = 60.0
    seed: int = 0
    probe_seconds: float | None = None
    conflict_check: bool = True
    #: Seconds to wait before the capacity probe after killing holders (default: the subject's lease).
    leak_grace: float | None = None
    fifo_tolerance: float = 0.01
    idle_warning: float = 0.5
    strict: bool = False
    ray_address: str | None = None
    ray_lease_seconds: float | None = None

    def validate(self) -> None:
        if self.limit < 1:
            raise ConfigError("--limit must be at least 1")
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)}")
        if self.requests < 1:
            raise ConfigError("--requests must be at least 1")
        if self.workers is not None and self.workers < 1:
            raise ConfigError("--workers must be at least 1")
        if self.limiter is not None and self.executor is not None:
            raise ConfigError("give --limiter or --executor, not both")
        if self.workload not in WORKLOADS:
            raise ConfigError(f"--workload must be one of {', '.join(WORKLOADS)}")
        if not 0.0 <= self.failure_rate <= 1.0:
            raise ConfigError("--failure-rate must be between 0 and 1")
        if not 0.0 <= self.gateway_rate <= 1.0:
            raise ConfigError("--gateway-rate must be between 0 and 1")
        if self.rate is not None and self.rate <= 0:
            raise ConfigError("--rate must be positive")
        if self.kill_holders and self.mode not in ("processes", "ray"):
            raise ConfigError("--kill-holders needs --mode processes or ray")
        if self.kill_holders and self.executor is not None and self.mode != "ray":
            raise ConfigError(
                "--kill-holders needs a limiter (an executor owns its workers), or --mode ray with an "
                "executor that is a Ray actor handle"
            )
        if self.kill_holders >= self.limit:
            raise ConfigError("--kill-holders must be below --limit (some permits must remain)")

    @property
    def effective_workers(self) -> int:
        # At least limit + 2, so that the cap is contested and the probe can see too many.
        return max(self.workers or 4 * self.limit, self.limit + 2)


@dataclass
class Phase:
    """Progress hooks: ``start(name, total)`` then ``advance()`` per finished job."""

    start: Callable[[str, int], None] = lambda name, total: None
    advance: Callable[[], None] = lambda: None


@dataclass
class _Resources:
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for cleanup in reversed(self.cleanups):
            try:
                cleanup()
            except Exception:
                pass


def reference_factory(mode: Mode, run_id: str, config: StressConfig) -> Callable[..., Any]:
    """The reference limiter for ``mode``, as a factory ``(limit, rate=None)``."""
    if mode == "threads":
        from mocksandbox.ratelimit.thread import FairLimiter

        return lambda limit, rate=None: FairLimiter(limit, rate=rate, name="reference")
    if mode == "asyncio":
        from mocksandbox.ratelimit.aio import AsyncioLimiter

        return lambda limit, rate=None: AsyncioLimiter(limit, rate=rate, name="reference")
    if mode == "processes":
        from mocksandbox.ratelimit.process import ProcessLimiter

        return lambda limit, rate=None: ProcessLimiter(limit, f"stress-{run_id}", rate=rate)
    from mocksandbox.ratelimit.ray_limiter import RayLimiter

    lease = config.ray_lease_seconds or (5.0 if config.kill_holders else 60.0)
    return lambda limit, rate=None: RayLimiter(
        limit, f"mocksandbox-stress-{run_id}", rate=rate, lease_seconds=lease
    )


def _cleanup_reference(obj: Any) -> None:
    for name in ("unlink", "destroy", "close"):
        method = getattr(obj, name, None)
        if callable(method):
            method()
            return


def plan_jobs(config: StressConfig) -> tuple[list[Job], set[int], set[int]]:
    """The calls of the run, and which of them fail on purpose or meet a 504 first."""
    rng = random.Random(config.seed)
    count = config.requests
    indices = range(count)
    if config.workload == "fail":
        failing = set(indices)
    elif config.workload == "ping" or config.failure_rate == 0:
        failing = set()
    else:
        failing = set(rng.sample(indices, min(count, max(1, round(config.failure_rate * count)))))
    gateway: set[int] = set()
    if config.workload == "gateway" and config.gateway_rate > 0:
        gateway = set(rng.sample(indices, min(count, max(1, round(config.gateway_rate * count)))))
    jobs = [
        Job(
            "call",
            i,
            CallSpec(
                url=config.url.rstrip("/"),
                index=i,
                workload=config.workload,
                program=build_program(config.workload, i, config.sleep_seconds, i in failing),
                planned_failure=i in failing,
                timeout=config.timeout,
                retry_sleeps=tuple(config.retry_sleeps),
            ),
        )
        for i in indices
    ]
    return jobs, failing, gateway


def _make_driver(config: StressConfig, subject: Subject) -> Any:
    workers = config.effective_workers
    if config.mode == "threads":
        return ThreadDriver(subject, workers)
    if config.mode == "asyncio":
        return AsyncioDriver(subject, workers)
    if config.mode == "processes":
        return ProcessDriver(subject, workers, config.timeout)
    return RayDriver(subject, workers)


def _ensure_ray(config: StressConfig) -> bool:
    """Connect to Ray (or start a small local instance); True when this call started it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--mode ray needs Ray: pip install 'mocksandbox[ray]'") from None
    if ray.is_initialized():
        return False
    if config.ray_address:
        ray.init(address=config.ray_address, log_to_driver=False)
    else:
        from mocksandbox.ratelimit.ray_limiter import start_local_ray

        start_local_ray(num_cpus=2)
    return True


def _probe(
    driver: Any, subject: Subject | None, calls: int, seconds: float, phase: Phase, name: str
) -> dict[str, Any]:
    """Run ``calls`` holding calls at once through the subject; how many held a permit together."""
    jobs = [Job("probe", -(i + 1), seconds=seconds, subject=subject) for i in range(calls)]
    phase.start(name, calls)

    def seen(outcome: Outcome) -> None:
        phase.advance()

    outcomes = driver.run(jobs, seen)
    good = [o for o in outcomes if o.result == "ok" and o.holds]
    errors = Counter((o.error_type or o.returned or "no permit window") for o in outcomes if o not in good)
    return {
        "calls": calls,
        "hold_seconds": seconds,
        "held": len(good),
        "effective": analysis.max_overlap(h for o in good for h in o.holds),
        "errors": dict(errors),
    }


def _probe_until(
    driver: Any,
    subject: Subject | None,
    calls: int,
    expected: int,
    config: StressConfig,
    phase: Phase,
    name: str,
) -> dict[str, Any]:
    """Probe; when fewer than ``expected`` held at once, confirm with longer holds (3x, then 10x).

    A shortfall is only believed when it survives a hold long enough that slow worker starts
    cannot explain it: a loaded machine must not make a correct limiter look leaky.
    """
    seconds = _probe_seconds(config)
    probe = _probe(driver, subject, calls, seconds, phase, name)
    shorter: list[dict[str, Any]] = []
    for factor in (3, 10):
        if probe["effective"] >= expected or probe["errors"]:
            break
        shorter.append(probe)
        probe = _probe(driver, subject, calls, factor * seconds, phase, name)
    if shorter:
        probe["shorter_holds"] = shorter
    return probe


def _conflict_check(
    factory: Callable[..., Any],
    kind: Kind,
    main: Subject,
    config: StressConfig,
    driver: Any,
    phase: Phase,
    resources: _Resources,
) -> dict[str, Any]:
    asked = config.limit + 1
    result: dict[str, Any] = {"checked": True, "asked": asked}
    try:
        other_obj = build(factory, asked, config.rate)
    except Exception as exc:
        result.update(outcome="refused", error=f"{type(exc).__name__}: {exc}"[:400])
        return result
    other = Subject(kind, other_obj, f"{main.label} (limit {asked})")
    # The second pool lives as long as the run, as it would beside the first in a real program
    # (dropping a Ray actor handle kills the actor, and with it whatever it created).
    if other_obj is not main.obj:
        if config.limiter is None and config.executor is None:
            resources.cleanups.append(lambda: _cleanup_reference(other_obj))
        else:
            resources.cleanups.append(other.close)
    result["reported_limit"] = other.reported_limit()
    probe = _probe_until(driver, other, asked + 1, asked, config, phase, "limit conflict check")
    result["probe"] = probe
    effective = probe["effective"]
    result["effective"] = effective
    if effective >= asked:
        result["outcome"] = "honoured"
    elif effective == config.limit and not probe["errors"]:
        result["outcome"] = "first-limit-wins"
    else:
        result["outcome"] = "inconclusive"
    return result


def _probe_seconds(config: StressConfig) -> float:
    return config.probe_seconds or PROBE_SECONDS[config.mode]


def run_stress(config: StressConfig, phase: Phase | None = None) -> dict[str, Any]:
    """Run the stress test described by ``config`` and return the report (see :mod:`.report`)."""
    from mocksandbox.stress.report import build_report

    config.validate()
    phase = phase or Phase()
    target = Target(config.url, timeout=min(10.0, config.timeout))
    target.check()
    run_id = uuid.uuid4().hex[:8]
    resources = _Resources([target.close])
    try:
        if config.mode == "ray" and _ensure_ray(config):
            import ray

            resources.cleanups.insert(0, ray.shutdown)
        spec = config.executor or config.limiter
        kind: Kind = "executor" if config.executor is not None else "limiter"
        if spec is None:
            factory = reference_factory(config.mode, run_id, config)
            label = f"reference {config.mode} limiter"
        else:
            try:
                factory = load_factory(spec)
            except FactoryError as exc:
                raise ConfigError(str(exc)) from None
            label = spec if isinstance(spec, str) else getattr(spec, "__qualname__", repr(spec))
        try:
            obj = build(factory, config.limit, config.rate)
        except Exception as exc:
            raise ConfigError(f"the factory failed for limit {config.limit}: {exc!r}") from exc
        subject = Subject(kind, obj, label)
        if spec is None:
            resources.cleanups.append(lambda: _cleanup_reference(obj))
        else:
            resources.cleanups.append(subject.close)
        try:
            driver = _make_driver(config, subject)
        except DriverError as exc:
            raise ConfigError(str(exc)) from None
        resources.cleanups.append(driver.close)

        # One call first: starts lazy workers and actors, so that the subject under test is the
        # first to create whatever it shares (a Ray actor dies with the actor that created it).
        driver.run([Job("probe", -1, seconds=0.0)], lambda outcome: None)
        conflict = (
            _conflict_check(factory, kind, subject, config, driver, phase, resources)
            if config.conflict_check
            else {"checked": False}
        )
        jobs, failing, gateway = plan_jobs(config)
        snapshot = target.snapshot()
        fault_ids = target.add_faults(
            [
                {
                    "name": f"stress-{run_id}-504-{i}",
                    "match": {"path": "/run_code", "body_contains": f"# MSBX-REQ-{i};"},
                    "action": {"type": "status", "status": 504},
                    "schedule": {"first": 1},
                }
                for i in sorted(gateway)
            ]
        )
        resources.cleanups.append(lambda: target.remove_faults(fault_ids))
        try:
            killed = (
                driver.kill_holders(config.kill_holders, lambda: build(factory, config.limit, config.rate))
                if config.kill_holders
                else 0
            )
        except DriverError as exc:
            raise ConfigError(str(exc)) from None

        phase.start("stress run", len(jobs))
        started = time.time()

        def seen(outcome: Outcome) -> None:
            phase.advance()

        outcomes = driver.run(jobs, seen)
        ended = time.time()
        target.remove_faults(fault_ids)
        target.wait_idle()
        server: ServerView | None = target.server_view(snapshot) if snapshot is not None else None
        grace = config.leak_grace
        if grace is None and killed:
            lease = subject.lease_seconds()
            grace = min(120.0, lease + 1.0) if lease is not None else 0.5
        if grace:
            time.sleep(grace)
        # limit + 2 calls: one too many shows the cap; a second spare keeps a grown cap visible
        # when one probe call fails (an executor whose acquire sometimes fails).
        probe = _probe_until(driver, None, config.limit + 2, config.limit, config, phase, "capacity probe")
        in_flight_after = subject.in_flight()
    finally:
        resources.close()
    return build_report(
        config=config,
        label=label,
        kind=kind,
        is_mock=target.is_mock,
        outcomes=outcomes,
        failing=failing,
        gateway=gateway,
        started=started,
        ended=ended,
        server=server,
        conflict=conflict,
        probe=probe,
        in_flight_after=in_flight_after,
        killed=killed,
        workers=config.effective_workers,
        run_id=run_id,
    )


def config_dict(config: StressConfig) -> dict[str, Any]:
    data = asdict(config)
    for key in ("limiter", "executor"):
        value = data[key]
        if value is not None and not isinstance(value, str):
            data[key] = getattr(value, "__qualname__", repr(value))
    data["workers"] = config.effective_workers
    return data
