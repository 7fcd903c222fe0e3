"""Run one command the way SandboxFusion does, without its failure modes.

As in SandboxFusion: ``/bin/bash -c <command>`` in the temp dir, a new session, the server's
environment, stdin written then closed (``None`` closes it at once), a wall-clock timeout that
yields ``TimeLimitExceeded`` with ``return_code: null`` and whatever the program had flushed, and
negative return codes for signals.

Beyond it: stdout and stderr are drained while the program runs and each is capped, so no program
blocks on a full pipe; every process the run started is killed when it ends (SandboxFusion leaves
orphans); and the program's parent is a small relay process, not the server, so a program that
kills its parent takes down only the relay (the run then reports the relay's signal, -9).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import resource
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass

from mocksandbox.execution.confinement import Confinement, ProcessGroupJail, RunJail
from mocksandbox.models import CommandRunResult, CommandRunStatus

_READ_CHUNK = 64 * 1024
_WRITE_CHUNK = 64 * 1024
#: How long to keep reading pipes after the run ended and its processes were killed.
_DRAIN_GRACE_S = 2.0

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc_fork = _libc.fork
_libc_signal = _libc.signal
_libc_signal.restype = ctypes.c_void_p
_libc_signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
_CATCHABLE_SIGNALS = [int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


@dataclass
class CapturedStream:
    """Bytes read from one pipe, keeping at most ``cap`` of them."""

    cap: int
    data: bytearray
    truncated: bool = False

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


def _relay_and_limit(jail: RunJail, memory_limit_mb: int) -> None:
    """Runs in the forked child before exec: join the jail, then split into relay and program.

    The relay (this process) waits for the program and leaves with the same status, so the server
    sees the program's exit code or signal. Only raw system calls here: the server is
    multi-threaded, so Python's own fork hooks and locks must not run (hence libc's fork).
    """
    jail.enter()
    pid = _libc_fork()
    if pid < 0:
        raise OSError(ctypes.get_errno(), "fork failed")
    if pid == 0:
        # The program: apply SandboxFusion's memory limit (soft AS, DATA and STACK) and go on to exec.
        if memory_limit_mb > 0:
            limit = memory_limit_mb * 1024 * 1024
            for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA, resource.RLIMIT_STACK):
                _, hard = resource.getrlimit(which)
                resource.setrlimit(which, (limit, hard))
        return
    # The relay: hold nothing the program's pipes or the exec-status pipe depend on.
    os.closerange(0, 65536)
    for sig in _CATCHABLE_SIGNALS:
        _libc_signal(sig, 0)  # SIG_DFL: behave like a plain process, not like a copy of the server
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(255)
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


class ProcessRunner:
    """Runs commands under a :class:`Confinement`, capturing capped output."""

    def __init__(self, confinement: Confinement, max_output_bytes: int) -> None:
        self.confinement = confinement
        self.max_output_bytes = max_output_bytes

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
        jail = self.confinement.new_jail(spec.command)
        try:
            return self._run_in(jail, spec)
        except Exception as exc:  # spawning failed: SandboxFusion reports an Error result
            return CommandRunResult(
                status=CommandRunStatus.Error,
                stderr=f"exception on running command {spec.command}: {exc} | None",
            )
        finally:
            jail.close()

    def _run_in(self, jail: RunJail, spec: CommandSpec) -> CommandRunResult:
        stdout = CapturedStream(self.max_output_bytes, bytearray())
        stderr = CapturedStream(self.max_output_bytes, bytearray())
        proc = subprocess.Popen(
            ["/bin/bash", "-c", spec.command],
            cwd=spec.cwd,
            env=dict(spec.env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=lambda: _relay_and_limit(jail, spec.memory_limit_mb),
            close_fds=True,
        )
        started = time.monotonic()
        if isinstance(jail, ProcessGroupJail):
            jail.attach(proc.pid)
        timeout = spec.timeout if math.isfinite(spec.timeout) else 365 * 24 * 3600.0
        deadline = started + timeout
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        selector = selectors.DefaultSelector()
        pidfd = os.pidfd_open(proc.pid)
        streams = {proc.stdout.fileno(): stdout, proc.stderr.fileno(): stderr}
        pending_stdin = memoryview(spec.stdin or b"")
        try:
            for fd in streams:
                os.set_blocking(fd, False)
                selector.register(fd, selectors.EVENT_READ)
            selector.register(pidfd, selectors.EVENT_READ)
            stdin_fd: int | None = proc.stdin.fileno()
            if pending_stdin:
                os.set_blocking(proc.stdin.fileno(), False)
                selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
                stdin_fd = None

            exited_at: float | None = None
            while exited_at is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                for key, _ in selector.select(remaining):
                    fd = int(key.fd)
                    if fd == pidfd:
                        exited_at = time.monotonic()
                    elif fd == stdin_fd:
                        try:
                            written = os.write(fd, pending_stdin[:_WRITE_CHUNK])
                            pending_stdin = pending_stdin[written:]
                        except BlockingIOError:
                            continue
                        except (BrokenPipeError, ConnectionResetError):
                            pending_stdin = pending_stdin[:0]
                        if not pending_stdin:
                            selector.unregister(fd)
                            proc.stdin.close()
                            stdin_fd = None
                    else:
                        self._read_into(selector, fd, streams)

            if exited_at is None:
                timed_out, elapsed = True, time.monotonic() - started
            else:
                timed_out, elapsed = False, exited_at - started
            # The run is over: nothing it started may outlive it (or keep our pipes open).
            jail.kill_all()
            return_code = proc.wait()
            drain_deadline = time.monotonic() + _DRAIN_GRACE_S
            while any(fd in selector.get_map() for fd in streams):
                remaining = drain_deadline - time.monotonic()
                if remaining <= 0:
                    break
                for key, _ in selector.select(remaining):
                    if int(key.fd) in streams:
                        self._read_into(selector, int(key.fd), streams)
                    elif int(key.fd) == pidfd:
                        selector.unregister(pidfd)
        finally:
            selector.close()
            os.close(pidfd)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                pipe.close()
            if proc.returncode is None:
                jail.kill_all()
                proc.wait()

        if timed_out:
            return CommandRunResult(
                status=CommandRunStatus.TimeLimitExceeded,
                execution_time=elapsed,
                return_code=None,
                stdout=stdout.text(),
                stderr=stderr.text(),
            )
        return CommandRunResult(
            status=CommandRunStatus.Finished,
            execution_time=elapsed,
            return_code=return_code,
            stdout=stdout.text(),
            stderr=stderr.text(),
        )

    @staticmethod
    def _read_into(selector: selectors.BaseSelector, fd: int, streams: dict[int, CapturedStream]) -> None:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return
        if chunk:
            streams[fd].feed(chunk)
        else:
            selector.unregister(fd)
