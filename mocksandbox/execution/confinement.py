"""Confining one run: every process it starts is bounded, and all of them die when it ends.

Two implementations behind one small interface:

* :class:`CgroupConfinement` (cgroup v1 ``pids``, ``memory`` and ``freezer``): a cgroup per run caps
  its process count (a fork bomb hits ``pids.max``) and memory (a hog is OOM-killed, rc -9), and
  lets the whole tree be frozen and killed, including children that called ``setsid`` or
  double-forked. Works for root, which rlimits like ``RLIMIT_NPROC`` do not bind.
* :class:`ProcessGroupConfinement`: a fallback where cgroups are not writable. Each run has its own
  session and process group, which is killed as a group; descendants that left the group are found
  through the process tree while their parent lives. Weaker, and said so at start-up.
"""

from __future__ import annotations

import errno
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import psutil

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_CONTROLLERS = ("pids", "memory", "freezer")


class RunJail(Protocol):
    """The confinement of one run."""

    #: ``cgroup.procs`` files the run's first process writes its pid to (empty: none).
    procs_files: list[str]
    #: A ``cgroup.procs`` file holding the launcher, for it to rewrite while runs keep coming (see
    #: ``forkserver.py``: it keeps cgroup moves fast); ``None`` where runs join no cgroup.
    warm_procs_file: str | None

    def kill_all(self) -> None:
        """Kill every process of the run that is still alive and wait until they are gone."""

    def close(self) -> None:
        """Kill what is left and release the confinement. Idempotent."""


class Confinement(Protocol):
    """A factory of :class:`RunJail`, one per run."""

    name: str

    def new_jail(self) -> RunJail: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


def _write(path: Path | bytes, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> bytes:
    """A small control file's contents, with plain system calls (several per run: pathlib and io
    objects would cost more than the reads)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def _own_cgroup_path(controller: str) -> str:
    """This process's cgroup path in ``controller`` (v1), e.g. ``/`` or ``/docker/abc``."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path
    raise OSError(errno.ENOENT, f"controller {controller} not mounted")


class CgroupJail:
    """One run's cgroups (one per controller). Reused for later runs once empty (see the pool)."""

    def __init__(
        self,
        dirs: dict[str, Path],
        max_processes: int,
        max_memory_bytes: int,
        release: Callable[[CgroupJail], bool],
        warm_procs_file: str | None = None,
    ) -> None:
        self._dirs = dirs
        self.warm_procs_file = warm_procs_file
        self._release = release
        self._closed = False
        for directory in dirs.values():
            directory.mkdir()
        _write(dirs["pids"] / "pids.max", str(max_processes))
        _write(dirs["memory"] / "memory.limit_in_bytes", str(max_memory_bytes))
        memsw = dirs["memory"] / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            try:
                _write(memsw, str(max_memory_bytes))
            except OSError:
                pass  # swap accounting off: the plain memory limit still holds
        self.procs_files = [str(d / "cgroup.procs") for d in dirs.values()]
        self._freezer_procs = str(dirs["freezer"] / "cgroup.procs")
        self._pids_current = str(dirs["pids"] / "pids.current")

    def reopen(self) -> CgroupJail:
        self._closed = False
        return self

    def _pids(self) -> list[int]:
        try:
            text = _read(self._freezer_procs)
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def kill_all(self) -> None:
        freezer = self._dirs["freezer"] / "freezer.state"
        deadline = time.monotonic() + 10.0
        while self._pids() and time.monotonic() < deadline:
            # Freeze first so that nothing can fork while we kill: a fork bomb cannot outrun us.
            try:
                _write(freezer, "FROZEN")
                freeze_deadline = time.monotonic() + 1.0
                while freezer.read_text().strip() != "FROZEN" and time.monotonic() < freeze_deadline:
                    time.sleep(0.001)
            except OSError:
                pass
            for pid in self._pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                _write(freezer, "THAWED")
            except OSError:
                pass
            # Killed processes leave the cgroup as soon as they are thawed and die.
            settle = time.monotonic() + 1.0
            while self._pids() and time.monotonic() < settle:
                time.sleep(0.001)

    def close(self) -> None:
        if self._closed:
            return
        self.kill_all()
        self._closed = True
        if self._is_clean() and self._release(self):
            return  # back in the pool, empty, for the next run
        self.remove()

    def _is_clean(self) -> bool:
        """No task left, and none still charged: dead but unreaped tasks (a fork bomb's zombies)
        still count against pids.max, which would starve the next run."""
        try:
            charged = int(_read(self._pids_current))
        except (OSError, ValueError):
            return False
        return charged == 0 and not self._pids()

    def remove(self) -> None:
        """Delete the groups (waiting briefly for dying tasks to leave)."""
        for directory in self._dirs.values():
            for _ in range(100):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)  # a dying task can keep the group busy for a moment


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


def _remove_stale_parents(home: Path) -> None:
    """Remove the cgroups of mocksandbox servers that died without cleaning up (e.g. SIGKILL)."""
    for parent in home.glob("mocksandbox-*"):
        pid_text = parent.name.removeprefix("mocksandbox-").split("-", 1)[0]
        if pid_text.isdigit() and not psutil.pid_exists(int(pid_text)):
            _remove_dir_tree(parent)


class CgroupConfinement:
    """A cgroup per run under ``<own cgroup>/mocksandbox-<pid>-<instance>`` in each v1 controller."""

    name = "cgroup"

    def __init__(self, max_processes: int, max_memory_mb: int) -> None:
        self.max_processes = max_processes
        self.max_memory_bytes = max_memory_mb * 1024 * 1024
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._idle: list[CgroupJail] = []
        self._closing = False
        self._parents: dict[str, Path] = {}
        # Several sandboxes may live in one process (tests, fixtures): each gets its own groups.
        self._instance = next(_INSTANCES)
        for controller in _CONTROLLERS:
            home = _CGROUP_ROOT / controller / _own_cgroup_path(controller).lstrip("/")
            _remove_stale_parents(home)
            parent = home / f"mocksandbox-{os.getpid()}-{self._instance}"
            parent.mkdir(exist_ok=True)
            self._parents[controller] = parent
        # The launcher is our child, so it sits in our own pids cgroup: rewriting its pid there
        # moves nothing but takes the lock that moves take (see forkserver.py).
        own_pids_cgroup = _CGROUP_ROOT / "pids" / _own_cgroup_path("pids").lstrip("/")
        self._warm_procs_file = str(own_pids_cgroup / "cgroup.procs")
        # Prove that a child group can be made, configured and removed before claiming to work.
        self.new_jail().remove()

    @classmethod
    def available(cls) -> bool:
        """Whether the v1 controllers are mounted and writable here."""
        try:
            return all(
                os.access(_CGROUP_ROOT / c / _own_cgroup_path(c).lstrip("/"), os.W_OK) for c in _CONTROLLERS
            )
        except OSError:
            return False

    def new_jail(self) -> CgroupJail:
        with self._lock:
            if self._idle:
                return self._idle.pop().reopen()
            run = f"run-{next(self._counter)}"
        dirs = {c: self._parents[c] / run for c in _CONTROLLERS}
        return CgroupJail(
            dirs, self.max_processes, self.max_memory_bytes, self._take_back, self._warm_procs_file
        )

    def _take_back(self, jail: CgroupJail) -> bool:
        """Keep an emptied jail for reuse: making and removing three cgroups per run costs more
        than the run's own bookkeeping."""
        with self._lock:
            if self._closing or len(self._idle) >= _IDLE_JAILS:
                return False
            self._idle.append(jail)
            return True

    def describe(self) -> str:
        return (
            f"cgroup v1 per run (pids.max={self.max_processes}, "
            f"memory={self.max_memory_bytes // (1024 * 1024)} MiB, freezer kill)"
        )

    def close(self) -> None:
        with self._lock:
            self._closing = True
            idle, self._idle = self._idle, []
        for jail in idle:
            jail.remove()
        for parent in self._parents.values():
            _remove_dir_tree(parent)


class ProcessGroupJail:
    """Kills the run's session/process group and every descendant still reachable."""

    def __init__(self) -> None:
        self.leader_pid: int | None = None
        self.procs_files: list[str] = []
        self.warm_procs_file: str | None = None
        self._known: dict[int, psutil.Process] = {}

    def attach(self, pid: int) -> None:
        self.leader_pid = pid

    def _snapshot(self) -> None:
        if self.leader_pid is None:
            return
        try:
            leader = psutil.Process(self.leader_pid)
            for proc in [leader, *leader.children(recursive=True)]:
                self._known.setdefault(proc.pid, proc)
        except psutil.Error:
            pass

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
    """Fallback when cgroups are not writable: process groups, the process tree and rlimits."""

    name = "process-group"

    def new_jail(self) -> ProcessGroupJail:
        return ProcessGroupJail()

    def describe(self) -> str:
        return "process group per run (no cgroups: fork bombs and memory are bounded only by rlimits)"

    def close(self) -> None:
        return None


def create_confinement(mode: str, max_processes: int, max_memory_mb: int) -> Confinement:
    """The confinement ``mode`` asks for; ``auto`` takes cgroups when this host allows them."""
    if mode in ("auto", "cgroup"):
        if CgroupConfinement.available():
            try:
                return CgroupConfinement(max_processes, max_memory_mb)
            except OSError:
                if mode == "cgroup":
                    raise
        elif mode == "cgroup":
            raise OSError(errno.EACCES, "cgroup v1 pids/memory/freezer controllers are not writable here")
    return ProcessGroupConfinement()
