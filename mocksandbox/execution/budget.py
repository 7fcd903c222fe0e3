"""How many processes the server's runs may have: the server's own limits, read at start-up.

A server usually lives under a process budget it did not choose: a container's or a systemd
unit's ``pids.max`` (cgroup v1 or v2, on its own cgroup or any above it), the kernel's
``pid_max`` and ``threads-max``, and for a non-root user ``RLIMIT_NPROC``. Every process and
thread of every run counts against the same budget as the server's own threads (one per
connection), its launcher and the relays it forks. If the runs in flight could use all of it, a
single fork bomb would leave the server unable to start the next run, or a thread to answer it.

So the budget is split once, at start-up: a reserve for the server (a quarter of the headroom,
at least :data:`MIN_SERVER_RESERVE`), the rest for all runs together (the ``pids.max`` of the
cgroup that holds every run's cgroup, so that runs together cannot take more), and each run at
most an eighth of that (:data:`RUNS_PER_SHARE`): a fork bomb takes its share and no more, and the
ordinary runs beside it still find room.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Processes and threads kept for the server itself (request threads, launcher, relays on their
#: way into a run's cgroup, kernels, git) whatever the budget: at least this many...
MIN_SERVER_RESERVE = 64
#: ...and at least this fraction of the headroom.
SERVER_RESERVE_FRACTION = 0.25
#: One run may use at most 1/N of what all runs together may use: N-1 fork bombs at once still
#: leave room for ordinary runs.
RUNS_PER_SHARE = 8
#: No run gets fewer than this (a shell and a pipeline, a small JVM's threads); a host whose budget
#: is smaller than that cannot honestly promise anything, and says so.
MIN_PER_RUN = 16


@dataclass(frozen=True)
class ProcessLimit:
    """One limit on the number of processes (threads included) the server and its runs may have."""

    #: Where it comes from, e.g. ``cgroup v1 pids.max of /ci-job`` or ``kernel.pid_max``.
    source: str
    limit: int
    #: How many of them were in use when it was read.
    in_use: int

    @property
    def headroom(self) -> int:
        return max(0, self.limit - self.in_use)


@dataclass(frozen=True)
class ProcessBudget:
    """What the runs may use, derived from the tightest :class:`ProcessLimit`."""

    #: The limit with the least headroom (``None``: nothing bounds the server).
    binding: ProcessLimit | None
    #: Kept for the server itself.
    server_reserve: int
    #: What every run in flight together may use (``None``: unbounded).
    runs_total: int | None
    #: What one run may use.
    per_run: int

    def describe(self) -> str:
        """One line for the start-up banner."""
        if self.binding is None or self.runs_total is None:
            return "no process limit found"
        b = self.binding
        return (
            f"{b.limit} ({b.source}), {b.in_use} in use; {self.server_reserve} kept for the server, "
            f"{self.runs_total} for all runs together, {self.per_run} per run"
        )


def plan_process_budget(limits: list[ProcessLimit], max_processes: int) -> ProcessBudget:
    """Split the tightest of ``limits`` between the server and its runs; ``max_processes`` (the
    setting) bounds what one run may have in any case."""
    if not limits:
        return ProcessBudget(None, 0, None, max_processes)
    binding = min(limits, key=lambda lim: lim.headroom)
    headroom = binding.headroom
    reserve = max(MIN_SERVER_RESERVE, int(headroom * SERVER_RESERVE_FRACTION))
    runs_total = max(MIN_PER_RUN, headroom - reserve)
    per_run = max(MIN_PER_RUN, min(max_processes, runs_total // RUNS_PER_SHARE))
    return ProcessBudget(binding, reserve, runs_total, min(per_run, max_processes))


def discover_process_limits(
    proc: Path = Path("/proc"), sys_fs: Path = Path("/sys/fs/cgroup")
) -> list[ProcessLimit]:
    """Every limit on this process's process count that can be read here (none is an error)."""
    found: list[ProcessLimit] = []
    found += _cgroup_v1_limits(proc, sys_fs)
    found += _cgroup_v2_limits(proc)
    tasks = _count_tasks(proc)
    for name in ("pid_max", "threads-max"):
        value = _read_int(proc / "sys" / "kernel" / name)
        if value is not None:
            found.append(ProcessLimit(f"kernel.{name.replace('-', '_')}", value, tasks))
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    # Root (CAP_SYS_RESOURCE / CAP_SYS_ADMIN) is not held to RLIMIT_NPROC by the kernel.
    if soft != resource.RLIM_INFINITY and os.geteuid() != 0:
        found.append(ProcessLimit("RLIMIT_NPROC", soft, _count_tasks(proc, uid=os.geteuid())))
    return found


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _own_cgroups(proc: Path) -> Iterator[tuple[str, str]]:
    """``(controllers, path)`` of each line of ``/proc/self/cgroup``."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            yield parts[1], parts[2]


def _limits_up_from(mount: Path, path: str, label: str) -> list[ProcessLimit]:
    """``pids.max`` of the cgroup at ``path`` under ``mount`` and of every cgroup above it."""
    found = []
    current = (mount / path.lstrip("/")).resolve()
    mount = mount.resolve()
    while True:
        limit = _read_int(current / "pids.max")  # "max" (no limit) reads as None
        in_use = _read_int(current / "pids.current")
        if limit is not None and in_use is not None:
            shown = "/" + str(current.relative_to(mount)) if current != mount else "/"
            found.append(ProcessLimit(f"{label} pids.max of {shown}", limit, in_use))
        if current == mount or current.parent == current:
            return found
        current = current.parent


def _cgroup_v1_limits(proc: Path, sys_fs: Path) -> list[ProcessLimit]:
    for controllers, path in _own_cgroups(proc):
        if "pids" in controllers.split(","):
            return _limits_up_from(sys_fs / "pids", path, "cgroup v1")
    return []


def _cgroup_v2_mount(proc: Path) -> Path | None:
    try:
        lines = (proc / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[1].split(" ", 1)[0] == "cgroup2":
            return Path(fields[0].split()[4])
    return None


def _cgroup_v2_limits(proc: Path) -> list[ProcessLimit]:
    mount = _cgroup_v2_mount(proc)
    if mount is None:
        return []
    for controllers, path in _own_cgroups(proc):
        if controllers == "":
            return _limits_up_from(mount, path, "cgroup v2")
    return []


def _count_tasks(proc: Path, uid: int | None = None) -> int:
    """Threads alive on this machine (pid numbers in use), or those of ``uid``."""
    count = 0
    try:
        entries = os.listdir(proc)
    except OSError:
        return 0
    for name in entries:
        if not name.isdigit():
            continue
        try:
            if uid is not None and os.stat(proc / name).st_uid != uid:
                continue
            count += len(os.listdir(proc / name / "task"))
        except OSError:
            continue  # gone meanwhile
    return count
