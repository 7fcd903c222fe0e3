"""Killing a cgroup's processes by the pids its ``cgroup.procs`` listed (``kill_members``): only
those still members when they are signalled, never a process that has taken a dead member's pid.

Real processes (this test's own children); membership is what the ``members`` callable says, as a
re-read of ``cgroup.procs`` would.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mocksandbox.execution import confinement
from mocksandbox.execution.confinement import (
    CgroupConfinement,
    ProcessGroupJail,
    kill_members,
    own_cgroup_dir,
)


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


def test_a_process_group_jail_leaves_the_group_of_a_reaped_leader_alone() -> None:
    """Once the relay says the run's first process exited (and reaped it), its pid, the group's
    id, may be another process's: here a stranger leading a group of that id, which the jail's
    kill must not reach."""
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        jail = ProcessGroupJail()
        jail.attach(stranger.pid)  # the number the run's leader had
        jail.leader_reaped()
        jail.kill_all()
        jail.close()
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_the_next_server_ends_what_a_killed_servers_runs_left_running() -> None:
    """A server killed mid-run (SIGKILL, isolation none) leaves its runs' processes in their
    groups; the next server, finding those groups' owner dead, kills them before it removes the
    groups."""
    if not CgroupConfinement.available():
        pytest.skip("cgroup v1 pids/memory/freezer controllers are not writable here")
    name = f"mocksandbox-0-0-{uuid.uuid4().hex[:8]}"  # nobody holds its lock: a dead server's
    runs = [own_cgroup_dir(c) / name / "run-0" for c in ("pids", "memory", "freezer")]
    left = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        for run in runs:
            run.mkdir(parents=True)
            (run / "cgroup.procs").write_text(str(left.pid))
        CgroupConfinement(max_processes=16, max_memory_mb=64).close()
        assert left.wait(timeout=10) == -9
        assert not any(run.parent.exists() for run in runs)
    finally:
        left.kill()
        left.wait()
        for run in runs:  # (if the test failed: its own groups go)
            for path in (run, run.parent):
                if path.exists():
                    path.rmdir()


def test_a_server_starting_beside_another_never_takes_its_new_groups_for_a_dead_servers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Servers start at once (xdist workers, a server's workers): one judges which groups are
    stale while another has made its group and not locked it yet. That group must not look like a
    dead server's (it was removed, and the other server failed to start)."""
    if not CgroupConfinement.available():
        pytest.skip("cgroup v1 pids/memory/freezer controllers are not writable here")
    lock_parent = confinement._lock_parent
    others: list[subprocess.Popen[bytes]] = []
    judge = "import sys; from pathlib import Path; from mocksandbox.execution import confinement; "
    judge += "confinement._remove_stale_parents(Path(sys.argv[1]))"

    def lock_while_another_server_starts(parent: Path) -> int:
        if parent.parent == own_cgroup_dir("pids") and not others:
            # Another server looks at the groups now, between our mkdir and our lock: it has
            # three seconds (an empty group goes in milliseconds), unless it must wait for us.
            others.append(subprocess.Popen([sys.executable, "-c", judge, str(parent.parent)]))
            deadline = time.monotonic() + 3
            while others[0].poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
        return lock_parent(parent)

    monkeypatch.setattr(confinement, "_lock_parent", lock_while_another_server_starts)
    made = CgroupConfinement(max_processes=16, max_memory_mb=64)
    try:
        assert others and all(parent.is_dir() for parent in made._parents.values())
        assert others[0].wait(timeout=60) == 0  # it looked once we held our lock, and left ours alone
        assert all(parent.is_dir() for parent in made._parents.values())
    finally:
        made.close()
        for other in others:
            other.kill()
            other.wait()


def test_a_list_file_is_read_to_its_end_though_a_read_comes_back_short() -> None:
    """``cgroup.procs`` is a seq_file: a read can come back short of the size asked for before the
    file's end (where its next line would not fit). The kernel's symbol list (megabytes of short
    lines, the same every read) has such reads at once; read as a list, it comes back whole."""
    path = "/proc/kallsyms"
    whole = Path(path).read_bytes()
    assert len(whole) > 4096
    assert confinement._read(path) == whole
