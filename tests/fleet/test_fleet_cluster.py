"""The Ray fleet on a simulated three-node cluster (``ray.cluster_utils.Cluster``, loopback).

One cluster and one fleet (three replicas, one per node) for the whole module: the contract suite
against the fleet URL, fault schedules and the cap counted fleet-wide, swedev sessions reached
from any replica, a replica killed mid-run, and verl's tool pattern (the project's
``CodeInterpreterTool`` with ``pool_mode: ray``) from actors on every node under a cluster-wide
rate limit. Every node's replica listens on the same loopback port (SO_REUSEPORT), so
the kernel spreads new connections over them as a node's clients would reach their own.

No assertion rests on timing: where a test needs requests on several replicas it checks that
they were (from the journal's ``worker``), and waits are for states, with generous deadlines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
pytest.importorskip("a2wsgi")

import requests  # noqa: E402

from mocksandbox.pytest_plugin import MockSandboxHandle  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("ray"),
    pytest.mark.mocksandbox_fleet(replicas=3, max_replicas_per_node=1),
]
NAMESPACE = "mocksandbox-fleet-tests"
MB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]

# Functions defined here run in Ray workers, which cannot import this test module: ship them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster(_mocksandbox_fleets: Any) -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    node: dict[str, Any] = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 * MB}
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        yield cluster
    finally:
        try:
            _mocksandbox_fleets.close()  # the plugin's fleet lives on this cluster: stop it first
            from ray import serve

            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()


@pytest.fixture
def fleet(cluster: Any, mocksandbox_fleet: MockSandboxHandle) -> MockSandboxHandle:
    """The module's fleet (the plugin's fixture, on the module's cluster), all replicas alive."""
    mocksandbox_fleet.sandbox.wait_replicas()  # type: ignore[union-attr]
    return mocksandbox_fleet


def post(url: str, path: str, body: Any, timeout: float = 120) -> requests.Response:
    """One request on a new connection (so the kernel picks a replica)."""
    with requests.Session() as session:
        session.trust_env = False
        return session.post(url + path, json=body, timeout=timeout)


def run_all(url: str, codes: list[str], timeout: float = 120) -> list[requests.Response]:
    with ThreadPoolExecutor(len(codes)) as pool:
        return list(
            pool.map(
                lambda code: post(url, "/run_code", {"code": code, "language": "python"}, timeout), codes
            )
        )


def workers_of(handle: MockSandboxHandle, path: str = "/run_code") -> set[str]:
    return {entry.worker for entry in handle.requests(path=path) if entry.worker}


# -- the contract suite -----------------------------------------------------------------------------


def _contract(url: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", *arguments, "--sandbox-url", url, "-p", "no:cacheprovider", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_contract_suite_passes_against_the_fleet(fleet: MockSandboxHandle) -> None:
    # The mock's extras count requests since their own reset: they need the target to themselves,
    # so they run after the rest (which runs on two xdist workers).
    rest = _contract(fleet.url, "contract_tests", "-n", "2", "--ignore", "contract_tests/test_mock_extras.py")
    assert rest.returncode == 0, rest.stdout[-6000:] + rest.stderr[-2000:]
    assert "swedev" in rest.stdout and " passed" in rest.stdout
    extras = _contract(fleet.url, "contract_tests/test_mock_extras.py")
    assert extras.returncode == 0, extras.stdout[-6000:] + extras.stderr[-2000:]
    assert "3 passed" in extras.stdout


# -- fleet-wide guarantees ----------------------------------------------------------------------------


def test_a_first_3_rule_fails_exactly_three_requests_fleet_wide(fleet: MockSandboxHandle) -> None:
    rule = fleet.fail(503, first=3)
    replies = run_all(fleet.url, [f"import time\ntime.sleep(0.2)\nprint({i})" for i in range(12)])
    statuses = sorted(r.status_code for r in replies)
    assert statuses == [200] * 9 + [503] * 3
    assert len(workers_of(fleet)) >= 2, "every request reached one replica: nothing was shown"
    [state] = [r for r in fleet.sandbox.fault_rules() if r.id == rule.id]
    assert (state.matched, state.fired) == (12, 3)
    assert fleet.stats()["faults_fired"] == {rule.id: 3}


def test_a_rule_and_a_cap_together_stay_exact_fleet_wide(fleet: MockSandboxHandle, visible_tmp_path: Path) -> None:
    """Leased permits and the actor's fault decisions at once: every admitted request holds its
    slot until the barrier, so the cap refuses exactly the six past it, and the rule (a short
    delay, then the program) fires on exactly the first two of the four admitted; the refused
    ones never reach it, as on one server."""
    fleet.set_capacity(max_in_flight=4)
    rule = fleet.delay(0.01, first=2)
    replies = held_past_the_cap(fleet, visible_tmp_path / "go", count=10, cap=4)
    assert sorted(r.status_code for r in replies) == [200] * 4 + [429] * 6
    [state] = [r for r in fleet.sandbox.fault_rules() if r.id == rule.id]
    assert (state.matched, state.fired) == (4, 2)
    stats = fleet.stats()
    assert stats["faults_fired"] == {rule.id: 2} and stats["max_in_flight"] == 4 and stats["in_flight"] == 0
    assert [e.fault_action for e in fleet.requests(path="/run_code") if e.faults] == ["delay", "delay"]


#: A held program's run_timeout: longer than any wait of a test that holds it (the default 10 s is
#: not, where a replica is killed and declared dead on a loaded machine), shorter than the client's 120 s.
HELD_RUN_TIMEOUT = 110


@contextmanager
def releasing(barrier: Path) -> Iterator[None]:
    """Creates ``barrier`` on the way out, whatever happened: a test that fails while it holds
    programs does not wait out their run_timeout. (Enter it after the pool that waits for them.)"""
    try:
        yield
    finally:
        barrier.touch()


def held_until(barrier: Path, i: int) -> str:
    """A program that stays in flight until the test creates ``barrier`` (every node of the
    simulated cluster is this machine), then prints ``i``. It lists the barrier's dir rather than
    look the file up: in a run's world (isolation lite) the host is an overlayfs lower layer, whose
    lookups keep a negative answer, while a dir only the host holds is listed afresh each time."""
    return (
        f"import os, time\nwhile {barrier.name!r} not in os.listdir({str(barrier.parent)!r}):\n"
        f"    time.sleep(0.02)\nprint({i})"
    )


def held_past_the_cap(
    fleet: MockSandboxHandle, barrier: Path, count: int, cap: int
) -> list[requests.Response]:
    """``count`` held programs at once against a cap of ``cap``: once ``cap`` hold their slots
    and the others are refused (whichever replica took them), the barrier lets them end; every
    reply, in the order sent."""
    with ThreadPoolExecutor(count) as pool, releasing(barrier):
        body = {"code": held_until(barrier, 7), "language": "python", "run_timeout": HELD_RUN_TIMEOUT}
        futures = [pool.submit(post, fleet.url, "/run_code", body) for _ in range(count)]
        refused = count - cap
        _wait_for(lambda: fleet.stats()["rejected_by_cap"] == refused, 120, f"{refused} refusals")
        assert fleet.stats()["in_flight"] == cap
        barrier.touch()
        return [f.result(timeout=120) for f in futures]


def test_the_cap_holds_across_replicas(fleet: MockSandboxHandle, visible_tmp_path: Path) -> None:
    fleet.set_capacity(max_in_flight=2)
    replies = held_past_the_cap(fleet, visible_tmp_path / "go", count=12, cap=2)
    codes = sorted(r.status_code for r in replies)
    assert codes == [200] * 2 + [429] * 10
    assert all(r.headers.get("Retry-After") for r in replies if r.status_code == 429)
    stats = fleet.stats()
    assert stats["max_in_flight"] == 2 and stats["in_flight"] == 0
    assert len(workers_of(fleet)) >= 2


def test_queued_over_the_cap_everyone_is_served_two_at_a_time(fleet: MockSandboxHandle) -> None:
    fleet.set_capacity(max_in_flight=2, overload="queue")
    replies = run_all(fleet.url, [f"import time\ntime.sleep(0.3)\nprint({i})" for i in range(8)])
    assert [r.status_code for r in replies] == [200] * 8
    assert [r.json()["run_result"]["stdout"] for r in replies] == [f"{i}\n" for i in range(8)]
    assert fleet.stats()["max_in_flight"] <= 2
    assert len(workers_of(fleet)) >= 2


def test_a_reset_fault_resets_the_clients_connection(fleet: MockSandboxHandle) -> None:
    # Each replica serves its connections itself (ingress "node"): a reset is a reset, as on one
    # server. (Behind Serve's proxies, ingress "serve", it is answered 502, saying so.)
    fleet.drop("reset", first=1)
    body = {"code": "print(1)", "language": "python"}
    with pytest.raises(requests.ConnectionError):
        post(fleet.url, "/run_code", body)
    assert post(fleet.url, "/run_code", body).status_code == 200
    assert [e.outcome for e in fleet.requests(path="/run_code")] == ["dropped", "answered"]


def test_one_journal_in_arrival_order_and_one_reset_for_all(fleet: MockSandboxHandle) -> None:
    run_all(fleet.url, ["print(1)"] * 9)
    entries = fleet.requests(path="/run_code")
    assert [e.id for e in entries] == sorted(e.id for e in entries)  # one arrival order
    assert fleet.stats()["requests_total"] == 9
    assert requests.post(fleet.url + "/_mock/reset", json={}, timeout=60).json() == {"reset": True}
    assert fleet.stats()["requests_total"] == 0 and fleet.requests() == []


def test_without_rules_or_cap_the_control_actor_is_off_the_request_path(fleet: MockSandboxHandle) -> None:
    """The fast path: no actor call per request; replicas tell their requests in batches, and a
    read drains them first, so the journal is complete, in arrival order across replicas (ids
    follow the times the requests arrived), with every answer; the actor decides on the requests a
    rule matches (one call each), the others stay off its path."""
    control = fleet.sandbox.control  # type: ignore[union-attr]
    counted = control.call_counts()
    before = sum(counted.values())
    replies = run_all(
        fleet.url, [f"import time\ntime.sleep(0.05 * ({i} % 3))\nprint({i})" for i in range(24)]
    )
    assert [r.status_code for r in replies] == [200] * 24
    assert sum(control.call_counts().values()) == before, "the actor was called on the request path"
    entries = fleet.requests(path="/run_code")
    assert len(entries) == 24 and len({e.worker for e in entries}) >= 2
    assert [e.started for e in entries] == sorted(e.started for e in entries)  # ids in arrival order
    assert all(e.status == 200 and e.ended is not None and e.ended >= e.started for e in entries)
    stats = fleet.stats()
    assert (stats["requests_total"], stats["by_status"], stats["in_flight"]) == (24, {"200": 24}, 0)
    assert 1 <= stats["max_in_flight"] <= 24
    # A rule for another path: these requests stay off the actor's path.
    fleet.fail(503, path="/submit")
    assert [r.status_code for r in run_all(fleet.url, ["print(1)"] * 6)] == [200] * 6
    assert sum(control.call_counts().values()) == before, (
        "the actor was asked about a request no rule matches"
    )
    # A rule they match: the actor decides on each (one call), exactly; the journal goes on in order.
    rule = fleet.fail(503, first=1)
    replies = run_all(fleet.url, ["print(1)"] * 3)
    assert [r.status_code for r in replies].count(503) == 1
    calls = control.call_counts()
    decides, admits = (calls.get(k, 0) - counted.get(k, 0) for k in ("decide", "admit"))
    assert (decides, admits) == (3, 0), calls
    entries = fleet.requests(path="/run_code")
    assert [e.started for e in entries] == sorted(e.started for e in entries)
    assert [e.faults for e in entries if e.status == 503] == [[rule.id]]


def test_with_a_cap_only_replicas_admit_on_leased_permits(fleet: MockSandboxHandle) -> None:
    """A cap and no rule: each replica admits on permits leased to it in blocks, so the actor is
    called far less than once per request, never past the cap, and the journal keeps one arrival
    order across replicas under concurrent load."""
    control = fleet.sandbox.control  # type: ignore[union-attr]
    fleet.set_capacity(max_in_flight=32)
    before = control.call_counts()
    codes = [f"import time\ntime.sleep(0.02 * ({i} % 4))\nprint({i})" for i in range(48)]
    with ThreadPoolExecutor(8) as pool:
        replies = list(
            pool.map(lambda c: post(fleet.url, "/run_code", {"code": c, "language": "python"}), codes)
        )
    assert [r.json()["run_result"]["stdout"] for r in replies] == [f"{i}\n" for i in range(48)]
    after = control.call_counts()
    assert after.get("admit", 0) == before.get("admit", 0), "a request went through the actor's admit"
    leases = after.get("lease", 0) - before.get("lease", 0)
    assert 1 <= leases <= len(codes) // 2, f"{leases} lease calls for {len(codes)} requests"
    entries = fleet.requests(path="/run_code")
    assert len(entries) == 48 and len({e.worker for e in entries}) >= 2
    assert [e.started for e in entries] == sorted(e.started for e in entries)  # ids in arrival order
    stats = fleet.stats()
    assert stats["in_flight"] == 0 and 1 <= stats["max_in_flight"] <= 8 and stats["rejected_by_cap"] == 0


# -- swedev sessions --------------------------------------------------------------------------------------


def _instance_hash(url: str) -> str:
    with requests.Session() as session:
        session.trust_env = False
        return str(session.get(url + "/_mock/instances", timeout=60).json()["instances"][0]["instance_hash"])


ECHO = "<function=execute_bash>\n<parameter=command>cat marker.txt 2>/dev/null || echo none</parameter>\n</function>"
WRITE = "<function=execute_bash>\n<parameter=command>echo {text} > marker.txt</parameter>\n</function>"


def test_a_session_is_reached_from_every_replica(fleet: MockSandboxHandle) -> None:
    reply = post(fleet.url, "/start_instance", {"instance_hash": _instance_hash(fleet.url)}, timeout=600)
    assert reply.status_code == 200, reply.text
    sid = reply.json()["sid"]
    [start] = fleet.requests(path="/start_instance")
    owner = start.worker
    assert (
        post(fleet.url, "/process_action", {"sid": sid, "content": WRITE.format(text="here")}).status_code
        == 200
    )
    # Ask until another replica than the owner took one (each try lands on a random replica).
    for _ in range(60):
        answer = post(fleet.url, "/process_action", {"sid": int(sid), "content": ECHO})
        assert answer.status_code == 200, answer.text
        assert "here" in answer.json()["content"]  # the owner's work tree, whoever was asked
        if workers_of(fleet, "/process_action") - {owner}:
            break
    else:
        pytest.fail("60 requests, all on the session's own replica")
    listed = requests.get(fleet.url + "/_mock/sessions", timeout=60).json()
    assert [s["sid"] for s in listed["live"]] == [sid]
    reward = post(fleet.url, "/compute_reward", {"sid": sid}, timeout=600)
    assert reward.status_code == 200 and isinstance(reward.json()["reward"], int | float)
    assert post(fleet.url, "/process_action", {"sid": "12345", "content": ECHO}).status_code == 404
    # A reset through any replica ends the session where it lives.
    requests.post(fleet.url + "/_mock/reset", json={}, timeout=60).raise_for_status()
    assert requests.get(fleet.url + "/_mock/sessions", timeout=60).json()["live"] == []


def test_a_session_survives_its_replicas_restart(fleet: MockSandboxHandle) -> None:
    box: Any = fleet.sandbox
    reply = post(fleet.url, "/start_instance", {"instance_hash": _instance_hash(fleet.url)}, timeout=600)
    sid = reply.json()["sid"]
    assert (
        post(fleet.url, "/process_action", {"sid": sid, "content": WRITE.format(text="kept")}).status_code
        == 200
    )
    [start] = fleet.requests(path="/start_instance")
    [owner] = [r for r in box.replicas() if r["key"] == start.worker]
    ray.kill(owner["handle"], no_restart=False)  # a crash: Ray restarts it on its node
    # Ray restarts it on its node (one replica per node): the successor takes the slot, and
    # with it the state dir holding the session.
    successor = _wait_for(
        lambda: [r for r in box.replicas() if r["slot"] == owner["slot"] and r["key"] != owner["key"]],
        180,
        "a successor in the dead replica's slot",
    )[0]
    assert successor["node_id"] == owner["node_id"]
    box.wait_replicas(3, timeout=180)
    for _ in range(3):
        answer = post(fleet.url, "/process_action", {"sid": sid, "content": ECHO})
        assert answer.status_code == 200, answer.text
        assert "kept" in answer.json()["content"]
    assert post(fleet.url, "/postprocess", {"sid": sid}, timeout=600).status_code == 200


# -- a replica killed mid-run ------------------------------------------------------------------------------


def _pending_by_worker(handle: MockSandboxHandle) -> dict[str, list[int]]:
    pending: dict[str, list[int]] = {}
    for entry in handle.requests(path="/run_code"):
        if entry.ended is None and entry.worker:
            pending.setdefault(entry.worker, []).append(entry.id)
    return pending


def _wait_for(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"{what}: not within {timeout:g} s")


def _all_held(handle: MockSandboxHandle, futures: list[Any], count: int) -> bool:
    """Whether ``count`` requests are in flight; a held request answered already fails the test
    with its answer (a refusal by the cap, a program that could not see its barrier, ...)."""
    for future in futures:
        if future.done():
            reply = future.result()
            pytest.fail(
                f"a held request was answered before its barrier: {reply.status_code} {reply.text[:2000]};"
                f" stats {handle.stats()}"
            )
    return bool(handle.stats()["in_flight"] == count)


def _served_by(handle: MockSandboxHandle, code: str) -> str | None:
    return next((e.worker for e in handle.requests(path="/run_code") if e.body["code"] == code), None)


def test_a_killed_replica_fails_its_requests_only_and_gives_back_its_permits(
    fleet: MockSandboxHandle, visible_tmp_path: Path
) -> None:
    box: Any = fleet.sandbox
    fleet.set_capacity(max_in_flight=9)  # a cap and no rule: the replicas' permits are leased
    admits = box.control.call_counts().get("admit", 0)
    for attempt in range(5):
        barrier = visible_tmp_path / f"go-{attempt}"
        codes = [held_until(barrier, i) for i in range(9)]
        bodies = [{"code": c, "language": "python", "run_timeout": HELD_RUN_TIMEOUT} for c in codes]
        pool = ThreadPoolExecutor(9)
        futures = [pool.submit(post, fleet.url, "/run_code", body, 120) for body in bodies]
        _wait_for(lambda held=futures: _all_held(fleet, held, 9), 60, "nine requests in flight")
        pending = _pending_by_worker(fleet)
        if len(pending) >= 2:
            break
        # Serve's proxy sent all nine to one replica (its choice, now and then): killing that one
        # would say nothing of the others' requests. Let them end and send nine again.
        barrier.touch()
        assert [f.result(timeout=120).status_code for f in futures] == [200] * 9
        pool.shutdown()
        _wait_for(lambda: fleet.stats()["in_flight"] == 0, 60, "the nine answered")
    else:
        pytest.fail(f"five times, all nine requests went to one replica: {pending}")
    with pool, releasing(barrier):
        victim = max(pending, key=lambda w: len(pending[w]))
        # Its leases: one permit per request it admitted (counted right after each admission).
        record = _wait_for(
            lambda: [r for r in box.replicas() if r["key"] == victim and r["held"] == len(pending[victim])],
            60,
            "the victim's leases counted",
        )[0]
        ray.kill(record["handle"], no_restart=False)  # a crash: Ray restarts it on its node
        # The victim's requests fail now, while the others are still held: none waits on them.
        _wait_for(
            lambda: all(
                f.done() for f, c in zip(futures, codes, strict=True) if _served_by(fleet, c) == victim
            ),
            120,
            "the killed replica's requests answered",
        )
        assert not any(
            f.done() for f, c in zip(futures, codes, strict=True) if _served_by(fleet, c) != victim
        )
        # Once Ray reports the victim dead, its permits are back, while the others hold theirs.
        _wait_for(
            lambda: not any(r["key"] == victim for r in box.replicas()),
            60,
            "the control actor declares the victim dead",
        )
        assert fleet.stats()["in_flight"] == 9 - len(pending[victim])
        barrier.touch()
        replies: list[Any] = []
        for future in futures:  # none hangs
            try:
                replies.append(future.result(timeout=120))
            except requests.ConnectionError as exc:  # the victim served this connection itself
                replies.append(exc)
    by_id = {e.id: e for e in fleet.requests(path="/run_code")}
    for reply, code in zip(replies, codes, strict=True):
        [entry] = [e for e in by_id.values() if e.body["code"] == code]
        if entry.worker == victim:
            # Its connection dies with it, as with one server (behind Serve's proxy: a 5xx).
            assert isinstance(reply, requests.ConnectionError) or 500 <= reply.status_code < 600, reply
            assert entry.outcome == "lost"
        else:
            assert reply.status_code == 200 and reply.json()["run_result"]["stdout"] == code[-2] + "\n", (
                reply.text
            )
    assert fleet.stats()["in_flight"] == 0
    assert box.control.call_counts().get("admit", 0) == admits  # (every permit came in a lease)
    events = [str(e.body) for e in fleet.requests() if e.method == "EVENT" and victim in str(e.body)]
    assert events and "died" in events[-1] and "cap permit(s) given back" in events[-1], events
    # Ray restarts it on its node; the fleet then admits its whole cap again at once.
    alive = box.wait_replicas(3, timeout=180)
    assert victim not in {r["key"] for r in alive}
    fleet.set_capacity(max_in_flight=3)
    second = visible_tmp_path / "again"
    with ThreadPoolExecutor(3) as pool, releasing(second):
        body = {"code": held_until(second, 3), "language": "python", "run_timeout": HELD_RUN_TIMEOUT}
        held = [pool.submit(post, fleet.url, "/run_code", body) for _ in range(3)]
        _wait_for(lambda: _all_held(fleet, held, 3), 120, "three in flight at once")
        second.touch()
        assert [f.result(timeout=120).status_code for f in held] == [200] * 3
    assert fleet.stats()["rejected_by_cap"] == 0


# -- verl's tool pattern through Ray, and the stress harness -------------------------------------------------


def _square_policy(a: int) -> Any:
    from mocksandbox.tools import PolicyInput, format_tool_call

    def play(view: PolicyInput) -> str:
        if view.turn == 0:
            code = f"import time\ntime.sleep(0.1)\nprint({a} * {a})"
            return format_tool_call("code_interpreter", {"code": code})
        return f"#### {view.last_tool_responses[0].strip()}"

    return play


class RolloutWorker:
    """A rollout worker of one node: its own tool (and Ray execution pool), one shared limiter."""

    def run(self, url: str, limiter_name: str, first: int, count: int) -> tuple[str, list[float]]:
        from mocksandbox.tools import CodeInterpreterTool, RolloutDriver

        tool = CodeInterpreterTool(
            {
                "sandbox_fusion_url": url,
                "pool_mode": "ray",
                "rate_limit": 3,
                "num_workers": 8,
                "rate_limiter_name": limiter_name,
                "ray_namespace": NAMESPACE,
            }
        )
        try:
            driver = RolloutDriver([tool])
            batch = [
                driver.create_request(f"{i}^2?", _square_policy(i), ground_truth=str(i * i))
                for i in range(first, first + count)
            ]
            records = driver.run_sync(batch)
        finally:
            tool.close()
        return ray.get_runtime_context().get_node_id(), [r.score for r in records]


def test_verl_tool_pattern_from_every_node_under_a_cluster_wide_limit(fleet: MockSandboxHandle) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from mocksandbox.ratelimit.ray_limiter import RayLimiter, node_ids

    name = f"fleet-tools-{uuid.uuid4().hex[:8]}"
    # The driver makes the limiter (as verl's trainer process would): the workers' tools attach to
    # it by name, and it outlives any one of them.
    limiter = RayLimiter(3, name, namespace=NAMESPACE)
    nodes = node_ids()
    assert len(nodes) == 3
    workers = [
        ray.remote(RolloutWorker)
        .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
        .remote()
        for node in nodes
    ]
    try:
        results = ray.get(
            [w.run.remote(fleet.url, name, 10 * k, 8) for k, w in enumerate(workers)], timeout=300
        )
        assert sorted(node for node, _ in results) == sorted(nodes)
        assert all(scores == [1.0] * 8 for _, scores in results)
        stats = fleet.stats()
        assert stats["by_path"] == {"/run_code": 24} and stats["by_status"] == {"200": 24}
        assert 1 <= stats["max_in_flight"] <= 3  # the fleet saw the cluster-wide limit hold
        granted = limiter.stats()
        assert granted["grants"] == 24 and granted["max_in_flight"] <= 3 and granted["in_flight"] == 0
        assert len(workers_of(fleet)) >= 2
    finally:
        for worker in workers:
            ray.kill(worker)
        limiter.destroy()


def test_stress_ray_mode_against_the_fleet(cluster: Any, fleet: MockSandboxHandle, tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    result = subprocess.run(
        [
            sys.executable, "-m", "mocksandbox.cli", "stress", "--url", fleet.url, "--limit", "3",
            "--mode", "ray", "--requests", "24", "--workload", "sleep", "--sleep", "0.1",
            "--ray-address", cluster.address, "--json", str(out), "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "ray" and report["verdict"]["passed"], report["verdict"]
    assert report["max_in_flight"] <= 3 and 1 <= fleet.stats()["max_in_flight"] <= 3
    assert len(workers_of(fleet)) >= 2
