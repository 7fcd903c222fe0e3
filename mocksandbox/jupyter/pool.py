"""A pool of started kernels, each used by one request and then killed.

SandboxFusion starts a kernel inside each request (~1.2 s before the first cell runs). Here
``size`` kernels are started ahead of time; a request takes a ready one (warm) and a replacement is
started in the background at once. When none is ready (a burst, or ``size`` 0) the request starts
its own (cold), as SandboxFusion would. A used kernel is never given to another request: it is
killed, so the pool cannot carry state from one request to the next.
"""

from __future__ import annotations

import itertools
import os
import queue
import secrets
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mocksandbox.execution.world import run_owner_of
from mocksandbox.jupyter.kernel import (
    Kernel,
    KernelConnection,
    KernelError,
    KernelProcess,
    new_connection_file,
)
from mocksandbox.jupyter.launchers import KernelLauncher

#: After a background start fails, wait this long before the pool tries again on its own
#: (requests still start kernels themselves, so they report the error).
_RETRY_AFTER_FAILURE_S = 5.0


class KernelStarter:
    """Starts ready kernels with a launcher, each in its own directory under ``runtime_root``, and
    remembers every process it launched until that kernel is closed (for :meth:`kill_all`)."""

    def __init__(
        self, launcher: KernelLauncher, runtime_root: Path, max_stream_chars: int | None = None
    ) -> None:
        import zmq

        self.launcher = launcher
        self.runtime_root = runtime_root
        self.max_stream_chars = max_stream_chars
        #: Where kernels in worlds see their work dirs (the host's temp root, as /run_code runs).
        self.view_tmp_root = tempfile.gettempdir()
        self._context = zmq.Context()  # one for all kernels' sockets (each socket serves one thread)
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._processes: dict[int, KernelProcess] = {}
        self._closed = False

    def __call__(self, deadline: float) -> Kernel:
        with self._lock:
            if self._closed:
                raise KernelError("the kernel starter is closed")
            number = next(self._numbers)
        kernel_dir = self.runtime_root / f"k{number}"
        # (Never remade: once closed, the runtime root is gone, and a start still under way fails.)
        connection_file, info = new_connection_file(kernel_dir)
        work: tuple[Path, str] | None = None
        if self.launcher.world is not None:
            # Where the request's files go on the host, and the temp dir its kernel sees them in
            # (a name as SandboxFusion's kernels get).
            work = (kernel_dir / "work", os.path.join(self.view_tmp_root, "tmp" + secrets.token_hex(4)))
            work[0].mkdir(mode=0o700)
            owner = run_owner_of(self.launcher.world)
            if owner is not None:
                # Its connection file and work dir are its own (as where the host root's files are
                # the run root's: a root server's runs without idmapped mounts).
                owner.give_tree(str(kernel_dir))
        try:
            process = self.launcher.launch(connection_file, kernel_dir, deadline, work)
        except BaseException:
            shutil.rmtree(kernel_dir, ignore_errors=True)
            raise
        with self._lock:
            closed = self._closed
            if not closed:
                self._processes[number] = process
        connection = None
        try:
            if closed:  # closed while this one started: kill_all did not know it
                raise KernelError("the kernel starter is closed")
            connection = KernelConnection(info, self._context)
            kernel = Kernel(process, connection, kernel_dir)
            kernel.max_stream_chars = self.max_stream_chars
            kernel.work = work
            kernel.wait_ready(deadline)
        except BaseException:
            if connection is not None:
                connection.close()
            self._forget(number)
            process.kill()
            shutil.rmtree(kernel_dir, ignore_errors=True)
            raise
        kernel.on_close = lambda: self._forget(number)
        return kernel

    def _forget(self, number: int) -> None:
        with self._lock:
            self._processes.pop(number, None)

    def live_pids(self) -> list[int]:
        with self._lock:
            return [process.pid for process in self._processes.values()]

    def kill_all(self) -> None:
        """Kill every kernel process still known, ready, busy or half-started."""
        with self._lock:
            processes = list(self._processes.values())
            self._processes.clear()
        for process in processes:
            process.kill()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.kill_all()
        self.launcher.close()
        self._context.term()  # every socket is closed by now (kernels close theirs)
        shutil.rmtree(self.runtime_root, ignore_errors=True)


@dataclass
class PoolStats:
    """Counts since the last reset."""

    warm: int = 0  # requests that got a ready kernel
    cold: int = 0  # requests that had to start one
    started: int = 0  # kernels started in the background
    start_failures: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "warm": self.warm,
            "cold": self.cold,
            "started": self.started,
            "start_failures": self.start_failures,
        }


class KernelPool:
    """Up to ``size`` ready kernels, refilled in the background. Thread-safe."""

    def __init__(
        self,
        start_kernel: Callable[[float], Kernel],
        size: int,
        startup_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        kill_pending: Callable[[], None] = lambda: None,
    ) -> None:
        self._start_kernel = start_kernel
        self._kill_pending = kill_pending
        self.size = size
        self.startup_timeout = startup_timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._ready: deque[Kernel] = deque()
        self._busy: set[Kernel] = set()
        self._starting = 0
        self._threads: set[threading.Thread] = set()
        self._closed = False
        self._quiet_until = 0.0
        self._stats = PoolStats()
        self._retired: queue.SimpleQueue[Kernel | None] = queue.SimpleQueue()
        self._reaper: threading.Thread | None = None

    # -- requests -------------------------------------------------------------------------------

    def acquire(self, deadline: float) -> tuple[Kernel, bool]:
        """A ready kernel for one request, and whether it was warm. Raises :class:`KernelError` and
        :class:`~mocksandbox.jupyter.kernel.DeadlineExceeded` (if ``deadline`` passes first)."""
        with self._lock:
            if self._closed:
                raise KernelError("the kernel pool is closed")
            kernel = self._pop_live_locked()
            if kernel is not None:
                self._stats.warm += 1
                self._busy.add(kernel)
                self._top_up_locked()  # its replacement starts now
                return kernel, True
        try:
            kernel = self._start_kernel(min(deadline, self._clock() + self.startup_timeout))
        finally:
            # Refill only once this request's own kernel is up: on a small machine the request
            # would otherwise share the CPU with the kernels it does not need.
            with self._lock:
                if not self.closed:
                    self._top_up_locked()
        with self._lock:
            closed = self.closed  # (another thread may have closed the pool meanwhile)
            if not closed:
                self._stats.cold += 1
                self._busy.add(kernel)
        if closed:
            kernel.close()
            raise KernelError("the kernel pool is closed")
        return kernel, False

    def release(self, kernel: Kernel) -> None:
        """The request is done with ``kernel``: kill it (in the background) and never reuse it."""
        with self._lock:
            self._busy.discard(kernel)
            self._ensure_reaper_locked()
        self._retired.put(kernel)

    def warm(self) -> None:
        """Start filling the pool now rather than at the first request."""
        with self._lock:
            if not self._closed:
                self._top_up_locked()

    # -- background -----------------------------------------------------------------------------

    def _pop_live_locked(self) -> Kernel | None:
        while self._ready:
            kernel = self._ready.popleft()
            if kernel.process.is_alive():
                return kernel
            self._ensure_reaper_locked()
            self._retired.put(kernel)  # died while waiting (killed from outside, OOM)
        return None

    def _top_up_locked(self) -> None:
        if self._clock() < self._quiet_until:
            return
        while len(self._ready) + self._starting < self.size:
            self._starting += 1
            thread = threading.Thread(target=self._start_in_background, name="mocksandbox-kernel-start")
            thread.daemon = True
            self._threads.add(thread)
            thread.start()

    def _start_in_background(self) -> None:
        kernel: Kernel | None = None
        try:
            kernel = self._start_kernel(self._clock() + self.startup_timeout)
        except Exception:
            with self._lock:
                self._stats.start_failures += 1
                self._quiet_until = self._clock() + _RETRY_AFTER_FAILURE_S
        finally:
            with self._lock:
                self._starting -= 1
                self._threads.discard(threading.current_thread())
                keep = kernel is not None and not self._closed
                if keep and kernel is not None:
                    self._stats.started += 1
                    self._ready.append(kernel)
        if kernel is not None and not keep:
            kernel.close()

    def _ensure_reaper_locked(self) -> None:
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reap, name="mocksandbox-kernel-reaper", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        while True:
            kernel = self._retired.get()
            if kernel is None:
                return
            try:
                kernel.close()
            except Exception:
                pass  # closing is best effort; the starter's kill_all is the backstop

    # -- state ----------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                **self._stats.as_dict(),
                "ready": len(self._ready),
                "starting": self._starting,
                "busy": len(self._busy),
            }

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = PoolStats()
            self._quiet_until = 0.0

    def close(self, timeout: float = 10.0) -> None:
        """Kill every kernel (ready, busy, or starting) and stop the background threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ready, self._ready = list(self._ready), deque()
            busy = list(self._busy)
            threads = list(self._threads)
            reaper = self._reaper
        for kernel in ready:
            kernel.close()
        for kernel in busy:
            kernel.process.kill()  # its request notices and releases it; its sockets are its own
        self._kill_pending()  # kernels still starting fail at once instead of being waited for
        end = self._clock() + timeout
        for thread in threads:
            thread.join(max(0.0, end - self._clock()))
        if reaper is not None:
            self._retired.put(None)
            reaper.join(max(0.0, end - self._clock()))
