"""Runs wait at the engine's gate on runs starting at once (setting ``starting_runs``), and a run's
timeout starts once it has its place, not while it waits for one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mocksandbox.core import MockSandbox
from mocksandbox.execution.run_gate import RunGate
from mocksandbox.models import RunCodeRequest, RunCodeResponse
from mocksandbox.settings import load_settings


@pytest.fixture
def one_at_a_time(tmp_path: Path) -> Iterator[MockSandbox]:
    """An engine that lets one run start at a time, and counts a run as starting for an hour (no
    place is given up by age while the test runs, however slow the machine)."""
    overrides = {"tmp_root": str(tmp_path), "confinement": "process-group", "isolation": "none"}
    box = MockSandbox.create(load_settings(overrides=overrides))
    box.engine.runner.gate = RunGate(1, 3600.0)
    yield box
    box.close()


def _until(holds: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not holds():
        assert time.monotonic() < deadline, "never came to be"
        time.sleep(0.01)


def test_a_run_waits_for_a_place_and_its_timeout_starts_once_it_has_one(
    one_at_a_time: MockSandbox, tmp_path: Path
) -> None:
    gate = one_at_a_time.engine.runner.gate
    assert gate is not None and gate.slots == 1
    go = tmp_path / "go"
    answers: dict[str, RunCodeResponse] = {}

    def run(name: str, code: str, timeout: float) -> None:
        request = RunCodeRequest(code=code, language="python", run_timeout=timeout)
        answers[name] = one_at_a_time.engine.run_code(request)

    waits_for_go = (
        f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\nprint('first')"
    )
    first = threading.Thread(target=run, args=("first", waits_for_go, 60))
    first.start()
    _until(lambda: gate.starting == 1)  # (the first run has its place)
    second = threading.Thread(target=run, args=("second", "print('second')", 1))
    second.start()
    _until(lambda: gate.waiting == 1)
    # Kept waiting past its own 1 s timeout, which has not started yet.
    time.sleep(1.5)
    assert gate.waiting == 1 and "second" not in answers
    go.touch()
    first.join(60)
    second.join(60)
    assert answers["first"].run_result is not None and answers["first"].run_result.stdout == "first\n"
    second_run = answers["second"].run_result
    assert second_run is not None
    assert (second_run.status, second_run.stdout) == ("Finished", "second\n"), second_run
