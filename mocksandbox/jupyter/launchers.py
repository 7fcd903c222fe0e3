"""Starting kernel processes: spawned from scratch (as SandboxFusion does) or forked from a template.

* :class:`SpawnLauncher` runs ``python -m ipykernel_launcher -f <connection file>`` per kernel:
  ~1.2 s until it answers, most of it importing ipykernel and its debugger.
* :class:`ForkServerLauncher` keeps one helper process (``_zygote.py``) that has done those imports
  and forks a child per kernel: ~0.2 s. Only imports happen before the fork, so each child is as
  fresh as a spawned kernel.

Both give each kernel its own session (killed as a process group), the environment user programs
get from ``/run_code``, and ``JPY_PARENT_PID`` so that a kernel exits if its parent dies.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import psutil

from mocksandbox.execution.affinity import release_to_programs
from mocksandbox.execution.launcher import LAUNCHER_DIR
from mocksandbox.jupyter.kernel import (
    DeadlineExceeded,
    ForkedProcess,
    KernelError,
    KernelProcess,
    SpawnedProcess,
    kill_tree,
)

#: Options every kernel starts with: no history database (hundreds of short-lived kernels would
#: contend for one SQLite file in the home directory; the history in memory still works).
KERNEL_OPTIONS: tuple[str, ...] = ("--HistoryManager.enabled=False",)

_ZYGOTE_SCRIPT = Path(__file__).with_name("_zygote.py")


class KernelLauncher(Protocol):
    """Starts kernel processes; thread-safe."""

    name: str
    #: What a kernel's world is made of (the launcher's ``World``'s config but its scratch), or
    #: ``None``: kernels run in the host's world.
    world: dict[str, Any] | None

    def launch(
        self, connection_file: Path, cwd: Path, deadline: float, work: tuple[Path, str] | None = None
    ) -> KernelProcess:
        """Start a kernel serving ``connection_file`` with ``cwd`` as its working directory; in a
        world of its own if :attr:`world`, with ``work = (host dir, where it sees it)`` bound in
        and its working directory, and ``cwd`` (holding its sockets) bound in place."""

    def close(self) -> None:
        """Release what the launcher holds (not the kernels it started). Idempotent."""


class SpawnLauncher:
    """A new interpreter per kernel, as SandboxFusion's driver does."""

    name = "spawn"
    world: dict[str, Any] | None = None  # never: in a world, kernels come from the fork server

    def __init__(self, python: str, env: Mapping[str, str]) -> None:
        self.python = python
        self.env = dict(env)

    def launch(
        self, connection_file: Path, cwd: Path, deadline: float, work: tuple[Path, str] | None = None
    ) -> KernelProcess:
        argv = [self.python, "-m", "ipykernel_launcher", "-f", str(connection_file), *KERNEL_OPTIONS]
        popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**self.env, "JPY_PARENT_PID": str(os.getpid())},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        release_to_programs(popen.pid)  # a kernel runs user code: every core, as without workers
        return SpawnedProcess(popen)

    def close(self) -> None:
        pass


class _LineChannel:
    """JSON lines over a pair of pipes, with a deadline on every read."""

    def __init__(self, write_to: Any, read_from: Any) -> None:
        self._out = write_to
        self._in_fd: int = read_from.fileno()
        self._buffer = b""

    def send(self, message: Mapping[str, Any]) -> None:
        self._out.write((json.dumps(message) + "\n").encode())
        self._out.flush()

    def receive(self, deadline: float) -> dict[str, Any]:
        with selectors.DefaultSelector() as selector:
            selector.register(self._in_fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeadlineExceeded("the kernel fork server did not answer in time")
                if not selector.select(remaining):
                    continue
                chunk = os.read(self._in_fd, 65536)
                if not chunk:
                    raise KernelError("the kernel fork server exited")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message


class ForkServerLauncher:
    """Kernels forked from one pre-imported helper process, started on first use."""

    name = "fork"

    def __init__(
        self,
        python: str,
        env: Mapping[str, str],
        marker: str,
        startup_timeout: float,
        world: Mapping[str, Any] | None = None,
        exec_kernels: bool = False,
    ) -> None:
        self.python = python
        self.env = dict(env)
        self.marker = marker
        self.startup_timeout = startup_timeout
        self.world = dict(world) if world is not None else None
        #: Each kernel a fresh interpreter (``exec``), as a spawned one: the ``spawn`` launcher's
        #: cost, in a world.
        self.exec_kernels = exec_kernels
        self._lock = threading.Lock()
        self._zygote: subprocess.Popen[bytes] | None = None
        self._channel: _LineChannel | None = None
        self._closed = False

    @property
    def zygote_pid(self) -> int | None:
        return self._zygote.pid if self._zygote is not None else None

    def _start_zygote(self) -> _LineChannel:
        argv = [self.python, str(_ZYGOTE_SCRIPT), self.marker]
        if self.world is not None:
            # The launcher's dir, whose modules make a run's world (``_launcher_world.World``).
            argv.append(f"--launcher-dir={LAUNCHER_DIR}")
        zygote = subprocess.Popen(
            argv,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C at a terminal reaches the server, which closes it in order
        )
        release_to_programs(zygote.pid)  # before it forks a kernel: they run user code, on every core
        channel = _LineChannel(zygote.stdin, zygote.stdout)
        try:
            hello = channel.receive(time.monotonic() + self.startup_timeout)
            if not hello.get("ready"):
                raise KernelError(str(hello.get("error", "the kernel fork server failed to start")))
        except BaseException:
            self._stop(zygote)
            raise
        self._zygote, self._channel = zygote, channel
        return channel

    def launch(
        self, connection_file: Path, cwd: Path, deadline: float, work: tuple[Path, str] | None = None
    ) -> KernelProcess:
        request: dict[str, Any] = {"argv": ["-f", str(connection_file), *KERNEL_OPTIONS], "cwd": str(cwd)}
        if self.exec_kernels:
            request["exec"] = True
        if self.world is not None:
            if work is None:
                raise KernelError("a kernel in a world needs its work dir")
            scratch = cwd / "world"  # its own tmpfs goes there, in its own mount namespace
            scratch.mkdir(mode=0o700, exist_ok=True)
            request["world"] = {
                "config": {**self.world, "scratch": str(scratch)},
                "binds": [[str(cwd), str(cwd)], [str(work[0]), work[1]]],
                "cwd": work[1],
            }
        # The fork server is shared: its start and its answers get the start-up timeout, not one
        # request's deadline (a request out of time would otherwise tear it down for everyone).
        with self._lock:
            if self._closed:
                raise KernelError("the kernel launcher is closed")
            channel = self._channel
            if channel is None or self._zygote is None or self._zygote.poll() is not None:
                if self._zygote is not None:
                    self._stop(self._zygote)
                    self._zygote = self._channel = None
                channel = self._start_zygote()
            try:
                channel.send(request)
                answer = channel.receive(time.monotonic() + self.startup_timeout)
            except (OSError, KernelError, DeadlineExceeded):
                # A half-finished exchange leaves the channel out of step: start afresh next time.
                if self._zygote is not None:
                    self._stop(self._zygote)
                self._zygote = self._channel = None
                raise
        if "pid" not in answer:
            raise KernelError(str(answer.get("error", "the kernel fork server refused")))
        return ForkedProcess(int(answer["pid"]))

    @staticmethod
    def _stop(zygote: subprocess.Popen[bytes]) -> None:
        for stream in (zygote.stdin, zygote.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        try:
            zygote.wait(timeout=2)  # it exits when its input closes
        except subprocess.TimeoutExpired:
            try:
                kill_tree(psutil.Process(zygote.pid))
            except psutil.NoSuchProcess:
                pass
            zygote.wait(timeout=5)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._zygote is not None:
                self._stop(self._zygote)
            self._zygote = self._channel = None


def create_launcher(
    kind: str,
    python: str,
    env: Mapping[str, str],
    marker: str,
    startup_timeout: float,
    world: Mapping[str, Any] | None = None,
) -> KernelLauncher:
    """The launcher named by the ``jupyter_launcher`` setting; kernels in worlds made of
    ``world`` if given (both kinds then go through the fork server, which makes the worlds)."""
    if kind == "spawn" and world is None:
        return SpawnLauncher(python, env)
    if kind in ("fork", "spawn"):
        return ForkServerLauncher(python, env, marker, startup_timeout, world, exec_kernels=kind == "spawn")
    raise ValueError(f"unknown kernel launcher {kind!r} (use 'fork' or 'spawn')")


def kernel_environment(base: Mapping[str, str], python: str) -> dict[str, str]:
    """The environment of kernels: ``base`` (what ``/run_code`` programs get) with the interpreter's
    directory first on PATH; each kernel adds its own ``JPY_PARENT_PID``."""
    env = dict(base)
    env["PATH"] = f"{Path(python).parent}:{env.get('PATH', os.defpath)}"
    env.pop("JPY_PARENT_PID", None)
    return env
