"""The server's side of the launcher: start it, send it runs, restart it, and keep the relays it
forked for the next runs.

The launcher itself is the rest of this dir, run as a script by the user's interpreter (see
``__main__.py``): its modules import each other by their top-level names, and this one (which
that process never runs) imports none of them but ``_launcher_syscalls``, which imports no other.
"""

from __future__ import annotations

import array
import ctypes
import json
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mocksandbox.execution.affinity import format_cpus, program_cpus
from mocksandbox.execution.launcher._launcher_syscalls import become_subreaper

__all__ = [
    "IDLE_RELAYS",
    "LAUNCHER_DIR",
    "LAUNCHER_MAIN",
    "Launcher",
    "LauncherError",
    "become_subreaper",
    "close_quietly",
]

#: The launcher's dir, and the file the launcher is started as (``python <dir>/__main__.py``, not
#: ``python <dir>``: see ``__main__.py``).
LAUNCHER_DIR = Path(__file__).parent
LAUNCHER_MAIN = LAUNCHER_DIR / "__main__.py"
#: Idle relays kept for the next runs (about the most runs in flight at once); more are let go.
IDLE_RELAYS = 64
#: How many of the most recently idle relays a run looks through for one on its thread's core.
_SAME_CORE_LOOKS = 8


class LauncherError(RuntimeError):
    """The launcher could not be (re)started or reached."""


#: The oldest CPython the launcher runs on (its dir's modules are written for it: ruff checks them
#: against 3.8's syntax, tests run them on pyenv's 3.8 to 3.13, 3.7 was run by hand): a ``python``
#: older than this is refused by :meth:`Launcher.start`, rather than every run ending -9.
OLDEST_PYTHON = (3, 7)


#: The largest run message that carries its program's source (``request["source"]``, which the
#: relay compiles before its fork): a seqpacket message must fit the sender's socket buffer
#: (``net.core.wmem_default``, 208 KiB on most hosts), and a larger program gains little.
SOURCE_MESSAGE_LIMIT = 64 * 1024

#: Set, with ``LD_BIND_NOW``, in the environment of a launcher whose server had no ``LD_BIND_NOW``
#: of its own: the launcher takes both out of its environment before anything else (``__main__``).
BIND_NOW_MARKER = "MOCKSANDBOX_LAUNCHER_BIND_NOW"


def launcher_env(env: Mapping[str, str]) -> dict[str, str]:
    """The launcher's environment: the runs' (``env``), and ``LD_BIND_NOW`` for the dynamic
    linker, which then binds every symbol of the interpreter and its libraries at the launcher's
    start. Bound lazily, each libc function a program calls first (``setsid``, ``chroot``...)
    would be looked up again in every forked program (the launcher never calls it): its lookup
    reads pages of every library and writes a page of the interpreter's table, a copy, about 11
    page faults a run."""
    if "LD_BIND_NOW" in env:
        return dict(env)
    return {**env, "LD_BIND_NOW": "1", BIND_NOW_MARKER: "1"}


def _core_reader() -> Callable[[], int] | None:
    """``sched_getcpu``: the core the calling thread runs on (glibc reads it from the thread's
    rseq area or the vDSO, no system call), called holding the GIL; ``None`` where there is none,
    or one core only."""
    if len(os.sched_getaffinity(0)) < 2:
        return None
    try:
        function = ctypes.PyDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = []
    return function


#: The core of the calling thread (see :func:`_core_reader`), or ``None``.
_current_core = _core_reader()


def _run_message(request: Mapping[str, Any]) -> bytes:
    """A run's message: the request as JSON, without its source where the whole would not fit the
    socket's buffer (a large program compiles its file itself)."""
    message = json.dumps(request).encode()
    if len(message) > SOURCE_MESSAGE_LIMIT and request.get("source") is not None:
        message = json.dumps({**request, "source": None}).encode()
    return message


class Launcher:
    """One launcher process, restarted when it dies. Thread-safe."""

    def __init__(
        self,
        python: str,
        env: Mapping[str, str],
        world: Mapping[str, Any] | None = None,
        pin_relays: bool = True,
    ) -> None:
        self.python = python
        self.env = dict(env)
        #: Whether each relay is kept to one core (``_launcher_serve.RelayCores``), or roams.
        self.pin_relays = pin_relays
        #: Where relays keep to cores: the core of each, so that a run goes to a relay on the core
        #: of the thread that sends it (see :meth:`launch`).
        self._core_now = _current_core if pin_relays else None
        #: The world settings relays are made with (see ``world.py``); ``None``: runs share the host's.
        self.world = dict(world) if world is not None else None
        #: Called by :meth:`close` after the launcher stopped (what its relays' worlds rest on).
        self.after_close: list[Callable[[], None]] = []
        #: Called when a relay was found gone, or was let go in the middle of a run: it may have
        #: died without cleaning up after itself (killed from outside).
        self.after_relay_lost: list[Callable[[], object]] = []
        #: Called with the launcher's pid each time one has started and is ready.
        self.after_start: list[Callable[[int], None]] = []
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._idle_relays: list[socket.socket] = []
        #: Relays made with a world (PID 1 of their own PID namespace, in namespaces of their own):
        #: they serve runs that ask for one (``request["world"]``) and no others.
        self._idle_world_relays: list[socket.socket] = []
        self._world_relays: set[socket.socket] = set()
        self._relay_cores: dict[socket.socket, int] = {}  # (see _core_now)
        #: Where relays keep to cores: runs under way a core, their relays, the cores (see launch).
        self._runs_on_core: dict[int, int] = {}
        self._busy_relays: dict[socket.socket, int] = {}
        self._cores = sorted(os.sched_getaffinity(0)) if self._core_now is not None else []
        self._closed = False
        self.restarts = 0

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [self.python, str(LAUNCHER_MAIN), str(theirs.fileno())]
        pass_fds = [theirs.fileno()]
        cpus = program_cpus()
        if cpus is not None:  # a worker kept to its share: the programs get every core back
            argv.append(f"--cpus={format_cpus(cpus)}")
        if not self.pin_relays:
            argv.append("--relays-roam")
        world_read: int | None = None
        if self.world is not None:
            # On a pipe rather than the command line, which every forked program would show.
            world_read, world_write = os.pipe()
            try:
                with open(world_write, "wb") as stream:  # closes it: the launcher reads to the end
                    stream.write(json.dumps(self.world).encode())
            except BaseException:
                os.close(world_read)
                raise
            argv.append(f"--world-fd={world_read}")
            pass_fds.append(world_read)
        try:
            self._proc = subprocess.Popen(
                argv,
                pass_fds=pass_fds,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=launcher_env(self.env),
                cwd="/",
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise LauncherError(f"cannot start the launcher with {self.python}: {exc}") from exc
        finally:
            theirs.close()
            if world_read is not None:
                os.close(world_read)
        if self.world is not None and self.world.get("userns") is not None:
            self._wait_until_ready(ours)
        self._sock = ours
        for callback in self.after_start:
            callback(self._proc.pid)
        return ours

    def _wait_until_ready(self, sock: socket.socket) -> None:
        """A launcher that makes the runs' user namespace says when it is done (the runs' files may
        live in its own mount namespace: nothing may be written there before)."""
        sock.settimeout(60)
        try:
            said = sock.recv(64)
        except OSError as exc:
            said = str(exc).encode()
        finally:
            sock.settimeout(None)
        if said != b"ready":
            sock.close()
            self._discard()
            raise LauncherError(f"the launcher did not start: {said.decode(errors='replace') or 'it exited'}")

    def start(self) -> None:
        """Start the launcher now rather than on the first run (keeps the first answer fast).
        ``LauncherError`` where it cannot start: its ``python`` older than :data:`OLDEST_PYTHON`,
        or not there."""
        with self._lock:
            if self._sock is None:
                self._refuse_an_old_python()
                self._start()

    def _refuse_an_old_python(self) -> None:
        from mocksandbox.runtime.production import interpreter_version

        version = interpreter_version(self.python)
        if version is not None and version[:2] < OLDEST_PYTHON:
            oldest = ".".join(map(str, OLDEST_PYTHON))
            raise LauncherError(
                f"{self.python} is Python {'.'.join(map(str, version))}: runs need CPython {oldest} "
                "or later (the launcher that starts them runs on it): name another (--python, setting python)"
            )

    def launch(self, request: Mapping[str, Any], fds: list[int]) -> socket.socket:
        """Send one run (stdin, stdout, stderr and status descriptors attached) to an idle relay,
        or to the launcher, which forks a new relay for it. Returns the relay's socket: give it
        back with :meth:`release` once the run's status pipe is closed.

        Where relays keep to cores, the run goes to an idle relay of this thread's core if one of
        the last few idle ones is (else to the last one idle), and a relay made for it is made on
        this core: the relay, its program and, as the program's output wakes it, this thread then
        work on one core, each reading what the one before it just wrote from that core's cache
        (A/B, verl-like runs at concurrency 16: -1.4% and -1.4% of a run's CPU in the two orders,
        req/s +4%).

        Unless another core has fewer runs under way: the run goes to the one with fewest. The
        kernel moves no task it has just run to a core that falls idle, so the few runs under way
        at once (``RunGate``), sent from wherever their threads last woke, often shared one core
        while the other idled (verl's reward batch, paired A/B: -4.5% and -3% of its time)."""
        core = self._core_now() if self._core_now is not None else -1
        message = _run_message(request)
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        in_world = request.get("world") is not None
        idle = self._idle_world_relays if in_world else self._idle_relays
        while True:
            with self._lock:
                if core >= 0:
                    core = self._least_busy(core)
                relay = self._take_idle(idle, core)
                if relay is not None:
                    self._count_run(relay, self._relay_cores.get(relay, -1))
            if relay is None:
                break
            try:
                relay.sendmsg([message], ancillary)
                return relay
            except OSError:
                self._close_relay(relay)  # it died between runs (killed from outside): try another
                self._relay_lost()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with self._lock:
            if core >= 0:
                self._relay_cores[ours] = core
                self._count_run(ours, core)
            if in_world:
                self._world_relays.add(ours)
        if core >= 0:  # (the launcher makes the relay on this core; a relay has no use for it)
            message = _run_message({**request, "core": core})
        try:
            with_relay = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [*fds, theirs.fileno()]))]
            self._send_to_launcher(message, with_relay)
        except BaseException:
            self._close_relay(ours)
            raise
        finally:
            theirs.close()
        return ours

    def _take_idle(self, idle: list[socket.socket], core: int) -> socket.socket | None:
        """An idle relay for a run sent from ``core`` (-1: unknown), taken off ``idle``: one of that
        core's among the last few idle, else the last one idle; ``None`` if none is. Call it
        holding the lock."""
        if not idle:
            return None
        if core >= 0:
            for index in range(len(idle) - 1, max(-1, len(idle) - 1 - _SAME_CORE_LOOKS), -1):
                if self._relay_cores.get(idle[index]) == core:
                    return idle.pop(index)
        return idle.pop()

    def _least_busy(self, core: int) -> int:
        """The core of ours with fewest runs under way, ``core`` among equals. Call it holding the
        lock."""
        counts = self._runs_on_core
        return min(self._cores, key=lambda other: (counts.get(other, 0), other != core), default=core)

    def _count_run(self, relay: socket.socket, core: int) -> None:
        """A run under way on ``relay``, kept to ``core`` (-1: none). Call it holding the lock."""
        if core >= 0:
            self._busy_relays[relay] = core
            self._runs_on_core[core] = self._runs_on_core.get(core, 0) + 1

    def _uncount_run(self, relay: socket.socket) -> None:
        """``relay``'s run is over (or the relay is gone). Call it holding the lock."""
        core = self._busy_relays.pop(relay, None)
        if core is not None:
            self._runs_on_core[core] -= 1

    def _close_relay(self, relay: socket.socket) -> None:
        with self._lock:
            self._uncount_run(relay)
            self._world_relays.discard(relay)
            self._relay_cores.pop(relay, None)
        relay.close()

    def release(self, relay: socket.socket, reusable: bool) -> None:
        """Take back the relay of a finished run: kept for the next run when ``reusable`` (it
        reported the run's end and closed the status pipe), closed otherwise (it then leaves)."""
        with self._lock:
            self._uncount_run(relay)
            idle = self._idle_world_relays if relay in self._world_relays else self._idle_relays
            if reusable and not self._closed and len(idle) < IDLE_RELAYS:
                idle.append(relay)
                return
        self._close_relay(relay)
        if not reusable:
            self._relay_lost()

    def _relay_lost(self) -> None:
        for callback in self.after_relay_lost:
            callback()

    def _send_to_launcher(self, message: bytes, ancillary: list[tuple[int, int, array.array[int]]]) -> None:
        with self._lock:
            for attempt in range(2):
                sock = self._sock or self._start()
                try:
                    sock.sendmsg([message], ancillary)
                    return
                except (BrokenPipeError, ConnectionResetError, ConnectionRefusedError) as exc:
                    # The launcher died (killed from outside): start a new one, once. Its relays
                    # live on and keep serving.
                    self._discard()
                    self.restarts += 1
                    if attempt:
                        raise LauncherError(f"the launcher keeps dying: {exc}") from exc

    def _discard(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        """Stop the launcher and its relays (closing their sockets ends their loops; a relay
        busy with a run leaves when that run is given back)."""
        with self._lock:
            self._closed = True
            idle, self._idle_relays = self._idle_relays + self._idle_world_relays, []
            self._idle_world_relays = []
            self._world_relays.clear()
            for relay in idle:
                relay.close()
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            if self._proc is not None:
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
                self._proc = None
        for callback in self.after_close:
            callback()

    @property
    def idle_relays(self) -> int:
        """How many relays wait for a run (each one a child of the launcher)."""
        with self._lock:
            return len(self._idle_relays) + len(self._idle_world_relays)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid


def close_quietly(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
