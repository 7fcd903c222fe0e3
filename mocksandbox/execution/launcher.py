"""The server's side of the launcher (see ``forkserver.py``): start it, send it runs, restart it."""

from __future__ import annotations

import array
import json
import os
import socket
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FORKSERVER_SCRIPT = Path(__file__).with_name("forkserver.py")


class LauncherError(RuntimeError):
    """The launcher could not be (re)started or reached."""


class Launcher:
    """One launcher process, restarted when it dies. Thread-safe."""

    def __init__(self, python: str, env: Mapping[str, str]) -> None:
        self.python = python
        self.env = dict(env)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [self.python, str(FORKSERVER_SCRIPT), str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=self.env,
                cwd="/",
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise LauncherError(f"cannot start the launcher with {self.python}: {exc}") from exc
        finally:
            theirs.close()
        self._sock = ours
        return ours

    def start(self) -> None:
        """Start the launcher now rather than on the first run (keeps the first answer fast)."""
        with self._lock:
            if self._sock is None:
                self._start()

    def launch(self, request: Mapping[str, Any], fds: list[int]) -> None:
        """Send one run (stdin, stdout, stderr and status descriptors attached)."""
        message = json.dumps(request).encode()
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        with self._lock:
            for attempt in range(2):
                sock = self._sock or self._start()
                try:
                    sock.sendmsg([message], ancillary)
                    return
                except (BrokenPipeError, ConnectionResetError, ConnectionRefusedError) as exc:
                    # The launcher died (a program may have killed it): start a new one, once.
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
        """Stop the launcher (closing its socket ends its loop)."""
        with self._lock:
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

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid


def close_quietly(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
