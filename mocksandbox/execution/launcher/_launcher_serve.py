"""The launcher's loop: it takes runs from the server and forks a relay for each run no idle relay
took (``_launcher_relay``), and keeps cgroup moves fast while runs come (:class:`CgroupLockWarmer`).

The launcher is the *child subreaper* of everything it starts, with ``SIGCHLD`` ignored: a
program's orphans (a fork bomb's, once their parents are killed) are handed to it and the kernel
reaps them the moment they die. Otherwise they would go to the machine's init, which may take its
time, and until then every zombie still counts against the ``pids.max`` of the run's cgroup and of
every cgroup above it, the server's own included.

With worlds (``--world-fd``), a run whose request carries ``world`` is sent to a relay that lives
in namespaces of its own, forked as PID 1 of its own PID namespace (:func:`fork_relay`).
"""

import _signal
import _socket
import os
import time

import _launcher_state as state
from _launcher_limits import ThreadStackDefault
from _launcher_protocol import RUN_FDS, close_all, receive, report_launch_error
from _launcher_python import forget_launcher_modules, make_program_stdio, warm_up
from _launcher_relay import run_relay, say_fault
from _launcher_syscalls import CLONE_NEWPID, become_subreaper
from _launcher_users import RunUsers

#: Keeping cgroup moves fast (see ``CgroupLockWarmer``): how long after a run, and how often.
_WARM_FOR_S = 10.0
_WARM_EVERY_S = 0.02


class CgroupLockWarmer:
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

    def ran(self, procs_file: "str | None") -> None:
        if procs_file:
            self.procs_file = procs_file
            self.until = time.monotonic() + _WARM_FOR_S

    def timeout(self) -> "float | None":
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


class RelayCores:
    """Each relay kept to one core, the relays spread over the launcher's cores in turn, and
    their programs given back every core (``state.PROGRAM_CPUS``).

    A relay writes what its program needs (its code, its request) just before it forks it; the
    program's first work is to read those pages, and to copy each one it writes. Left to itself,
    the kernel puts each new process on the idlest core, where the program then reads the relay's
    pages from the other core's cache. A relay kept to one core has its program start where they
    are: about 2% less CPU a run, measured on this project's 2-core VM (verl-like runs, A/B at
    concurrency 16 in both orders; as much at concurrency 1). The program is put back on every
    core the server may use before anything of the user's runs, as a spawned program has them
    (``os.sched_getaffinity``, ``nproc``); a relay, which works a few hundred microseconds a run,
    waits its turn on its core. Nothing is kept where the launcher has one core, or may not set
    affinities, or was told to let relays roam (``--relays-roam``: the setting ``pin_workers:
    false``, for cores that other busy processes share)."""

    def __init__(self) -> None:
        #: The cores relays are kept to in turn (none: relays are left where they are).
        self.cores: list = []
        self._next = 0
        try:
            own = sorted(os.sched_getaffinity(0))
            if len(own) > 1 and not state.RELAYS_ROAM:
                os.sched_setaffinity(0, own)  # (what programs are given back: allowed here)
                self.cores = own
        except OSError:
            pass
        if self.cores and state.PROGRAM_CPUS is None:
            state.PROGRAM_CPUS = set(self.cores)

    def next_core(self, asked: "int | None" = None) -> "int | None":
        """The core of the relay about to be forked (in the launcher): the one ``asked`` for by the
        server (the core its thread runs on: ``Launcher.launch``), else the next in turn; or
        ``None``."""
        if not self.cores:
            return None
        if asked in self.cores:
            return asked
        core = self.cores[self._next % len(self.cores)]
        self._next += 1
        return core

    @staticmethod
    def keep_to(core: "int | None") -> None:
        """In a new relay: keep to ``core`` (best effort: a relay left to move only costs more)."""
        if core is not None:
            try:
                os.sched_setaffinity(0, (core,))
            except OSError:
                pass


def open_missing_std_fds() -> None:
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


def serve(sock: _socket.socket, baseline_modules: frozenset) -> None:
    """Serve the server on ``sock`` until it closes its end. ``baseline_modules``: the module table
    of a fresh ``python <file>``, which forked Python programs get back."""
    import gc
    import select

    state.PROGRAM_STDIO = make_program_stdio()
    state.THREAD_STACKS = ThreadStackDefault()
    state.RELAY_CORES = RelayCores()
    warm_up()
    # Relays say "a run just happened" on this pipe (see CgroupLockWarmer); never blocking them.
    ran_r, ran_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    forget_launcher_modules(baseline_modules)
    # Everything the launcher holds now lives for its whole life: keep the collector away from it,
    # so that a forked program's first collection does not touch (and copy) every page it shares.
    gc.collect()
    gc.freeze()
    if state.SYSCALLS is not None:
        state.SYSCALLS.trim_heap()
    # Relays, and the orphans handed to the subreaper, are reaped by the kernel as they die.
    _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)
    become_subreaper()
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # the server's Ctrl-C is the server's business
    _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)
    warmer = CgroupLockWarmer()
    # With worlds, each relay is the first process of a PID namespace of its own.
    own_pid_namespace = (
        os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC) if state.WORLD_CONFIG else None
    )
    if state.USERS is not None and not state.USERS.programs_join:
        own_pid_namespace = state.USERS  # (else relays stay the host's root: their programs join it)
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
                received = receive(sock, RUN_FDS + 1)
            except InterruptedError:
                continue
            if received is None:
                return  # the server closed its end
            request, fds = received
            if request is None:
                continue
            in_world = request.get("world") is not None
            if in_world and state.USERS_ERROR is not None:
                try:
                    os.write(fds[2], f"mocksandbox launcher: {state.USERS_ERROR}\n".encode())
                except OSError:
                    pass
                report_launch_error(fds[3], 1)
                close_all(fds)
                continue
            core = state.RELAY_CORES.next_core(request.get("core"))
            try:
                # A relay serves runs of one kind: in worlds (it lives in one) or on the host.
                pid = fork_relay(own_pid_namespace if in_world else None)
            except OSError as exc:
                if in_world:
                    try:
                        os.write(fds[2], f"mocksandbox launcher: cannot start a relay: {exc}\n".encode())
                    except OSError:
                        pass
                report_launch_error(fds[3], exc.errno)
                close_all(fds)
                continue
            if pid == 0:
                try:
                    RelayCores.keep_to(core)
                    sock.close()
                    os.close(ran_r)
                    relay_sock = _socket.socket(fileno=fds[4])
                    # The run goes to the relay in a list it empties, not in this frame's names:
                    # this frame lives as long as the relay, and its later programs could reach
                    # this run's request (its source) through it.
                    first = [request]
                    request = received = None
                    run_relay(relay_sock, first, fds[:4], ran_w)
                except BaseException as exc:
                    say_fault("that ended it", exc)
                    report_launch_error(fds[3], getattr(exc, "errno", None))
                finally:
                    os._exit(0)
            warmer.ran(request.get("warm_procs_file"))
            close_all(fds)


def fork_relay(own_pid_namespace: "int | RunUsers | None") -> int:
    """Fork a relay: with worlds, as PID 1 of a new PID namespace (``unshare`` sets where the
    launcher's next child goes; ``setns`` puts it back, so the launcher itself never moves).
    With the runs' own user namespace (``RunUsers``), a child joins it and forks the relay there,
    then leaves: the relay's PID namespace must belong to that user namespace."""
    if own_pid_namespace is None:
        return os.fork()
    if isinstance(own_pid_namespace, RunUsers):
        # The child says on this pipe why it could not start the relay (an errno), or closes it.
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            try:
                own_pid_namespace.become_root(state.SYSCALLS)
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
    users = state.USERS
    if users is not None and state.WORLD_CONFIG.get("network", "private") == "private":
        # Relays that stay the host's root (their programs join the runs' user namespace): a network
        # namespace of that user namespace, made here, where its maker takes no pid of the relay's.
        users.network = users.make_network(state.SYSCALLS)
    state.SYSCALLS.unshare(CLONE_NEWPID)
    try:
        pid = os.fork()
    except BaseException:
        state.SYSCALLS.setns(own_pid_namespace, CLONE_NEWPID)
        _forget_network(users)
        raise
    if pid == 0:
        os.close(own_pid_namespace)
    else:
        state.SYSCALLS.setns(own_pid_namespace, CLONE_NEWPID)
        _forget_network(users)  # (the relay has it)
    return pid


def _forget_network(users: "RunUsers | None") -> None:
    if users is not None and users.network is not None:
        os.close(users.network)
        users.network = None
