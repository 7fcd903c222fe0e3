"""The Ray limiter and pool on a real two-node cluster (``ray.cluster_utils.Cluster``, one machine).

As the seed design plans them, and more: the singleton across processes, a single node (6 calls of
a known duration with limit 3: lower time bound and order), rotten execution, multi-node, leases,
and the harness in ``--mode ray``. Ray starts once for this module, on loopback, with one CPU per
node. Timing assertions are lower bounds only (they hold however loaded the machine is).
"""

from __future__ import annotations

import json
import operator
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Ray reads this when it is imported: keep every address on loopback.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")

from mocksandbox.pytest_plugin import MockSandboxHandle  # noqa: E402
from mocksandbox.ratelimit import LimitMismatchError, PermitError, faulty  # noqa: E402
from mocksandbox.ratelimit.pool import RayExecutionPool  # noqa: E402
from mocksandbox.ratelimit.ray_limiter import RayLimiter, node_ids  # noqa: E402
from mocksandbox.stress.analysis import max_overlap  # noqa: E402
from mocksandbox.stress.drivers import StressWorker  # noqa: E402
from mocksandbox.stress.harness import StressConfig, run_stress  # noqa: E402
from mocksandbox.stress.subject import Subject  # noqa: E402
from mocksandbox.stress.workload import probe_hold  # noqa: E402

# One xdist worker runs them all (`make test` uses --dist loadgroup): one cluster per test run.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]
NAMESPACE = "mocksandbox-tests"
MB = 1024 * 1024

# Functions defined here run in Ray workers, which cannot import this test module: ship them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    node: dict[str, Any] = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 * MB}
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def identity(limit: int, name: str) -> tuple[str, int]:
    """In a worker: build the limiter by name; which actor instance did we get, from which process?"""
    return RayLimiter(limit, name).stats()["instance"], os.getpid()


class Holder:
    """An actor (its own process) that builds the limiter by name too."""

    def identity(self, limit: int, name: str) -> tuple[str, int]:
        return identity(limit, name)


def test_singleton_across_processes(cluster: Any) -> None:
    name = unique("singleton")
    limiter = RayLimiter(3, name)
    instance = limiter.stats()["instance"]
    holders = [
        ray.remote(Holder).options(num_cpus=0, scheduling_strategy=_on(node)).remote() for node in node_ids()
    ]
    seen = ray.get([h.identity.remote(3, name) for h in holders])
    seen.append(ray.get(ray.remote(identity).options(num_cpus=0).remote(3, name)))
    assert {inst for inst, _pid in seen} == {instance}
    assert len({pid for _inst, pid in seen} | {os.getpid()}) >= 3  # really other processes

    # Another driver process, connecting on its own, reaches the same actor.
    script = (
        "import os, ray; os.environ.setdefault('RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER', '0');"
        f"ray.init(address={cluster.address!r}, namespace={NAMESPACE!r}, log_to_driver=False,"
        " _node_ip_address='127.0.0.1');"
        "from mocksandbox.ratelimit.ray_limiter import RayLimiter;"
        f"print('INSTANCE', RayLimiter(3, {name!r}).stats()['instance'])"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert f"INSTANCE {instance}" in out.stdout, out.stderr[-2000:]

    # Another limit for the same name is refused, in the caller, with its type.
    with pytest.raises(LimitMismatchError, match="limit"):
        ray.get(ray.remote(identity).options(num_cpus=0).remote(4, name))
    with pytest.raises(LimitMismatchError):
        RayLimiter(4, name)
    limiter.destroy()


def _on(node: str | None) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return None if node is None else NodeAffinitySchedulingStrategy(node, soft=False)


def test_single_node_six_calls_limit_three_keep_order(cluster: Any) -> None:
    name = unique("single")
    limiter = RayLimiter(3, name)
    head = node_ids()[0]
    pool = RayExecutionPool(6, limiter, node_id=head)
    assert pool.node_id() == head
    pool.execute(probe_hold, 0.0)  # warm the pool actor up
    base = limiter.stats()["arrivals"]
    hold = 1.0
    started = time.monotonic()
    refs = []
    for i in range(6):
        refs.append(pool.submit(probe_hold, hold))
        # The next call is sent only once this one is queued at the limiter: arrival order is known.
        while limiter.stats()["arrivals"] < base + i + 1:
            time.sleep(0.005)
    windows = ray.get(refs)
    elapsed = time.monotonic() - started
    assert elapsed >= 2 * hold  # two waves of three, each at least `hold` long
    assert max_overlap(windows) <= 3
    starts = [start for start, _end in windows]
    # Order: the limiter granted in arrival order (= submission order here); so every call of the
    # second three started after every call of the first three started, and after one of them ended.
    stats = limiter.stats()
    assert stats["grant_order"] == stats["arrival_order"]
    assert max(starts[:3]) <= min(starts[3:])
    assert min(starts[3:]) >= min(end for _start, end in windows[:3])
    assert stats["max_in_flight"] <= 3 and stats["in_flight"] == 0
    pool.close()
    limiter.destroy()


def test_rotten_execution_raises_with_its_type_and_frees_the_permit(cluster: Any) -> None:
    limiter = RayLimiter(2, unique("rotten"))
    pool = RayExecutionPool(4, limiter)
    with pytest.raises(ZeroDivisionError):
        pool.execute(operator.truediv, 1, 0)
    assert pool.execute(operator.add, 40, 2) == 42
    stats = limiter.stats()
    assert stats["in_flight"] == 0 and stats["rejected_releases"] == 0
    with pytest.raises(PermitError):  # and a release that was never acquired is refused
        ray.get(limiter.handle.release.remote("not-a-token"))
    pool.close()
    limiter.destroy()


def test_multi_node_limit_holds_across_nodes(cluster: Any) -> None:
    nodes = node_ids()
    assert len(nodes) >= 2
    limiter = RayLimiter(3, unique("multi"))
    pools = [RayExecutionPool(6, limiter, node_id=node) for node in nodes[:2]]
    assert {pool.node_id() for pool in pools} == set(nodes[:2])
    hold = 0.5
    started = time.monotonic()
    windows = ray.get([pool.submit(probe_hold, hold) for pool in pools for _ in range(6)])
    elapsed = time.monotonic() - started
    assert max_overlap(windows) <= 3
    assert elapsed >= 12 * hold / 3  # twelve calls, three at a time
    assert limiter.stats()["max_in_flight"] <= 3 and limiter.in_flight == 0
    for pool in pools:
        pool.close()
    limiter.destroy()


def test_leases_return_a_dead_holders_permit_and_renew_a_live_ones(cluster: Any) -> None:
    limiter = RayLimiter(2, unique("lease"), lease_seconds=3.0)
    victim = (
        ray.remote(StressWorker)
        .options(num_cpus=0, max_restarts=0)
        .remote(Subject("limiter", limiter, "lease test"))
    )
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(victim.hold_and_die.remote())
    mine = limiter.acquire()  # a live holder: its lease is renewed while it holds
    time.sleep(6.5)  # past two leases: the dead holder's expired, ours was renewed (every 1 s)
    deadline = time.monotonic() + 60
    while limiter.in_flight > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = limiter.stats()
    assert stats["in_flight"] == 1 and stats["expired"] == 1  # the dead one's permit came back
    other = limiter.acquire(timeout=30)
    limiter.release(mine)  # still valid: renewed, not expired
    limiter.release(other)
    assert limiter.in_flight == 0
    limiter.destroy()


def test_harness_ray_mode_reference_passes(cluster: Any, mocksandbox: MockSandboxHandle) -> None:
    report = run_stress(
        StressConfig(
            url=mocksandbox.url,
            limit=3,
            mode="ray",
            requests=24,
            workload="sleep",
            sleep_seconds=0.05,
            failure_rate=0.15,
            kill_holders=1,
            ray_lease_seconds=2.0,
        )
    )
    assert report["verdict"]["passed"], report["verdict"]
    assert report["max_in_flight"] <= 3 and mocksandbox.stats()["max_in_flight"] <= 3
    assert report["permits"]["holders_killed"] == 1 and report["permits"]["leaked"] == 0
    assert report["errors"]["typed"] == report["errors"]["planned_failures"] == 4
    assert report["limit_conflict"]["outcome"] == "refused"


def test_harness_ray_mode_exposes_the_seeds_ray_pool_faults_2_3_5(
    cluster: Any, mocksandbox: MockSandboxHandle
) -> None:
    report = run_stress(
        StressConfig(
            url=mocksandbox.url,
            limit=3,
            mode="ray",
            requests=24,
            workload="sleep",
            sleep_seconds=0.05,
            failure_rate=0.2,
            executor=faulty.seed_ray_execution_pool,
            probe_seconds=0.2,
            kill_holders=1,  # one more seed pool, killed while its call holds a permit
        )
    )
    reasons = "\n".join(report["verdict"]["reasons"])
    errors = report["errors"]
    assert errors["swallowed"] == errors["planned_failures"] == 5, (errors, report["requests"])
    assert "errors swallowed" in reasons
    assert report["limit_conflict"]["outcome"] == "first-limit-wins"
    assert "first limit wins" in reasons
    permits = report["permits"]  # no lease: the dead pool's permit never comes back
    assert permits["holders_killed"] == 1 and permits["leaked"] == 1 and permits["effective_after"] == 2
    assert "permits leaked" in reasons


def test_cli_ray_mode_joins_a_cluster(cluster: Any, mocksandbox: MockSandboxHandle, tmp_path: Any) -> None:
    out = tmp_path / "ray.json"
    script = Path(sys.executable).with_name("mocksandbox")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "mocksandbox.cli"]
    result = subprocess.run(
        [
            *command, "stress", "--url", mocksandbox.url, "--limit", "2", "--mode", "ray",
            "--requests", "12", "--workload", "short", "--ray-address", cluster.address,
            "--json", str(out), "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["max_in_flight"] <= 2 and report["mode"] == "ray"
    assert report["limit_conflict"]["outcome"] == "refused"
