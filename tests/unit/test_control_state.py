"""The control state's guarantees, the same tests for every backend: one process (local), and worker
processes sharing one state server (shared), including real processes calling it at once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from mocksandbox.control.pooled import PooledControlState
from mocksandbox.control.shared import ControlStateServer, ControlStateUnavailable, RemoteControlState
from mocksandbox.control.state import (
    CapacityPolicy,
    ControlState,
    IncomingRequest,
    LocalControlState,
    ServerError,
)
from mocksandbox.faults import FaultError, FaultSpec, StatusAction


def _request(n: int = 0, worker: str | None = None, path: str = "/run_code") -> IncomingRequest:
    body = json.dumps({"code": f"print({n})", "language": "python"}).encode()
    return IncomingRequest("POST", path, "", body, f"127.0.0.1:{n}", worker)


def _spec(**parts: object) -> FaultSpec:
    return FaultSpec.model_validate(parts)


def _serve(state: ControlState, n: int, status: int = 200) -> bool:
    admission = state.admit(_request(n))
    if not admission.admitted:
        state.finish(admission.entry_id, 429, b'{"detail":"Too Many Requests"}', "rejected", leave=False)
        return False
    state.finish(admission.entry_id, status, b"{}")
    return True


def test_journal_keeps_arrival_order_and_counts(state: ControlState) -> None:
    threads = [
        threading.Thread(target=lambda i=i: [_serve(state, i * 100 + k) for k in range(20)]) for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    entries = state.entries()
    assert [e.id for e in entries] == list(range(1, 161))
    assert all(e.status == 200 and e.ended is not None for e in entries)
    stats = state.stats()
    assert stats["requests_total"] == 160 and stats["by_status"] == {"200": 160}
    assert stats["in_flight"] == 0


def test_cap_is_exact_and_a_refusal_counts_once(state: ControlState) -> None:
    state.set_capacity(CapacityPolicy(max_in_flight=3))
    admitted = [state.admit(_request(i)) for i in range(5)]
    assert [a.admitted for a in admitted] == [True, True, True, False, False]
    for refused in admitted[3:]:
        state.finish(refused.entry_id, 429, b"{}", "rejected", leave=False)
    stats = state.stats()
    assert (stats["in_flight"], stats["max_in_flight"], stats["rejected_by_cap"]) == (3, 3, 2)
    for held in admitted[:3]:
        state.finish(held.entry_id, 200, b"{}")
    stats = state.stats()
    assert (stats["in_flight"], stats["max_in_flight"], stats["by_status"]) == (0, 3, {"429": 2, "200": 3})
    assert [point[1] for point in state.timeline()] == [1, 2, 3, 2, 1, 0]


def test_queued_requests_wait_for_a_slot(state: ControlState) -> None:
    state.set_capacity(CapacityPolicy(max_in_flight=1, overload="queue", queue_timeout_s=10))
    first = state.admit(_request(1))
    waited: list[float] = []

    def second() -> None:
        started = time.monotonic()
        admission = state.admit(_request(2))
        waited.append(time.monotonic() - started)
        state.finish(admission.entry_id, 200, b"{}")

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(0.3)
    assert thread.is_alive(), "the second request must wait while the first holds the only slot"
    state.finish(first.entry_id, 200, b"{}")
    thread.join(10)
    assert not thread.is_alive() and state.stats()["max_in_flight"] == 1


def test_fault_schedules_count_every_request(state: ControlState) -> None:
    state.add_faults(
        [
            _spec(name="first-two", action={"type": "status", "status": 503}, schedule={"first": 2}),
            _spec(name="every-third", action={"type": "delay", "seconds": 0.001}, schedule={"every": 3}),
        ]
    )
    decisions = [state.admit(_request(i)).decision for i in range(9)]
    for admission_decision in decisions:
        assert admission_decision.delay_seconds in (0.0, 0.001)
    assert [isinstance(d.action, StatusAction) for d in decisions] == [True, True] + [False] * 7
    # every-third never sees the two requests first-two answers (a deciding action ends the scan):
    # its matches are requests 3..9, and it fires on its 3rd and 6th, requests 5 and 8.
    assert [d.delay_seconds > 0 for d in decisions] == [False] * 4 + [True, False, False, True, False]
    fired = {rule.id: (rule.matched, rule.fired) for rule in state.fault_rules()}
    assert fired == {"first-two": (9, 2), "every-third": (7, 2)}


def test_output_mode_rules_modify_and_later_rules_still_decide(state: ControlState) -> None:
    state.add_faults(
        [
            _spec(name="as-production", match={"body_contains": "print(1"}, action={"type": "output_mode"}),
            _spec(name="third", action={"type": "status", "status": 503}, schedule={"first": 3}),
        ]
    )
    decisions = [state.admit(_request(n)).decision for n in (10, 2, 11, 4)]
    assert [d.output_mode for d in decisions] == ["sandboxfusion", None, "sandboxfusion", None]
    assert [isinstance(d.action, StatusAction) for d in decisions] == [True, True, True, False]
    assert [e.fault_action for e in state.entries()] == ["status"] * 3 + [None]


def test_divergences_are_journaled_and_counted_by_kind(state: ControlState) -> None:
    notes = [("output: stdout of 200000 bytes", "toolchain: no swiftc"), (), ("output: stderr of 1 MB",)]
    for n, divergences in enumerate(notes):
        admission = state.admit(_request(n))
        state.finish(admission.entry_id, 200, b"{}", divergences=divergences)
    assert [e.divergences for e in state.entries()] == [list(d) for d in notes]
    assert state.stats()["divergences"] == {"total": 3, "by_kind": {"output": 2, "toolchain": 1}}
    state.reset([], CapacityPolicy())
    assert state.stats()["divergences"] == {"total": 0, "by_kind": {}}


def test_seeded_probabilities_are_reproducible(state: ControlState) -> None:
    rule = _spec(action={"type": "status", "status": 500}, schedule={"probability": 0.5, "seed": 7})

    def draw() -> list[bool]:
        state.reset([rule], CapacityPolicy())
        return [state.admit(_request(i)).decision.action is not None for i in range(40)]

    first, second = draw(), draw()
    assert first == second and 5 < sum(first) < 35


def test_adding_faults_is_all_or_nothing(state: ControlState) -> None:
    state.add_faults([_spec(name="taken", action={"type": "close"})])
    with pytest.raises(FaultError, match="exists already"):
        state.add_faults(
            [_spec(name="new", action={"type": "close"}), _spec(name="taken", action={"type": "reset"})]
        )
    assert [rule.id for rule in state.fault_rules()] == ["taken"]
    assert state.remove_fault("taken") and not state.remove_fault("taken")


def test_reset_goes_back_to_the_baseline(state: ControlState) -> None:
    _serve(state, 1)
    state.set_capacity(CapacityPolicy(max_in_flight=1))
    state.add_faults([_spec(name="extra", action={"type": "close"})])
    baseline = [_spec(name="baseline", action={"type": "status", "status": 429})]
    state.reset(baseline, CapacityPolicy(max_in_flight=7))
    assert state.entries() == [] and state.stats()["requests_total"] == 0
    assert [rule.id for rule in state.fault_rules()] == ["baseline"]
    assert state.capacity() == CapacityPolicy(max_in_flight=7)
    assert state.admit(_request()).entry_id == 1


def test_server_errors_reach_the_test(state: ControlState) -> None:
    try:
        raise KeyError("boom")
    except KeyError as exc:
        state.record_error(ServerError("/run_code", exc, "Traceback ...\nKeyError: 'boom'\n"))
    (error,) = state.take_errors()
    assert error.path == "/run_code" and "boom" in str(error.exception)
    assert state.take_errors() == []


def test_a_client_of_a_stopped_state_server_says_so() -> None:
    server = ControlStateServer(LocalControlState())
    client = RemoteControlState(server.path)
    server.close()
    with pytest.raises(ControlStateUnavailable):
        client.stats()
    with pytest.raises(ControlStateUnavailable):
        RemoteControlState(server.path)


#: A worker process: 8 threads, each serving 25 requests through the shared state, holding each
#: admitted one for a moment so that they overlap.
_WORKER = """
import json, sys, threading, time
from mocksandbox.control.shared import RemoteControlState
from mocksandbox.control.state import IncomingRequest

state = RemoteControlState(sys.argv[1])
worker = sys.argv[2]

def serve(thread):
    for k in range(25):
        body = json.dumps({"code": "print(1)", "language": "python"}).encode()
        admission = state.admit(IncomingRequest("POST", "/run_code", "", body, f"{worker}:{thread}", worker))
        if not admission.admitted:
            state.finish(admission.entry_id, 429, b"{}", "rejected", leave=False)
            continue
        time.sleep(0.002)
        status = admission.decision.action.status if admission.decision.action is not None else 200
        state.finish(admission.entry_id, status, b"{}")

threads = [threading.Thread(target=serve, args=(t,)) for t in range(8)]
for t in threads: t.start()
for t in threads: t.join()
state.close()
"""


def _serve_two_workers(local: LocalControlState) -> None:
    """Serve ``local`` to two processes running ``_WORKER`` at once, until both are done; what they
    told is all applied (a read drains it) before the state server stops."""
    server = ControlStateServer(local)
    try:
        workers = [
            subprocess.Popen([sys.executable, "-c", _WORKER, server.path, f"worker-{n}"]) for n in (1, 2)
        ]
        for worker in workers:
            assert worker.wait(timeout=120) == 0
        local.stats()
    finally:
        server.close()


@pytest.mark.parametrize("holder", [LocalControlState, PooledControlState])
def test_two_worker_processes_share_one_exact_state(holder: type[LocalControlState]) -> None:
    """What two real processes see at once: one journal in arrival order, a cap never exceeded, and
    fault schedules counted across both."""
    local = holder(capacity=CapacityPolicy(max_in_flight=4))
    local.add_faults(
        [
            _spec(name="first-five", action={"type": "status", "status": 503}, schedule={"first": 5}),
            _spec(name="every-seventh", action={"type": "status", "status": 504}, schedule={"every": 7}),
        ]
    )
    try:
        _serve_two_workers(local)
        entries = local.entries()
        stats = local.stats()
    finally:
        local.close()
    assert [e.id for e in entries] == list(range(1, 401))
    assert stats["requests_total"] == 400 and stats["in_flight"] == 0
    assert stats["max_in_flight"] <= 4
    assert {e.worker for e in entries} == {"worker-1", "worker-2"}
    by_status = stats["by_status"]
    admitted = 400 - stats["rejected_by_cap"]
    assert by_status.get("429", 0) == stats["rejected_by_cap"]
    rules = {rule.id: rule for rule in local.fault_rules()}
    assert rules["first-five"].fired == 5 == by_status["503"]
    # every-seventh sees the admitted requests that first-five did not answer.
    assert rules["every-seventh"].matched == admitted - 5
    assert rules["every-seventh"].fired == (admitted - 5) // 7 == by_status.get("504", 0)


def test_two_worker_processes_on_the_fast_path_keep_the_state_exact() -> None:
    """No fault rule and a rejecting cap: the workers admit by themselves through the shared
    counters and tell the master one way. Ids still run 1..400 in arrival order, the cap is never
    exceeded, each 429 is counted once, and the timeline never shows more than the cap."""
    local = PooledControlState(capacity=CapacityPolicy(max_in_flight=4))
    try:
        _serve_two_workers(local)
        entries = local.entries()
        stats = local.stats()
        timeline = local.timeline()
    finally:
        local.close()
    assert [e.id for e in entries] == list(range(1, 401))
    assert {e.worker for e in entries} == {"worker-1", "worker-2"}
    assert all(e.status is not None for e in entries)  # every answer arrived, none lost
    assert stats["requests_total"] == 400 and stats["in_flight"] == 0
    assert 1 <= stats["max_in_flight"] <= 4
    rejected = [e for e in entries if e.outcome == "rejected"]
    assert len(rejected) == stats["rejected_by_cap"] == stats["by_status"].get("429", 0)
    assert stats["by_status"].get("200", 0) == 400 - len(rejected)
    counts = [count for _, count in timeline]
    assert len(counts) == 2 * (400 - len(rejected)) and max(counts) == stats["max_in_flight"]
    assert counts[-1] == 0 and [t for t, _ in timeline] == sorted(t for t, _ in timeline)


def test_what_a_worker_told_before_a_reset_stays_out_of_the_new_journal() -> None:
    local = PooledControlState()
    server = ControlStateServer(local)
    client = RemoteControlState(server.path)
    try:
        old = client.admit(_request(1))
        local.reset([], CapacityPolicy())
        new = client.admit(_request(2))
        client.finish(new.entry_id, 200, b"{}")
        client.finish(old.entry_id, 200, b"{}")  # the old request ends after the reset
        assert [e.id for e in local.entries()] == [new.entry_id] == [1]
        assert local.entries()[0].status == 200
        assert local.stats()["in_flight"] == 0  # as with one process: a reset zeroes it, never below
    finally:
        client.close()
        server.close()
        local.close()


def test_a_rule_closes_the_fast_path_and_removing_it_opens_it_again() -> None:
    local = PooledControlState()
    server = ControlStateServer(local)
    client = RemoteControlState(server.path)
    try:
        assert local.counters.snapshot().fast
        (rule,) = client.add_faults([_spec(name="once", action={"type": "status", "status": 503})])
        assert not local.counters.snapshot().fast
        admission = client.admit(_request(1))
        assert isinstance(admission.decision.action, StatusAction)  # decided by the master
        client.finish(admission.entry_id, 503, b"{}")
        assert client.remove_fault(rule.id)
        assert local.counters.snapshot().fast
        client.set_capacity(CapacityPolicy(max_in_flight=1, overload="queue"))
        assert not local.counters.snapshot().fast  # queueing needs the master
        client.set_capacity(CapacityPolicy(max_in_flight=1, overload="reject"))
        assert local.counters.snapshot().fast
        assert [e.faults for e in local.entries()] == [["once"]]
    finally:
        client.close()
        server.close()
        local.close()


def test_a_queued_request_gets_the_slot_a_worker_leaves() -> None:
    local = PooledControlState(capacity=CapacityPolicy(max_in_flight=1, overload="queue", queue_timeout_s=30))
    server = ControlStateServer(local)
    first, second = RemoteControlState(server.path), RemoteControlState(server.path)
    try:
        held = first.admit(_request(1))
        assert held.admitted
        waiting: list[bool] = []
        thread = threading.Thread(target=lambda: waiting.append(second.admit(_request(2)).admitted))
        thread.start()
        time.sleep(0.2)
        assert not waiting  # queued behind the one in flight
        first.finish(held.entry_id, 200, b"{}")
        thread.join(timeout=10)
        assert waiting == [True]
        assert local.stats()["max_in_flight"] == 1
    finally:
        first.close()
        second.close()
        server.close()
        local.close()
