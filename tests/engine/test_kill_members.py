"""Killing a cgroup's processes by the pids its ``cgroup.procs`` listed (``kill_members``): only
those still members when they are signalled, never a process that has taken a dead member's pid.

Real processes (this test's own children); membership is what the ``members`` callable says, as a
re-read of ``cgroup.procs`` would.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from mocksandbox.execution import confinement
from mocksandbox.execution.confinement import kill_members


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    made = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    yield made
    for proc in made:
        proc.kill()
        proc.wait()


def test_members_are_killed(sleepers: list[subprocess.Popen[bytes]]) -> None:
    pids = [p.pid for p in sleepers]
    kill_members(pids, lambda: pids)
    assert [p.wait(timeout=10) for p in sleepers] == [-9, -9, -9]


def test_a_pid_no_longer_listed_is_not_killed(sleepers: list[subprocess.Popen[bytes]]) -> None:
    # The first two pids were listed, then left the group (died, and their numbers went to
    # processes elsewhere): by the time the members are read again, only the last is there.
    pids = [p.pid for p in sleepers]
    kill_members(pids, lambda: pids[2:])
    assert sleepers[2].wait(timeout=10) == -9
    assert [p.poll() for p in sleepers[:2]] == [None, None]


def test_pids_of_the_dead_are_passed_over(sleepers: list[subprocess.Popen[bytes]]) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    pids = [gone.pid, *(p.pid for p in sleepers)]
    kill_members(pids, lambda: pids)
    assert [p.wait(timeout=10) for p in sleepers] == [-9, -9, -9]


def test_more_pids_than_it_holds_pidfds_for_at_once(
    sleepers: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(confinement, "_PIDFDS_AT_ONCE", 2)
    pids = [p.pid for p in sleepers]
    kill_members(pids, lambda: pids)
    assert [p.wait(timeout=10) for p in sleepers] == [-9, -9, -9]
