"""The fleet's control actor as a plain object (no Ray cluster): leases, slots and the session index.

Ray's part (noticing that a replica's actor died) is exercised on a real cluster in
``test_fleet_cluster.py``; here a death is declared directly, as the watcher does on Ray's report.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before Ray's first import
pytest.importorskip("ray")

from mocksandbox.control import ray_state
from mocksandbox.control.ray_state import ControlActor
from mocksandbox.control.state import CapacityPolicy, IncomingRequest
from mocksandbox.faults import validate_fault_spec


@pytest.fixture
def actor() -> Iterator[ControlActor]:
    actor = ControlActor(1000, CapacityPolicy(max_in_flight=3), [])
    yield actor
    actor.shutdown()


def request(code: str = "print(1)") -> IncomingRequest:
    return IncomingRequest("POST", "/run_code", "", f'{{"code": "{code}"}}'.encode(), "c:1")


def test_a_dead_replicas_permits_and_requests_come_back(actor: ControlActor) -> None:
    actor.register("a", None, "node-1", "http://a")
    actor.register("b", None, "node-2", "http://b")
    a1, a2 = actor.admit(request(), "a"), actor.admit(request(), "a")
    b1 = actor.admit(request(), "b")
    assert all(x.admitted for x in (a1, a2, b1))
    assert not actor.admit(request(), "b").admitted  # the cap: 3
    actor._declare_dead("a", "died")
    assert actor.stats()["in_flight"] == 1
    lost = [e for e in actor.entries() if e.id in (a1.entry_id, a2.entry_id)]
    assert [e.outcome for e in lost] == ["lost", "lost"]
    [event] = [e for e in actor.entries() if e.method == "EVENT"][-1:]
    assert "replica a died; 2 request(s) it was serving lost, 2 cap permit(s) given back" in str(event.body)
    # Its late calls change nothing (its permits went back already).
    actor.finish(a1.entry_id, 200, b"{}", "answered", True, "a")
    actor.leave("a")
    assert actor.stats()["in_flight"] == 1
    # The whole cap is there again: two more besides b's.
    assert actor.admit(request(), "b").admitted and actor.admit(request(), "b").admitted
    assert not actor.admit(request(), "b").admitted


def test_admitted_after_its_replica_died_the_permit_goes_back_at_once(actor: ControlActor) -> None:
    actor.register("a", None, "node-1", "http://a")
    actor._declare_dead("a", "died")
    admission = actor.admit(request(), "a")
    assert admission.admitted  # (the waiting caller is gone; nobody reads this)
    assert actor.stats()["in_flight"] == 0


def test_finish_and_leave_release_exactly_their_own_permits(actor: ControlActor) -> None:
    actor.register("a", None, "node-1", "http://a")
    first = actor.admit(request(), "a")
    second = actor.admit(request(), "a")
    actor.finish(first.entry_id, 200, b"{}", "answered", True, "a")
    actor.finish(second.entry_id, 200, b"{}", "answered", False, "a")  # a slow body: still in flight
    assert [r["held"] for r in actor.replicas()] == [1]
    actor.leave("a")
    assert [r["held"] for r in actor.replicas()] == [0] and actor.stats()["in_flight"] == 0


def test_a_successor_on_the_same_node_takes_the_dead_replicas_slot(actor: ControlActor) -> None:
    assert actor.register("a", None, "node-1", "http://a") == 1
    assert actor.register("b", None, "node-2", "http://b") == 2
    actor._declare_dead("a", "died")
    assert actor.register("c", None, "node-2", "http://c") == 3  # another node: a new slot
    assert actor.register("d", None, "node-1", "http://d") == 1  # a's node: a's slot
    assert sorted((r["key"], r["slot"], r["alive"]) for r in actor.replicas()) == [
        ("b", 2, True),
        ("c", 3, True),
        ("d", 1, True),
    ]


def test_sessions_route_to_whoever_holds_their_slot(actor: ControlActor) -> None:
    actor.register("a", None, "node-1", "http://a")
    actor.place_session("42", "a")
    assert actor.route_session("42") == (1, "a", "http://a")
    assert actor.route_session("43") is None
    actor._declare_dead("a", "died")
    assert actor.route_session("42") == (1, None, None)  # down: the router answers 503
    actor.register("b", None, "node-1", "http://b")
    assert actor.route_session("42") == (1, "b", "http://b")
    actor.reset([], CapacityPolicy())
    assert actor.route_session("42") is None


def test_fault_schedules_are_counted_once_for_every_replica(actor: ControlActor) -> None:
    actor.register("a", None, "node-1", "http://a")
    actor.register("b", None, "node-2", "http://b")
    actor.set_capacity(CapacityPolicy())
    [rule] = actor.add_faults(
        [
            validate_fault_spec(
                {
                    "match": {"path": "/run_code"},
                    "action": {"type": "status", "status": 503},
                    "schedule": {"first": 3},
                }
            )
        ]
    )
    fired = 0
    for i in range(8):
        admission = actor.admit(request(), "ab"[i % 2])
        fired += admission.decision.action is not None
        actor.finish(admission.entry_id, 200, b"{}", "answered", True, "ab"[i % 2])
    assert fired == 3
    assert actor.stats()["faults_fired"] == {rule.id: 3}


def test_told_requests_reach_the_journal_in_time_order_with_or_without_a_read(actor: ControlActor) -> None:
    """What replicas tell on the fast path: a read drains it all, in the order it happened; with
    nobody reading, what is old enough that nothing older can come goes in by itself."""
    now = time.time()

    def request(replica: str, local: int, at: float) -> list[tuple[object, ...]]:
        begin = ("begin", replica, at, local, "POST", "/run_code", "", b"{}", "client", True, 0, at)
        return [begin, ("finish", replica, at + 0.01, local, 200, b"{}", "answered", True, ())]

    actor.told("r1", 1, request("r1", -1, now - 30) + request("r1", -2, now), None)
    actor.told("r2", 2, request("r2", -1, now - 20), None)  # (its batch 1 has not arrived yet)
    actor.told("r2", 1, request("r2", -3, now - 25), None)
    deadline = time.monotonic() + 10
    while len(actor.state.entries()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)  # the applier's rounds: the three old requests, not the new one
    assert [(e.worker, e.status) for e in actor.state.entries()] == [("r1", 200), ("r2", 200), ("r2", 200)]
    assert [e.started for e in actor.state.entries()] == sorted(e.started for e in actor.state.entries())
    entries = actor.entries()  # a read drains the rest
    assert len(entries) == 4 and [e.id for e in entries] == [1, 2, 3, 4]
    assert actor.stats()["in_flight"] == 0 and actor.stats()["requests_total"] == 4


# -- the cap's permits, leased in blocks (no rule in force) -------------------------------------------


def test_with_a_cap_only_permits_are_leased_in_blocks_and_never_past_the_cap(actor: ControlActor) -> None:
    actor.register("a", None, "node-1", "http://a")
    actor.register("b", None, "node-2", "http://b")
    epoch = actor.path_word().epoch
    assert actor.path_word().mode == "leased" and epoch >= 1
    assert actor.lease("a", epoch, 2)[:2] == (epoch, 2)
    assert actor.lease("b", epoch, 2)[:2] == (epoch, 1)  # what is left
    assert actor.lease("b", epoch, 1)[:2] == (epoch, 0)  # every permit is out: refused
    assert sorted((r["key"], r["held"]) for r in actor.replicas()) == [("a", 2), ("b", 1)]
    actor.give_back("a", epoch, 1)
    assert actor.lease("b", epoch, 4)[:2] == (epoch, 1)
    actor.give_back("a", epoch - 1, 1)  # a permit of another epoch is void
    assert actor.lease("b", epoch, 1)[:2] == (epoch, 0)
    assert actor.lease("b", epoch - 1, 1)[1] == -1  # an epoch that is over: ask admit
    assert actor.call_counts()["lease"] == 6 and "admit" not in actor.call_counts()


def test_a_dead_replicas_leased_permits_come_back(actor: ControlActor) -> None:
    actor.register("a", None, "node-1", "http://a")
    actor.register("b", None, "node-2", "http://b")
    epoch = actor.path_word().epoch
    assert actor.lease("a", epoch, 3)[1] == 3
    # One of them in use: a's request, told.
    now = time.time()
    begin = ("begin", "a", now, -1, "POST", "/run_code", "", b"{}", "client", True, epoch, now)
    actor.told("a", 1, [begin], None)
    assert actor.stats()["in_flight"] == 1
    assert actor.lease("b", epoch, 1)[1] == 0
    actor._declare_dead("a", "died")
    event = [e for e in actor.entries() if e.method == "EVENT"][-1]
    assert "replica a died; 1 request(s) it was serving lost, 3 cap permit(s) given back" in str(event.body)
    assert actor.stats()["in_flight"] == 0
    assert actor.lease("b", epoch, 3)[1] == 3
    actor.give_back("b", epoch, 3)
    assert actor.lease("a", epoch, 1)[1] == -1  # (dead: it asks admit, which gives back at once)


def test_requests_in_flight_when_the_cap_is_set_keep_their_slots_until_they_leave(
    actor: ControlActor,
) -> None:
    actor.set_capacity(CapacityPolicy())
    actor.register("a", None, "node-1", "http://a")
    first, second = actor.admit(request(), "a"), actor.admit(request(), "a")
    actor.set_capacity(CapacityPolicy(max_in_flight=3))
    epoch = actor.path_word().epoch
    assert actor.lease("a", epoch, 3)[1] == 1  # two slots are carried by the requests in flight
    assert actor.lease("a", epoch, 1)[1] == 0
    actor.finish(first.entry_id, 200, b"{}", "answered", True, "a")
    assert actor.lease("a", epoch, 1)[1] == 1
    actor.leave("a", second.entry_id)
    assert actor.lease("a", epoch, 1)[1] == 1
    assert actor.lease("a", epoch, 1)[1] == 0


def test_the_actors_own_admit_takes_pool_permits_while_leased(actor: ControlActor) -> None:
    actor.register("a", None, "node-1", "http://a")
    epoch = actor.path_word().epoch
    assert actor.lease("a", epoch, 2)[1] == 2
    admitted = actor.admit(request(), "b")  # (a driver's, or a replica that fell back)
    assert admitted.admitted and not actor.admit(request(), "b").admitted
    actor.finish(admitted.entry_id, 200, b"{}", "answered", True, "b")
    assert actor.lease("a", epoch, 1)[1] == 1
    assert actor.stats()["in_flight"] == 0


def test_queued_for_a_permit_replicas_give_each_back_as_it_frees(actor: ControlActor) -> None:
    actor.set_capacity(CapacityPolicy(max_in_flight=1, overload="queue", queue_timeout_s=30))
    actor.register("a", None, "node-1", "http://a")
    actor.register("b", None, "node-2", "http://b")
    epoch = actor.path_word().epoch
    assert actor.lease("a", epoch, 1)[1] == 1
    result: list[tuple[int, int, float]] = []
    waiter = threading.Thread(target=lambda: result.append(actor.lease("b", epoch, 1)))
    waiter.start()
    deadline = time.monotonic() + 10
    while not actor.path_word().tight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert actor.path_word().tight and not result  # a is told to give back at once
    actor.give_back("a", epoch, 1)
    waiter.join(10)
    assert result and result[0][1] == 1
    deadline = time.monotonic() + 10
    while actor.path_word().tight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not actor.path_word().tight  # nobody queues: permits stay where they free


def test_a_rule_leaves_the_path_open_and_the_actor_decides_what_it_matches(actor: ControlActor) -> None:
    actor.register("a", None, "node-1", "http://a")
    epoch = actor.path_word().epoch
    spec = {
        "match": {"path": "/submit"},
        "action": {"type": "status", "status": 503},
        "schedule": {"first": 2},
    }
    [rule] = actor.add_faults([validate_fault_spec(spec)])
    word = actor.path_word()
    assert (word.mode, word.epoch) == ("leased", epoch)  # the leases stand
    assert [m.path for m in word.matches] == ["/submit"]  # replicas ask the actor about these
    assert actor.lease("a", epoch, 1)[1] == 1
    decisions = [actor.decide("POST", "/submit", b"{}") for _ in range(3)]
    assert [d.rule_ids for d in decisions] == [(rule.id,), (rule.id,), ()]
    assert actor.call_counts()["decide"] == 3 and actor.fault_rules()[0].fired == 2
    # The journal notes the rules that fired on a replica's request (told with it).
    now = time.time()
    begin = ("begin", "a", now, -1, "POST", "/submit", "", b"{}", "client", True, epoch, now)
    actor.told("a", 1, [begin, ("faults", "a", now + 0.001, -1, decisions[0])], None)
    [entry] = [e for e in actor.entries() if e.path == "/submit"]
    assert (entry.faults, entry.fault_action) == ([rule.id], "status")
    actor.clear_faults()
    assert actor.path_word().matches == () and actor.path_word().epoch == epoch


def test_a_request_told_but_not_yet_in_the_journal_when_its_replica_died_is_lost(actor: ControlActor) -> None:
    actor.set_capacity(CapacityPolicy())
    actor.register("a", None, "node-1", "http://a")
    now = time.time()
    actor.told(
        "a", 1, [("begin", "a", now, -1, "POST", "/run_code", "", b"{}", "client", True, 0, now)], None
    )
    actor._declare_dead("a", "died")  # (before any read put its request in the journal)
    [entry] = [e for e in actor.entries() if e.path == "/run_code"]
    assert entry.outcome == "lost"
    assert actor.stats()["in_flight"] == 0


def test_before_refusing_the_actor_recalls_permits_a_replica_holds_unused(actor: ControlActor) -> None:
    """Exact refusals: with every permit leased, one held unused by another replica is recalled
    (the replica answers the signal with it) and granted, rather than the request refused."""
    actor.set_capacity(CapacityPolicy(max_in_flight=2))
    actor.register("a", None, "node-1", "http://a")
    actor.register("b", None, "node-2", "http://b")
    epoch = actor.path_word().epoch
    assert actor.lease("a", epoch, 2)[1] == 2  # a holds both, in use by none
    held = {"unused": 2}
    with _answering_recalls(actor, "a", held):
        assert actor.lease("b", epoch, 1)[1] == 1  # recalled from a, granted to b
        assert held["unused"] == 0
        assert actor.lease("b", epoch, 1)[1] == 1  # the second one a gave back
        assert actor.lease("b", epoch, 1)[1] == 0  # now every permit is in use: refused


def test_a_lease_while_a_recall_is_under_way_takes_one_permit_not_a_block(actor: ControlActor) -> None:
    """Exact refusals under a race: the permits a recall brings back are not leased in a block to
    another replica while the request that recalled them waits for the rest of the answers (the
    block would sit unused with a replica that has answered already, and the request would be
    refused with permits unused)."""
    actor.set_capacity(CapacityPolicy(max_in_flight=2))
    for name in ("a", "b", "c"):
        actor.register(name, None, f"node-{name}", f"http://{name}")
    epoch = actor.path_word().epoch
    assert actor.lease("a", epoch, 2)[1] == 2  # a holds both, in use by none
    granted_to_c: list[int] = []
    stop = threading.Event()

    def poll() -> None:  # a answers the recall: its permits back, then c leases, then a's answer
        seen, batch = -1, 0
        while not stop.is_set():
            word = actor.await_signal("a", seen, 0.2)
            if word.signal <= seen:
                continue
            if word.recall:
                actor.give_back("a", word.epoch, 2)
                granted_to_c.append(actor.lease("c", word.epoch, 2)[1])  # a block of two, asked
            batch += 1
            actor.told("a", batch, [], word.signal, 0, word.epoch)
            seen = word.signal

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        deadline = time.monotonic() + 10
        while "a" not in actor._acked and time.monotonic() < deadline:
            time.sleep(0.01)
        assert actor.lease("b", epoch, 1)[1] == 1  # not refused: one of the two is unused
        assert granted_to_c == [1]
    finally:
        stop.set()
        poller.join(10)


@contextmanager
def _answering_recalls(
    actor: ControlActor, replica: str, held: dict[str, int], delay: float = 0.0
) -> Iterator[None]:
    """``replica`` subscribed and answering the actor's signals as ``FastPath._poll`` does: a
    recall is answered (after ``delay`` seconds) with the permits ``held["unused"]`` counts."""
    stop = threading.Event()

    def poll() -> None:
        seen, batch = -1, 0
        while not stop.is_set():
            word = actor.await_signal(replica, seen, 0.2)
            if word.signal <= seen:
                continue
            if word.recall:
                time.sleep(delay)
            returned = held["unused"] if word.recall else 0
            held["unused"] -= returned
            batch += 1
            actor.told(replica, batch, [], word.signal, returned, word.epoch)
            seen = word.signal

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        deadline = time.monotonic() + 10
        while replica not in actor._acked and time.monotonic() < deadline:
            time.sleep(0.01)
        yield
    finally:
        stop.set()
        poller.join(10)


def test_a_replica_slow_to_answer_a_recall_is_waited_for_rather_than_the_request_refused(
    actor: ControlActor,
) -> None:
    """A busy replica (a loaded machine) that answers the recall after the drain's timeout still
    gives its unused permit to the request: the cap refuses only when every permit is in use."""
    actor.set_capacity(CapacityPolicy(max_in_flight=1))
    actor.register("a", None, "node-1", "http://a")
    actor.register("b", None, "node-2", "http://b")
    epoch = actor.path_word().epoch
    assert actor.lease("a", epoch, 1)[1] == 1  # a holds the only permit, in use by none
    held = {"unused": 1}
    with _answering_recalls(actor, "a", held, delay=ray_state.DRAIN_TIMEOUT_S + 0.5):
        assert actor.lease("b", epoch, 1)[1] == 1  # a's permit, once it answered
        assert held["unused"] == 0
        started = time.monotonic()
        assert actor.lease("a", epoch, 1)[1] == 0  # now the one permit is in use: refused
        assert time.monotonic() - started < ray_state.RECALL_TIMEOUT_S  # (once a answered)


def test_a_recall_does_not_wait_for_a_replica_declared_dead_meanwhile(actor: ControlActor) -> None:
    actor.set_capacity(CapacityPolicy(max_in_flight=1))
    actor.register("a", None, "node-1", "http://a")
    actor.register("b", None, "node-2", "http://b")
    epoch = actor.path_word().epoch
    assert actor.lease("a", epoch, 1)[1] == 1
    actor.await_signal("a", -1, 0)  # a subscribes, then never answers again
    threading.Timer(0.5, actor._declare_dead, ("a", "died")).start()
    started = time.monotonic()
    assert actor.lease("b", epoch, 1)[1] == 1  # a's permit, back with its death
    assert time.monotonic() - started < ray_state.RECALL_TIMEOUT_S
