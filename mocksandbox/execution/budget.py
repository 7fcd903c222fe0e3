"""What the server's runs may use, processes and memory: the server's own limits, read at start-up.

A server usually lives under budgets it did not choose: a container's or a systemd unit's
``pids.max`` and memory limit (cgroup v1 or v2, on its own cgroup or any above it), the kernel's
``pid_max`` and ``threads-max``, and for a non-root user ``RLIMIT_NPROC``. Every process, thread and
byte of every run counts against the same budget as the server's own threads (one per connection),
its launcher, the relays it forks and its Jupyter kernels. If the runs in flight could use all of
it, a single fork bomb would leave the server unable to start the next run, or a thread to answer
it; and a run of many processes, each smaller than the server, would drive the server's memory
cgroup to its limit, where the kernel's OOM killer takes the largest task: possibly the server.

So each budget is split once, at start-up: a reserve for the server (a quarter of the headroom, at
least :data:`MIN_SERVER_RESERVE` processes or :data:`MIN_SERVER_MEMORY_RESERVE` bytes), the rest
for all runs together (the limits of the cgroups that hold every run's cgroup, so that runs
together cannot take more, and an OOM they cause happens among them), and each run at most an
eighth of the processes (:data:`RUNS_PER_SHARE`: a fork bomb takes its share and no more, and the
ordinary runs beside it still find room) and at most all of the runs' memory.

The host's memory is a budget too (:func:`host_memory_limit`): MemTotal, with what was not
MemAvailable at start-up in use. Without it, a burst of memory-hungry runs on a host whose server
has no memory cgroup limit (most hosts) ended at the kernel's global OOM killer, with the whole host
under pressure first; with it, runs together are held to their share in the cgroups above them and
an OOM they cause is one among them. Where no cgroup is writable nothing holds runs together to it
(each process's rlimit bounds only that process), and the confinement says so. Every program
is the OOM killer's first choice in any case (``launcher/_launcher_program.py``).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

#: Processes and threads kept for the server itself (request threads, launcher, relays (one per run
#: in flight, each run's program on its way into the run's cgroup), kernels, git) whatever the
#: budget: at least this many...
MIN_SERVER_RESERVE = 64
#: ...and at least this fraction of the headroom (of processes and of memory alike).
SERVER_RESERVE_FRACTION = 0.25
#: One run may use at most 1/N of the processes all runs together may use: N-1 fork bombs at once
#: still leave room for ordinary runs.
RUNS_PER_SHARE = 8
#: No run gets fewer than this (a shell and a pipeline, a small JVM's threads); a host whose budget
#: is smaller than that cannot honestly promise anything, and says so.
MIN_PER_RUN = 16

MIB = 1024 * 1024
#: Memory kept for the server itself (its own growth, the launcher, Jupyter kernels, git): at least
#: this much, and at least :data:`SERVER_RESERVE_FRACTION` of the headroom.
MIN_SERVER_MEMORY_RESERVE = 256 * MIB
#: All runs together get at least this much memory (an interpreter and a small program).
MIN_RUNS_MEMORY = 64 * MIB
#: A memory limit at least this large is "no limit": cgroup v1 reports an unlimited group as
#: ``PAGE_COUNTER_MAX`` pages, just under 2**63 bytes.
NO_MEMORY_LIMIT = 1 << 62


#: What bounds memory where no cgroup does (a budget's ``not_held``, doctor's memory row).
MEMORY_NOT_HELD = (
    "no cgroup holds runs together to it; each process is bounded by its own RLIMIT_DATA, runs "
    "together by nothing but the host's OOM killer"
)


@dataclass(frozen=True)
class _Limit:
    #: Where it comes from, e.g. ``cgroup v1 pids.max of /ci-job`` or ``kernel.pid_max``.
    source: str
    limit: int
    #: How much of it was in use when it was read.
    in_use: int

    @property
    def headroom(self) -> int:
        return max(0, self.limit - self.in_use)


@dataclass(frozen=True)
class ProcessLimit(_Limit):
    """One limit on the number of processes (threads included) the server and its runs may have."""


@dataclass(frozen=True)
class MemoryLimit(_Limit):
    """One limit, in bytes, on the memory the server and its runs may use together. ``in_use``
    leaves out the page cache the kernel can drop at once (inactive files), as ``docker stats``
    and the kubelet do."""


L = TypeVar("L", bound=_Limit)


@dataclass(frozen=True)
class _Budget(Generic[L]):
    #: The limit with the least headroom (``None``: nothing bounds the server).
    binding: L | None
    #: Kept for the server itself.
    server_reserve: int
    #: What every run in flight together may use (``None``: unbounded).
    runs_total: int | None
    #: What one run may use.
    per_run: int
    #: Why runs together are not held to ``runs_total`` here, and what bounds them instead (empty:
    #: they are held to it, by the cgroups above them).
    not_held: str = ""

    #: What is counted, for "no ... limit found".
    _counted: ClassVar[str] = ""

    @staticmethod
    def _amount(value: int) -> str:
        return str(value)

    def describe(self) -> str:
        """One line for the start-up banner."""
        if self.binding is None or self.runs_total is None:
            return f"no {self._counted} limit found"
        b, amount = self.binding, self._amount
        held = f"; NOT held to it: {self.not_held}" if self.not_held else ""
        return (
            f"{amount(b.limit)} ({b.source}), {amount(b.in_use)} in use; "
            f"{amount(self.server_reserve)} kept for the server, "
            f"{amount(self.runs_total)} for all runs together, {amount(self.per_run)} per run{held}"
        )


@dataclass(frozen=True)
class ProcessBudget(_Budget[ProcessLimit]):
    """How many processes the runs may have, derived from the tightest :class:`ProcessLimit`."""

    _counted: ClassVar[str] = "process"


@dataclass(frozen=True)
class MemoryBudget(_Budget[MemoryLimit]):
    """How many bytes the runs may use, derived from the tightest :class:`MemoryLimit`."""

    _counted: ClassVar[str] = "memory"

    @staticmethod
    def _amount(value: int) -> str:
        return f"{value // MIB} MiB"


def _split(limits: list[L], min_reserve: int, min_runs: int) -> tuple[L, int, int] | None:
    """The tightest of ``limits``, what the server keeps of its headroom, and what all runs get."""
    if not limits:
        return None
    binding = min(limits, key=lambda lim: lim.headroom)
    reserve = max(min_reserve, int(binding.headroom * SERVER_RESERVE_FRACTION))
    return binding, reserve, max(min_runs, binding.headroom - reserve)


def plan_process_budget(limits: list[ProcessLimit], max_processes: int) -> ProcessBudget:
    """Split the tightest of ``limits`` between the server and its runs; ``max_processes`` (the
    setting) bounds what one run may have in any case."""
    split = _split(limits, MIN_SERVER_RESERVE, MIN_PER_RUN)
    if split is None:
        return ProcessBudget(None, 0, None, max_processes)
    binding, reserve, runs_total = split
    per_run = max(MIN_PER_RUN, min(max_processes, runs_total // RUNS_PER_SHARE))
    return ProcessBudget(binding, reserve, runs_total, min(per_run, max_processes))


def plan_memory_budget(limits: list[MemoryLimit], max_memory_mb: int) -> MemoryBudget:
    """Split the tightest of ``limits`` between the server and its runs; ``max_memory_mb`` (the
    setting) bounds what one run may use in any case."""
    max_memory = max_memory_mb * MIB
    split = _split(limits, MIN_SERVER_MEMORY_RESERVE, MIN_RUNS_MEMORY)
    if split is None:
        return MemoryBudget(None, 0, None, max_memory)
    binding, reserve, runs_total = split
    return MemoryBudget(binding, reserve, runs_total, min(max_memory, runs_total))


def discover_process_limits(
    proc: Path = Path("/proc"), sys_fs: Path = Path("/sys/fs/cgroup")
) -> list[ProcessLimit]:
    """Every limit on this process's process count that can be read here (none is an error)."""
    found: list[ProcessLimit] = []
    found += _cgroup_v1_limits(proc, sys_fs, "pids", _pids_limit)
    found += _cgroup_v2_limits(proc, _pids_limit)
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


def discover_memory_limits(
    proc: Path = Path("/proc"), sys_fs: Path = Path("/sys/fs/cgroup")
) -> list[MemoryLimit]:
    """Every memory cgroup limit on this process that can be read here, and the host's memory
    (none is an error)."""
    found = _cgroup_v1_limits(proc, sys_fs, "memory", _memory_v1_limit)
    found += _cgroup_v2_limits(proc, _memory_v2_limit)
    host = host_memory_limit(proc)
    if host is not None:
        found.append(host)
    return found


def host_memory_limit(proc: Path = Path("/proc")) -> MemoryLimit | None:
    """The host's memory as a limit: ``MemTotal`` of ``/proc/meminfo``, with what is not
    ``MemAvailable`` in use (the kernel's own estimate of what can be had without swapping, page
    cache it can drop included); ``None`` where it cannot be read. In a container, ``/proc/meminfo``
    is the host's (or LXCFS's view of the container's limit), and a cgroup limit, if any, is read too."""
    try:
        lines = (proc / "meminfo").read_text().splitlines()
    except OSError:
        return None
    values: dict[str, int] = {}
    for line in lines:
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[name] = int(fields[0]) * 1024  # (kB)
    total, available = values.get("MemTotal"), values.get("MemAvailable")
    if total is None or available is None:
        return None
    return MemoryLimit("host memory, MemTotal", total, max(0, total - available))


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat_value(path: Path, key: str) -> int:
    """One counter of a ``memory.stat`` file (0 if absent)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


# -- the cgroup tree: one walk, a reader per limit ---------------------------------------------------

#: Reads one limit off the cgroup directory it is given (``label`` and ``shown`` name it, e.g.
#: ``cgroup v1`` and ``/ci-job``); ``None`` where that cgroup sets none.
_Reader = Callable[[Path, str, str], L | None]


def _pids_limit(directory: Path, label: str, shown: str) -> ProcessLimit | None:
    limit = _read_int(directory / "pids.max")  # "max" (no limit) reads as None
    in_use = _read_int(directory / "pids.current")
    if limit is None or in_use is None:
        return None
    return ProcessLimit(f"{label} pids.max of {shown}", limit, in_use)


def _memory_limit(
    directory: Path, source: str, limit_file: str, usage_file: str, inactive_file: str
) -> MemoryLimit | None:
    limit = _read_int(directory / limit_file)  # v2's "max" (no limit) reads as None
    usage = _read_int(directory / usage_file)
    if limit is None or usage is None or limit >= NO_MEMORY_LIMIT:
        return None
    reclaimable = _stat_value(directory / "memory.stat", inactive_file)
    return MemoryLimit(source, limit, max(0, usage - reclaimable))


def _memory_v1_limit(directory: Path, label: str, shown: str) -> MemoryLimit | None:
    source = f"{label} memory.limit_in_bytes of {shown}"
    return _memory_limit(
        directory, source, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"
    )


def _memory_v2_limit(directory: Path, label: str, shown: str) -> MemoryLimit | None:
    source = f"{label} memory.max of {shown}"
    return _memory_limit(directory, source, "memory.max", "memory.current", "inactive_file")


def own_cgroups(proc: Path = Path("/proc")) -> Iterator[tuple[str, str]]:
    """``(controllers, path)`` of each line of ``/proc/self/cgroup`` (v2: controllers ``""``)."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            yield parts[1], parts[2]


def _limits_up_from(mount: Path, path: str, label: str, read: _Reader[L]) -> list[L]:
    """What ``read`` finds in the cgroup at ``path`` under ``mount`` and in every cgroup above it."""
    found = []
    current = (mount / path.lstrip("/")).resolve()
    mount = mount.resolve()
    while True:
        shown = "/" + str(current.relative_to(mount)) if current != mount else "/"
        limit = read(current, label, shown)
        if limit is not None:
            found.append(limit)
        if current == mount or current.parent == current:
            return found
        current = current.parent


def _cgroup_v1_limits(proc: Path, sys_fs: Path, controller: str, read: _Reader[L]) -> list[L]:
    for controllers, path in own_cgroups(proc):
        if controller in controllers.split(","):
            return _limits_up_from(sys_fs / controller, path, "cgroup v1", read)
    return []


def _unescape_mount_path(field: str) -> str:
    """A path of ``/proc/self/mountinfo``: spaces, tabs, newlines and backslashes come octal."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def cgroup2_mount(proc: Path = Path("/proc")) -> tuple[Path, str] | None:
    """Where the cgroup v2 hierarchy is mounted (usually ``/sys/fs/cgroup``; on hybrid hosts
    ``/sys/fs/cgroup/unified``) and which of its cgroups is that mount's root, or ``None``."""
    try:
        lines = (proc / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[1].split(" ", 1)[0] == "cgroup2":
            mine = fields[0].split()
            return Path(_unescape_mount_path(mine[4])), _unescape_mount_path(mine[3])
    return None


def _cgroup_v2_limits(proc: Path, read: _Reader[L]) -> list[L]:
    found = cgroup2_mount(proc)
    if found is None:
        return []
    mount = found[0]
    for controllers, path in own_cgroups(proc):
        if controllers == "":
            return _limits_up_from(mount, path, "cgroup v2", read)
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
