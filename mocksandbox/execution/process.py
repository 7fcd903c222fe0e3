"""Run one command the way SandboxFusion does, without its failure modes.

As in SandboxFusion: ``/bin/bash -c <command>`` in the temp dir, a new session, the server's
environment, stdin written then closed (``None`` closes it at once), a wall-clock timeout that
yields ``TimeLimitExceeded`` with ``return_code: null`` and whatever the program had flushed, and
negative return codes for signals.

Beyond it: stdout and stderr are drained while the program runs and each is capped, so no program
blocks on a full pipe; every process the run started is killed when it ends (SandboxFusion leaves
orphans); and programs are started by a relay of the launcher (``launcher/``), never by forking
the server: a program that kills its parent takes down only that relay (the run then reports -9).
In ``fork`` mode, Python programs skip the interpreter start-up.
"""

from __future__ import annotations

import errno
import math
import os
import select
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from mocksandbox import divergence
from mocksandbox.divergence import SANDBOXFUSION_READER_PAUSE_BYTES
from mocksandbox.execution.confinement import Confinement, ProcessGroupJail, RunJail
from mocksandbox.execution.launcher import Launcher, close_quietly
from mocksandbox.execution.run_gate import RunGate
from mocksandbox.models import CommandRunResult, CommandRunStatus

_READ_CHUNK = 64 * 1024
_WRITE_CHUNK = 64 * 1024
#: What a new, empty pipe takes at least (a page; 64 KiB unless the user's pipes are over
#: ``fs.pipe-user-pages-soft``): a write of no more is never left waiting.
_PIPE_LEAST_CAPACITY = 4096
#: What SandboxFusion's event loop (uvloop) reads from a stream at a time.
_SANDBOXFUSION_READ_CHUNK = 256 * 1024
#: The send buffer of the program's end of its stdout and stderr sockets (output mode
#: ``sandboxfusion``): Linux's default (``net.core.wmem_default``), which SandboxFusion's sockets
#: had where its recordings were made. Once its reader pauses, this decides how much more a
#: program can write before it blocks, and how the kernel splits one large write (into pieces of
#: at most half of it): set on every run, not inherited from the host's setting. (An AF_UNIX
#: stream queues against the sender's buffer only: the reading end's SO_RCVBUF plays no part.)
SANDBOXFUSION_SEND_BUFFER = 212992
#: ``SO_SNDBUFFORCE`` (Linux; not in Python's socket module): SO_SNDBUF past ``net.core.wmem_max``,
#: for a process with CAP_NET_ADMIN.
_SO_SNDBUFFORCE = 32
#: How long to keep reading pipes after the run ended and its processes were killed.
_DRAIN_GRACE_S = 2.0
#: How long a relay may take to close the status pipe after reporting the program's exit.
_RELAY_DONE_GRACE_S = 0.5


@dataclass
class CapturedStream:
    """Bytes read from one pipe, keeping at most ``cap`` of them; with ``pause_above``, no more
    is read once more than that many are held (SandboxFusion's reader, see ``_launch``)."""

    cap: int
    data: bytearray
    truncated: bool = False
    pause_above: int | None = None

    def feed(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room >= len(chunk):
            self.data += chunk
        else:
            if room > 0:
                self.data += chunk[:room]
            self.truncated = True

    def text(self) -> str:
        """Decoded as SandboxFusion decodes: UTF-8, or a ``[DecodeError] ...`` line in its place."""
        raw = bytes(self.data)
        if self.truncated:
            raw = _trim_partial_utf8(raw)
        return decode_output(raw)


def decode_output(raw: bytes) -> str:
    """UTF-8 text, or SandboxFusion's ``[DecodeError] <reason>`` in place of the whole stream."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"[DecodeError] {exc}"


def _trim_partial_utf8(raw: bytes) -> bytes:
    """Drop an incomplete multi-byte character that the output cap cut in two."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0b1100_0000 != 0b1000_0000:  # a lead byte or ASCII
            expected = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return raw[:-back] if expected > back else raw
    return raw


@dataclass(frozen=True)
class CommandSpec:
    """One command to run."""

    command: str
    cwd: str
    env: Mapping[str, str]
    stdin: bytes | None
    timeout: float
    memory_limit_mb: int = -1
    #: Run this Python file in a forked warm interpreter instead of ``command`` (fork mode).
    python_file: str | None = None
    #: What ``python_file`` holds, sent with the run for its relay to compile before its fork (a
    #: small one only: see ``Launcher.launch``); ``None``: the program reads and compiles its file.
    python_source: str | None = None
    #: The run's layers (isolation lite, see ``world.py``): its relay mounts them as the program's
    #: root; ``None``: the program runs in the host's file system.
    world: Mapping[str, Any] | None = None
    #: ``complete`` (streams drained, kept up to the cap) or ``sandboxfusion`` (SandboxFusion's
    #: reader: see :meth:`ProcessRunner._launch`).
    output_mode: str = "complete"


#: ``return_code`` when the relay died before reporting (a program killed its parent): SIGKILL.
RELAY_KILLED = -9


#: Launch errors worth another try: the process budget (``pids.max``, ``RLIMIT_NPROC``) or memory
#: was spent for a moment, typically by a fork bomb beside this run, and comes back when it ends.
_RETRYABLE_LAUNCH_ERRORS = frozenset({errno.EAGAIN, errno.ENOMEM})
#: Back-off between attempts to start a run, doubling from the first to the last.
_LAUNCH_RETRY_FIRST_S = 0.005
_LAUNCH_RETRY_MAX_S = 0.25


class LaunchError(RuntimeError):
    """A run that could not be started; the message says why (the run reports an ``Error``)."""

    def __init__(self, error: int, attempts: int, waited: float, detail: str = "") -> None:
        self.errno = error
        cause = f"[Errno {error}] {os.strerror(error)}" if error else "the launcher could not start it"
        retried = f" (tried {attempts} times over {waited:.2f} s)" if attempts > 1 else ""
        budget = (
            ": no process or memory left in this server's budget" if error in _RETRYABLE_LAUNCH_ERRORS else ""
        )
        said = f" ({detail})" if detail else ""
        super().__init__(f"cannot start the program{budget}, {cause}{said}{retried}")


class _LaunchFailed(Exception):
    """The relay or the launcher reported (``E``) that the run could not be started; ``detail``:
    what it said why on the run's stderr (``mocksandbox launcher: ...``)."""

    def __init__(self, error: int, detail: str = "") -> None:
        super().__init__(error)
        self.errno = error
        self.detail = detail


class _StatusReader:
    """Parses the relay's status pipe: ``P`` + pid (runs on the host only), then ``S`` + wait
    status (or ``E`` + errno); ``K`` + a signal number before either when the relay ended the run
    itself."""

    def __init__(self) -> None:
        self.buffer = b""
        self.pid: int | None = None
        self.wait_status: int | None = None
        self.launch_error: int | None = None
        #: The relay ended the run itself, woken by this signal (0: its socket read as closed).
        self.ended_by_relay: int | None = None

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        while len(self.buffer) >= 9:
            kind, value = self.buffer[:1], self.buffer[1:9]
            self.buffer = self.buffer[9:]
            if kind == b"P":
                self.pid = int.from_bytes(value, "little")
            elif kind == b"S":
                self.wait_status = int.from_bytes(value, "little", signed=True)
            elif kind == b"E":
                self.launch_error = int.from_bytes(value, "little", signed=True)
            elif kind == b"K":
                self.ended_by_relay = int.from_bytes(value, "little", signed=True)

    def return_code(self) -> int:
        if self.wait_status is None:
            return RELAY_KILLED
        return os.waitstatus_to_exitcode(self.wait_status)


def _set_send_buffer(sock: socket.socket, size: int) -> None:
    """Give ``sock`` a send buffer of ``size`` bytes, whatever the host's default: beyond
    ``net.core.wmem_max`` where this process may (CAP_NET_ADMIN), else up to it (the kernel
    doubles the value it is given, for its bookkeeping, and reports the doubled one)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, size // 2)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size // 2)


def _kill_program_and_group(pid: int) -> None:
    """SIGKILL a run's program by its pid, and its process group (which it may not have made yet:
    it makes it first thing after its fork)."""
    for kill in (os.kill, os.killpg):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _write_some(fd: int, pending: memoryview) -> memoryview:
    """Write what the pipe ``fd`` takes of ``pending`` (a chunk at most) without waiting: ``fd`` is
    non-blocking, or ``pending`` is a page or less and the pipe new and empty; what is left to
    write (nothing once the reader is gone: a program need not read its stdin)."""
    try:
        return pending[os.write(fd, pending[:_WRITE_CHUNK]) :]
    except BlockingIOError:
        return pending
    except (BrokenPipeError, ConnectionResetError):
        return pending[:0]


class _PipePoll:
    """The pipes of one run, watched by ``poll(2)`` itself: ``selectors.PollSelector`` keeps a key
    and a mapping for each, several Python calls per pipe and per wake-up (about a twentieth of
    the server's CPU for a short run). ``fds``: the pipes watched (asked of a plain set, without a
    call of ours, on every turn of the run's loop)."""

    __slots__ = ("_poll", "fds")

    def __init__(self) -> None:
        self._poll = select.poll()
        self.fds: set[int] = set()

    def register(self, fd: int, events: int) -> None:
        self._poll.register(fd, events)
        self.fds.add(fd)

    def unregister(self, fd: int) -> None:
        self._poll.unregister(fd)
        self.fds.discard(fd)

    def ready(self, timeout: float) -> list[tuple[int, int]]:
        """The pipes that can be read or written (or were closed at the other end, or failed), as
        ``(fd, events)``, waiting up to ``timeout`` seconds (rounded up to a millisecond, as the
        selector does)."""
        return self._poll.poll(math.ceil(max(timeout, 0.0) * 1000))


class ProcessRunner:
    """Runs commands through the launcher under a :class:`Confinement`, capturing capped output;
    with a :class:`RunGate`, no more runs starting at once than it lets start."""

    def __init__(
        self, confinement: Confinement, launcher: Launcher, max_output_bytes: int, gate: RunGate | None = None
    ) -> None:
        self.confinement = confinement
        self.launcher = launcher
        self.max_output_bytes = max_output_bytes
        self.gate = gate

    def run(self, spec: CommandSpec) -> CommandRunResult:
        """Run ``spec``; never raises for anything the program does."""
        if not (spec.timeout > 0):  # also catches NaN
            # SandboxFusion starts the process and times out at once; the program never gets to run.
            started = time.monotonic()
            return CommandRunResult(
                status=CommandRunStatus.TimeLimitExceeded,
                execution_time=time.monotonic() - started,
                return_code=None,
                stdout="",
                stderr="",
            )
        try:
            if self.gate is None:
                return self._run_with_retries(spec)
            # The wait for a place is before the run: its timeout starts after it.
            ticket = self.gate.enter()
            try:
                return self._run_with_retries(spec)
            finally:
                self.gate.leave(ticket)
        except Exception as exc:  # the run could not be started: SandboxFusion reports an Error result
            return CommandRunResult(
                status=CommandRunStatus.Error,
                stderr=f"exception on running command {spec.command}: {exc} | None",
            )

    def relay_uids(self) -> list[int]:
        """The host uids of the launcher's relays (what its runs' worlds are made as)."""
        pid = self.launcher.pid
        if pid is None:
            return []
        try:
            return [relay.uids().real for relay in psutil.Process(pid).children()]
        except psutil.Error:
            return []

    def _run_with_retries(self, spec: CommandSpec) -> CommandRunResult:
        """Run ``spec`` in a fresh jail; a launch that fails for want of processes or memory is
        tried again with back-off, within the run's own timeout, then reported (LaunchError)."""
        first_try = time.monotonic()
        give_up_at = first_try + (spec.timeout if math.isfinite(spec.timeout) else _LAUNCH_RETRY_MAX_S)
        pause = _LAUNCH_RETRY_FIRST_S
        attempts = 0
        while True:
            attempts += 1
            jail = self.confinement.new_jail()
            try:
                # Time spent on failed attempts comes off the run's own timeout.
                return self._run_in(jail, spec, spec.timeout - (time.monotonic() - first_try))
            except _LaunchFailed as failed:
                error, detail = failed.errno, failed.detail
            finally:
                jail.close()
            now = time.monotonic()
            if error not in _RETRYABLE_LAUNCH_ERRORS or now + pause >= give_up_at:
                raise LaunchError(error, attempts, now - first_try, detail)
            time.sleep(pause)
            pause = min(pause * 2, _LAUNCH_RETRY_MAX_S)

    def _launch(self, jail: RunJail, spec: CommandSpec) -> tuple[socket.socket, int, int, int, int]:
        """Start the run; its relay, and our ends of (stdin, stdout, stderr, status).

        Output mode ``sandboxfusion``: stdout and stderr are Unix socket pairs, as libuv makes them
        for SandboxFusion's server (uvicorn on uvloop), and are read as its asyncio StreamReader
        reads them (``_run_in``): 256 KiB at a time, and not at all once a stream holds more than
        128 KiB. The send buffer of the program's end (:data:`SANDBOXFUSION_SEND_BUFFER`, set
        here, not the host's default) then decides when the program blocks, as there.
        Measured against SandboxFusion 469de08 (run_timeout 2 s, three runs each): a stream of up
        to 130000 bytes comes back whole; one ``write`` of 220000-300000 bytes comes back cut to
        219264 and ``Finished``, of 1 MB cut to 219264 and ``TimeLimitExceeded``; 140000 bytes and
        more in small writes (``print`` lines) come back ``TimeLimitExceeded`` with 131-142 KB.
        This emulation gives the same (tests/engine/test_output_mode.py)."""
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(4)]
        if spec.output_mode == "sandboxfusion":
            for index in (1, 2):
                os.close(pipes[index][0])
                os.close(pipes[index][1])
                ours, theirs = socket.socketpair()  # (not inheritable: close-on-exec, as pipe2's)
                _set_send_buffer(theirs, SANDBOXFUSION_SEND_BUFFER)
                pipes[index] = (ours.detach(), theirs.detach())
        (stdin_r, stdin_w), (stdout_r, stdout_w), (stderr_r, stderr_w), (status_r, status_w) = pipes
        request = {
            "mode": "python" if spec.python_file else "exec",
            "argv": ["/bin/bash", "-c", spec.command],
            "file": spec.python_file,
            "source": spec.python_source,
            "cwd": spec.cwd,
            # The launcher's own environment is not sent again (most runs); it checks for None.
            "env": None if spec.env == self.launcher.env else dict(spec.env),
            "cgroup_procs": jail.procs_files,
            "warm_procs_file": jail.warm_procs_file,
            "rlimits": jail.rlimits,
            "memory_limit_mb": spec.memory_limit_mb,
            "world": None if spec.world is None else dict(spec.world),
        }
        try:
            relay = self.launcher.launch(request, [stdin_r, stdout_w, stderr_w, status_w])
        except BaseException:
            close_quietly(stdin_w, stdout_r, stderr_r, status_r)
            raise
        finally:
            close_quietly(stdin_r, stdout_w, stderr_w, status_w)
        return relay, stdin_w, stdout_r, stderr_r, status_r

    def _run_in(self, jail: RunJail, spec: CommandSpec, timeout: float) -> CommandRunResult:
        pause = SANDBOXFUSION_READER_PAUSE_BYTES if spec.output_mode == "sandboxfusion" else None
        stdout = CapturedStream(self.max_output_bytes, bytearray(), pause_above=pause)
        stderr = CapturedStream(self.max_output_bytes, bytearray(), pause_above=pause)
        status = _StatusReader()
        relay, stdin_fd, stdout_fd, stderr_fd, status_fd = self._launch(jail, spec)
        started = time.monotonic()
        deadline = started + (timeout if math.isfinite(timeout) else 365 * 24 * 3600.0)
        streams = {stdout_fd: stdout, stderr_fd: stderr}
        open_fds = {stdin_fd, stdout_fd, stderr_fd, status_fd}
        pending_stdin = memoryview(spec.stdin or b"")
        # poll, not epoll: a run watches three or four pipes for a few milliseconds, and poll needs
        # no kernel object of its own (no epoll_create, epoll_ctl per pipe and close): ~10 us less.
        selector = _PipePoll()
        # A world's pids are its own namespace's: only a run on the host is killed by its pids.
        by_pid = isinstance(jail, ProcessGroupJail) and spec.world is None
        released = False
        try:
            # The ends read stay blocking: each read follows a poll that said it would not block
            # (one reader; a pipe or socket stays readable until read). Each set_blocking was a
            # system call, and each of those lets the other threads take the GIL.
            for fd in (stdout_fd, stderr_fd, status_fd):
                selector.register(fd, select.POLLIN)
            if pending_stdin:
                # Most stdin fits in the pipe's buffer: written now, it costs no turn of the loop.
                # Into the new, empty pipe, up to a page (the least a pipe holds) is written whole
                # without blocking; more is written as the pipe takes it, without blocking.
                if len(pending_stdin) > _PIPE_LEAST_CAPACITY:
                    os.set_blocking(stdin_fd, False)
                pending_stdin = _write_some(stdin_fd, pending_stdin)
            if pending_stdin:
                selector.register(stdin_fd, select.POLLOUT)
            else:
                os.close(stdin_fd)
                open_fds.discard(stdin_fd)

            exited_at: float | None = None
            while exited_at is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                for fd, _ in selector.ready(remaining):
                    if fd == status_fd:
                        if not self._read_status(selector, fd, status) or status.wait_status is not None:
                            exited_at = time.monotonic()
                        if status.pid is not None and by_pid and isinstance(jail, ProcessGroupJail):
                            jail.attach(status.pid)
                    elif fd == stdin_fd:
                        pending_stdin = _write_some(fd, pending_stdin)
                        if not pending_stdin:
                            selector.unregister(fd)
                            os.close(fd)
                            open_fds.discard(fd)
                    else:
                        self._read_into(selector, fd, streams)

            if exited_at is None:
                timed_out, elapsed = True, time.monotonic() - started
            else:
                timed_out, elapsed = False, exited_at - started
            if status.launch_error is not None:
                raise _LaunchFailed(status.launch_error, self._launcher_said(selector, stderr_fd, streams))
            on_host = spec.world is None
            if timed_out and on_host and status.pid is None:
                # The deadline passed before the relay said the program's pid (a loaded machine, a
                # deadline of a few milliseconds): the program may start yet, and join its cgroup
                # after the kill below looked there. Its pid comes first; it is killed by it. (One
                # that takes longer than this, its relay kills: it finds its socket closed.)
                self._wait_for_relay(selector, status_fd, status, streams, _DRAIN_GRACE_S, until_pid=True)
            if status.pid is not None and by_pid and isinstance(jail, ProcessGroupJail):
                jail.attach(status.pid)
            if not timed_out:
                # The relay closes the status pipe right after reporting; once it has, it is ready
                # for another run.
                self._wait_for_relay(selector, status_fd, status, streams)
            if status.wait_status is not None and isinstance(jail, ProcessGroupJail):
                jail.leader_reaped()
            # The run is over: nothing it started may outlive it (or keep our pipes open).
            if isinstance(jail, ProcessGroupJail) and not by_pid:
                if timed_out:
                    # Its relay, PID 1 of its namespace, takes every process there with it once let
                    # go (a program that exited, it killed the rest of, before it said so).
                    self.launcher.release(relay, False)
                    released = True
            else:
                if timed_out and on_host and status.pid is not None and status.wait_status is None:
                    # Not reaped yet (its relay reaps it only after it said so): the pid is still
                    # the program's. By pid first, as it may not have joined its cgroup yet.
                    _kill_program_and_group(status.pid)
                jail.kill_all()
            drain_deadline = time.monotonic() + _DRAIN_GRACE_S
            # (The status pipe too: a timed-out run's relay reports the kill and is then reusable.)
            while not selector.fds.isdisjoint((*streams, status_fd)):
                remaining = drain_deadline - time.monotonic()
                if remaining <= 0:
                    break
                for fd, _ in selector.ready(remaining):
                    if fd in streams:
                        self._read_into(selector, fd, streams)
                    elif fd == status_fd:
                        self._read_status(selector, fd, status)
                    elif fd == stdin_fd:
                        selector.unregister(fd)
        finally:
            # A relay that said how its run ended and closed the status pipe serves the next one;
            # one that did not (killed, or still waiting for a program past its deadline) leaves.
            relay_done = status_fd not in selector.fds and (
                status.wait_status is not None or status.launch_error is not None
            )
            if not released:
                self.launcher.release(relay, relay_done)
            close_quietly(*open_fds)

        if timed_out:
            return CommandRunResult(
                status=CommandRunStatus.TimeLimitExceeded,
                execution_time=elapsed,
                return_code=None,
                stdout=stdout.text(),
                stderr=stderr.text(),
            )
        if status.ended_by_relay is not None:
            # The relay ends a run only once its socket with the server reads as closed (a SIGIO
            # alone ends nothing: see _launcher_watch.end_the_run).
            when = f"woken by signal {status.ended_by_relay}" if status.ended_by_relay else "as the run began"
            divergence.note(
                divergence.RELAY,
                f"the run's relay ended the run itself: its socket with the server read as closed "
                f"({when}) though the server had not let the run go; this answer is wrong: please "
                "report it",
            )
        elif status.wait_status is None:
            # -9 is what a program that killed its parent (the relay) gets, as on SandboxFusion;
            # anything else that ends a relay early is the mock's fault, and must not pass as the
            # program's own answer.
            divergence.note(
                divergence.RELAY,
                f"the run's relay ended before it said how the program ended; the return code "
                f"{RELAY_KILLED} is a guess (a program that killed its parent gets it); if this "
                "program did not, this answer is wrong: please report it",
            )
        return_code = status.return_code()
        if return_code == -signal.SIGKILL and jail.ended_by_shared_memory_budget():
            divergence.note(
                divergence.MEMORY_BUDGET,
                "the run was killed for want of memory when all runs together reached what the "
                f"server keeps for them ({self.confinement.memory_budget.describe()}), not at its "
                "own limit; SandboxFusion keeps no such budget: its host's OOM killer would have "
                "chosen among all of the host's processes",
            )
        return CommandRunResult(
            status=CommandRunStatus.Finished,
            execution_time=elapsed,
            return_code=return_code,
            stdout=stdout.text(),
            stderr=stderr.text(),
        )

    def _wait_for_relay(
        self,
        selector: _PipePoll,
        status_fd: int,
        status: _StatusReader,
        streams: dict[int, CapturedStream],
        within: float = _RELAY_DONE_GRACE_S,
        until_pid: bool = False,
    ) -> None:
        """Read the relay's status (and the run's output) until it closes the status pipe, or
        ``until_pid`` until it said the program's pid (or that it could not start it), for at most
        ``within`` seconds."""
        deadline = time.monotonic() + within
        while status_fd in selector.fds:
            if until_pid and (status.pid is not None or status.launch_error is not None):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for fd, _ in selector.ready(remaining):
                if fd == status_fd:
                    self._read_status(selector, fd, status)
                elif fd in streams:
                    self._read_into(selector, fd, streams)

    def _launcher_said(self, selector: _PipePoll, stderr_fd: int, streams: dict[int, CapturedStream]) -> str:
        """Why the launcher could not start a run, as it wrote on the run's stderr (it writes
        that before it reports the failure and then closes the pipe, so it is there to read)."""
        deadline = time.monotonic() + _RELAY_DONE_GRACE_S
        # Stderr alone is waited for: its end is blocking, and another pipe's being ready (the
        # status pipe's, stdout's end) says nothing of it.
        stderr_alone = _PipePoll()
        stderr_alone.register(stderr_fd, select.POLLIN)
        while stderr_fd in selector.fds and time.monotonic() < deadline:
            if stderr_alone.ready(deadline - time.monotonic()):
                self._read_into(selector, stderr_fd, streams)
        lines = [
            line
            for line in streams[stderr_fd].text().splitlines()
            if line.startswith("mocksandbox launcher: ")
        ]
        return lines[-1].removeprefix("mocksandbox launcher: ") if lines else ""

    @staticmethod
    def _read_status(selector: _PipePoll, fd: int, status: _StatusReader) -> bool:
        """Read what the relay said; False once the pipe is closed."""
        try:
            chunk = os.read(fd, 64)
        except BlockingIOError:
            return True
        if chunk:
            status.feed(chunk)
            return True
        selector.unregister(fd)
        return False

    @staticmethod
    def _read_into(selector: _PipePoll, fd: int, streams: dict[int, CapturedStream]) -> None:
        stream = streams[fd]
        try:
            chunk = os.read(fd, _READ_CHUNK if stream.pause_above is None else _SANDBOXFUSION_READ_CHUNK)
        except BlockingIOError:
            return
        if chunk:
            stream.feed(chunk)
            if stream.pause_above is not None and len(stream.data) > stream.pause_above:
                selector.unregister(fd)  # SandboxFusion's reader pauses, never to resume
        else:
            selector.unregister(fd)
