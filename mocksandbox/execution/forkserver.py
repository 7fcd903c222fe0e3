"""The launcher: a small, single-threaded process that forks every run for the server.

Started once per engine as ``<python> forkserver.py <socket fd>`` (standard library only, so any
interpreter can run it, with nothing of the user's imported). It forks *relays*; a relay forks
one *program* per run, in a new session, made the OOM killer's first choice and moved into the
run's cgroups, waits for it and reports its wait status. A relay serves one run at a time and many
runs in its life: the server keeps the idle ones and sends a run straight to one of them, so a run
costs one fork and no hop through the launcher; only when no relay is idle does the server send
the run to the launcher, which forks a new relay for it. Two modes of program:

``exec``    the program ``execve``s ``/bin/bash -c <command>`` (every language; the plain spawn);
``python``  the program is this warm interpreter itself, turned into ``python <file>``: fresh
            module table, argv, cwd, environment, stdio, ``__main__``, exit handling. It skips
            the interpreter's start-up (tens of milliseconds) for a fork (well under one).

Protocol, on SOCK_SEQPACKET sockets: one message per run, a JSON object with the run's four file
descriptors attached (stdin, stdout, stderr, status). Sent to the launcher, a fifth descriptor
rides along: the socket on which the new relay will take its later runs. On the status pipe the
relay writes ``b"P"`` + the program's pid (8 bytes) once it is started, then ``b"S"`` + its wait
status (8 bytes, signed) when it has exited, and closes the pipe: the relay is then ready for its
next run. A relay that dies first (a program killed its parent) closes the pipe without the ``S``
record; the server then drops it. A run that could not be started (no process slot or memory left
for the relay or the program, a cgroup that cannot be joined) gets ``b"E"`` + the errno (8 bytes)
instead: the server retries it or reports why, but never as a program's exit.

The launcher is the *child subreaper* of everything it starts, with ``SIGCHLD`` ignored: a
program's orphans (a fork bomb's, once their parents are killed) are handed to it and the kernel
reaps them the moment they die. Otherwise they would go to the machine's init, which may take its
time, and until then every zombie still counts against the ``pids.max`` of the run's cgroup and of
every cgroup above it, the server's own included.

With ``--world-fd=<fd>`` (its JSON on that pipe; isolation lite, see ``world.py``), a run whose
request carries ``world`` (its layers) is sent to a relay that lives in namespaces of its own, as
PID 1 of its own PID namespace: the relay mounts the run's overlay root before the fork and the
program enters it (see "a run's world" below). Such relays serve only such runs; the others go to
plain relays.

Why separate processes: the server is multi-threaded and large; forking it per run is slow and
unsafe, and a program that kills its parent must not kill the server, nor the launcher: it kills
its relay only, and that run alone reports -9.
"""

import sys

# Captured first: the modules a fresh `python <file>` has too. Everything imported after this
# line belongs to the launcher and is dropped from the program's module table.
_BASELINE_MODULES = frozenset(sys.modules)

# The per-run paths call ``_signal`` directly: ``signal``'s wrappers turn every old handler and
# every signal of an old mask into enum members, which costs a forked child more than the call.
import _signal  # noqa: E402
import _socket  # noqa: E402
import atexit  # noqa: E402 - kept: a program's exit runs it without importing it again
import binascii  # noqa: E402
import fcntl as _fcntl  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

try:  # for the thread stacks of memory-limited programs (see _ThreadStackDefault)
    import ctypes
except ImportError:  # an interpreter built without libffi
    ctypes = None

#: The cores programs get back when the server keeps the launcher to a share of them (--cpus=,
#: ``0,1,3``; see ``mocksandbox/execution/affinity.py``), else ``None``: programs inherit ours.
_PROGRAM_CPUS = None
_STATUS_PID = b"P"
_STATUS_EXIT = b"S"
_STATUS_LAUNCH_ERROR = b"E"
#: The relay ended the run itself (its socket with the server woke it, or read as closed), with
#: the signal that woke it (0: the closed socket): said before the relay leaves.
_STATUS_ENDED_BY_RELAY = b"K"
#: The status pipe of the run this relay is watching (for _end_the_run), while it watches.
_WATCHED_STATUS_FD: "int | None" = None
#: This relay's socket with the server (for _end_the_run), once it is a relay.
_RELAY_SOCKET: "_socket.socket | None" = None
#: That socket's flags with and without ``O_ASYNC``, once its owner is set (one socket a relay).
_RELAY_SOCKET_FLAGS: "tuple | None" = None
#: The program a relay on the host is watching (for _end_the_run): from its fork until its
#: relay reaps it, while its pid can be no other process's.
_WATCHED_PID: "int | None" = None
_PR_SET_CHILD_SUBREAPER = 36
_MAX_FDS = 65536
#: Dispositions the launcher changes (or CPython set at start-up) that a new program must not
#: inherit: ignored signals stay ignored across exec.
_RESET_FOR_EXEC = (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ)
_ALL_SIGNALS = signal.valid_signals()
#: Keeping cgroup moves fast (see ``_CgroupLockWarmer``): how long after a run, and how often.
_WARM_FOR_S = 10.0
_WARM_EVERY_S = 0.02


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[written:]


def _join_cgroups(procs_files: list) -> None:
    pid = str(os.getpid()).encode()
    for path in procs_files:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)


def _prefer_for_oom_kill() -> None:
    """Make this program and everything it starts (they inherit it, across exec too) the kernel
    OOM killer's first choice wherever memory runs out: in the machine, in a
    container's cgroup, in the runs' own. A run's processes go before the server, its launcher or
    a Jupyter kernel, even where no cgroup caps the runs' memory (process-group confinement). One
    small write; lowering the score needs privileges, raising it does not."""
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, b"1000")
        finally:
            os.close(fd)
    except OSError:
        pass  # no /proc here: the cgroups' limits still hold


def _apply_memory_limit(megabytes: int) -> None:
    """SandboxFusion's limit: soft RLIMIT_AS, RLIMIT_DATA and RLIMIT_STACK of N MiB (within the
    hard limits the run's confinement set)."""
    if megabytes > 0:
        limit = megabytes * 1024 * 1024
        for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA, resource.RLIMIT_STACK):
            hard = resource.getrlimit(which)[1]
            resource.setrlimit(which, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def _apply_rlimits(limits: list) -> None:
    """The run's confinement's rlimits (``[resource, limit]``), soft and hard alike."""
    for which, limit in limits:
        resource.setrlimit(which, (limit, limit))


class _ThreadStackDefault:
    """The default stack size of new threads that forked programs inherit from the launcher.

    glibc reads RLIMIT_STACK once, at a program's start, as the default stack size of new threads.
    Under SandboxFusion's ``memory_limit_MB`` (soft RLIMIT_STACK = RLIMIT_AS = N MiB) every new
    thread then asks for an N MiB stack inside an N MiB address space, so none can start ("can't
    start new thread"). A forked interpreter would keep the launcher's default instead, so before
    forking a memory-limited Python run the relay sets its own default (it starts no threads
    itself) to what glibc would have derived, and puts its own back for the next unlimited run.
    Done here rather than in the program: ctypes calls in a fresh fork cost about 1.5 ms of page
    faults, in the relay a few microseconds. glibc only (``pthread_setattr_default_np``);
    elsewhere this does nothing.
    """

    _ATTR_BYTES = 256  # a pthread_attr_t: 56 bytes on x86-64 glibc
    _PTHREAD_STACK_MIN = 16384

    def __init__(self) -> None:
        self._functions = None
        self._own = self._current = 0
        if ctypes is None:
            return
        try:
            libc = ctypes.CDLL(None)
            self._functions = (
                libc.pthread_attr_init,
                libc.pthread_attr_destroy,
                libc.pthread_attr_setstacksize,
                libc.pthread_attr_getstacksize,
                libc.pthread_getattr_default_np,
                libc.pthread_setattr_default_np,
            )
        except (OSError, AttributeError):
            return
        self._functions[2].argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        attr = ctypes.create_string_buffer(self._ATTR_BYTES)
        size = ctypes.c_size_t()
        if self._functions[4](attr) == 0:
            self._functions[3](attr, ctypes.byref(size))
            self._functions[1](attr)
        self._own = self._current = size.value

    def prepare(self, request: dict) -> None:
        """Set the default that the program of ``request`` must start with."""
        if self._functions is None or not self._own:
            return
        limit_mb = request.get("memory_limit_mb", -1) if request.get("mode") == "python" else -1
        if limit_mb > 0:
            page = os.sysconf("SC_PAGE_SIZE")
            wanted = -(-max(limit_mb * 1024 * 1024, self._PTHREAD_STACK_MIN) // page) * page
        else:
            wanted = self._own
        if wanted == self._current:
            return
        attr_init, attr_destroy, attr_setstacksize, _, _, setattr_default = self._functions
        attr = ctypes.create_string_buffer(self._ATTR_BYTES)
        if attr_init(attr) == 0:
            try:
                if attr_setstacksize(attr, wanted) == 0 and setattr_default(attr) == 0:
                    self._current = wanted
            finally:
                attr_destroy(attr)


class _RecursionDepth:
    """Where a forked program's recursion starts: at its ``<module>``, as in a fresh ``python <file>``.

    A forked program runs below the launcher's own frames (its loop, the relay's, the start of the
    run: eight on CPython 3.10), and the interpreter counts them against the recursion limit: a
    program that recursed 998 deep under SandboxFusion got a RecursionError here, and the one that
    hit the limit printed ``[Previous line repeated 988 more times]`` where SandboxFusion's printed
    996. The count is a field of the thread state (``recursion_depth`` on 3.10, counting up;
    ``recursion_remaining`` and ``py_recursion_remaining`` after it, counting down), with no API to
    set it: ctypes finds it once, here in the launcher, as the one int of the thread state that a
    call moves by one, and measures what ``exec`` adds. While the program runs, the count is shifted
    by the depth of the launcher's frames, and put back after; ``sys.getrecursionlimit()`` and the
    limit itself stay the program's. Where the field cannot be found (no ctypes, another layout)
    nothing is shifted, as before.
    """

    def __init__(self) -> None:
        self.field = None
        self.exec_adds = 0
        self.at_module = 0
        if ctypes is None:
            return
        try:
            get_state = ctypes.pythonapi.PyThreadState_Get
            get_state.restype = ctypes.c_void_p
            state = get_state()
            ints = [ctypes.c_int.from_address(state + offset) for offset in range(16, 64, 4)]
        except (AttributeError, OSError, TypeError, ValueError):
            return
        # The field moves by one per call, and by two per two calls.
        here = [field.value for field in ints]
        one = _values_one_call_down(ints)
        two = _values_two_calls_down(ints)
        moving = [
            field
            for field, a, b, c in zip(ints, here, one, two, strict=True)
            if b - a in (1, -1) and c - a == 2 * (b - a)
        ]
        if len(moving) == 1:
            self.field = moving[0]

    def read(self) -> int:
        """The count, as a call of this method sees it (0 where it was not found)."""
        return self.field.value if self.field is not None else 0

    def measure(self, at_module: int) -> None:
        """``at_module``: :meth:`read` called at the launcher's module level, the depth of a fresh
        ``python <file>``'s ``<module>``: what a program's must see. Measures here what ``exec``
        adds, called as ``_run_main`` calls it."""
        if self.field is None:
            return
        self.at_module = at_module
        seen = []
        code = compile("seen.append(depth.read())", "<mocksandbox-depth>", "exec", dont_inherit=True)
        before = self.read()
        exec(code, {"seen": seen, "depth": self})
        self.exec_adds = seen[0] - before

    def shift_for_program(self, before: int) -> int:
        """Shift the count so that the ``<module>`` that ``exec`` runs next sees ``at_module``;
        ``before`` is :meth:`read` called from the frame that calls ``exec``. The shift, for
        :meth:`unshift`."""
        if self.field is None:
            return 0
        shift = self.at_module - self.exec_adds - before
        self.field.value += shift
        return shift

    def unshift(self, shift: int) -> None:
        if shift:
            self.field.value -= shift


def _values_one_call_down(ints: list) -> list:
    return [field.value for field in ints]


def _values_two_calls_down(ints: list) -> list:
    return _values_one_call_down(ints)


def _install_stdio(fds: list) -> None:
    for target, fd in enumerate(fds):
        if fd != target:
            os.dup2(fd, target)
    os.closerange(3, _MAX_FDS)


def _relay(sock: _socket.socket, request: dict, fds: list, ran_fd: int) -> None:
    """A relay's life: the run it was forked for, then each run the server sends on ``sock``, one
    at a time, until the server closes it; never returns."""
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # the launcher ignores it; we must wait
    global _RELAY_SOCKET
    _RELAY_SOCKET = sock
    _signal.signal(_signal.SIGIO, _end_the_run)  # (a world's relay sets it again, as its PID 1)
    if _WORLD_CONFIG is not None and request.get("world") is not None:
        global _WORLD
        try:
            _WORLD = _World(_WORLD_CONFIG, _SYSCALLS)
        except OSError as exc:
            # No world, no runs: this one is told why (on its stderr) and the relay leaves.
            try:
                os.write(fds[2], f"mocksandbox launcher: cannot make the run's world: {exc}\n".encode())
            finally:
                _report_launch_error(fds[3], exc.errno)
                os._exit(0)
    while True:
        _relay_one_run(request, fds, sock)
        try:  # "a run just happened": the launcher keeps the cgroup lock warm (_CgroupLockWarmer)
            os.write(ran_fd, b".")
        except OSError:
            pass  # full (the launcher will wake anyway) or the launcher is gone
        while True:
            try:
                received = _receive(sock, _RUN_FDS)
            except OSError:
                received = None
            if received is None:
                if _WORLD is not None:
                    _WORLD.drop_kept()  # (its upper layer is on the runs' tmpfs, which outlives us)
                os._exit(0)  # the server closed our socket: it will send no more runs
            request, fds = received
            if request is not None:
                break


def _relay_one_run(request: dict, fds: list, sock: _socket.socket) -> None:
    """Start the run's program, report its pid and, once it has exited, its wait status."""
    status_fd = fds[3]
    world = request.get("world")
    try:
        if world is not None:
            if _WORLD is None:
                raise OSError(95, "this launcher makes no worlds")  # EOPNOTSUPP
            _WORLD.mount_run(world, request["cwd"])
            if _WORLD.kernel_reaps:  # this run's children: ours to wait for
                _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
                _WORLD.kernel_reaps = False
        _THREAD_STACKS.prepare(request)
        if _SYSCALLS is not None:  # (an exec'ed program gets its command line from execve)
            _SYSCALLS.prepare_command_line(
                ["python", request["file"]] if request["mode"] == "python" else None
            )
        pid = os.fork()
    except Exception as exc:  # EAGAIN: the host's or the server's process budget is spent
        if not isinstance(exc, OSError):
            _say_fault("before its fork", exc)
        if world is not None:
            try:  # why, first: the server reads it once the failure is reported
                os.write(fds[2], f"mocksandbox launcher: cannot make the run's world: {exc}\n".encode())
            except OSError:
                pass
            if _WORLD is not None:
                _WORLD.unmount_run()
        _report_launch_error(status_fd, getattr(exc, "errno", None))
        _close_all(fds)
        return
    if pid == 0:
        _start_program(request, fds)
    _close_all(fds[:3])
    global _WATCHED_STATUS_FD
    _WATCHED_STATUS_FD = status_fd
    nothing_left = False
    try:
        _write_all(status_fd, _STATUS_PID + pid.to_bytes(8, "little"))
        status = _WORLD.wait_for_program(pid, sock) if world is not None else _wait_for_on_host(pid, sock)
        try:
            if world is not None:
                _end_what_the_program_left(world)
                nothing_left = True
        except Exception as exc:  # (how the program ended is known: it is said all the same)
            _say_fault("after its program ended", exc)
        _write_all(status_fd, _STATUS_EXIT + status.to_bytes(8, "little", signed=True))
        kept = _WORLD.kept if world is not None else None
        if nothing_left and kept is not None and kept.cwd is not None:
            # Its dir goes once the exit is said (its time is not the run's: a program that left
            # many files does not go past its deadline for it) and before the status pipe closes,
            # which the server waits for (it then finds the dir gone: it reuses no dir of a kept
            # root), and before this relay takes another run into this root.
            kept.run_dir_gone = kept.remove_run_dir(request.get("file"))
    except OSError:
        pass  # the server gave up on this run (it closed its end): nobody to tell
    finally:
        _WATCHED_STATUS_FD = None
        if world is not None and not nothing_left:
            _WORLD.reap()
        os.close(status_fd)
        if world is not None:
            _WORLD.unmount_run()  # (the next run of this relay waits for it)
            # (Where some of the run's processes may live on, what they may yet make is not
            # counted now: a new namespace all the same.)
            if not nothing_left or _WORLD.ipc_left():
                try:
                    _WORLD.renew_ipc()  # (here, after the answer, rather than before the next run)
                except OSError:
                    pass  # tried again before the next run, which fails if it fails again


def _end_what_the_program_left(world: dict) -> None:
    """Once a world's program has exited: what it left is killed, and its root unmounted where
    that must come before the answer."""
    if _WORLD.anything_left():
        # Nothing the program started outlives it (as its cgroup's kill would see to, where
        # there is one): this relay is PID 1 of the run's namespace, -1 is all the rest of it.
        try:
            os.kill(-1, _signal.SIGKILL)
        except OSError:
            pass  # nothing left
        # Once they are gone, the run's files change no more: the server, told the run is
        # over when the status pipe closes, reads them and removes them at once.
        _WORLD.reap(until_gone=True)
    if _WORLD.kept is not None and _WORLD.kept.cwd is not None:
        return  # (its dir goes once the exit is said; its root is checked after the answer)
    # The run's root is unmounted once the answer is on its way, where nothing needs it
    # sooner: a later command of the request stacks its layer over this one's (which must not
    # be an upper layer then), and the space the run's files took on the runs' tmpfs comes
    # back only when they are unmounted (a run that filled it must not cost the next request
    # an ENOSPC).
    if not (world.get("last") and _WORLD.space_to_spare(world["upper"])):
        _WORLD.unmount_run()


def _say_fault(when: str, exc: BaseException) -> None:
    """A fault of the relay itself (not of a run's program), said on its stderr: the server's."""
    try:
        os.write(2, f"mocksandbox relay {os.getpid()}: a fault {when}: {exc!r}\n".encode())
    except OSError:
        pass


def _wait_for_on_host(pid: int, sock: _socket.socket) -> int:
    """The wait status of our child ``pid`` (a run on the host), once what it left in its process
    group is killed, watching our socket meanwhile: if the server lets the run go (its deadline
    passed before it knew the program's pid, so it could kill neither by pid nor, where the
    program had not joined it yet, by cgroup), its end closes and the program's group is killed
    here (see _end_the_run).

    The group is killed while the program is a zombie not yet reaped: until then its pid, which
    is its group's id, cannot go to another process. Once reaped, a kill of the group by that id
    (as the server's process-group jail would make) could reach whoever took the number,
    anywhere on the host; so the pid is forgotten before the reap."""
    global _WATCHED_PID
    _WATCHED_PID = pid
    try:
        if _watch_server(sock):
            _say_ended_by_relay(0)
            _kill_host_program(pid)  # the server left before we watched
        while True:
            try:
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                return 255 << 8
        try:
            os.killpg(pid, _signal.SIGKILL)
        except OSError:
            pass  # (only the zombie was left: nothing to kill)
        _WATCHED_PID = None  # (before the reap: a SIGIO from here on must not kill by this pid)
        while True:
            try:
                return os.waitpid(pid, 0)[1]
            except InterruptedError:
                continue
            except ChildProcessError:
                return 255 << 8
    finally:
        _WATCHED_PID = None
        _unwatch_server(sock)


def _kill_host_program(pid: int) -> None:
    """Kill our unreaped child ``pid`` and its process group (it may not have made one yet)."""
    for kill in (os.kill, os.killpg):
        try:
            kill(pid, _signal.SIGKILL)
        except OSError:
            pass


def _start_program(request: dict, fds: list) -> None:
    """In the forked program: its own session, the run's cgroups and stdio, then the program
    itself (``execve``, or this interpreter turned into ``python <file>``); never returns."""
    status_fd = fds[3]
    try:
        if _PROGRAM_CPUS is not None:
            os.sched_setaffinity(0, _PROGRAM_CPUS)
        os.setsid()
        if request.get("world") is None or not _WORLD.users:  # (else its relay's, inherited)
            _prefer_for_oom_kill()
        # Joined here, by the program, rather than by the relay: the relay stays outside the run's
        # groups and can serve the next run. Nothing runs in the program before this line.
        _join_cgroups(request["cgroup_procs"])
        _apply_rlimits(request.get("rlimits", ()))
        if request.get("world") is not None:
            _WORLD.enter(request["cwd"])
        else:
            _signal.signal(_signal.SIGIO, _signal.SIG_DFL)  # the relay's, not the program's
            if _SYSCALLS is not None:
                _SYSCALLS.set_command_line()  # where this program may (root): as in a world
    except BaseException as exc:
        # The run never started: why on the run's stderr, then said on the status pipe.
        try:
            os.write(fds[2], f"mocksandbox launcher: cannot start the run: {exc}\n".encode())
        finally:
            _report_launch_error(status_fd, getattr(exc, "errno", None))
            os._exit(0)
    try:
        os.close(status_fd)
        _install_stdio(fds[:3])
        if request["mode"] == "python":
            _become_python_program(request)
        # A new program starts with default dispositions and nothing blocked.
        for sig in _RESET_FOR_EXEC:
            _signal.signal(sig, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
        _apply_memory_limit(request.get("memory_limit_mb", -1))
        os.chdir(request["cwd"])
        # No "env": the launcher's own environment, which the server found equal to the run's.
        env = request["env"] if request["env"] is not None else os.environ
        os.execve(request["argv"][0], request["argv"], env)
    except BaseException as exc:
        try:
            os.write(2, f"mocksandbox launcher: cannot start the program: {exc}\n".encode())
        finally:
            os._exit(127)


def _close_all(fds: list) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _receive(sock: _socket.socket, fd_count: int) -> tuple | None:
    """The next message on ``sock``: ``(request, fds)``, ``(None, [])`` for one that was not a
    run (reported on its status pipe where it had one), or ``None`` once the peer has closed."""
    data, ancillary, _, _ = sock.recvmsg(1 << 20, _socket.CMSG_SPACE(fd_count * 4))
    if not data:
        return None
    fds = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, len(payload), 4)]
    try:
        request = json.loads(data)
        if len(fds) != fd_count:
            raise ValueError(f"expected {fd_count} descriptors, got {len(fds)}")
    except Exception as exc:
        if len(fds) >= _RUN_FDS:
            _report_launch_error(fds[3], getattr(exc, "errno", None))
        _close_all(fds)
        return None, []
    return request, fds


def _read_all(fd: int) -> bytes:
    """Everything on ``fd`` (until its writer closed it, or the file's end), read with plain system
    calls (no io objects to build in a program); closes it."""
    chunks = []
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _report_launch_error(status_fd: int, error: int | None) -> None:
    try:
        _write_all(status_fd, _STATUS_LAUNCH_ERROR + (error or 0).to_bytes(8, "little", signed=True))
    except OSError:
        pass


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux ``PR_SET_CHILD_SUBREAPER``):
    a process whose parent dies is handed to it, not to the host's init. False where the kernel
    or libc refuses."""
    if ctypes is None:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# -- a run's world (isolation "lite"; see mocksandbox/execution/world.py) ----------------------------
#
# Made of system calls, never of helper programs (unshare(1), mount(8) and ip(8) cost milliseconds
# a run). What lasts is made once per relay: the launcher forks each relay as the first process
# (PID 1) of a new PID namespace, and the relay enters new mount, network, IPC and UTS namespaces of
# its own, mounts its /proc, hardens it, and builds the read-only pieces every run shares (a mask
# layer, a read-only /sys, a /dev). What is fresh is made per run: an overlay whose upper layer
# the server made for this request, and the program chroot'ed into it with a reduced capability set.

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MS_SLAVE = 1 << 19
_MNT_DETACH = 2
# What is left in an IPC namespace (see _World.ipc_left): the INFO commands of shmctl, semctl, msgctl.
_SHM_INFO = 14
_SEM_INFO = 19
_MSG_INFO = 12
# inotify: a kept root's changes (see _KeptRoot). Every change of a dir's entries or of an inode's
# attributes (mode, owner, times set, extended attributes) or contents; not reads, opens or closes.
_IN_CHANGES = 0x2 | 0x4 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
# The new mount API (the same numbers on every architecture): idmapped mounts.
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 4
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_IDMAP = 0x100000
_PR_CAPBSET_DROP = 24
_PR_SET_SECCOMP = 22
_PR_SET_DUMPABLE = 4
_PR_SET_MM = 35
_PR_SET_MM_MAP = 14
_SECCOMP_MODE_FILTER = 2
_CAP_LAST = 63
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 1
#: The devices a run's /dev holds (name, major, minor): the harmless character devices.
_DEVICES = (
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
)
_DEV_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
)

#: Top-level dirs that a run of an unprivileged server finds empty, as in a fresh container (see
#: ``_World._host_tops``), but for what it must see there (``_World.shown``).
_FRESH_TOPS = ("tmp", "run")

#: The launcher's world settings (``--world``), or ``None``: runs share the host's (isolation none).
_WORLD_CONFIG = None
#: Set in each relay that entered its world.
_WORLD = None


class _Syscalls:
    """The libc calls the world needs, bound once in the launcher (forked relays share them)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.libc = libc
        text = ctypes.c_char_p
        libc.mount.argtypes = (text, text, text, ctypes.c_ulong, text)
        libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
        libc.unshare.argtypes = (ctypes.c_int,)
        libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
        libc.inotify_add_watch.argtypes = (ctypes.c_int, text, ctypes.c_uint32)

        class _CapHeader(ctypes.Structure):
            _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))

        class _CapData(ctypes.Structure):
            _fields_ = (
                ("effective", ctypes.c_uint32),
                ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32),
            )

        self._ipc_info = (ctypes.c_int * 32)()  # (any of the three INFO structs, read as ints)
        self._mm_map = None
        self._layout: list = []
        self._layout_of = 0
        libc.sbrk.restype = ctypes.c_void_p
        self._cap_header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        self._cap_data = (_CapData * 2)()
        self._capset = libc.capset
        self._capset_args = (ctypes.byref(self._cap_header), self._cap_data)

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"{what}: {os.strerror(error)}")

    def unshare(self, flags: int) -> None:
        self._check(self.libc.unshare(flags), "unshare")

    def setns(self, fd: int, kind: int) -> None:
        self._check(self.libc.setns(fd, kind), "setns")

    def mount(self, source, target: str, fstype, flags: int, data=None) -> None:
        encoded = (source and source.encode(), target.encode(), fstype and fstype.encode())
        if self.libc.mount(*encoded, flags, data and data.encode()) != 0:
            self._check(-1, f"mount {fstype or source} on {target}")  # (its words only if it failed)

    def umount(self, target: str) -> None:
        if self.libc.umount2(target.encode(), _MNT_DETACH) != 0:
            self._check(-1, f"umount {target}")

    def sysv_ipc_objects(self) -> int:
        """How many SysV shared memory segments, semaphore sets and message queues this process's
        IPC namespace holds (``struct shm_info``'s ``used_ids``, ``struct seminfo``'s ``semusz``,
        ``struct msginfo``'s ``msgpool``)."""
        info, libc = self._ipc_info, self.libc
        if libc.shmctl(0, _SHM_INFO, info) < 0:
            self._check(-1, "shmctl SHM_INFO")
        count = info[0]
        if libc.semctl(0, 0, _SEM_INFO, info) < 0:
            self._check(-1, "semctl SEM_INFO")
        count += info[7]
        if libc.msgctl(0, _MSG_INFO, info) < 0:
            self._check(-1, "msgctl MSG_INFO")
        return count + info[0]

    def watch_changes(self, dirs: list) -> int:
        """An inotify descriptor (non-blocking) that has an event once anything in ``dirs``, or
        any of them, changes (:data:`_IN_CHANGES`)."""
        fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)  # (IN_NONBLOCK, IN_CLOEXEC)
        if fd < 0:
            self._check(-1, "inotify_init1")
        try:
            for path in dirs:
                mask = _IN_CHANGES | _IN_ONLYDIR | _IN_DONT_FOLLOW
                if self.libc.inotify_add_watch(fd, path.encode(), mask) < 0:
                    self._check(-1, f"inotify_add_watch {path}")
        except OSError:
            os.close(fd)
            raise
        return fd

    def idmapped_clone(self, source: str, target: str, userns_fd: int, read_only: bool) -> None:
        """Mount a copy of the mount at ``source`` (not its submounts) on ``target``, its owners
        shifted by the user namespace ``userns_fd``'s map: a file the host's uid 0 owns is owned
        by that namespace's root there, and what its root writes is stored as the host's uid 0."""
        syscall = self.libc.syscall
        syscall.restype = ctypes.c_long
        fd = syscall(_SYS_OPEN_TREE, _AT_FDCWD, source.encode(), _OPEN_TREE_CLONE | os.O_CLOEXEC)
        if fd < 0:
            self._check(-1, f"open_tree {source}")
        try:
            flags = _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
            flags |= _MOUNT_ATTR_RDONLY if read_only else 0
            attr = ctypes.create_string_buffer(
                b"".join(v.to_bytes(8, sys.byteorder) for v in (flags, 0, 0, userns_fd)), 32
            )
            result = syscall(_SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH, attr, ctypes.c_size_t(32))
            self._check(0 if result == 0 else -1, f"an idmapped mount of {source}")
            result = syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, target.encode(), _MOVE_MOUNT_F_EMPTY_PATH)
            self._check(0 if result == 0 else -1, f"move_mount {source} to {target}")
        finally:
            os.close(fd)

    def drop_bounding_set(self, keep: set) -> None:
        for cap in range(_CAP_LAST + 1):
            dropped = cap in keep or self.libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0
            if not dropped and ctypes.get_errno() == 22:  # EINVAL: past the kernel's last capability
                break

    def prepare_capabilities(self, keep: set) -> None:
        low = sum(1 << cap for cap in keep if cap < 32)
        high = sum(1 << (cap - 32) for cap in keep if cap >= 32)
        self._cap_data[0].effective = self._cap_data[0].permitted = low
        self._cap_data[1].effective = self._cap_data[1].permitted = high

    def prepare_filter(self, program: bytes) -> None:
        """Keep a seccomp filter (classic BPF, from ``mocksandbox/execution/syscall_filter.py``)
        ready for :meth:`install_filter`: built once, so that a program pays one ``prctl``."""
        self._filter_code = ctypes.create_string_buffer(program, len(program))
        # struct sock_fprog: an unsigned short count, then a pointer (aligned).
        self._filter = ctypes.create_string_buffer(16)
        ctypes.memmove(self._filter, (len(program) // 8).to_bytes(2, sys.byteorder), 2)
        pointer = ctypes.addressof(self._filter_code).to_bytes(8, sys.byteorder)
        ctypes.memmove(ctypes.addressof(self._filter) + 8, pointer, 8)

    def install_filter(self) -> None:
        """In a world's first process, while it may (CAP_SYS_ADMIN in its user namespace): the
        filter, for it and everything it starts."""
        result = self.libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(self._filter), 0, 0)
        self._check(result, "seccomp")

    def prepare_command_line(self, argv: "list | None") -> None:
        """In a relay, before it forks a warm Python program: what its ``/proc/self/cmdline`` (and
        ``ps``) must say (``python <file>``, as a spawned one's would), instead of the launcher's own
        command line. The new argument area lives in this buffer, which the fork copies to the
        same address; the rest of the map is this process's, which the fork keeps as is."""
        if argv is None:
            self._mm_map = None
            return
        payload = b"\0".join(arg.encode() for arg in argv) + b"\0"
        self._command_line = ctypes.create_string_buffer(payload, len(payload))
        if self._layout_of != os.getpid():  # read once per relay: its code, data and stack stay put
            with open("/proc/self/stat", "rb") as stat:
                self._layout = stat.read().rsplit(b")", 1)[1].split()
            self._layout_of = os.getpid()
        fields = self._layout

        def field(number: int) -> int:  # proc(5) numbers the fields from 1; two precede ")"
            return int(fields[number - 3])

        start = ctypes.addressof(self._command_line)
        self._mm_map = _MmMap(
            field(26), field(27), field(45), field(46), field(47), self.libc.sbrk(0) or 0, field(28),
            start, start + len(payload), field(50), field(51), 0, 0, 0xFFFFFFFF,
        )  # fmt: skip

    def set_command_line(self) -> None:
        """In the forked program, while it may (CAP_SYS_ADMIN in its user namespace: the prctl is
        checkpoint/restore's): the command line :meth:`prepare_command_line` made. Best effort: a
        program that cannot keeps the launcher's (which names nothing hidden from it)."""
        if self._mm_map is not None:
            self.libc.prctl(
                _PR_SET_MM, _PR_SET_MM_MAP, ctypes.addressof(self._mm_map), ctypes.sizeof(self._mm_map), 0
            )

    def reduce_capabilities(self) -> None:
        """In a forked program: effective and permitted down to the kept set, nothing inheritable
        (an ``execve`` gives root the bounding set anyway; a forked Python program execs nothing)."""
        self._check(self._capset(*self._capset_args), "capset")


class _RunUsers:
    """Runs as an unprivileged range of host uids (made once, in the launcher, while it is root).

    A user namespace maps its uids 0..count-1 to the host's ``uid``..``uid``+count-1: a run is root
    inside it (``id`` says 0, it may do what root may in its own namespaces) and an ordinary user
    outside, so the kernel's own checks stand behind every namespace and mask (the host's files it
    does not own, other users' processes, the host's keyrings, every capability over the host).

    The host's files keep their owners in the run's view through idmapped mounts, made here once
    and copied into every relay's mount namespace: ``<base>/lower``, the root file system read-only
    (the runs' lowest layer), and ``<base>/m<i>``, each of ``mapped_roots`` (the runs' layers, the
    sessions' dirs) writable. A file the host's root owns is the run's root's there, and what the
    run writes is stored as the host's root's, so the server reads and removes it as before.

    The launcher first moves into a mount namespace of its own (a slave of the host's, so that
    later mounts of the host still reach its plain runs): none of this is ever seen on the host.

    A server that is not root (``self_mapped``) can do none of that: each relay makes a user
    namespace of its own, mapping its root to the server's uid alone (what any user may do where
    unprivileged user namespaces are allowed). The host's files are then seen with their own
    owners, those of other users (root's) as nobody's: read-only to the run, as on the host.
    """

    def __init__(self, config: dict, calls: _Syscalls) -> None:
        users = config["userns"]
        self.uid, self.gid, self.count = users["uid"], users["gid"], users["count"]
        self.self_mapped = bool(users.get("self_mapped"))
        self.nested = bool(users.get("nested"))
        self.userns = self.base = -1
        #: The server's uid as the relays' parent namespace sees it.
        self.outside_uid, self.outside_gid = self.uid, self.gid
        if self.self_mapped:
            if users.get("runs_tmpfs"):
                self._own_runs_tmpfs(config["runs_root"], users["runs_tmpfs"], calls)
                os.mkdir(config["scratch"], 0o700)  # (the host's is under the tmpfs now)
            return
        calls.unshare(_CLONE_NEWNS)
        calls.mount(None, "/", None, _MS_REC | _MS_SLAVE)
        self.userns = self._make_namespace(calls)
        base = config["scratch"]
        calls.mount("tmpfs", base, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=64k")
        os.mkdir(base + "/lower", 0o755)
        calls.idmapped_clone("/", base + "/lower", self.userns, read_only=True)
        for index, root in enumerate(config["mapped_roots"]):
            os.mkdir(f"{base}/m{index}", 0o755)
            calls.idmapped_clone(root, f"{base}/m{index}", self.userns, read_only=False)
        self.base = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def _own_runs_tmpfs(self, runs_root: str, options: str, calls: _Syscalls) -> None:
        """A server that is not root cannot mount the runs' tmpfs on the host: the launcher moves
        into a user and a mount namespace of its own (its root the server's uid) and mounts it
        there, sized, over the runs' dir. Relays inherit it; the server reaches it through
        ``/proc/<launcher>/root`` (``RunsRoot.seen_through``); it is gone with the launcher."""
        calls.unshare(_CLONE_NEWUSER | _CLONE_NEWNS)
        _write_text("/proc/self/setgroups", "deny")
        _write_text("/proc/self/uid_map", f"0 {self.uid} 1\n")
        _write_text("/proc/self/gid_map", f"0 {self.gid} 1\n")
        calls.mount(None, "/", None, _MS_REC | _MS_SLAVE)
        calls.mount("tmpfs", runs_root, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=0700,{options}")
        self.outside_uid = self.outside_gid = 0  # the relays' namespaces nest in this one

    def _make_namespace(self, calls: _Syscalls) -> int:
        """A user namespace with the run's map (a child makes it, the launcher maps it and keeps
        a descriptor of it; the child then leaves)."""
        made_r, made_w = os.pipe()
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(made_r)
                os.close(done_w)
                calls.unshare(_CLONE_NEWUSER)
                os.write(made_w, b"u")
                os.read(done_r, 1)  # until the launcher has its descriptor
            finally:
                os._exit(0)
        os.close(made_w)
        os.close(done_r)
        try:
            if os.read(made_r, 1) != b"u":
                raise OSError(1, "cannot make a user namespace here")  # EPERM
            _write_text(f"/proc/{pid}/uid_map", f"0 {self.uid} {self.count}\n")
            _write_text(f"/proc/{pid}/gid_map", f"0 {self.gid} {self.count}\n")
            return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(done_w)
            os.close(made_r)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass

    def become_root(self, calls: _Syscalls) -> None:
        """In a new relay: into the runs' user namespace as its root, then into a new PID namespace
        for the relay's own child (that namespace belongs to the user namespace: the relay may mount
        its /proc). The working directory is the base: the relay finds the mounts there."""
        # The OOM killer's first choice, now, while this process may still raise it for itself (its
        # /proc files are the host root's once its uid has changed): the relay and every program it
        # forks inherit it (a program's own write, _prefer_for_oom_kill, may then fail).
        try:
            _write_text("/proc/self/oom_score_adj", "1000")
        except OSError:
            pass
        if self.self_mapped:
            # A user namespace of this relay's own: its root is the server's uid, as the kernel
            # lets any process map its own uid (and its gid, once it gave up setgroups).
            calls.unshare(_CLONE_NEWUSER)
            _write_text("/proc/self/setgroups", "deny")
            _write_text("/proc/self/uid_map", f"0 {self.outside_uid} 1\n")
            _write_text("/proc/self/gid_map", f"0 {self.outside_gid} 1\n")
            calls.unshare(_CLONE_NEWPID)
            return
        os.fchdir(self.base)
        calls.setns(self.userns, _CLONE_NEWUSER)
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        if self.nested:
            # A user namespace of this relay's own inside the runs' (its root theirs): the kernel
            # counts RLIMIT_NPROC per user namespace and uid, so that the limit bounds this relay's
            # runs alone, where no cgroup bounds them. (Their other uids are not mapped there.)
            # (The uid change made this process undumpable, which gives its /proc files to the
            # host's root: dumpable again while it writes its maps, and undumpable after.)
            calls.unshare(_CLONE_NEWUSER)
            calls.libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
            _write_text("/proc/self/setgroups", "deny")
            _write_text("/proc/self/uid_map", "0 0 1\n")
            _write_text("/proc/self/gid_map", "0 0 1\n")
            calls.libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        calls.unshare(_CLONE_NEWPID)


#: Set in the launcher when runs are an unprivileged user (``--world`` with ``userns``).
_USERS = None
#: Why that could not be made: every run that asks for a world is then refused with it.
_USERS_ERROR = None


if ctypes is not None:

    class _MmMap(ctypes.Structure):
        """``struct prctl_mm_map`` (linux/prctl.h)."""

        _fields_ = (
            *((name, ctypes.c_uint64) for name in (
                "start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
                "arg_start", "arg_end", "env_start", "env_end", "auxv",
            )),
            ("auxv_size", ctypes.c_uint32),
            ("exe_fd", ctypes.c_uint32),
        )  # fmt: skip


class _World:
    """One relay's namespaces, and the per-run overlay it mounts for each run that asks."""

    def __init__(self, config: dict, calls: _Syscalls) -> None:
        self.calls = calls
        self.scratch = config["scratch"]
        self.root = self.scratch + "/root"
        self.mask = self.scratch + "/mask"
        self.mounted = False
        #: The root a run kept from run to run (see _KeptRoot), if any, and the root of the run
        #: being made or run now (``root`` or the kept one's).
        self.kept: _KeptRoot | None = None
        self.current = self.root
        #: SIGCHLD is ignored (see reap): the kernel reaps the run's orphans; not while a run is
        #: on (the relay is made with it at its default, and must wait for its program).
        self.kernel_reaps = False
        #: Whether the relay's IPC namespace holds what a run left, which the next run must not
        #: find (see renew_ipc).
        self.ipc_dirty = False
        #: In a user namespace of the runs' own (see _RunUsers), else the host's root.
        self.users = config.get("userns") is not None
        #: Where the host's root file system is seen as the runs see it (their lowest layer): the
        #: idmapped copy in a user namespace (there the host's own "/" shows its root's files as
        #: nobody's), else "/" itself.
        self.host = self.scratch + "/host" if self.users and "mapped_roots" in config else ""
        #: An unprivileged relay may not take the host's root file system as one layer (the mounts
        #: under it are locked to it in a user namespace, and overlayfs refuses such a layer): each
        #: top-level dir of it is a layer of its own then (``_host_tops``), else ``None``.
        self.tops = None
        #: The xattrs overlayfs keeps its marks in (a user namespace may only write user.*).
        self.opaque_xattr = "user.overlay.opaque" if self.users else "trusted.overlay.opaque"
        private_network = config.get("network", "private") == "private"
        flags = _CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWUTS | (_CLONE_NEWNET if private_network else 0)
        calls.unshare(flags)
        calls.mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        # This PID namespace's own /proc (the relay is its PID 1).
        calls.mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        if self.host:
            # The idmapped copies (in the base, our working directory) over the host dirs they
            # copy: the runs' layers and the sessions' dirs are then the run's own at their paths.
            for index, root in enumerate(config["mapped_roots"]):
                calls.mount(f"m{index}", root, None, _MS_BIND)
        if private_network:
            self._loopback_up()
            # No TIME_WAIT sockets: a run that binds the port an earlier run of this relay served on
            # (without SO_REUSEADDR, as socketserver.TCPServer does) must not find it taken.
            try:
                _write_text("/proc/sys/net/ipv4/tcp_max_tw_buckets", "0")
            except OSError:
                if not self.users:
                    raise
        # Kernel tunables and the magic SysRq key stay out of reach of a root program.
        calls.mount("/proc/sys", "/proc/sys", None, _MS_BIND | _MS_REC)
        read_only = _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        calls.mount(None, "/proc/sys", None, read_only)
        if os.path.exists("/proc/sysrq-trigger"):
            calls.mount("/dev/null", "/proc/sysrq-trigger", None, _MS_BIND)
        calls.mount("tmpfs", self.scratch, "tmpfs", _MS_NOSUID, "mode=0700,size=8m")
        for name in ("mask", "sys", "dev", "root", "kept", "mqueue"):
            os.mkdir(self.scratch + "/" + name, 0o755)
        #: The POSIX message queues of the relay's IPC namespace, where they can be seen (else
        #: every run's namespace is a new one: see ipc_left).
        self.mqueue: str | None = self.scratch + "/mqueue"
        self._mount_mqueue()
        if self.host:
            os.mkdir(self.host, 0o755)
            calls.mount("lower", self.host, None, _MS_BIND)
            os.chdir("/")  # done with the base: the relay holds no dir of the runs'
        read_only_sys = _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        try:
            calls.mount("sysfs", self.scratch + "/sys", "sysfs", read_only_sys)
        except OSError:
            if not self.users:
                raise
            # A user namespace may mount a sysfs only with a network namespace of its own (not so
            # with run_network: host): the host's, read-only.
            calls.mount("/sys", self.scratch + "/sys", None, _MS_BIND | _MS_REC)
            calls.mount(None, self.scratch + "/sys", None, _MS_BIND | _MS_REMOUNT | read_only_sys)
        self._build_dev(calls)
        #: Host dirs a run must see where its tops leave them out (the user's Python and runtime,
        #: kept under /tmp by a CI job or a checkout there): bound read-only for each run.
        self.shown: list = []
        if self.users and not self.host:
            self.tops = self._host_tops()
            fresh = [f"/{name}/" for name in _FRESH_TOPS]
            self.shown = [
                p for p in config.get("show", []) if p.startswith(tuple(fresh)) and os.path.isdir(p)
            ]
        #: Dirs whose entries with a prefix are hidden as they come and go: ``[dir, prefix]``.
        self.hidden_prefixes = [tuple(pair) for pair in config.get("hide_prefixed", [])]
        self._scanned: dict = {}
        self._masked: dict = {}
        self.hidden = config.get("hide", [])
        self._build_mask(self.hidden)
        self.keep_caps = set(config["keep_caps"])
        calls.drop_bounding_set(self.keep_caps)
        calls.prepare_capabilities(self.keep_caps)
        # A handler, not the default action: a namespace's PID 1 drops signals it has none for.
        _signal.signal(_signal.SIGIO, _end_the_run)
        #: The runs' seccomp filter (``syscall_filter.py``), if the server has one: installed here,
        #: once, in the world's first process (the relay, or a kernel's world), so that each
        #: program inherits it at its fork instead of paying for a filter of its own (the kernel
        #: compiles and JITs each one; about a fifth of a millisecond a run). What the relay still
        #: does for each run (mount and unmount its root) the filter leaves to the capability check.
        self.filtered = config.get("syscall_filter") is not None
        if self.filtered:
            calls.prepare_filter(binascii.a2b_base64(config["syscall_filter"]))
            calls.install_filter()

    @staticmethod
    def _loopback_up() -> None:
        """``ip link set lo up``: SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP (a struct ifreq: the
        name in 16 bytes, then the flags; packed by hand: the relay imports as little as it can,
        since every page it touches is copied at each fork)."""
        sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
        try:
            request = b"lo".ljust(16, b"\0") + bytes(24)
            answer = _fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request)
            flags = int.from_bytes(answer[16:18], sys.byteorder) | _IFF_UP
            _fcntl.ioctl(
                sock.fileno(), _SIOCSIFFLAGS, answer[:16] + flags.to_bytes(2, sys.byteorder) + bytes(22)
            )
        finally:
            sock.close()

    def _build_dev(self, calls: _Syscalls) -> None:
        """The runs' /dev, made once: a small tmpfs of the harmless devices, their usual links and a
        /dev/pts of this relay's own, read-only (each run mounts a fresh /dev/shm on it). A run
        binds it whole, with one call (a bind per device cost each run a lookup in its new overlay
        and a mount of its own)."""
        dev = self.scratch + "/dev"
        calls.mount("tmpfs", dev, "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=64k")
        for name, major, minor in _DEVICES:
            if self.users:
                # No device nodes in a user namespace (nor could a run open them on a file system
                # mounted there): the host's own, bound on these.
                os.close(os.open(dev + "/" + name, os.O_WRONLY | os.O_CREAT, 0o666))
                calls.mount("/dev/" + name, dev + "/" + name, None, _MS_BIND)
            else:
                os.mknod(dev + "/" + name, 0o666 | 0o020000, os.makedev(major, minor))
                os.chmod(dev + "/" + name, 0o666)
        for name, target in _DEV_LINKS:
            os.symlink(target, dev + "/" + name)
        for name in ("shm", "pts", "mqueue"):
            os.mkdir(dev + "/" + name, 0o755)
        try:
            pts_options = "newinstance,ptmxmode=0666,mode=0620"
            calls.mount("devpts", dev + "/pts", "devpts", _MS_NOSUID | _MS_NOEXEC, pts_options)
        except OSError:
            pass  # no pseudo-terminals then (a kernel without devpts, or one that refuses it here)
        calls.mount(None, dev, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC)

    def _mask_dir(self, path: str, opaque: bool) -> str:
        """``path`` made in the mask layer with its host attributes (the topmost layer holding a
        directory gives it its mode and owner), parents included."""
        target = self.mask + path
        if not os.path.isdir(target):
            parent = os.path.dirname(path)
            if parent != path:
                self._mask_dir(parent, False)
            if not os.path.isdir(target):
                info = os.stat(self.host + path) if os.path.isdir(self.host + path) else None
                os.mkdir(target)
                if info is not None:
                    os.chmod(target, info.st_mode & 0o7777)
                    self._chown(target, info.st_uid, info.st_gid)
        if opaque:
            os.setxattr(target, self.opaque_xattr, b"y")
        return target

    @staticmethod
    def _chown(path: str, uid: int, gid: int) -> None:
        try:
            os.chown(path, uid, gid)
        except OSError:
            pass  # an owner the runs' user namespace does not map (its root's, then)

    @staticmethod
    def _host_tops() -> list:
        """``(name, how)`` for each dir at the top of the host's root file system that is a layer
        of its own in a run's root: ``overlay`` (copy-on-write, as the whole root elsewhere), or
        ``bind`` (read-only: something is mounted inside it, which an unprivileged overlay may not
        take as a layer). Empty dirs are left to the mask, where they are plain dirs; so are /proc,
        /sys and /dev (made for each run), and /tmp and /run, which a run finds as in a fresh
        container: its own files only, not the host's, its users' or their sockets (an agent's, a
        session bus, Docker's: a socket's path reaches across network namespaces)."""
        with open("/proc/self/mountinfo") as mountinfo:
            mounted = [line.split()[4] for line in mountinfo]
        tops = []
        for name in sorted(os.listdir("/")):
            path = "/" + name
            if name in ("proc", "sys", "dev", *_FRESH_TOPS):
                continue
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if info.st_mode & 0o170000 != 0o040000:
                continue
            try:
                if not os.listdir(path):
                    continue
            except OSError:
                pass  # unreadable (root's home): a layer still, as unreadable as on the host
            inside = any(point.startswith(path + "/") for point in mounted)
            tops.append((name, "bind" if inside else "overlay"))
        return tops

    def _build_mask(self, hidden: list) -> None:
        """The layer between each run's upper layer and the host: an empty /dev, and every hidden
        path (secrets, the server's state) present but empty. Where the host's top
        dirs are layers of their own (``tops``), the mask holds the top of the host's tree too."""
        if self.tops is not None:
            for name in os.listdir("/"):
                try:
                    if os.path.islink("/" + name):
                        os.symlink(os.readlink("/" + name), self.mask + "/" + name)
                    elif os.path.isdir("/" + name):
                        self._mask_dir("/" + name, False)
                except OSError:
                    continue
        self._mask_dir("/dev", True)  # (the runs' /dev is mounted on it: _build_dev)
        for path in hidden:
            self._mask_path(path)
        for path in self.shown:  # mount points for them (the host's own modes and owners)
            self._mask_dir(path, False)

    def _mask_path(self, path: str) -> bool:
        """``path`` made present but empty in the mask layer; whether there was one to hide."""
        try:
            info = os.lstat(self.host + path)
        except OSError:
            return False  # nothing there to hide (a run may make it, in its own layer)
        if info.st_mode & 0o170000 == 0o040000:  # a dir
            self._mask_dir(path, True)
        else:
            self._mask_dir(os.path.dirname(path), False)
            fd = os.open(self.mask + path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, info.st_mode & 0o7777)
            os.close(fd)
            self._chown(self.mask + path, info.st_uid, info.st_gid)
        return True

    def refresh_mask(self) -> None:
        """Hide what servers made in their temp roots since the last run (state dirs, control
        sockets, shared counters, kernels' connection files: ``mocksandbox-*``), and stop hiding
        what is gone. Between runs only: a lower layer must not change while it is mounted (a
        kept root, which has the mask below it, goes first). A dir is listed again only when its
        mtime says that its entries changed."""
        for directory, prefix in self.hidden_prefixes:
            try:
                changed = os.stat(self.host + directory).st_mtime_ns
            except OSError:
                continue
            if self._scanned.get(directory) == changed:
                continue
            self._scanned[directory] = changed
            try:
                names = {n for n in os.listdir(self.host + directory) if n.startswith(prefix)}
            except OSError:
                continue
            masked = self._masked.setdefault(directory, set())
            if names != masked:
                self.drop_kept()
            for name in names - masked:
                if self._mask_path(os.path.join(directory, name)):
                    masked.add(name)
            for name in masked - names:
                gone = self.mask + os.path.join(directory, name)
                try:  # an empty opaque dir, or an empty file
                    os.rmdir(gone) if os.path.isdir(gone) else os.unlink(gone)
                except OSError:
                    pass
                masked.discard(name)

    def mount_run(self, world: dict, cwd: "str | None" = None) -> None:
        """The run's root: its layers over the mask over the host, with /proc, /sys and /dev,
        and the host dirs ``world["binds"]`` names (``[host dir, where the run sees it]``). A run
        that ``world["keep"]`` says touches nothing but its own dir ``cwd`` may have the root an
        earlier run kept (:class:`_KeptRoot`)."""
        if self.mounted or (self.kept is not None and self.kept.cwd is not None):
            self.unmount_run()  # the last run's, if its unmount failed
        if self.ipc_dirty:
            self.renew_ipc()  # (the last run's renewal failed: this run fails if this one does)
        self.refresh_mask()
        self.current = self.root
        keep = world.get("keep")
        plain = not world.get("lowers") and not world.get("binds")
        if keep is not None and cwd is not None and self.tops is None and plain:
            if self.kept is not None and not self.kept.serves():
                self.drop_kept()
            if self.kept is None:
                self.kept = _KeptRoot(self, keep["dir"])
            try:
                self.kept.take(cwd, keep["cwd_host"])
            except FileExistsError:  # an earlier run's dir had that name: a new root has none
                self.drop_kept()
                self.kept = _KeptRoot(self, keep["dir"])
                self.kept.take(cwd, keep["cwd_host"])
            self.current = self.kept.root
            return
        self._mount_overlay(self.root, world["lowers"], world["upper"], world["work"], world)
        self.mounted = True
        # Host dirs the run works in, in place (a swedev session's /workspace and /tmp): their
        # mount points are made in the run's upper layer.
        for source, target in world.get("binds", ()):
            os.makedirs(self.root + target, 0o755, exist_ok=True)
            self.calls.mount(source, self.root + target, None, _MS_BIND)

    def _mount_overlay(self, root: str, layers: list, upper: str, work: str, world: dict) -> None:
        """An overlay at ``root``: ``upper`` over ``layers``, the mask and the host, with the host's
        top dirs (where they are layers of their own), /proc, /sys, /dev and a fresh /dev/shm."""
        tops = self.tops or ()
        for name, how in tops:
            if how == "overlay":  # made before the root's overlay: its upper must not change under it
                os.makedirs(upper + "/" + name, 0o755, exist_ok=True)
                os.makedirs(work + "." + name, 0o700, exist_ok=True)
        lowers = ":".join([*layers, self.mask, *(() if self.tops is not None else (self.host or "/",))])
        # No redirects, no index: what the server reads back through the layers (world.py) only
        # has whiteouts and opaque dirs to follow. (In a user namespace overlayfs keeps its marks
        # in user.* xattrs, and "off" would still follow redirects there: "nofollow".)
        options = f"lowerdir={lowers},upperdir={upper},workdir={work}"
        options += (
            ",userxattr,redirect_dir=nofollow,index=off" if self.users else ",redirect_dir=off,index=off"
        )
        self.calls.mount("overlay", root, "overlay", 0, options)
        for name, how in tops:
            self._mount_top(root, name, how, world)
        for path in self.shown:
            self.calls.mount(path, root + path, None, _MS_BIND | _MS_REC)
            self.calls.mount(None, root + path, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY)
        self.calls.mount("/proc", root + "/proc", None, _MS_BIND | _MS_REC)
        self.calls.mount(self.scratch + "/sys", root + "/sys", None, _MS_BIND | _MS_REC)
        self.calls.mount(self.scratch + "/dev", root + "/dev", None, _MS_BIND | _MS_REC)
        # Docker's /dev/shm: a tmpfs of the run's own, 64 MiB.
        self.calls.mount("tmpfs", root + "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=64m")

    def _mount_top(self, root: str, name: str, how: str, world: dict) -> None:
        """The host's top dir ``name`` in the run's root: its own overlay (its upper and lowers the
        run's layers' dirs of that name, so that the server reads them as ever), or read-only."""
        target = root + "/" + name
        if how == "bind":
            self.calls.mount("/" + name, target, None, _MS_BIND | _MS_REC)
            self.calls.mount(None, target, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY)
            for hidden in self.hidden:  # no mask below a bind: the mask's empty ones bound over them
                if hidden.startswith("/" + name + "/") and os.path.lexists(self.mask + hidden):
                    self.calls.mount(self.mask + hidden, root + hidden, None, _MS_BIND)
            return
        below = [layer + "/" + name for layer in world["lowers"]]
        below += [self.mask + "/" + name, "/" + name]
        lowers = ":".join(path for path in below if os.path.isdir(path))
        options = f"lowerdir={lowers},upperdir={world['upper']}/{name},workdir={world['work']}.{name}"
        self.calls.mount(
            "overlay", target, "overlay", 0, options + ",userxattr,redirect_dir=nofollow,index=off"
        )

    @staticmethod
    def space_to_spare(path: str) -> bool:
        """Whether the file system of ``path`` (the runs' tmpfs) has more than half its space free."""
        try:
            sizes = os.statvfs(path)
        except OSError:
            return False
        return sizes.f_bavail * 2 > sizes.f_blocks

    def unmount_run(self) -> None:
        """The run's root taken down: unmounted, or (a kept one) its run's dir taken out of it,
        and the root itself dropped unless it is as the first run found it."""
        if self.kept is not None and self.kept.cwd is not None and not self.kept.give_back():
            self.drop_kept()
        if self.mounted:
            try:
                self.calls.umount(self.root)
            except OSError:
                pass
            self.mounted = False

    def ipc_left(self) -> bool:
        """Once a run's processes are gone: whether it left anything in the relay's IPC namespace.
        SysV shared memory, semaphores and message queues and POSIX message queues outlive the
        processes that made them, and the next run must find none of a run's (nor may runs pile
        them up, each holding memory). Counted in four calls; where the queues cannot be seen,
        always."""
        try:
            if self.mqueue is None or os.stat(self.mqueue).st_size != self.mqueue_empty:
                return True  # (its root's size is 20 bytes a queue over its empty size)
            return self.calls.sysv_ipc_objects() != 0
        except OSError:
            return True

    def renew_ipc(self) -> None:
        """A new IPC namespace for the relay, which its next run inherits; what the last run left
        goes with the old one, which its last process has left. The seccomp filter lets this one
        ``unshare`` through; a program, without ``CAP_SYS_ADMIN``, is refused it by the kernel."""
        self.ipc_dirty = True
        self.calls.unshare(_CLONE_NEWIPC)
        self.ipc_dirty = False
        if self.mqueue is not None:
            try:
                self.calls.umount(self.mqueue)
            except OSError:
                pass
            self._mount_mqueue()

    def _mount_mqueue(self) -> None:
        """The POSIX message queues of the relay's IPC namespace (a mount sees the namespace it
        was made in) at :attr:`mqueue`, or ``None`` there where they cannot be seen."""
        try:
            self.calls.mount("mqueue", self.mqueue, "mqueue", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
            #: The size of its root in a new namespace, which holds no queue.
            self.mqueue_empty = os.stat(self.mqueue).st_size
        except OSError:
            self.mqueue = None

    def drop_kept(self) -> None:
        """Unmount the kept root, if any, and remove its upper layer."""
        kept, self.kept = self.kept, None
        if kept is not None:
            kept.drop()

    def enter(self, cwd: str) -> None:
        """In the forked program: into the run's root, with the kept capabilities only."""
        _signal.signal(_signal.SIGIO, _signal.SIG_DFL)  # the relay's, not the program's
        if self.kept is not None:
            os.close(self.kept.lock)  # the relay's to hold (a program could unlock it)
            if self.kept.changes is not None:
                os.close(self.kept.changes)  # (a program could read its changes' events away)
        os.chroot(self.current)
        os.chdir(cwd)
        self.calls.set_command_line()
        self.calls.reduce_capabilities()  # (the seccomp filter is the world's: see __init__)

    # The relay is PID 1 of the run's namespace: the run's orphans come to it, and each one that
    # dies must be reaped at once (a zombie still counts against pids.max, and the server answers
    # only once the run's cgroup is empty). While a program runs, the relay reaps in its blocking
    # wait; once it has exited, what it left is killed and reaped before the answer
    # (_end_what_the_program_left), so that no process of the run is left between runs. Where
    # that could not be done (the server gave the run up first), SIGCHLD is ignored until the
    # next run, so that the kernel reaps what is left as it dies (reap). And while a program
    # runs, the relay's socket is in async mode: if the server dies (its end closes), SIGIO ends
    # the run and the relay (see _end_the_run).
    # Little Python runs in the relay while a program lives: every page it writes then is copied.

    def wait_for_program(self, pid: int, sock: _socket.socket) -> int:
        """The wait status of the program ``pid``, reaping the run's orphans meanwhile."""
        if _watch_server(sock):
            _say_ended_by_relay(0)
            os.kill(-1, _signal.SIGKILL)  # the server left before we watched: end the run
        try:
            while True:
                try:
                    done, status = os.waitpid(-1, 0)
                except InterruptedError:
                    continue
                except ChildProcessError:
                    return 255 << 8
                if done == pid:
                    return status
        finally:
            _unwatch_server(sock)

    @staticmethod
    def anything_left() -> bool:
        """Whether any process of the run's namespace is left (reaping one that died): every
        process of a PID namespace descends from its PID 1, this relay, and an orphan comes to it,
        so none is left once the relay has no child. (Cheaper than ``kill(-1)``, which looks at
        every process of the host.)"""
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        return True

    def reap(self, until_gone: bool = False) -> None:
        """Reap what died of the run, and let the kernel reap the rest until the next run; with
        ``until_gone``, wait until every process of the namespace (killed) has died first."""
        if not until_gone:
            _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)
            self.kernel_reaps = True
        while True:
            try:
                if os.waitpid(-1, 0 if until_gone else os.WNOHANG)[0] == 0:
                    return
            except ChildProcessError:
                return
            except InterruptedError:
                continue


class _KeptRoot:
    """A relay's root kept from run to run, for the runs that touch nothing but their own dir.

    Mounting a new overlay for each run (and tearing it down) is most of what a world costs its
    relay. A run that only reads the image and writes in its own dir (most of a reward pipeline's:
    a program and its tests, no ``fetch_files``, no files put outside its dir; the server says
    which in ``world["keep"]``) leaves its root as it found it. So the relay keeps such a root: an
    overlay with an upper layer of its own (``<runs root>/kept-*``) over the mask and the host, and
    each run's dir, which the server made on the runs' tmpfs, bound into it at the run's path.
    Once the run's processes are gone and its exit is said, before the status pipe closes (which
    the server waits for), the relay removes the run's dir from the tmpfs (the server never hands
    the dir's name or inode to another run); once the answer is on its way, it unmounts the dir
    and removes its mount point (:meth:`give_back`): a later run finds nothing of an earlier one.
    After the answer, the root is kept only if nothing changed while the run ran in its upper
    layer's dirs on the way to the runs' dirs (the root of the layer, ``/tmp`` in it) or in its
    /dev/shm: their entries, or their own mode, owner or extended attributes.
    Anything a run writes, deletes or changes outside its dir shows there first (what it changes
    anywhere in the image is copied up, under a new entry of the layer's root or of a dir on the
    way; the mount point below is covered by the run's dir), and the root then goes, as a run's
    root always went before. inotify watches on those dirs, made at the root's first run, say so:
    one read after each run, where looking at each dir cost a relay's every run a tenth of a
    millisecond. A kept root serves at most :data:`MAX_AGE_S` (a lower layer, the host, may change
    under it: its new files are then seen within that time) and :data:`MAX_RUNS` runs (a mount
    each); where no watch can be had (inotify's limits), one run.
    """

    MAX_AGE_S = 1.0
    MAX_RUNS = 1000

    def __init__(self, world: "_World", runs_dir: str) -> None:
        self.world = world
        #: The inotify descriptor watching what runs must leave as they found it (see
        #: :meth:`take`), from the first run on; ``None`` before, or where none could be had.
        self.changes: int | None = None
        name = os.urandom(6).hex()
        # Made under another name, locked, then named kept-*: the server removes a kept-* whose
        # lock nobody holds (its relay was killed from outside and could not drop it), and must
        # never find one not locked yet. The lock is held for the relay's life (a forked program
        # closes its copy: World.enter).
        building = f"{runs_dir}/.kept-{name}"
        os.mkdir(building, 0o700)
        try:
            self.lock = os.open(building + "/lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            _fcntl.flock(self.lock, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
            self.base = f"{runs_dir}/kept-{name}"
            os.rename(building, self.base)
        except OSError:
            _remove_tree(building)
            raise
        try:
            os.mkdir(self.base + "/u", 0o755)
            os.mkdir(self.base + "/w", 0o700)
            self.upper = self.base + "/u"
            self.root = world.scratch + "/kept"
            world._mount_overlay(self.root, [], self.upper, self.base + "/w", {})
        except OSError:
            self._remove()
            raise
        self.shm = self.root + "/dev/shm"
        self.born = time.monotonic()
        self.runs = 0
        #: Whether it may serve a run after this one (not where it has no watch).
        self.lasts = True
        #: The current run's dir (its path in the run's view), while it is bound here.
        self.cwd: str | None = None
        #: The current run's dir on the runs' tmpfs, and whether it was removed after the run.
        self.cwd_host = ""
        self.run_dir_gone = False

    def serves(self) -> bool:
        """Whether it may serve another run (young enough, not too many runs yet)."""
        return self.lasts and self.runs < self.MAX_RUNS and time.monotonic() - self.born < self.MAX_AGE_S

    def take(self, cwd: str, cwd_host: str) -> None:
        """Bind the run's dir ``cwd_host`` (on the runs' tmpfs) at ``cwd`` in this root; a
        ``FileExistsError`` if an earlier run's mount point has that name."""
        target = self.root + cwd
        first = self.runs == 0
        if first:
            os.makedirs(os.path.dirname(target), exist_ok=True)
        os.mkdir(target, 0o700)  # (the first run's copies up the dirs on the way)
        if first:
            # What the upper layer holds now is what every later run must leave, but for one
            # more mount point in the runs' parent dir for each run (this relay's own change,
            # dropped from the watch's queue below). The runs of a root share that parent dir (the
            # server's temp dir, as runs see it); a run's dir elsewhere would copy its own
            # parents up, which the watch sees.
            path, watched = self.upper, []
            for part in os.path.dirname(cwd).split("/"):
                if part:
                    watched.append(path)
                    path += "/" + part
            try:
                self.changes = self.world.calls.watch_changes([*watched, path, self.shm])
            except OSError:
                self.lasts = False  # (it cannot tell whether a run left it as it was)
        elif self.changes is not None:
            # What the queue holds now is the mkdir's: the last run left nothing (give_back), and
            # since then only this relay has been at work.
            self.changed()
        self.cwd = cwd
        self.cwd_host = cwd_host
        self.run_dir_gone = False
        self.runs += 1
        self.world.calls.mount(cwd_host, target, None, _MS_BIND)

    def remove_run_dir(self, code_file: "str | None") -> bool:
        """Once the run's processes are gone, before its relay closes the status pipe: its dir
        removed from the runs' tmpfs (where the server made it, and where the server, once the
        pipe closes, expects it gone). ``code_file``: the program's file (its path in the run's
        view). Whether the dir is gone. Its mount goes after the answer (:meth:`give_back`)."""
        path = self.cwd_host
        if code_file is not None and self.cwd is not None and code_file.startswith(self.cwd + "/"):
            try:
                os.unlink(path + code_file[len(self.cwd) :])
            except OSError:
                pass
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            pass
        try:
            _remove_tree(path)
        except Exception:
            return False
        return not os.path.lexists(path)

    def give_back(self) -> bool:
        """Once the run's answer is on its way: whether the root is as the run found it, and,
        if so, the run's dir taken out of it (its mount, then its mount point), so that no later
        run finds anything of it: not its name in ``/tmp`` or in the mount table, nor the mode,
        owner or extended attributes the run gave its dir (a dead dir left bound showed them).
        The unmount waits for an RCU grace period (tens of microseconds here), which the server
        spends sending the answer; the mount point's removal is this relay's own change, whose
        event the next :meth:`take` drains with its ``mkdir``'s."""
        assert self.cwd is not None
        cwd, self.cwd = self.cwd, None
        if not (self.run_dir_gone and self.changes is not None and not self.changed()):
            return False
        target = self.root + cwd
        try:
            self.world.calls.umount(target)
            os.rmdir(target)
        except OSError:
            return False  # (the root goes, and the run's mount with it)
        return True

    def changed(self) -> bool:
        """Whether the watched dirs changed since the last call (their events are read and
        dropped): any event at all says so (a lost one too: the queue overflowed)."""
        assert self.changes is not None
        seen = False
        while True:
            try:
                if not os.read(self.changes, 65536):
                    return True
            except BlockingIOError:
                return seen
            except OSError:
                return True
            seen = True

    def drop(self) -> None:
        """Unmount it (its run's dir too, if bound) and remove its upper layer."""
        try:
            self.world.calls.umount(self.root)
        except OSError:
            pass
        self._remove()

    def _remove(self) -> None:
        if self.changes is not None:
            os.close(self.changes)
            self.changes = None
        _remove_tree(self.base)
        try:
            os.close(self.lock)  # (after: the server removes no dir while it is locked)
        except OSError:
            pass


def _remove_tree(path: str) -> None:
    """``rm -rf path`` (the relay imports no shutil)."""
    try:
        entries = list(os.scandir(path))
    except NotADirectoryError:
        os.unlink(path)
        return
    except OSError:
        return
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
                continue
            # Most are empty (a kept root's runs' mount points, hundreds of them): one call each.
            os.rmdir(entry.path)
        except OSError:
            if entry.is_dir(follow_symlinks=False):
                _remove_tree(entry.path)
    try:
        os.rmdir(path)
    except OSError:
        pass


def _say_ended_by_relay(why: int) -> None:
    """Tell the server, on the run's status pipe, that this relay ends the run itself."""
    if _WATCHED_STATUS_FD is not None:
        try:
            os.write(_WATCHED_STATUS_FD, _STATUS_ENDED_BY_RELAY + why.to_bytes(8, "little", signed=True))
        except OSError:
            pass


def _server_left(sock: _socket.socket) -> bool:
    """Whether the server closed its end of the relay's socket ``sock`` (it reads as closed),
    without waiting and without taking a message that may be there."""
    try:
        return sock.recv(1, _socket.MSG_PEEK | _socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False  # still there, nothing sent: the usual case
    except OSError:
        return True  # (reset: gone all the same)


def _watch_server(sock: _socket.socket) -> bool:
    """Put the relay's socket ``sock`` in async mode (SIGIO when the server's end closes), while a
    program runs; whether the server had left already (closed before we watched: no SIGIO)."""
    global _RELAY_SOCKET_FLAGS
    fd = sock.fileno()
    if _RELAY_SOCKET_FLAGS is None:  # (a relay has one socket, for its whole life)
        _fcntl.fcntl(fd, _fcntl.F_SETOWN, os.getpid())
        flags = _fcntl.fcntl(fd, _fcntl.F_GETFL) & ~os.O_ASYNC
        _RELAY_SOCKET_FLAGS = (flags | os.O_ASYNC, flags)
    _fcntl.fcntl(fd, _fcntl.F_SETFL, _RELAY_SOCKET_FLAGS[0])
    return _server_left(sock)


def _unwatch_server(sock: _socket.socket) -> None:
    if _RELAY_SOCKET_FLAGS is not None:
        _fcntl.fcntl(sock.fileno(), _fcntl.F_SETFL, _RELAY_SOCKET_FLAGS[1])


def _end_the_run(signum: int, frame: object) -> None:
    """SIGIO in a relay while a program runs: on the host, if the server let the run go, the
    program's group is killed (the relay then reaps it, finds its socket closed and leaves).
    In a world's relay: if the server let the run go (its deadline
    passed, where no cgroup kills it) or is gone, its end of our socket is closed. Every process
    of the namespace is then killed (a signal to -1 from its PID 1 reaches all the others), then
    the relay; its kept root goes first, once nothing of the run writes any more: what a timed-out
    run wrote outside its dir is in that root's upper layer, on the runs' tmpfs, which outlives the
    relay (a run that filled it and slept past its deadline, again and again, would leave every
    later run without space).

    A SIGIO alone proves nothing, and ends nothing: only a socket that reads as closed does.
    The kernel raises it for a message the relay may have taken already. A sender queues its
    message, then wakes the socket's owner; when the server's thread is delayed between the two
    (preempted, its virtual CPU stolen), the relay, not yet asleep, takes the message, starts the
    run it carries and turns the socket's SIGIO on, and the late wake-up then lands in that run
    (seen: 1 run in 2000-4000 at concurrency 1 on a 2-core VM, answered -9). A program may also
    send it to its PID 1, as to any init, which ignores it. A kernel's world (no relay socket)
    ignores it too."""
    if _RELAY_SOCKET is None or not _server_left(_RELAY_SOCKET):
        return
    _say_ended_by_relay(signum)
    if _WATCHED_PID is not None:  # a run on the host: never -1, which is every process we may signal
        _kill_host_program(_WATCHED_PID)
        return
    if _WORLD is None:
        return
    os.kill(-1, _signal.SIGKILL)
    _WORLD.reap(until_gone=True)
    _WORLD.drop_kept()
    os._exit(1)


def _write_text(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# -- the warm Python path --------------------------------------------------------------------------


def _stdio_encoding_and_errors(fd: int) -> tuple:
    """What CPython's start-up chose for std stream ``fd``, read off the launcher's own streams;
    for one the launcher was started without (``None``): the others' encoding, and the errors
    CPython gives that stream (stderr always ``backslashreplace``)."""
    own = (sys.__stdin__, sys.__stdout__, sys.__stderr__)[fd]
    if own is not None:
        return own.encoding, own.errors
    other = sys.__stdout__ or sys.__stdin__ or sys.__stderr__
    encoding = other.encoding if other is not None else sys.getfilesystemencoding()
    if fd == 2:
        return encoding, "backslashreplace"
    sibling = (sys.__stdout__, sys.__stdin__)[fd]  # stdin's errors are stdout's, and back
    return encoding, sibling.errors if sibling is not None else "strict"


def _make_stdio(fd: int, mode: str) -> object:
    """A text stream on ``fd`` configured as CPython's start-up configures its std streams."""
    encoding, errors = _stdio_encoding_and_errors(fd)
    stream = open(  # noqa: SIM115 - lives as long as the program
        fd,
        mode,
        encoding=encoding,
        errors=errors,
        newline="\n",
        closefd=False,
    )
    if "w" in mode:
        stream.reconfigure(line_buffering=fd == 2 or os.isatty(fd))
    return stream


def _make_program_stdio() -> tuple:
    """The std streams of every forked program, built once in the launcher.

    A program's descriptors 0, 1 and 2 are always pipes, so the streams are built here on pipes
    dup'ed onto 0, 1 and 2 (what a stream learns at creation, seekable or not, a tty or not, its
    buffer size, is then what it would learn in the program), and the launcher's own descriptors
    are put back. A stream holds only the descriptor number: in the forked program it reads and
    writes the run's pipes, with empty buffers.
    """
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    read_end, write_end = os.pipe()
    try:
        os.dup2(read_end, 0)
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        return (_make_stdio(0, "r"), _make_stdio(1, "w"), _make_stdio(2, "w"))
    finally:
        for fd, original in enumerate(saved):
            os.dup2(original, fd)
            os.close(original)
        os.close(read_end)
        os.close(write_end)


#: Set by ``_serve`` before the first fork.
_PROGRAM_STDIO: tuple = ()
_THREAD_STACKS: "_ThreadStackDefault"
#: The descriptors of a run: stdin, stdout, stderr, status.
_RUN_FDS = 4
#: The launcher's own std streams, referenced here so that a program replacing them does not pay
#: for tearing them down (they never close their descriptors: CPython opens them closefd=False).
_LAUNCHER_STDIO = (sys.stdin, sys.stdout, sys.stderr)


def _become_python_program(request: dict) -> None:
    """Turn this forked launcher into ``python <file>``; never returns."""
    path = request["file"]
    os.chdir(request["cwd"])
    env = request["env"]
    if env is not None:  # None: the launcher's own environment, nothing to do
        os.environ.clear()
        os.environ.update(env)
    sys.argv[:] = [path]
    sys.path[0] = os.path.dirname(path)
    stdin, stdout, stderr = _PROGRAM_STDIO
    sys.stdin = sys.__stdin__ = stdin
    sys.stdout = sys.__stdout__ = stdout
    sys.stderr = sys.__stderr__ = stderr
    # What CPython's start-up sets: SIGPIPE and SIGXFSZ ignored, SIGINT -> KeyboardInterrupt, the
    # rest (that the launcher changed) at their defaults; nothing blocked.
    _signal.signal(_signal.SIGPIPE, _signal.SIG_IGN)
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    # (The default stack size of new threads was set for this limit before the fork.)
    _apply_memory_limit(request.get("memory_limit_mb", -1))

    import _frozen_importlib_external  # in every interpreter's module table already

    main = type(sys)("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__annotations__ = {}
    main.__loader__ = _frozen_importlib_external.SourceFileLoader("__main__", path)
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    os._exit(_run_main(path, main))


def _run_main(path: str, main: object) -> int:
    """Run the program as CPython's ``pymain_run_file`` does; its exit code."""
    code = 0
    try:
        source = _read_file(path)
        compiled = compile(source, path, "exec", dont_inherit=True)
        depth = _RECURSION
        shift = depth.shift_for_program(depth.read()) if depth is not None else 0
        try:
            exec(compiled, main.__dict__)
        finally:
            if depth is not None:
                depth.unshift(shift)
    except SystemExit as exc:
        code = _system_exit_code(exc)
    except BaseException as exc:
        tb = exc.__traceback__
        # Hide the launcher's own frame: the traceback starts at the program's <module>.
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        exc.__traceback__ = tb
        try:
            sys.excepthook(type(exc), exc, tb)
        except SystemExit as hook_exit:
            code = _system_exit_code(hook_exit)
        else:
            code = 1
        if isinstance(exc, KeyboardInterrupt):
            code = _finish(code)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            return 128 + signal.SIGINT
    return _finish(code)


def _read_file(path: str) -> bytes:
    """The file's bytes (see ``_read_all``)."""
    return _read_all(os.open(path, os.O_RDONLY | os.O_CLOEXEC))


def _system_exit_code(exc: SystemExit) -> int:
    value = exc.code
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    try:
        sys.stderr.write(f"{value}\n")
    except Exception:
        pass
    return 1


def _finish(code: int) -> int:
    """Interpreter shutdown as far as a program can see it: threads, atexit, flushing."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = 120
    return code


# -- the launcher loop ---------------------------------------------------------------------------------


class _CgroupLockWarmer:
    """Keeps the kernel's cgroup-move lock in the mode where taking it is cheap, while runs come.

    Every relay moves itself into its run's cgroups. A move takes a global lock (the cgroup
    threadgroup rwsem) whose first taker after a quiet spell waits for an RCU grace period, several
    milliseconds on a small VM; takers that follow within a grace period or two do not. So a run
    after 100 ms of quiet cost about 6 ms more than one right after another. For ``_WARM_FOR_S``
    after each run the launcher, when idle, rewrites its own pid into the cgroup it is already in
    every ``_WARM_EVERY_S`` (which moves nothing, but takes the lock). A little CPU while runs keep
    coming, none when they stop.
    """

    def __init__(self) -> None:
        self.procs_file: str | None = None
        self.until = 0.0
        self.pid = str(os.getpid()).encode()

    def ran(self, procs_file: str | None) -> None:
        if procs_file:
            self.procs_file = procs_file
            self.until = time.monotonic() + _WARM_FOR_S

    def timeout(self) -> float | None:
        """How long the launcher may wait for the next run before warming again."""
        return _WARM_EVERY_S if self.procs_file and time.monotonic() < self.until else None

    def warm(self) -> None:
        try:
            fd = os.open(self.procs_file, os.O_WRONLY)
            try:
                os.write(fd, self.pid)
            finally:
                os.close(fd)
        except OSError:
            self.procs_file = None  # not writable here after all: stop trying


def _forget_launcher_modules() -> None:
    """Give the module table back the shape of a fresh interpreter's, once, before any fork.

    The launcher keeps using the modules it imported (its functions hold them); a program that
    imports them gets new ones, as a fresh ``python <file>`` would.
    """
    for name in list(sys.modules):
        if name not in _BASELINE_MODULES:
            del sys.modules[name]


def _warm_up() -> None:
    """Do once, here, the lazy first-time work of the compiler and the io stack (a few
    milliseconds on a small VM) that every forked program would otherwise repeat."""
    import _frozen_importlib_external  # noqa: F401 - the loader class the programs' __main__ uses

    source = b"import sys\nvalue = [i * 2 for i in range(3)]\nprint(value, file=sys.stderr)\n"
    code = compile(source, "<mocksandbox-warm-up>", "exec", dont_inherit=True)
    sink = open(os.devnull, "w", encoding="utf-8", errors="strict", newline="\n")  # noqa: SIM115
    saved, sys.stderr = sys.stderr, sink
    try:
        exec(code, {"__name__": "__warm__", "__builtins__": __builtins__})
    finally:
        sys.stderr = saved
        sink.close()


def _open_missing_std_fds() -> None:
    """Put /dev/null on any of descriptors 0-2 the launcher was started without (a server run with
    ``2>&-``): otherwise the next pipe or dup would take that number and be mistaken for it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _serve(sock: _socket.socket) -> None:
    import gc
    import select

    global _PROGRAM_STDIO, _THREAD_STACKS
    _PROGRAM_STDIO = _make_program_stdio()
    _THREAD_STACKS = _ThreadStackDefault()
    _warm_up()
    # Relays say "a run just happened" on this pipe (see _CgroupLockWarmer); never blocking them.
    ran_r, ran_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    _forget_launcher_modules()
    # Everything the launcher holds now lives for its whole life: keep the collector away from it,
    # so that a forked program's first collection does not touch (and copy) every page it shares.
    gc.collect()
    gc.freeze()
    # Relays, and the orphans handed to the subreaper, are reaped by the kernel as they die.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    become_subreaper()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl-C is the server's business
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    warmer = _CgroupLockWarmer()
    # With worlds, each relay is the first process of a PID namespace of its own.
    own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC) if _WORLD_CONFIG else None
    if _USERS is not None:
        own_pid_namespace = _USERS
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(ran_r, select.POLLIN)
    while True:
        timeout = warmer.timeout()
        try:
            ready = poller.poll(None if timeout is None else timeout * 1000)
        except InterruptedError:
            continue
        if not ready:
            warmer.warm()
            continue
        for fd, _ in ready:
            if fd == ran_r:
                try:
                    while os.read(ran_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                warmer.ran(warmer.procs_file)
                continue
            try:
                received = _receive(sock, _RUN_FDS + 1)
            except InterruptedError:
                continue
            if received is None:
                return  # the server closed its end
            request, fds = received
            if request is None:
                continue
            in_world = request.get("world") is not None
            if in_world and _USERS_ERROR is not None:
                try:
                    os.write(fds[2], f"mocksandbox launcher: {_USERS_ERROR}\n".encode())
                except OSError:
                    pass
                _report_launch_error(fds[3], 1)
                _close_all(fds)
                continue
            try:
                # A relay serves runs of one kind: in worlds (it lives in one) or on the host.
                pid = _fork_relay(own_pid_namespace if in_world else None)
            except OSError as exc:
                if in_world:
                    try:
                        os.write(fds[2], f"mocksandbox launcher: cannot start a relay: {exc}\n".encode())
                    except OSError:
                        pass
                _report_launch_error(fds[3], exc.errno)
                _close_all(fds)
                continue
            if pid == 0:
                try:
                    sock.close()
                    os.close(ran_r)
                    relay_sock = _socket.socket(fileno=fds[4])
                    _relay(relay_sock, request, fds[:4], ran_w)
                except BaseException as exc:
                    _say_fault("that ended it", exc)
                    _report_launch_error(fds[3], getattr(exc, "errno", None))
                finally:
                    os._exit(0)
            warmer.ran(request.get("warm_procs_file"))
            _close_all(fds)


def _fork_relay(own_pid_namespace: "int | _RunUsers | None") -> int:
    """Fork a relay: with worlds, as PID 1 of a new PID namespace (``unshare`` sets where the
    launcher's next child goes; ``setns`` puts it back, so the launcher itself never moves).
    With the runs' own user namespace (``_RunUsers``), a child joins it and forks the relay there,
    then leaves: the relay's PID namespace must belong to that user namespace."""
    if own_pid_namespace is None:
        return os.fork()
    if isinstance(own_pid_namespace, _RunUsers):
        # The child says on this pipe why it could not start the relay (an errno), or closes it.
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            try:
                own_pid_namespace.become_root(_SYSCALLS)
                relay = os.fork()
            except BaseException as exc:
                os.write(write_end, str(getattr(exc, "errno", 0) or 0).encode())
                os._exit(1)
            if relay == 0:
                os.close(write_end)
                return 0
            os._exit(0)
        os.close(write_end)
        try:
            said = os.read(read_end, 64)
        finally:
            os.close(read_end)
        if said:
            raise OSError(int(said), "cannot start a relay in the runs' user namespace")
        return pid
    _SYSCALLS.unshare(_CLONE_NEWPID)
    try:
        pid = os.fork()
    except BaseException:
        _SYSCALLS.setns(own_pid_namespace, _CLONE_NEWPID)
        raise
    if pid == 0:
        os.close(own_pid_namespace)
    else:
        _SYSCALLS.setns(own_pid_namespace, _CLONE_NEWPID)
    return pid


#: The libc calls, bound once in the launcher where ctypes is (worlds need them; warm Python
#: programs use them for their command line).
_SYSCALLS: "_Syscalls | None" = None
#: The interpreter's recursion count, which forked programs start at a fresh one's (see the class).
_RECURSION: "_RecursionDepth | None" = None


if __name__ == "__main__":
    _open_missing_std_fds()
    if ctypes is not None:
        _SYSCALLS = _Syscalls()
    _RECURSION = _RecursionDepth()
    _RECURSION.measure(_RECURSION.read())  # read here, at module level: see measure()
    for option in sys.argv[2:]:
        if option.startswith("--cpus="):
            _PROGRAM_CPUS = {int(cpu) for cpu in option.removeprefix("--cpus=").split(",")}
        elif option.startswith("--world-fd="):
            # On a pipe, not on the command line: a program must not read in its /proc/self/cmdline
            # (the launcher's, for a forked one) what is hidden from it.
            _WORLD_CONFIG = json.loads(_read_all(int(option.removeprefix("--world-fd="))))
            if _WORLD_CONFIG.get("userns") is not None:
                try:
                    _USERS = _RunUsers(_WORLD_CONFIG, _SYSCALLS)
                except OSError as exc:
                    _USERS_ERROR = f"cannot make the runs' user namespace: {exc}"
    server_socket = _socket.socket(fileno=int(sys.argv[1]))
    if _WORLD_CONFIG is not None and _WORLD_CONFIG.get("userns") is not None:
        # Ready: the server may now write the runs' files where the relays will see them.
        server_socket.send(b"ready")
    _serve(server_socket)
