"""Confining one run: every process it starts is bounded, and all of them die when it ends.

Three implementations behind one small interface:

* :class:`CgroupConfinement` (cgroup v1 ``pids``, ``memory`` and ``freezer``): a cgroup per run caps
  its process count (a fork bomb hits ``pids.max``) and memory (a hog is OOM-killed, rc -9), and
  lets the whole tree be frozen and killed, including children that called ``setsid`` or
  double-forked. Works for root, which rlimits like ``RLIMIT_NPROC`` do not bind. The parents of
  the runs' groups cap all runs together (see :mod:`mocksandbox.execution.budget`).
* :class:`~mocksandbox.execution.cgroup_v2.CgroupV2Confinement`: the same on cgroup v2 (``pids``,
  ``memory``, ``cgroup.kill``), in a subtree of the server's own cgroup; see that module.
* :class:`ProcessGroupConfinement`: a fallback where cgroups are not writable. Each run has its own
  session and process group, which is killed as a group; descendants that left the group are found
  through the process tree while their parent lives. Weaker, and said so at start-up.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import itertools
import os
import resource
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import psutil

from mocksandbox.execution.budget import (
    MEMORY_NOT_HELD,
    MIN_PER_RUN,
    MemoryBudget,
    ProcessBudget,
    discover_memory_limits,
    discover_process_limits,
    own_cgroups,
    plan_memory_budget,
    plan_process_budget,
)

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_CONTROLLERS = ("pids", "memory", "freezer")


class RunJail(Protocol):
    """The confinement of one run."""

    #: ``cgroup.procs`` files the run's first process writes its pid to (empty: none).
    procs_files: list[str]
    #: A ``cgroup.procs`` file holding the launcher, for it to rewrite while runs keep coming (see
    #: ``launcher/_launcher_serve.py``: it keeps cgroup moves fast); ``None`` where runs join no cgroup.
    warm_procs_file: str | None
    #: ``(resource, limit)`` the run's first process sets (soft and hard) before it starts: what
    #: bounds a run where no cgroup does.
    rlimits: list[tuple[int, int]]

    def kill_all(self) -> None:
        """Kill every process of the run that is still alive and wait until they are gone."""

    def ended_by_shared_memory_budget(self) -> bool:
        """Whether one of the run's processes was killed for want of memory since the last look
        while the run's own memory limit was never reached: the cgroup of all runs together (the
        memory budget) reached its limit, not this run's. Asked after a run killed by SIGKILL."""

    def close(self) -> None:
        """Kill what is left and release the confinement. Idempotent."""


class Confinement(Protocol):
    """A factory of :class:`RunJail`, one per run."""

    name: str
    #: How many processes runs may use, read off this host's limits at start-up.
    budget: ProcessBudget
    #: How much memory runs may use, likewise.
    memory_budget: MemoryBudget

    def new_jail(self) -> RunJail: ...

    def delegate_runs_to(self, uid: int | None, gid: int | None) -> None:
        """Runs are this host uid and gid (``None``: the server's user): a run's first process,
        which joins its confinement itself, must be let in."""

    def describe(self) -> str: ...

    def close(self) -> None: ...


def _write(path: Path | bytes, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _set_memory_limit(group: Path, limit: int) -> None:
    """Cap the v1 memory cgroup ``group`` at ``limit`` bytes, swap included where the kernel
    accounts it (else a capped group could swap instead of being OOM-killed). The kernel keeps
    ``memsw`` >= the plain limit at every step: when raising, ``memsw`` goes first."""
    plain, memsw = group / "memory.limit_in_bytes", group / "memory.memsw.limit_in_bytes"
    try:
        raising = limit > int(memsw.read_text())
    except (OSError, ValueError):
        raising = None  # no swap accounting here: the plain limit is all there is
    if raising:
        _write(memsw, str(limit))
    _write(plain, str(limit))
    if raising is False:
        _write(memsw, str(limit))


#: How many pidfds :func:`kill_members` holds at once (a fork bomb's pids may outnumber the fds a
#: process may open).
_PIDFDS_AT_ONCE = 256


def kill_members(pids: list[int], members: Callable[[], list[int]]) -> None:
    """SIGKILL each of ``pids`` (read off a cgroup's ``cgroup.procs``) that is still a member of
    that group, as ``members`` reads it again.

    Not ``kill(pid)``: once a member dies, its pid may go to a process anywhere on the host (a fork
    bomb's churn wraps the pid space within a second), which a plain kill would then reach. So
    each pid is opened as a pidfd first (which names one process for good), the group's members
    are read again, and a pidfd is signalled only if its pid is still among them: the process it
    names was then the member holding that pid (or it has died since, and the signal goes
    nowhere). Where the kernel has no pidfds (before Linux 5.3), or this process has no fd left for
    one, a plain kill."""
    for start in range(0, len(pids), _PIDFDS_AT_ONCE):
        opened: dict[int, int] = {}
        try:
            for pid in pids[start : start + _PIDFDS_AT_ONCE]:
                try:
                    opened[pid] = os.pidfd_open(pid)
                except ProcessLookupError:
                    continue  # gone already
                except OSError as exc:
                    if exc.errno not in (errno.ENOSYS, errno.EMFILE, errno.ENFILE):
                        raise
                    # No pidfds here (or none left to this process): a plain kill, rather than
                    # none, which would leave a fork bomb running.
                    _kill_quietly(pid)
            still = set(members()) if opened else set()
            for pid, fd in opened.items():
                if pid in still:
                    try:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        finally:
            for fd in opened.values():
                os.close(fd)


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _procs(procs_file: str) -> list[int]:
    """The pids in a ``cgroup.procs`` (0: a process this PID namespace cannot see), or none if it
    cannot be read (the group is gone)."""
    try:
        return [int(p) for p in _read(procs_file).split() if p != b"0"]
    except OSError:
        return []


def _kill_group(procs_file: str, freezer_state: Path | None, within: float) -> None:
    """Kill every process of the v1 group whose ``cgroup.procs`` is ``procs_file`` (frozen first,
    where ``freezer_state`` is given), until none is left or ``within`` seconds have passed."""
    deadline = time.monotonic() + within
    while _procs(procs_file) and time.monotonic() < deadline:
        # Freeze first so that nothing can fork while we kill: a fork bomb cannot outrun us.
        if freezer_state is not None:
            try:
                _write(freezer_state, "FROZEN")
                freeze_deadline = time.monotonic() + 1.0
                while freezer_state.read_text().strip() != "FROZEN" and time.monotonic() < freeze_deadline:
                    time.sleep(0.001)
            except OSError:
                pass
        kill_members(_procs(procs_file), lambda: _procs(procs_file))
        if freezer_state is not None:
            try:
                _write(freezer_state, "THAWED")
            except OSError:
                pass
        # Killed processes leave the cgroup as soon as they are thawed and die.
        settle = time.monotonic() + 1.0
        while _procs(procs_file) and time.monotonic() < settle:
            time.sleep(0.001)


def _read(path: str, one_page: bool = False) -> bytes:
    """A small control file's contents, with plain system calls (several per run: pathlib and io
    objects would cost more than the reads). ``one_page``: a file that always fits in a page (one
    value, or a few flat keys), which one read gets whole: no second read to see its end. (Not so
    a list, such as ``cgroup.procs``: a read of one can come back short before its end, where
    the next line would not fit.)"""
    fd = os.open(path, os.O_RDONLY)
    try:
        if one_page:
            return os.read(fd, 4096)
        # Page by page: a read's buffer is allocated whole, and these files hold a few bytes
        # (a buffer of a megabyte cost each read about 15 us more).
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 4096)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _counter(text: bytes, name: bytes) -> int:
    """The value of ``name`` in a flat-keyed cgroup file (``memory.events``, ``oom_control``)."""
    for line in text.splitlines():
        key, _, value = line.partition(b" ")
        if key == name:
            return int(value)
    raise ValueError(f"no {name.decode()} in the file")


def own_cgroup_dir(controller: str) -> Path:
    """This process's cgroup directory in the v1 ``controller`` hierarchy, e.g.
    ``/sys/fs/cgroup/pids`` or ``/sys/fs/cgroup/pids/docker/abc``."""
    for controllers, path in own_cgroups():
        if controller in controllers.split(","):
            return _CGROUP_ROOT / controller / path.lstrip("/")
    raise OSError(errno.ENOENT, f"controller {controller} not mounted")


class CgroupJail:
    """One run's cgroups (one per controller). Reused for later runs once empty (see the pool)."""

    def __init__(
        self,
        dirs: dict[str, Path],
        max_processes: int,
        max_memory_bytes: int,
        release: Callable[[CgroupJail, bool], None],
        warm_procs_file: str | None = None,
        owner: tuple[int, int] | None = None,
    ) -> None:
        self._dirs = dirs
        self.warm_procs_file = warm_procs_file
        self.rlimits: list[tuple[int, int]] = []  # the cgroups bound the run
        self._release = release
        self._closed = False
        for directory in dirs.values():
            directory.mkdir()
            if owner is not None:
                # The run's first process writes its own pid here, as the runs' uid: only this
                # file is theirs (the limits stay root's).
                os.chown(directory / "cgroup.procs", *owner)
        _write(dirs["pids"] / "pids.max", str(max_processes))
        _set_memory_limit(dirs["memory"], max_memory_bytes)
        self.procs_files = [str(d / "cgroup.procs") for d in dirs.values()]
        self._freezer_procs = str(dirs["freezer"] / "cgroup.procs")
        self._pids_current = str(dirs["pids"] / "pids.current")
        #: The last kill_all found no task in the group. Nothing can enter it after that (only the
        #: run's program joins, and its descendants, who would have been found), so close() need
        #: not look again.
        self._found_empty = False
        #: ``pids.current`` read 0 after the run: no task at all, live or dead (see kill_all).
        self._found_drained = False
        #: The memory cgroup's OOM kills at the last look (a new group: none), and its own limit.
        self._oom_kills = 0
        self.max_memory_bytes = max_memory_bytes

    def reopen(self) -> CgroupJail:
        self._closed = False
        self._found_empty = False
        self._found_drained = False
        return self

    def _pids(self) -> list[int]:
        return _procs(self._freezer_procs)

    def kill_all(self) -> None:
        if self._found_empty:
            return
        if self._charged() == 0:
            # No task charged, not even a dead one: nothing to kill and nothing to wait for, known
            # from one file (most runs; their cgroup.procs and a second read are spared).
            self._found_empty = self._found_drained = True
            return
        if not self._pids():
            self._found_empty = True
            return
        _kill_group(self._freezer_procs, self._dirs["freezer"] / "freezer.state", within=10.0)

    def ended_by_shared_memory_budget(self) -> bool:
        """See :meth:`RunJail.ended_by_shared_memory_budget`: the memory cgroup's ``oom_kill``
        count (``memory.oom_control``) rose while its high-water mark
        (``memory.max_usage_in_bytes``, reset here) stayed under its own limit: the limit reached
        was one above it. (``memory.failcnt`` would say so directly, but recent kernels no longer
        count it.) Read only when asked (after a SIGKILL), so that a run that is not killed pays
        nothing for it."""
        memory = self._dirs["memory"]
        try:
            kills = _counter(_read(str(memory / "memory.oom_control"), one_page=True), b"oom_kill")
            peak = int(_read(str(memory / "memory.max_usage_in_bytes"), one_page=True))
            _write(memory / "memory.max_usage_in_bytes", "0")
        except (OSError, ValueError):
            return False
        before, self._oom_kills = self._oom_kills, kills
        return kills > before and peak < self.max_memory_bytes

    def close(self) -> None:
        """Kill what is left, wait until the group charges nothing, and hand it back: to the pool
        when it drained, else to be retired (never reused)."""
        if self._closed:
            return
        self.kill_all()
        self._closed = True
        self._release(self, self.wait_drained(DRAIN_BOUND_S))

    def _charged(self) -> int | None:
        try:
            return int(_read(self._pids_current, one_page=True))
        except (OSError, ValueError):
            return None

    def wait_drained(self, within: float) -> bool:
        """Whether, within ``within`` seconds, no task is left and none is still charged.

        Dead but unreaped tasks (a fork bomb's zombies) still count against ``pids.max`` here and
        in every cgroup above, the server's own included: an answer sent before they are reaped
        would let the next runs find the budget spent. The launcher is their subreaper and reaps
        them as they die (see ``launcher/_launcher_serve.py``), so this is normally already true, or
        true within a few milliseconds.
        """
        if self._found_drained:
            return True
        deadline = time.monotonic() + within
        pause = 0.0005
        while True:
            charged = self._charged()
            if charged == 0 and (self._found_empty or not self._pids()):
                return True
            if charged is None or time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def remove(self) -> bool:
        """Delete the groups (waiting briefly for dying tasks to leave); whether all are gone."""
        removed = True
        for directory in self._dirs.values():
            for _ in range(100):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)  # a dying task can keep the group busy for a moment
            else:
                removed = False
        return removed


def _remove_dir_tree(parent: Path) -> None:
    for child in parent.glob("run-*"):
        try:
            child.rmdir()
        except OSError:
            pass  # still has live tasks: leave it
    try:
        parent.rmdir()
    except OSError:
        pass


_INSTANCES = itertools.count()
#: Emptied jails kept for reuse (about the most runs in flight at once).
_IDLE_JAILS = 64
#: How long a run's answer may wait for its cgroup to charge nothing before the group is retired.
DRAIN_BOUND_S = 5.0


class _PooledJail(Protocol):
    def reopen(self) -> Any: ...

    def remove(self) -> bool: ...


J = TypeVar("J", bound=_PooledJail)


class JailPool(Generic[J]):
    """The emptied cgroups of one confinement, kept for reuse (making a group and writing its
    limits costs more than a run's own bookkeeping), and those retired because they did not drain
    in time (never reused, removed at close). Thread-safe; cgroup v1 and v2 share it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[J] = []
        self._retired: list[J] = []
        #: How many jails were retired because they did not drain in time (still charged or busy).
        self.retired = 0
        self._closing = False

    def take(self) -> J | None:
        """An emptied jail, reopened, if one waits."""
        with self._lock:
            return self._idle.pop().reopen() if self._idle else None

    def give_back(self, jail: J, drained: bool) -> None:
        """Keep a jail that drained for reuse; remove one that did not, or retire it if busy."""
        with self._lock:
            if drained and not self._closing and len(self._idle) < _IDLE_JAILS:
                self._idle.append(jail)
                return
            if not drained:
                self.retired += 1
        if not jail.remove():
            with self._lock:
                self._retired.append(jail)  # still busy: removed at close

    def forget_idle(self) -> None:
        """Remove the idle jails (made for another owner: not to be reused)."""
        with self._lock:
            stale, self._idle = self._idle, []
        for jail in stale:
            jail.remove()

    def close(self) -> bool:
        """Remove every jail kept; ``False`` if the pool was closed already."""
        with self._lock:
            if self._closing:
                return False
            self._closing = True
            kept, self._idle, self._retired = self._idle + self._retired, [], []
        for jail in kept:
            jail.remove()
        return True


def _remove_stale_parents(home: Path) -> None:
    """Remove the cgroups of mocksandbox servers that died without cleaning up (e.g. SIGKILL).

    A live server holds a lock on each of its parent groups (see :func:`_lock_parent`); a group
    whose lock can be taken belongs to nobody. Each controller's group is judged by its own lock:
    two processes may sit in different groups of one controller and the same of another. Pids
    are no guide: in a container or PID namespace the next server has the dead one's pid (1 or 2)
    and would take its leftovers for its own.
    """
    with holding_home(home):  # (a group just made is locked before anyone may judge it)
        for parent in home.glob("mocksandbox-*"):
            try:
                lock = _lock_parent(parent)
            except FileNotFoundError:
                continue  # removed meanwhile
            except OSError:
                continue  # alive (or not ours to judge): left alone
            try:
                _end_stale_runs(parent)
                _remove_dir_tree(parent)
            finally:
                os.close(lock)


def _end_stale_runs(parent: Path, within: float = 5.0) -> None:
    """Kill what the runs of a dead server (killed with SIGKILL mid-run) left in their groups
    under ``parent``: with no PID namespace of their own (isolation ``none``) nothing else ends
    them, and a fork bomb among them would hold its ``pids.max`` and its CPU for good. Frozen
    first where this is the freezer's hierarchy, so that nothing forks while it is killed."""
    for run in parent.glob("run-*"):
        freezer = run / "freezer.state"
        _kill_group(str(run / "cgroup.procs"), freezer if freezer.exists() else None, within)


@contextmanager
def holding_home(home: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the cgroup ``home`` (blocking) while a server makes its group
    there and locks it, or judges which groups there are stale: a group made and not yet locked
    would look like a dead server's to another server starting at that moment, which would then
    remove it (and the first server would fail to start). Several servers start at once wherever
    tests run in parallel, or a server has workers."""
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (the lock goes with it)


def _lock_parent(parent: Path) -> int:
    """An exclusive ``flock`` on a server's parent group, held while the server lives; raises
    ``OSError`` if another process (or another sandbox of this one) holds it."""
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


class CgroupConfinement:
    """A cgroup per run under ``<own cgroup>/mocksandbox-<pid>-<instance>`` in each v1 controller.

    The ``pids`` and ``memory`` parents hold every run's group and are capped at the budgets'
    ``runs_total``, so that the runs in flight together can never take what the server itself
    needs (see :mod:`mocksandbox.execution.budget`); each run is capped at ``per_run``. An OOM that
    runs cause then happens inside the memory parent, where only their processes are candidates.
    """

    name = "cgroup"

    def __init__(
        self,
        max_processes: int,
        max_memory_mb: int,
        budget: ProcessBudget | None = None,
        memory_budget: MemoryBudget | None = None,
    ) -> None:
        self.budget = budget if budget is not None else ProcessBudget(None, 0, None, max_processes)
        self.memory_budget = (
            memory_budget if memory_budget is not None else plan_memory_budget([], max_memory_mb)
        )
        self.max_processes = min(max_processes, self.budget.per_run)
        self.max_memory_bytes = min(max_memory_mb * 1024 * 1024, self.memory_budget.per_run)
        self._counter = itertools.count()
        self._pool: JailPool[CgroupJail] = JailPool()
        #: ``(uid, gid)`` runs are on the host, when not the server's user.
        self._owner: tuple[int, int] | None = None
        self._parents: dict[str, Path] = {}
        # Several sandboxes may live in one process (tests, fixtures): each gets its own groups.
        self._instance = next(_INSTANCES)
        # Unique per server instance (a random part: pids repeat in every container), and locked
        # while we live, so that the next server can tell our groups from a dead server's.
        name = f"mocksandbox-{os.getpid()}-{self._instance}-{secrets.token_hex(4)}"
        self._owner_locks: list[int] = []
        for controller in _CONTROLLERS:
            home = own_cgroup_dir(controller)
            _remove_stale_parents(home)
            with holding_home(home):
                parent = home / name
                parent.mkdir()
                self._parents[controller] = parent
                self._owner_locks.append(_lock_parent(parent))
        if self.budget.runs_total is not None:
            _write(self._parents["pids"] / "pids.max", str(self.budget.runs_total))
        if self.memory_budget.runs_total is not None:
            _set_memory_limit(self._parents["memory"], self.memory_budget.runs_total)
        # The launcher is our child, so it sits in our own pids cgroup: rewriting its pid there
        # moves nothing but takes the lock that moves take (see launcher/_launcher_serve.py).
        self._warm_procs_file = str(self._parents["pids"].parent / "cgroup.procs")
        # Prove that a child group can be made, configured and removed before claiming to work.
        self.new_jail().remove()

    @classmethod
    def available(cls) -> bool:
        """Whether the v1 controllers are mounted and writable here."""
        try:
            return all(os.access(own_cgroup_dir(c), os.W_OK) for c in _CONTROLLERS)
        except OSError:
            return False

    @property
    def retired(self) -> int:
        """How many jails were retired because they did not drain in time."""
        return self._pool.retired

    def new_jail(self) -> CgroupJail:
        jail = self._pool.take()
        if jail is not None:
            return jail
        run = f"run-{next(self._counter)}"  # (itertools.count: thread-safe under the GIL)
        dirs = {c: self._parents[c] / run for c in _CONTROLLERS}
        return CgroupJail(
            dirs,
            self.max_processes,
            self.max_memory_bytes,
            self._pool.give_back,
            self._warm_procs_file,
            self._owner,
        )

    def delegate_runs_to(self, uid: int | None, gid: int | None) -> None:
        self._owner = None if uid is None or gid is None else (uid, gid)
        self._pool.forget_idle()  # jails made for another owner are not reused

    def describe(self) -> str:
        return (
            f"cgroup v1 per run (pids.max={self.max_processes}, "
            f"memory={self.max_memory_bytes // (1024 * 1024)} MiB, freezer kill)"
        )

    def close(self) -> None:
        self._pool.close()
        for parent in self._parents.values():
            _remove_dir_tree(parent)
        locks, self._owner_locks = self._owner_locks, []
        for lock in locks:
            os.close(lock)


class ProcessGroupJail:
    """Kills the run's session/process group and every descendant still reachable."""

    def __init__(self, rlimits: list[tuple[int, int]] | None = None) -> None:
        self.leader_pid: int | None = None
        self.procs_files: list[str] = []
        self.warm_procs_file: str | None = None
        self.rlimits = list(rlimits or [])
        self._known: dict[int, psutil.Process] = {}

    def attach(self, pid: int) -> None:
        self.leader_pid = pid

    def leader_reaped(self) -> None:
        """The run's first process has exited and been reaped (its relay killed its group first):
        its pid, and so its group's id, may now be another process's anywhere on the host, which
        :meth:`kill_all` must not reach. Nothing of the run is left to find through it."""
        self.leader_pid = None

    def _snapshot(self) -> None:
        if self.leader_pid is None:
            return
        try:
            leader = psutil.Process(self.leader_pid)
            for proc in [leader, *leader.children(recursive=True)]:
                self._known.setdefault(proc.pid, proc)
        except psutil.Error:
            pass

    def ended_by_shared_memory_budget(self) -> bool:
        return False  # (no cgroup holds runs together: MEMORY_NOT_HELD)

    def kill_all(self) -> None:
        if self.leader_pid is None:
            return
        self._snapshot()
        try:
            os.killpg(self.leader_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for proc in self._known.values():
            try:
                proc.kill()
            except psutil.Error:
                pass

    def close(self) -> None:
        self.kill_all()


class ProcessGroupConfinement:
    """Fallback when cgroups are not writable: process groups, the process tree and rlimits.

    The rlimits bind where the runs are not the host's root (whom they do not bind), and are set
    soft and hard (a run's root in a user namespace may not raise a hard limit):

    * ``RLIMIT_NPROC`` counts the processes of the run's uid in its user namespace (and the
      kernel holds every enclosing namespace's count to the limit its creator had). Runs in user
      namespaces of their own, one per relay (``delegate_runs_to``), get the budget's share of one
      run: each run is bounded apart. Runs that share the server's uid outside any (isolation none,
      a server that is not root) get its limit less what the budget keeps for the server: a fork
      bomb stops before the server's threads do.
    * ``RLIMIT_DATA`` (a process's heap and private writable memory; not its address space, which
      runtimes such as V8 and the JVM reserve in the gigabytes) and ``RLIMIT_FSIZE`` (one file's
      size: scratch space) at what one run may use, as under cgroups: ``max_memory_mb``, or the
      memory budget's share of one run where that is less (``max_memory_mb`` alone let one hog
      of a small host take the host's memory, and the kernel's OOM killer then chose among all
      its processes, the server's included). Per process, not per run: nothing holds a run's
      processes together, nor all runs (the budget is read and said, not enforced). The file
      size follows the same figure: a run's files are memory where they are on a tmpfs (the runs'
      tmpfs of a world, a ``/tmp`` on tmpfs) and are counted in a run's memory under cgroups, so
      one file may be as large as one run's memory and no larger.

    ``why``: why no cgroup could be had (shown by :meth:`describe`).
    """

    name = "process-group"

    def __init__(
        self,
        budget: ProcessBudget | None = None,
        memory_budget: MemoryBudget | None = None,
        max_memory_mb: int = 4096,
        why: str = "",
    ) -> None:
        self.budget = budget if budget is not None else ProcessBudget(None, 0, None, 0)
        # Read, shown, but enforced by nothing here: no cgroup to cap the runs together.
        memory_budget = memory_budget if memory_budget is not None else MemoryBudget(None, 0, None, 0)
        if memory_budget.runs_total is not None:
            memory_budget = dataclasses.replace(memory_budget, not_held=MEMORY_NOT_HELD)
        self.memory_budget = memory_budget
        self.max_memory_bytes = max_memory_mb * 1024 * 1024
        if memory_budget.runs_total is not None:
            # (Only where the host's memory was read: without it, per_run is a placeholder.)
            self.max_memory_bytes = min(self.max_memory_bytes, memory_budget.per_run)
        #: The uid runs are, where it is theirs alone.
        self._runs_uid: int | None = None
        self.why = why

    def new_jail(self) -> ProcessGroupJail:
        return ProcessGroupJail(self.rlimits())

    def delegate_runs_to(self, uid: int | None, gid: int | None) -> None:
        self._runs_uid = uid

    def rlimits(self) -> list[tuple[int, int]]:
        """``(resource, limit)`` every run gets (see the class)."""
        limits = [
            (resource.RLIMIT_DATA, self.max_memory_bytes),
            (resource.RLIMIT_FSIZE, self.max_memory_bytes),
        ]
        processes = self.process_limit()
        if processes is not None:
            limits.append((resource.RLIMIT_NPROC, processes))
        return limits

    def process_limit(self) -> int | None:
        """The ``RLIMIT_NPROC`` of runs, or ``None`` where none would bind them (the host's root)."""
        if self._runs_uid is not None:
            return self.budget.per_run
        if os.geteuid() == 0:
            return None
        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        if soft == resource.RLIM_INFINITY:
            return self.budget.runs_total
        return max(MIN_PER_RUN, soft - self.budget.server_reserve)

    def describe(self) -> str:
        processes = self.process_limit()
        whose = "each run" if self._runs_uid is not None else "this user's processes"
        bound = "nothing bounds a fork bomb of the host's root"
        if processes is not None:
            bound = f"RLIMIT_NPROC {processes} for {whose}"
        megabytes = self.max_memory_bytes // (1024 * 1024)
        per_process = f"RLIMIT_DATA and RLIMIT_FSIZE {megabytes} MiB per process"
        why = f" ({self.why})" if self.why else ""
        return f"process group per run, no cgroups{why}: {bound}; {per_process}"

    def close(self) -> None:
        return None


def create_confinement(
    mode: str,
    max_processes: int,
    max_memory_mb: int,
    budget: ProcessBudget | None = None,
    memory_budget: MemoryBudget | None = None,
) -> Confinement:
    """The confinement ``mode`` asks for. ``auto``: cgroup v1 where its controllers are writable,
    else cgroup v2 where the server's cgroup is writable and given ``pids`` and ``memory``, else
    process groups (saying why). ``cgroup``: either version, or an error saying why neither;
    ``cgroup-v2``: v2 only. ``budget`` and ``memory_budget``: how many processes and how much
    memory runs may use (by default read off this host's limits)."""
    # Here, not at the top: the v2 module builds on this one's helpers.
    from mocksandbox.execution import cgroup_v2

    if budget is None:
        budget = plan_process_budget(discover_process_limits(), max_processes)
    if memory_budget is None:
        memory_budget = plan_memory_budget(discover_memory_limits(), max_memory_mb)
    if mode == "process-group":
        return ProcessGroupConfinement(budget, memory_budget, max_memory_mb, "asked for")
    reasons: list[str] = []
    if mode != "cgroup-v2":
        if CgroupConfinement.available():
            try:
                return CgroupConfinement(max_processes, max_memory_mb, budget, memory_budget)
            except OSError as exc:
                reasons.append(f"cgroup v1: {exc}")
        else:
            reasons.append("cgroup v1: pids/memory/freezer controllers are not writable here")
    why_not_v2 = cgroup_v2.unavailable_reason()
    if why_not_v2 is None:
        try:
            return cgroup_v2.CgroupV2Confinement(max_processes, max_memory_mb, budget, memory_budget)
        except OSError as exc:
            why_not_v2 = exc.strerror or str(exc)
    reasons.append(f"cgroup v2: {why_not_v2}")
    if mode != "auto":
        raise OSError(errno.EACCES, "; ".join(reasons))
    return ProcessGroupConfinement(budget, memory_budget, max_memory_mb, "; ".join(reasons))
