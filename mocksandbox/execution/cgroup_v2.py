"""Confining runs on cgroup v2: a cgroup per run, in a subtree of the cgroup the server started in.

Most hosts users have are cgroup v2 only (current distributions, Kubernetes nodes, CI runners).
There the server keeps a subtree of its own under the cgroup it was started in, its *home* ``H``
(read off ``/proc/self/cgroup``, under the ``cgroup2`` mount of ``/proc/self/mountinfo``)::

    H/                              cgroup.subtree_control: +pids +memory (enabled here if need be)
    H/mocksandbox-<pid>-<random>/   this server's subtree, flock'ed while it lives; +pids +memory
        server                      a leaf: the server (every thread), and what it forks after that:
                                    its launcher, the launcher's relays, kernels
        runs/                       every run together: pids.max and memory.max at the budgets'
                                    runs_total, memory.swap.max 0; +pids +memory
            run-N                   one run: pids.max, memory.max, memory.swap.max 0

**Why the server moves.** v2 lets a cgroup hand controllers to its children
(``cgroup.subtree_control``) only while it holds no process itself (the root excepted), and moves
no process into one that has. So the server first moves itself into the leaf ``server`` (a write
to ``cgroup.procs`` moves the whole process, every thread), and only then enables ``pids`` and
``memory`` in ``H`` (which must then be empty: where other processes share ``H`` this fails with
``EBUSY``, the server moves back and says why) and in its own subtree, then makes the runs'
groups. Nothing but the server itself is ever moved: a cgroup of the server's own (a systemd scope
with ``Delegate=yes``, a container) is what v2 confinement needs. Closing undoes it in reverse: the
runs' groups go, the controllers the server enabled in ``H`` are disabled again (v2 lets no
process back into a cgroup with controllers enabled for its children), the server moves back and
removes its subtree, so that ``H`` is left as it was found.

**Runs that join as another uid.** A run's first process (forked by a relay, which sits in the
``server`` leaf) writes its own pid into its run's ``cgroup.procs``; under isolation ``lite`` it is
then an unprivileged host uid (root only in a user namespace of its own). v2 lets it move only if
it may write the destination's ``cgroup.procs`` *and* the ``cgroup.procs`` of the nearest common
ancestor of source and destination (there is no "same uid" rule as on v1). Both files are chowned
to the runs' uid: ``run-N/cgroup.procs`` and the subtree's own ``mocksandbox-.../cgroup.procs``
(the common ancestor of ``server`` and ``runs/run-N``). That lets the runs' uid move processes
between cgroups of this subtree only, and only processes it can name: a run sees its own processes
alone (a PID namespace of its own), never a relay, the launcher or the server. It cannot move any
into the subtree's root (v2 refuses: it has controllers enabled) nor into ``server`` (that file
stays the server's), and every limit file and ``cgroup.subtree_control`` stay the server's. (A
narrower grant, ``runs/cgroup.procs`` alone, would need the launcher in a leaf under ``runs``: the
launcher is forked into ``server`` and nothing moves it today.)

**Ending a run.** ``cgroup.kill`` (Linux 5.14+) kills every process of the group at once, forks
racing with it included; older kernels freeze the group (``cgroup.freeze``), SIGKILL every pid in
``cgroup.procs`` and thaw it. ``cgroup.events`` says ``populated 0`` once no process is left, and
``pids.current`` 0 once every zombie is reaped (they still count against every ``pids.max`` above).

**A killed server's leftovers.** Each subtree is named with a random part (pids repeat in every
container) and locked (``flock``) while its server lives; the next server removes the subtrees
whose lock it can take (``rmdir`` only: a subtree that still holds processes is left alone, and
nothing is moved).

All the writes that shape the tree and set limits go through :class:`CgroupFs`, one thin layer
that tests hold to the kernel's rules with a fake over plain files; this host's own v2 hierarchy
may have no ``pids`` or ``memory`` controller at all (a v1 host), where ``controllers=()`` builds
the same tree for membership and kill only: for tests, never chosen by ``create_confinement``.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import itertools
import os
import secrets
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from mocksandbox.execution.budget import (
    MemoryBudget,
    ProcessBudget,
    cgroup2_mount,
    own_cgroups,
    plan_memory_budget,
)
from mocksandbox.execution.confinement import (
    DRAIN_BOUND_S,
    JailPool,
    _counter,
    _lock_parent,
    _procs,
    _read,
    holding_home,
    kill_members,
)

#: The controllers that bound runs: without both, v2 confinement is not offered.
LIMIT_CONTROLLERS: tuple[str, ...] = ("pids", "memory")
#: A server's subtree is ``<home>/mocksandbox-<pid>-<random>``; its leaf, ``server``.
SUBTREE_PREFIX = "mocksandbox-"
SERVER_LEAF = "server"
RUNS_DIR = "runs"


class CgroupFs:
    """The system calls that shape a v2 tree: making and removing groups, handing a file to the
    runs' uid, and every write that moves a process, enables a controller or sets a limit.

    Plain system calls here; a test's fake of it over plain files holds the confinement to the
    kernel's rules (which file exists when, what is refused while a process sits where)."""

    def mkdir(self, path: Path) -> None:
        os.mkdir(path, 0o755)

    def rmdir(self, path: Path) -> None:
        os.rmdir(path)

    def chown(self, path: Path, uid: int, gid: int) -> None:
        os.chown(path, uid, gid)

    def write(self, path: Path, value: str) -> None:
        # No O_CREAT: a control file that is not there (a controller not enabled, a typo) is an
        # error, never a new plain file.
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)


# -- the thin layer: controllers and limits ----------------------------------------------------------


def enable_controllers(fs: CgroupFs, group: Path, controllers: Sequence[str]) -> list[str]:
    """Let ``group``'s children use ``controllers`` (those not enabled yet, in one write);
    returns those this enabled (what :func:`disable_controllers` gives back).

    v2 refuses this with ``EBUSY`` while ``group`` holds a process (the root excepted), and with
    ``ENOENT`` for a controller ``group`` was not given (its ``cgroup.controllers``): the caller
    moves its processes into leaves first, and enables from the top down.
    """
    enabled = (group / "cgroup.subtree_control").read_text().split()
    missing = [c for c in controllers if c not in enabled]
    if missing:
        fs.write(group / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
    return missing


def disable_controllers(fs: CgroupFs, group: Path, controllers: Sequence[str]) -> None:
    """Take ``controllers`` from ``group``'s children again (those still enabled, in one write).

    v2 refuses this with ``EBUSY`` while a child of ``group`` has one of them enabled for its own
    children: the caller disables from the bottom up, the reverse of enabling.
    """
    enabled = (group / "cgroup.subtree_control").read_text().split()
    present = [c for c in controllers if c in enabled]
    if present:
        fs.write(group / "cgroup.subtree_control", " ".join(f"-{c}" for c in present))


def set_limits(fs: CgroupFs, group: Path, max_processes: int | None, max_memory_bytes: int | None) -> None:
    """Cap ``group``: ``pids.max``, and ``memory.max`` with ``memory.swap.max`` 0 (a capped group
    must be OOM-killed, not swap: v2 counts swap apart from memory, so 0 means none). ``None``
    leaves that limit as it is (its controller is not in use, or nothing bounds it). The files
    exist only once the parent's ``cgroup.subtree_control`` holds the controller."""
    if max_processes is not None:
        fs.write(group / "pids.max", str(max_processes))
    if max_memory_bytes is not None:
        fs.write(group / "memory.max", str(max_memory_bytes))
        swap = group / "memory.swap.max"
        if swap.exists():  # absent where the kernel does not account swap (no swap either)
            fs.write(swap, "0")


def _populated(events: str) -> bool:
    """Whether the group whose ``cgroup.events`` is ``events`` (or any below it) holds a live
    process; a group that is gone holds none."""
    try:
        return b"populated 1" in _read(events, one_page=True)
    except OSError:
        return False


def _frozen(events: str) -> bool:
    try:
        return b"frozen 1" in _read(events, one_page=True)
    except OSError:
        return False


def _others(procs_file: str) -> str:
    """How many processes a ``cgroup.procs`` holds, and some of their pids, for a message. Not
    ``_procs``: it drops the ``0`` the kernel shows for each process of another PID namespace
    (a server in a container beside its host's processes, or one started in a PID namespace of
    its own), and those count here as much as any."""
    try:
        entries = _read(procs_file).split()
    except OSError:
        return "none left now"
    visible = [entry.decode() for entry in entries if entry != b"0"]
    hidden = len(entries) - len(visible)
    parts = []
    if visible:
        parts.append(f"e.g. pid {', '.join(visible[:3])}")
    if hidden:
        parts.append(f"{hidden} of other PID namespaces" if visible else "of other PID namespaces")
    return f"{len(entries)}, {'; '.join(parts)}" if parts else "none left now"


def _wait(condition: Callable[[], bool], within: float) -> bool:
    """Poll ``condition`` with a growing pause until it holds or ``within`` seconds passed."""
    deadline = time.monotonic() + within
    pause = 0.0005
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return True


def freeze(fs: CgroupFs, group: Path, frozen: bool, within: float = 1.0) -> bool:
    """Freeze (or thaw) ``group`` and everything below it; whether ``cgroup.events`` says so
    within ``within`` seconds (a task in an uninterruptible sleep freezes when it wakes)."""
    fs.write(group / "cgroup.freeze", "1" if frozen else "0")
    events = str(group / "cgroup.events")
    return _wait(lambda: _frozen(events) == frozen, within)


# -- where the server is -------------------------------------------------------------------------


def own_cgroup_v2_dir(proc: Path = Path("/proc")) -> Path | None:
    """This process's cgroup v2 directory (``0::<path>`` of ``/proc/self/cgroup``), or ``None``
    where there is no v2 hierarchy or the process's cgroup is not under its mount."""
    mount = cgroup2_mount(proc)
    if mount is None:
        return None
    mount_point, mount_root = mount
    for controllers, path in own_cgroups(proc):
        if controllers == "":
            path = path.removesuffix(" (deleted)")
            relative = os.path.relpath(path, mount_root)
            if relative == ".." or relative.startswith("../"):
                return None  # above what this mount shows (another cgroup namespace's mount)
            return mount_point if relative == "." else mount_point / relative
    return None


def home_of(own: Path) -> Path:
    """The cgroup a server confines its runs under, given the one it sits in: that one, unless it
    is the ``server`` leaf of a mocksandbox subtree (this process's own earlier sandbox, or the
    server that started this process), whose home is then this one's too."""
    if own.name == SERVER_LEAF and fnmatch.fnmatch(own.parent.name, f"{SUBTREE_PREFIX}*"):
        return own.parent.parent
    return own


def unavailable_reason(
    home: Path | None = None, controllers: Sequence[str] = LIMIT_CONTROLLERS
) -> str | None:
    """Why v2 confinement with ``controllers`` cannot be had here (``None``: it may be; building
    it proves it). ``home``: where runs would go (by default this process's home)."""
    if home is None:
        own = own_cgroup_v2_dir()
        if own is None:
            return "no cgroup v2 hierarchy holds this process"
        home = home_of(own)
    try:
        offered = (home / "cgroup.controllers").read_text().split()
    except OSError as exc:
        return f"cannot read {home}/cgroup.controllers: {exc.strerror}"
    missing = [c for c in controllers if c not in offered]
    if missing:
        return (
            f"the cgroup v2 {home} is given no {' or '.join(missing)} controller "
            f"(its cgroup.controllers: {' '.join(offered) or 'none'})"
        )
    for path in (home, home / "cgroup.procs", home / "cgroup.subtree_control"):
        if not os.access(path, os.W_OK):
            return (
                f"the cgroup v2 {home} is not writable by this user (delegate it: run as root, or "
                "under `systemd-run --user --scope -p Delegate=yes`)"
            )
    return None


# -- reclaiming a dead server's subtree ----------------------------------------------------------


def _remove_subtree(fs: CgroupFs, subtree: Path) -> bool:
    """``rmdir`` a server's subtree from the leaves up (nothing is moved or killed here); whether
    it is gone. A group that still holds a process is left, and so is everything above it."""
    _remove_runs(fs, subtree)
    _rmdir_quietly(fs, subtree / SERVER_LEAF)
    return _rmdir_quietly(fs, subtree)


def _remove_runs(fs: CgroupFs, subtree: Path) -> bool:
    """``rmdir`` the runs' groups of a server's subtree and ``runs`` itself; whether it is gone."""
    for run in subtree.glob(f"{RUNS_DIR}/run-*"):
        _rmdir_quietly(fs, run)
    return _rmdir_quietly(fs, subtree / RUNS_DIR)


def _rmdir_quietly(fs: CgroupFs, path: Path) -> bool:
    try:
        fs.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # still holds a process (or a group below it does)
    return True


def _end_dead_runs(fs: CgroupFs, subtree: Path, within: float = 5.0, use_kill: bool | None = None) -> None:
    """Kill what the runs of a dead server (killed with SIGKILL mid-run) left in ``runs/``: with
    no PID namespace of their own (isolation ``none``) nothing else ends them, and a fork bomb
    among them would hold its ``pids.max`` and its CPU for good. One ``cgroup.kill`` of ``runs``
    takes every run's group below it; before Linux 5.14, each run's group is frozen and killed.
    The server's own leaf is left alone: what is there is not a run's. (``use_kill``: whether
    to use ``cgroup.kill``; by default, where the kernel has it.)"""
    runs = subtree / RUNS_DIR
    events = str(runs / "cgroup.events")
    if not _populated(events):
        return
    if use_kill is None:
        use_kill = (runs / "cgroup.kill").exists()
    try:
        if use_kill:
            fs.write(runs / "cgroup.kill", "1")
        else:
            for run in runs.glob("run-*"):
                procs = str(run / "cgroup.procs")
                try:
                    freeze(fs, run, True)
                    kill_members(_procs(procs), functools.partial(_procs, procs))
                finally:
                    freeze(fs, run, False, within=0)
    except OSError:
        pass  # gone meanwhile
    _wait(lambda: not _populated(events), within)


def reclaim_dead_subtrees(fs: CgroupFs, home: Path) -> list[Path]:
    """Remove the subtrees under ``home`` of mocksandbox servers that died without cleaning up
    (SIGKILL, OOM): those whose lock can be taken, once what their runs left running is killed.
    Pids are no guide (in a container the next server has the dead one's pid). Returns what was
    removed."""
    removed = []
    with holding_home(home):  # (a subtree just made is locked before anyone may judge it)
        for subtree in home.glob(f"{SUBTREE_PREFIX}*"):
            try:
                lock = _lock_parent(subtree)
            except OSError:
                continue  # alive (its server holds the lock), or removed meanwhile
            try:
                _end_dead_runs(fs, subtree)
                if _remove_subtree(fs, subtree):
                    removed.append(subtree)
            finally:
                os.close(lock)
    return removed


# -- one run -------------------------------------------------------------------------------------


class CgroupV2Jail:
    """One run's cgroup ``runs/run-N``. Reused for later runs once drained (see the pool)."""

    def __init__(
        self,
        directory: Path,
        fs: CgroupFs,
        max_processes: int | None,
        max_memory_bytes: int | None,
        release: Callable[[CgroupV2Jail, bool], None],
        warm_procs_file: str | None,
        owner: tuple[int, int] | None,
        use_kill: bool,
    ) -> None:
        self.directory = directory
        self._fs = fs
        self._release = release
        self._use_kill = use_kill
        self._closed = False
        fs.mkdir(directory)
        if owner is not None:
            # The run's first process writes its own pid here, as the runs' uid: only this file
            # is theirs (the limits stay the server's).
            fs.chown(directory / "cgroup.procs", *owner)
        set_limits(fs, directory, max_processes, max_memory_bytes)
        self.procs_files = [str(directory / "cgroup.procs")]
        self.warm_procs_file = warm_procs_file
        self.rlimits: list[tuple[int, int]] = []  # the cgroup bounds the run
        self._events = str(directory / "cgroup.events")
        #: Charged tasks (zombies included): only where the pids controller is in use.
        self._pids_current = str(directory / "pids.current") if max_processes is not None else None
        #: The last kill_all found the group empty. Nothing enters it after that (only the run's
        #: program joins, and its descendants would have been found): close() need not look again.
        self._found_empty = False
        #: ``pids.current`` read 0 after the run: no task at all, live or dead (see kill_all).
        self._found_drained = False
        #: ``memory.events``, where the memory controller is in use, and its ``oom_kill`` and
        #: ``oom`` counts at the last look (a new group: none).
        self._memory_events_file = str(directory / "memory.events") if max_memory_bytes is not None else None
        self._memory_events = (0, 0)

    def reopen(self) -> CgroupV2Jail:
        self._closed = False
        self._found_empty = False
        self._found_drained = False
        return self

    def kill_all(self) -> None:
        if self._found_empty:
            return
        if self._pids_current is not None and self._charged() == 0:
            # No task charged, not even a dead one: nothing to kill and nothing to wait for,
            # known from one file (most runs).
            self._found_empty = self._found_drained = True
            return
        if not _populated(self._events):
            self._found_empty = True
            return
        deadline = time.monotonic() + 10.0
        while _populated(self._events) and time.monotonic() < deadline:
            try:
                if self._use_kill:
                    # Every process of the group and below, forks racing with it included.
                    self._fs.write(self.directory / "cgroup.kill", "1")
                else:
                    self._freeze_and_kill()
            except OSError:
                pass  # the group is gone, or emptied meanwhile
            # Killed processes leave the group as they die (zombies too: cgroup.events no longer
            # counts them; pids.current does, until they are reaped).
            _wait(lambda: not _populated(self._events), 1.0)

    def _freeze_and_kill(self) -> None:
        """Before ``cgroup.kill`` (Linux < 5.14): freeze first, so that nothing forks while we
        kill and a fork bomb cannot outrun us, then SIGKILL every pid and thaw."""
        procs = self.procs_files[0]
        try:
            freeze(self._fs, self.directory, True)
            kill_members(_procs(procs), lambda: _procs(procs))
        finally:
            freeze(self._fs, self.directory, False, within=0)

    def ended_by_shared_memory_budget(self) -> bool:
        """See ``RunJail.ended_by_shared_memory_budget``: the group's ``oom_kill`` count rose
        while its ``oom`` count (the OOM killer invoked at this group's own ``memory.max``; one
        invoked at a group above, ``runs``, counts there and above) did not. Read only when asked
        (after a SIGKILL)."""
        if self._memory_events_file is None:
            return False
        try:
            events = _read(self._memory_events_file, one_page=True)
            counts = (_counter(events, b"oom_kill"), _counter(events, b"oom"))
        except (OSError, ValueError):
            return False
        before, self._memory_events = self._memory_events, counts
        return counts[0] > before[0] and counts[1] == before[1]

    def close(self) -> None:
        """Kill what is left, wait until the group charges nothing, and hand it back: to the pool
        when it drained, else to be retired (never reused)."""
        if self._closed:
            return
        self.kill_all()
        self._closed = True
        self._release(self, self.wait_drained(DRAIN_BOUND_S))

    def _charged(self) -> int | None:
        if self._pids_current is None:
            return 0  # no pids controller: nothing is charged, nothing to drain
        try:
            return int(_read(self._pids_current, one_page=True))
        except (OSError, ValueError):
            return None

    def wait_drained(self, within: float) -> bool:
        """Whether, within ``within`` seconds, no task is left and none is still charged (a dead
        but unreaped task counts against ``pids.max`` here and above, the server's own included:
        the launcher, their subreaper, reaps them as they die, see ``launcher/_launcher_serve.py``)."""

        def drained() -> bool:
            return self._charged() == 0 and (self._found_empty or not _populated(self._events))

        return self._found_drained or _wait(drained, within)

    def remove(self) -> bool:
        """Delete the group (waiting briefly for dying tasks to leave); whether it is gone."""
        for _ in range(100):
            try:
                self._fs.rmdir(self.directory)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                time.sleep(0.01)  # a dying task can keep the group busy for a moment
        return False


# -- the confinement -----------------------------------------------------------------------------


class CgroupV2Confinement:
    """A v2 cgroup per run under ``<home>/mocksandbox-<pid>-<random>/runs`` (see the module).

    ``runs`` is capped at the budgets' ``runs_total``, so that the runs in flight together can
    never take what the server needs (see :mod:`mocksandbox.execution.budget`); each run at
    ``per_run``. Building it moves this process into the subtree's ``server`` leaf; closing it
    disables what it enabled in ``home`` and moves it back where it was, where v2 allows (not
    into a cgroup that has controllers enabled for its children by then, as another server's
    subtree beside ours may keep them: it then stays, and the next server removes the leaf once
    empty).

    ``controllers``: those the runs are bounded by (``pids`` and ``memory``; tests on a host whose
    v2 hierarchy has neither pass others or none: the tree, moves and kills, no limits).
    ``home``, ``came_from``, ``fs``: where runs go, where this process sits, the layer the tree is
    written through (by default this process's, off ``/proc/self``, and plain system calls).
    """

    name = "cgroup"
    version = 2

    def __init__(
        self,
        max_processes: int,
        max_memory_mb: int,
        budget: ProcessBudget | None = None,
        memory_budget: MemoryBudget | None = None,
        *,
        controllers: Sequence[str] = LIMIT_CONTROLLERS,
        home: Path | None = None,
        came_from: Path | None = None,
        fs: CgroupFs | None = None,
    ) -> None:
        self.budget = budget if budget is not None else ProcessBudget(None, 0, None, max_processes)
        self.memory_budget = (
            memory_budget if memory_budget is not None else plan_memory_budget([], max_memory_mb)
        )
        self.controllers = tuple(controllers)
        self._bounds_processes = "pids" in self.controllers
        self._bounds_memory = "memory" in self.controllers
        self.max_processes = min(max_processes, self.budget.per_run)
        self.max_memory_bytes = min(max_memory_mb * 1024 * 1024, self.memory_budget.per_run)
        self._fs = fs if fs is not None else CgroupFs()
        if home is None or came_from is None:
            own = own_cgroup_v2_dir()
            if own is None:
                raise OSError(errno.ENOENT, "no cgroup v2 hierarchy holds this process")
            home = home if home is not None else home_of(own)
            came_from = came_from if came_from is not None else own
        self.home = home
        self._came_from = came_from
        why = unavailable_reason(home, self.controllers)
        if why is not None:
            raise OSError(errno.EOPNOTSUPP, why)
        self._counter = itertools.count()
        self._pool: JailPool[CgroupV2Jail] = JailPool()
        #: ``(uid, gid)`` runs are on the host, when not the server's user.
        self._owner: tuple[int, int] | None = None
        # Unique per server instance (a random part: pids repeat in every container), and locked
        # while we live, so that the next server can tell our subtree from a dead server's.
        self.subtree = home / f"{SUBTREE_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        self.server_leaf = self.subtree / SERVER_LEAF
        self.runs = self.subtree / RUNS_DIR
        self._subtree_lock: int | None = None
        self._moved = False
        #: The controllers this server enabled in ``home`` (to give back when it closes).
        self._enabled_in_home: list[str] = []
        try:
            self._build()
        except BaseException:
            self._unbuild()
            raise

    def _build(self) -> None:
        fs = self._fs
        with holding_home(self.home):
            fs.mkdir(self.subtree)
            self._subtree_lock = _lock_parent(self.subtree)
        fs.mkdir(self.server_leaf)
        # The leaf first: no controller can be enabled where we sit.
        fs.write(self.server_leaf / "cgroup.procs", str(os.getpid()))
        self._moved = True
        # What a dead server left (the leaf we just left included, if it was one's).
        reclaim_dead_subtrees(fs, self.home)
        try:
            # Under the home's lock, so that a server closing beside us (which disables what it
            # enabled there, see _give_back_home) never does so between these two writes.
            with holding_home(self.home):
                self._enabled_in_home = enable_controllers(fs, self.home, self.controllers)
                enable_controllers(fs, self.subtree, self.controllers)
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            raise OSError(
                errno.EBUSY,
                f"the cgroup v2 {self.home} holds other processes "
                f"({_others(str(self.home / 'cgroup.procs'))}): v2 enables controllers only in a "
                "cgroup without processes, and the server moves none but itself (start it in a "
                "cgroup of its own: `systemd-run --scope -p Delegate=yes`, a container)",
            ) from None
        fs.mkdir(self.runs)
        enable_controllers(fs, self.runs, self.controllers)
        set_limits(
            fs,
            self.runs,
            self.budget.runs_total if self._bounds_processes else None,
            self.memory_budget.runs_total if self._bounds_memory else None,
        )
        # cgroup.kill came with Linux 5.14, cgroup.freeze with 5.2.
        self.use_kill = (self.runs / "cgroup.kill").exists()
        if not self.use_kill and not (self.runs / "cgroup.freeze").exists():
            raise OSError(errno.EOPNOTSUPP, "this kernel's cgroup v2 has no cgroup.kill or cgroup.freeze")
        # The launcher is forked after this, into our leaf: rewriting its pid there moves nothing
        # but takes the lock that moves take (see launcher/_launcher_serve.py: it keeps cgroup moves fast).
        self._warm_procs_file = str(self.server_leaf / "cgroup.procs")
        # Prove that a run's group can be made, configured and removed before claiming to work.
        self.new_jail().remove()

    def _unbuild(self) -> None:
        """Undo what was built (any part of it): the runs' groups removed, the controllers this
        server enabled in its home disabled again, this process back where it was, the rest
        removed, the lock released."""
        _remove_runs(self._fs, self.subtree)
        if self._moved:
            with holding_home(self.home):
                # One hold for both: a server starting beside us enables under it, and would
                # otherwise enable again between them, refusing our move back.
                self._give_back_home()
                left = self._leave_leaf()
            if left:
                self._moved = False
                # What we forked dies on its own time (a launcher we closed, an init killed with
                # its parent): let it leave the leaf before removing it.
                events = str(self.server_leaf / "cgroup.events")
                _wait(lambda: not _populated(events), 1.0)
        _rmdir_quietly(self._fs, self.server_leaf)
        _rmdir_quietly(self._fs, self.subtree)
        if self._subtree_lock is not None:
            os.close(self._subtree_lock)
            self._subtree_lock = None

    def _give_back_home(self) -> None:
        """Disable in ``home`` the controllers this server enabled there, leaving it as found (a
        systemd unit with ``Delegate=yes`` holds its own processes again, with no controller
        enabled for its children): v2 lets no process back into a cgroup that has controllers
        enabled for its children, so while they stay, this process cannot leave its leaf and
        the leaf and subtree outlive it. From the bottom up, as v2 asks: our subtree's first
        (the runs' groups are gone by now), then the home's. Where v2 refuses (a run's group
        still holds a process, or another server's subtree under the same home uses them) they
        stay, and so does this process (the next server reclaims the subtree once empty).
        Controllers found enabled in ``home`` are not ours to take away."""
        if not self._enabled_in_home:
            return
        try:
            disable_controllers(self._fs, self.subtree, self.controllers)
            disable_controllers(self._fs, self.home, self._enabled_in_home)
        except OSError:
            return
        self._enabled_in_home = []

    def _leave_leaf(self) -> bool:
        """Move this process back to where it came from, if it still sits in our leaf; whether
        it is out of it. v2 refuses the move into a cgroup with controllers enabled for its
        children (as ``home`` has while the controllers we enabled there stay)."""
        pid = os.getpid()
        if pid not in _procs(str(self.server_leaf / "cgroup.procs")):
            return True
        try:
            self._fs.write(self._came_from / "cgroup.procs", str(pid))
            return True
        except OSError:
            return False

    @classmethod
    def available(cls) -> bool:
        """Whether this process's home has the ``pids`` and ``memory`` controllers and is
        writable here (building the confinement proves the rest)."""
        return unavailable_reason() is None

    @property
    def retired(self) -> int:
        """How many jails were retired because they did not drain in time."""
        return self._pool.retired

    def new_jail(self) -> CgroupV2Jail:
        jail = self._pool.take()
        if jail is not None:
            return jail
        run = f"run-{next(self._counter)}"  # (itertools.count: thread-safe under the GIL)
        return CgroupV2Jail(
            self.runs / run,
            self._fs,
            self.max_processes if self._bounds_processes else None,
            self.max_memory_bytes if self._bounds_memory else None,
            self._pool.give_back,
            self._warm_procs_file,
            self._owner,
            self.use_kill,
        )

    def delegate_runs_to(self, uid: int | None, gid: int | None) -> None:
        """Runs join as ``uid``/``gid``: hand them their groups' ``cgroup.procs`` and the
        subtree's (the common ancestor of the relays' leaf and theirs, which v2 asks for);
        ``None`` hands them back to the server's user."""
        owner = None if uid is None or gid is None else (uid, gid)
        ancestor = owner if owner is not None else (os.geteuid(), os.getegid())
        self._fs.chown(self.subtree / "cgroup.procs", *ancestor)
        self._owner = owner
        self._pool.forget_idle()  # jails made for another owner are not reused

    def describe(self) -> str:
        kill = "cgroup.kill" if self.use_kill else "freeze and kill"
        if not (self._bounds_processes or self._bounds_memory):
            return f"cgroup v2 per run (no limit controllers: membership and {kill} only)"
        return (
            f"cgroup v2 per run (pids.max={self.max_processes}, "
            f"memory={self.max_memory_bytes // (1024 * 1024)} MiB, {kill})"
        )

    def close(self) -> None:
        if self._pool.close():
            self._unbuild()
