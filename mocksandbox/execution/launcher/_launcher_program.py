"""The start of a run's program, in the process a relay forked for it: its session, cgroups,
limits, stdio and world, then the program itself.

Two modes of program:

``exec``    the program ``execve``s ``/bin/bash -c <command>`` (every language; the plain spawn);
``python``  the program is this warm interpreter itself, turned into ``python <file>``
            (``_launcher_python``): it skips the interpreter's start-up (tens of milliseconds)
            for a fork (well under one).
"""

import _signal
import os

import _launcher_state as state
from _launcher_limits import apply_memory_limit, apply_rlimits
from _launcher_protocol import close_all, report_launch_error
from _launcher_python import become_python_program, prepare_python_program

_MAX_FDS = 65536
#: Dispositions the launcher changes (or CPython set at start-up) that a new program must not
#: inherit: ignored signals stay ignored across exec.
_RESET_FOR_EXEC = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGCHLD, _signal.SIGPIPE, _signal.SIGXFSZ)


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


def _install_stdio(fds: list) -> None:
    for target, fd in enumerate(fds):
        if fd != target:
            os.dup2(fd, target)
    os.closerange(3, _MAX_FDS)


def prepare_program(request: dict) -> tuple:
    """In the relay, before its fork: what the program will need made already (each page the
    program writes is a copy, about 2.5 µs with its fault; what the relay writes before its fork is
    not): the run's ``cgroup.procs`` files opened, for the program to join by writing ``0`` (the
    writer itself) to each, and a Python program's ``__main__``, ``argv``, ``sys.path[0]`` and,
    where its source came with the run, its code (``_launcher_python.prepare_python_program``).
    The relay closes the files once it has forked (:func:`forget_program`); an ``OSError`` if one
    cannot be opened, said as the program would have said it (:func:`say_cannot_start`)."""
    procs: list = []
    try:
        for path in request["cgroup_procs"]:
            procs.append(os.open(path, os.O_WRONLY | os.O_CLOEXEC))
        python = None
        if request["mode"] == "python":
            python = prepare_python_program(request["file"], request.get("source"))
    except BaseException:
        close_all(procs)
        raise
    return procs, python


def forget_program(prepared: tuple) -> None:
    """In the relay, once it has forked: its copies of what :func:`prepare_program` opened."""
    close_all(prepared[0])


def say_cannot_start(fds: list, exc: BaseException) -> None:
    """Why the run never started: on its stderr first, then said on its status pipe."""
    try:
        os.write(fds[2], f"mocksandbox launcher: cannot start the run: {exc}\n".encode())
    except OSError:
        pass
    report_launch_error(fds[3], getattr(exc, "errno", None))


def start_program(request: dict, fds: list, prepared: tuple) -> None:
    """In the forked program: its own session, the run's cgroups and stdio, then the program
    itself (``execve``, or this interpreter turned into ``python <file>``); never returns.
    ``prepared``: what :func:`prepare_program` made for it before the fork."""
    status_fd = fds[3]
    try:
        if state.PROGRAM_CPUS is not None:
            os.sched_setaffinity(0, state.PROGRAM_CPUS)
        os.setsid()
        if request.get("world") is None or not state.WORLD.users:  # (else its relay's, inherited)
            _prefer_for_oom_kill()
        # Joined here, by the program, rather than by the relay: the relay stays outside the run's
        # groups and can serve the next run. Nothing runs in the program before this line.
        for procs in prepared[0]:
            os.write(procs, b"0")
        apply_rlimits(request.get("rlimits", ()))
        if request.get("world") is not None:
            state.WORLD.enter(request["cwd"])
        else:
            _signal.signal(_signal.SIGIO, _signal.SIG_DFL)  # the relay's, not the program's
            if state.SYSCALLS is not None:
                state.SYSCALLS.set_command_line()  # where this program may (root): as in a world
    except BaseException as exc:
        try:
            say_cannot_start(fds, exc)
        finally:
            os._exit(0)
    try:
        os.close(status_fd)
        _install_stdio(fds[:3])
        if prepared[1] is not None:
            become_python_program(request, prepared[1])
        # A new program starts with default dispositions and nothing blocked.
        for sig in _RESET_FOR_EXEC:
            _signal.signal(sig, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
        apply_memory_limit(request.get("memory_limit_mb", -1))
        if request.get("world") is None:  # (a world's program is in its dir already: World.enter)
            os.chdir(request["cwd"])
        # No "env": the launcher's own environment, which the server found equal to the run's.
        env = request["env"] if request["env"] is not None else os.environ
        os.execve(request["argv"][0], request["argv"], env)
    except BaseException as exc:
        try:
            os.write(2, f"mocksandbox launcher: cannot start the program: {exc}\n".encode())
        finally:
            os._exit(127)
