"""A relay's watch on the server while a program runs: SIGIO when the server's end of the relay's
socket closes, and the run ended by the relay itself (:func:`end_the_run`).

While a program runs, the relay's socket is in async mode (:func:`watch_server`): if the server
lets the run go (its deadline passed before it could kill the program itself) or dies, its end
closes, the kernel sends SIGIO, and the relay ends the run: on the host, the program's process
group; in a world, every process of the run's PID namespace, then the relay. It says so on the
run's status pipe first (``b"K"``, :func:`say_ended_by_relay`).
"""

import _signal
import _socket
import fcntl as _fcntl
import os

import _launcher_state as state
from _launcher_protocol import STATUS_ENDED_BY_RELAY


def say_ended_by_relay(why: int) -> None:
    """Tell the server, on the run's status pipe, that this relay ends the run itself."""
    if state.WATCHED_STATUS_FD is not None:
        try:
            os.write(state.WATCHED_STATUS_FD, STATUS_ENDED_BY_RELAY + why.to_bytes(8, "little", signed=True))
        except OSError:
            pass


def server_left(sock: _socket.socket) -> bool:
    """Whether the server closed its end of the relay's socket ``sock`` (it reads as closed),
    without waiting and without taking a message that may be there."""
    try:
        return sock.recv(1, _socket.MSG_PEEK | _socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False  # still there, nothing sent: the usual case
    except OSError:
        return True  # (reset: gone all the same)


def watch_server(sock: _socket.socket) -> bool:
    """Put the relay's socket ``sock`` in async mode (SIGIO when the server's end closes), while a
    program runs; whether the server had left already (closed before we watched: no SIGIO)."""
    fd = sock.fileno()
    if state.RELAY_SOCKET_FLAGS is None:  # (a relay has one socket, for its whole life)
        _fcntl.fcntl(fd, _fcntl.F_SETOWN, os.getpid())
        flags = _fcntl.fcntl(fd, _fcntl.F_GETFL) & ~os.O_ASYNC
        state.RELAY_SOCKET_FLAGS = (flags | os.O_ASYNC, flags)
    _fcntl.fcntl(fd, _fcntl.F_SETFL, state.RELAY_SOCKET_FLAGS[0])
    return server_left(sock)


def unwatch_server(sock: _socket.socket) -> None:
    if state.RELAY_SOCKET_FLAGS is not None:
        _fcntl.fcntl(sock.fileno(), _fcntl.F_SETFL, state.RELAY_SOCKET_FLAGS[1])


def kill_host_program(pid: int) -> None:
    """Kill our unreaped child ``pid`` and its process group (it may not have made one yet)."""
    for kill in (os.kill, os.killpg):
        try:
            kill(pid, _signal.SIGKILL)
        except OSError:
            pass


def end_the_run(signum: int, frame: object) -> None:
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
    ignores it too. A program whose relay forked it with that signal pending (``Syscalls.fork``)
    runs this handler until it sets its own: there it does nothing."""
    if os.getpid() != state.RELAY_PID or state.RELAY_SOCKET is None:
        return
    if not server_left(state.RELAY_SOCKET):
        return
    say_ended_by_relay(signum)
    if state.WATCHED_PID is not None:  # a run on the host: never -1, which is every process we may signal
        kill_host_program(state.WATCHED_PID)
        return
    world = state.WORLD
    if world is None:
        return
    os.kill(-1, _signal.SIGKILL)
    world.reaper.reap(until_gone=True)
    world.drop_kept()
    os._exit(1)
