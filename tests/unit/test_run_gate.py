"""The gate on runs starting at once (``mocksandbox.execution.run_gate``): its places, its queue's
order, a place given up by a run that has started long enough; the settings that make it."""

from __future__ import annotations

import threading

import pytest

from mocksandbox.execution.affinity import usable_cpus
from mocksandbox.execution.engine import run_gate
from mocksandbox.execution.run_gate import RunGate
from mocksandbox.settings import load_settings

#: Long enough that no place is given up by age while a test runs.
_FOREVER_S = 3600.0


class _Waiter:
    """A run waiting at ``gate`` on a thread of its own: its ticket once it has a place."""

    def __init__(self, gate: RunGate, name: str, admitted: list[str]) -> None:
        self.ticket: int | None = None
        self.entered = threading.Event()
        waiting_before = gate.waiting

        def enter() -> None:
            self.ticket = gate.enter()
            admitted.append(name)
            self.entered.set()

        self.thread = threading.Thread(target=enter, daemon=True)
        self.thread.start()
        # In the queue (counted under the gate's lock) before the next one comes.
        while gate.waiting == waiting_before and not self.entered.is_set():
            self.entered.wait(0.001)

    def wait_entered(self) -> int:
        assert self.entered.wait(30), "never got a place"
        assert self.ticket is not None
        return self.ticket


def test_at_most_its_places_start_at_once_and_waiting_runs_go_in_the_order_they_came() -> None:
    gate = RunGate(2, _FOREVER_S)
    first, second = gate.enter(), gate.enter()
    admitted: list[str] = []
    waiters = [_Waiter(gate, name, admitted) for name in ("w1", "w2", "w3")]
    assert (gate.waiting, gate.starting, admitted) == (3, 2, [])
    gate.leave(first)
    w1 = waiters[0].wait_entered()
    assert (admitted, gate.waiting) == (["w1"], 2)
    gate.leave(second)
    waiters[1].wait_entered()
    assert (admitted, gate.waiting) == (["w1", "w2"], 1)
    gate.leave(w1)
    waiters[2].wait_entered()
    assert (admitted, gate.waiting, gate.starting) == (["w1", "w2", "w3"], 0, 2)


def test_a_run_that_has_started_long_enough_gives_its_place_up() -> None:
    """A run that sleeps or computes past ``starting_s`` holds its place no longer: the next run
    starts without waiting for its end, and its own end gives back no place it no longer has."""
    gate = RunGate(1, 0.05)
    long_run = gate.enter()
    admitted: list[str] = []
    waiter = _Waiter(gate, "next", admitted)
    next_run = waiter.wait_entered()
    assert gate.starting == 1
    gate.leave(long_run)  # (its place went with its start)
    assert gate.starting == 1
    gate.leave(next_run)
    assert gate.starting == 0


def test_a_gate_has_a_place_at_least() -> None:
    with pytest.raises(ValueError, match="at least one place"):
        RunGate(0, 0.02)


def test_the_settings_make_one_place_a_core_by_default_and_none_for_zero() -> None:
    default = run_gate(load_settings(overrides={}))
    assert default is not None
    assert (default.slots, default.starting_s) == (len(usable_cpus()), 0.02)
    three = run_gate(load_settings(overrides={"starting_runs": 3, "starting_run_ms": 50}))
    assert three is not None and (three.slots, three.starting_s) == (3, 0.05)
    assert three.describe() == "3 at once, each for its first 50 ms"
    assert run_gate(load_settings(overrides={"starting_runs": 0})) is None
