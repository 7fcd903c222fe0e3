"""A relay: forked by the launcher, it forks one program per run, in a new session, made the OOM
killer's first choice and moved into the run's cgroups, waits for it and reports its wait status.

A relay serves one run at a time and many runs in its life: the server keeps the idle ones and
sends a run straight to one of them, so a run costs one fork and no hop through the launcher; only
when no relay is idle does the server send the run to the launcher, which forks a new relay for it
(``_launcher_serve``). A relay of a world lives in namespaces of its own, as PID 1 of its own PID
namespace, and mounts each run's root before the fork (``_launcher_world``). Such relays serve
only such runs; the others go to plain relays.

Why a relay between the launcher and each program: a program that kills its parent must not kill
the server, nor the launcher: it kills its relay only, and that run alone reports -9.
"""

import _signal
import _socket
import os

import _launcher_state as state
from _launcher_program import forget_program, prepare_program, say_cannot_start, start_program
from _launcher_protocol import (
    RUN_FDS,
    STATUS_EXIT,
    STATUS_PID,
    close_all,
    receive,
    report_launch_error,
    write_all,
)
from _launcher_watch import end_the_run, kill_host_program, say_ended_by_relay, unwatch_server, watch_server
from _launcher_world import World


def run_relay(sock: _socket.socket, first: list, fds: list, ran_fd: int) -> None:
    """A relay's life: the run it was forked for (``first``: a list of its request, which this
    takes out), then each run the server sends on ``sock``, one at a time, until the server closes
    it; never returns."""
    request = first.pop()
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # the launcher ignores it; we must wait
    state.RELAY_SOCKET = sock
    state.RELAY_PID = os.getpid()
    _signal.signal(_signal.SIGIO, end_the_run)  # (a world's relay sets it again, as its PID 1)
    if state.WORLD_CONFIG is not None and request.get("world") is not None:
        try:
            state.WORLD = World(state.WORLD_CONFIG, state.SYSCALLS, state.USERS)
        except OSError as exc:
            # No world, no runs: this one is told why (on its stderr) and the relay leaves.
            try:
                os.write(fds[2], f"mocksandbox launcher: cannot make the run's world: {exc}\n".encode())
            finally:
                report_launch_error(fds[3], exc.errno)
                os._exit(0)
    while True:
        _relay_one_run(request, fds, sock)
        try:  # "a run just happened": the launcher keeps the cgroup lock warm (CgroupLockWarmer)
            os.write(ran_fd, b".")
        except OSError:
            pass  # full (the launcher will wake anyway) or the launcher is gone
        while True:
            try:
                received = receive(sock, RUN_FDS)
            except OSError:
                received = None
            if received is None:
                if state.WORLD is not None:
                    # (On the runs' file system, which outlives us: its kept root's upper layer,
                    # and its mask where it keeps it there.)
                    state.WORLD.drop_kept()
                    state.WORLD.drop_mask()
                os._exit(0)  # the server closed our socket: it will send no more runs
            request, fds = received
            if request is not None:
                break


def _relay_one_run(request: dict, fds: list, sock: _socket.socket) -> None:
    """Start the run's program, report its pid (on the host) and, once it has exited, its wait
    status.

    A world's relay does everything it can before the fork (its watch on the server armed, the
    status pipe named for ``end_the_run``) and nothing but wait while the program lives: each page
    either writes while both share their pages is copied, for the writer, and the relay's copies of
    the program's stdio close once it has exited. It says no pid: the server ends a world's run by
    its cgroup or by letting its relay go (``_launcher_watch``), never by a pid of its namespace.
    A run on the host says its pid at once: the server may have to kill the program by it."""
    status_fd = fds[3]
    world = request.get("world")
    watching = server_gone = False
    try:
        if world is not None:
            if state.WORLD is None:
                raise OSError(95, "this launcher makes no worlds")  # EOPNOTSUPP
            state.WORLD.mount_run(world, request["cwd"])
            state.WORLD.reaper.before_run()
        state.THREAD_STACKS.prepare(request)
        if state.SYSCALLS is not None:  # (an exec'ed program gets its command line from execve)
            state.SYSCALLS.prepare_command_line(
                ["python", request["file"]] if request["mode"] == "python" else None
            )
        try:
            prepared = prepare_program(request)
        except OSError as exc:
            if world is not None:
                state.WORLD.unmount_run()
            say_cannot_start(fds, exc)
            close_all(fds)
            return
        if world is not None:
            state.WATCHED_STATUS_FD = status_fd
            watching = True
            server_gone = watch_server(sock)
        try:
            pid = state.SYSCALLS.fork() if state.SYSCALLS is not None else os.fork()
        except BaseException:
            forget_program(prepared)
            raise
    except Exception as exc:  # EAGAIN: the host's or the server's process budget is spent
        if watching:
            state.WATCHED_STATUS_FD = None
            unwatch_server(sock)
        if not isinstance(exc, OSError):
            say_fault("before its fork", exc)
        if world is not None:
            try:  # why, first: the server reads it once the failure is reported
                os.write(fds[2], f"mocksandbox launcher: cannot make the run's world: {exc}\n".encode())
            except OSError:
                pass
            if state.WORLD is not None:
                state.WORLD.unmount_run()
        report_launch_error(status_fd, getattr(exc, "errno", None))
        close_all(fds)
        return
    if pid == 0:
        start_program(request, fds, prepared)
    forget_program(prepared)
    nothing_left = False
    try:
        if world is not None:
            try:
                status = state.WORLD.reaper.wait_for_program(pid, sock, server_gone)
            finally:
                close_all(fds[:3])
        else:
            close_all(fds[:3])
            state.WATCHED_STATUS_FD = status_fd
            write_all(status_fd, STATUS_PID + pid.to_bytes(8, "little"))
            status = _wait_for_on_host(pid, sock)
        try:
            if world is not None:
                _end_what_the_program_left(world)
                nothing_left = True
        except Exception as exc:  # (how the program ended is known: it is said all the same)
            say_fault("after its program ended", exc)
        write_all(status_fd, STATUS_EXIT + status.to_bytes(8, "little", signed=True))
        kept = state.WORLD.kept if world is not None else None
        if nothing_left and kept is not None and kept.cwd is not None:
            # Its dir goes once the exit is said (its time is not the run's: a program that left
            # many files does not go past its deadline for it) and before the status pipe closes,
            # which the server waits for (it then finds the dir gone: it reuses no dir of a kept
            # root), and before this relay takes another run into this root.
            kept.run_dir_gone = kept.remove_run_dir(request.get("file"))
    except OSError:
        pass  # the server gave up on this run (it closed its end): nobody to tell
    finally:
        state.WATCHED_STATUS_FD = None
        if world is not None and not nothing_left:
            state.WORLD.reaper.reap()
        os.close(status_fd)
        if world is not None:
            state.WORLD.unmount_run()  # (the next run of this relay waits for it)
            # (Where some of the run's processes may live on, what they may yet make is not
            # counted now: a new namespace all the same.)
            if not nothing_left or state.WORLD.ipc.left():
                try:
                    state.WORLD.ipc.renew()  # (here, after the answer, rather than before the next run)
                except OSError:
                    pass  # tried again before the next run, which fails if it fails again


def _end_what_the_program_left(world: dict) -> None:
    """Once a world's program has exited: what it left is killed, and its root unmounted where
    that must come before the answer."""
    if state.WORLD.reaper.anything_left():
        # Nothing the program started outlives it (as its cgroup's kill would see to, where
        # there is one): this relay is PID 1 of the run's namespace, -1 is all the rest of it.
        try:
            os.kill(-1, _signal.SIGKILL)
        except OSError:
            pass  # nothing left
        # Once they are gone, the run's files change no more: the server, told the run is
        # over when the status pipe closes, reads them and removes them at once.
        state.WORLD.reaper.reap(until_gone=True)
    if state.WORLD.kept is not None and state.WORLD.kept.cwd is not None:
        return  # (its dir goes once the exit is said; its root is checked after the answer)
    # The run's root is unmounted once the answer is on its way, where nothing needs it
    # sooner: a later command of the request stacks its layer over this one's (which must not
    # be an upper layer then), and the space the run's files took on the runs' tmpfs comes
    # back only when they are unmounted (a run that filled it must not cost the next request
    # an ENOSPC).
    if not (world.get("last") and _space_to_spare(world["upper"])):
        state.WORLD.unmount_run()


def _space_to_spare(path: str) -> bool:
    """Whether the file system of ``path`` (the runs' tmpfs) has more than half its space free."""
    try:
        sizes = os.statvfs(path)
    except OSError:
        return False
    return sizes.f_bavail * 2 > sizes.f_blocks


def say_fault(when: str, exc: BaseException) -> None:
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
    here (see _launcher_watch.end_the_run).

    The group is killed while the program is a zombie not yet reaped: until then its pid, which
    is its group's id, cannot go to another process. Once reaped, a kill of the group by that id
    (as the server's process-group jail would make) could reach whoever took the number,
    anywhere on the host; so the pid is forgotten before the reap."""
    state.WATCHED_PID = pid
    try:
        if watch_server(sock):
            say_ended_by_relay(0)
            kill_host_program(pid)  # the server left before we watched
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
        state.WATCHED_PID = None  # (before the reap: a SIGIO from here on must not kill by this pid)
        while True:
            try:
                return os.waitpid(pid, 0)[1]
            except InterruptedError:
                continue
            except ChildProcessError:
                return 255 << 8
    finally:
        state.WATCHED_PID = None
        unwatch_server(sock)
