"""One IPython kernel: its process, a client over Unix sockets, running cells against a deadline.

A kernel serves one request and is then killed: every request sees a brand-new interpreter, as with
SandboxFusion, so nothing (variables, imports, working directory, environment, module state) can
pass from one request to the next. What makes that cheap is the pool (:mod:`mocksandbox.jupyter.pool`)
starting kernels ahead of time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from mocksandbox.jupyter.models import CellRunResult
from mocksandbox.jupyter.outputs import CellOutputs

if TYPE_CHECKING:
    import zmq
    from jupyter_client.session import Session

#: How often a wait for the kernel checks that its process is still alive.
_LIVENESS_INTERVAL_S = 0.25
#: How long a kernel_info request goes unanswered before another is sent while a kernel starts.
_NUDGE_INTERVAL_S = 2.0


class KernelError(Exception):
    """The kernel could not be started, or died."""


class KernelDied(KernelError):
    """The kernel process exited while it was running a cell."""


class DeadlineExceeded(Exception):
    """The request's time ran out (SandboxFusion: the driver was killed)."""


class KernelProcess(Protocol):
    """The operating-system side of a kernel."""

    pid: int

    def is_alive(self) -> bool: ...

    def kill(self) -> None:
        """Kill the kernel and the processes it started; return when they are gone."""


def kill_tree(process: psutil.Process, timeout: float = 5.0) -> None:
    """SIGKILL ``process``, its process group and its descendants; wait until they have exited.

    A process that has exited is done with, as a zombie too: its reaping is its parent's business.
    (psutil's ``wait_procs`` waits for the reaping of a process that is not our child, which for
    an orphan is the host's init's: about a second a kernel where that init reaps by polling,
    forever where it never reaps, as a container's first process may not.)"""
    try:
        victims = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    try:
        if process.is_running() and os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, signal.SIGKILL)  # the group: what it started and did not move away
    except (ProcessLookupError, PermissionError):
        pass
    for victim in victims:
        try:
            victim.kill()  # psutil checks the pid was not reused
        except psutil.NoSuchProcess:
            pass
    _wait_exited(victims, timeout)


def _wait_exited(processes: list[psutil.Process], timeout: float) -> None:
    """Return once every one of ``processes`` has exited (or is gone), or ``timeout`` has passed.
    Our own children are reaped on the way."""
    deadline = time.monotonic() + timeout
    interval = 0.0005
    waiting = list(processes)
    while True:
        waiting = [process for process in waiting if not _exited(process)]
        if not waiting or time.monotonic() >= deadline:
            return
        time.sleep(interval)
        interval = min(interval * 2, 0.02)


def _exited(process: psutil.Process) -> bool:
    try:
        if os.waitpid(process.pid, os.WNOHANG)[0] == process.pid:
            return True  # our child, reaped here
    except ChildProcessError:
        pass  # not our child (or reaped already)
    return not _running(process)


def _running(process: psutil.Process) -> bool:
    """Whether ``process`` is still running (a zombie has exited)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class SpawnedProcess:
    """A kernel started by us (``python -m ipykernel_launcher``): our child, reaped by us."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self._process = psutil.Process(popen.pid)

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        kill_tree(self._process)
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class ForkedProcess:
    """A kernel forked by the fork server: its child, reaped by it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self._process: psutil.Process | None = psutil.Process(pid)
        except psutil.NoSuchProcess:
            self._process = None

    def is_alive(self) -> bool:
        return self._process is not None and _running(self._process)

    def kill(self) -> None:
        if self._process is not None:
            kill_tree(self._process)


class KernelConnection:
    """The shell and IOPub channels of one kernel: plain zmq sockets and jupyter_client's message
    signing, used from one thread at a time. (jupyter_client's blocking client would give every
    calling thread an asyncio event loop of its own that is never closed.)"""

    def __init__(self, info: dict[str, Any], context: zmq.Context[Any]) -> None:
        import zmq
        from jupyter_client.session import Session

        self._zmq = zmq
        self.session: Session = Session(
            key=str(info["key"]).encode("ascii"), signature_scheme=info["signature_scheme"]
        )
        self.shell = context.socket(zmq.DEALER)
        self.iopub = context.socket(zmq.SUB)
        for socket, port in ((self.shell, info["shell_port"]), (self.iopub, info["iopub_port"])):
            socket.linger = 0
            socket.connect(f"ipc://{info['ip']}-{port}")
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")

    def send(self, msg_type: str, content: dict[str, Any]) -> str:
        """Send a shell request; its message id."""
        message = self.session.send(self.shell, msg_type, content)
        if message is None:  # only when the session refuses to send from a forked child
            raise KernelError("cannot send to the kernel")
        return str(message["header"]["msg_id"])

    def receive(self, socket: zmq.Socket[Any], timeout: float) -> dict[str, Any] | None:
        """The next message on ``socket`` within ``timeout`` seconds, or None."""
        if not socket.poll(max(0, int(timeout * 1000))):
            return None
        _, parts = self.session.feed_identities(socket.recv_multipart())
        message: dict[str, Any] = self.session.deserialize(parts)
        return message

    def close(self) -> None:
        self.shell.close(linger=0)
        self.iopub.close(linger=0)


class Kernel:
    """A started kernel and its connection. Not thread-safe: one request uses it at a time."""

    def __init__(self, process: KernelProcess, connection: KernelConnection, runtime_dir: Path) -> None:
        self.process = process
        self.connection = connection
        self.runtime_dir = runtime_dir
        self.started_at = time.monotonic()
        #: Called once the kernel is closed (the starter forgets its process).
        self.on_close: Callable[[], None] | None = None
        #: Characters kept per stream per cell (``None``: all).
        self.max_stream_chars: int | None = None
        #: In a world of its own (isolation lite): its work dir, ``(on the host, in its world)``.
        self.work: tuple[Path, str] | None = None
        self._closed = False

    @property
    def pid(self) -> int:
        return self.process.pid

    # -- start ----------------------------------------------------------------------------------

    def wait_ready(self, deadline: float) -> None:
        """Return once the kernel has answered every request sent to it and its IOPub
        subscription is live.

        Kernels with the IOPub welcome message (ipykernel 7) say so as soon as the subscription
        reaches them; with older ones, the busy/idle status of our own kernel_info request shows it.
        One kernel_info request is in flight at a time (another only once it is answered, or after
        :data:`_NUDGE_INTERVAL_S` without an answer): ipykernel 7 (seen with 7.1 to 7.3) can leave
        the last of several requests that reached it together unread until another message comes,
        so after a burst of kernel_info requests the first execute_request waited for the deadline
        (here in about one start in ten; none in 120 since).
        """
        connection = self.connection
        asked: set[str] = set()
        unanswered: set[str] = set()
        last_sent = 0.0
        iopub_live = False
        while not (iopub_live and asked and not unanswered):
            now = time.monotonic()
            if now >= deadline:
                raise DeadlineExceeded("the kernel did not become ready in time")
            if not self.process.is_alive():
                raise KernelError("the kernel exited while starting")
            if (not unanswered and not (iopub_live and asked)) or now - last_sent >= _NUDGE_INTERVAL_S:
                msg_id = connection.send("kernel_info_request", {})
                asked.add(msg_id)
                unanswered.add(msg_id)
                last_sent = now
            reply = connection.receive(connection.shell, 0.005)
            if reply is not None and reply["msg_type"] == "kernel_info_reply":
                unanswered.discard(reply["parent_header"].get("msg_id"))
            message = connection.receive(connection.iopub, 0.02)
            if message is not None and (
                message["msg_type"] == "iopub_welcome" or message["parent_header"].get("msg_id") in asked
            ):
                iopub_live = True
        while connection.receive(connection.iopub, 0) is not None:
            pass  # what remains of the handshake

    # -- run ------------------------------------------------------------------------------------

    def run_cell(self, code: str, deadline: float) -> CellRunResult:
        """Execute ``code`` (as a notebook cell: history stored, errors do not stop later cells) and
        collect its outputs until the kernel is idle again."""
        outputs = CellOutputs(self.max_stream_chars)
        self._execute(code, deadline, outputs.feed)
        return outputs.result()

    def run_setup(self, code: str, deadline: float) -> None:
        """Execute bookkeeping code whose outputs nobody sees (it still counts as ``In[1]``)."""
        errors: list[str] = []

        def watch(msg_type: str, content: Any) -> None:
            if msg_type == "error":
                errors.append(f"{content.get('ename')}: {content.get('evalue')}")

        self._execute(code, deadline, watch)
        if errors:
            raise KernelError(f"setting up the kernel failed: {errors[0]}")

    def _execute(self, code: str, deadline: float, feed: Callable[[str, Any], None]) -> None:
        msg_id = self.connection.send(
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": False,
            },
        )
        next_liveness_check = time.monotonic() + _LIVENESS_INTERVAL_S
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise DeadlineExceeded("the request ran out of time")
            if now >= next_liveness_check:
                if not self.process.is_alive():
                    raise KernelDied("Kernel died")
                next_liveness_check = now + _LIVENESS_INTERVAL_S
            message = self.connection.receive(
                self.connection.iopub, min(deadline - now, _LIVENESS_INTERVAL_S)
            )
            if message is None:
                continue
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            msg_type = message["msg_type"]
            if msg_type == "status" and message["content"].get("execution_state") == "idle":
                return
            feed(msg_type, message["content"])

    # -- end ------------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill the kernel and what it started, and remove its connection files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.connection.close()
        finally:
            self.process.kill()
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
            if self.on_close is not None:
                self.on_close()


def new_connection_file(runtime_dir: Path) -> tuple[Path, dict[str, Any]]:
    """A connection file for a kernel on Unix sockets in ``runtime_dir`` (no TCP ports, no races),
    and what it says."""
    runtime_dir.mkdir(mode=0o700, exist_ok=True)  # its parent, the pool's root, must be there
    info: dict[str, Any] = {
        "shell_port": 1,
        "iopub_port": 2,
        "stdin_port": 3,
        "control_port": 4,
        "hb_port": 5,
        "ip": str(runtime_dir / "s"),
        "key": uuid.uuid4().hex,
        "transport": "ipc",
        "signature_scheme": "hmac-sha256",
        "kernel_name": "",
    }
    path = runtime_dir / "kernel.json"
    path.write_text(json.dumps(info, indent=1))
    return path, info
