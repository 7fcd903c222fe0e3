"""``/run_jupyter``: run cells in order in a brand-new kernel and answer as SandboxFusion does.

SandboxFusion writes the request to a driver script and runs it with ``run_timeout = total_timeout
+ 10``; the driver prints ``config: `` and the request as indented JSON, starts a kernel in a fresh
temp dir holding ``files``, runs the cells and writes their outputs. The answer carries the driver's
CommandRunResult: ``Success`` when the driver finished (even if a cell raised), ``Failed`` with a
timed-out driver and no cells when the time ran out. Here the kernel comes from a
:class:`~mocksandbox.jupyter.pool.KernelPool` and the driver's result is written to match.
"""

from __future__ import annotations

import base64
import json
import math
import os
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from mocksandbox.execution.engine import (
    fetch_files,
    nan_timeout_result,
    program_environment,
    restore_files,
)
from mocksandbox.execution.world import make_locked_dir, remove_unlocked_dirs
from mocksandbox.jupyter.kernel import DeadlineExceeded, KernelDied
from mocksandbox.jupyter.launchers import create_launcher, kernel_environment
from mocksandbox.jupyter.models import CellRunResult, RunJupyterRequest, RunJupyterResponse
from mocksandbox.jupyter.pool import KernelPool, KernelStarter
from mocksandbox.models import CommandRunResult, CommandRunStatus, RunStatus
from mocksandbox.runtime.production import PythonRuntime
from mocksandbox.settings import Settings

#: SandboxFusion runs its driver with ``run_timeout = total_timeout + 10``.
DRIVER_GRACE_S = 10.0
# Unix socket paths are limited to 107 bytes; kernels' sockets live under the runtime directory.
_MAX_RUNTIME_DIR_LENGTH = 60


def driver_log(request: RunJupyterRequest) -> str:
    """What SandboxFusion's driver prints before it starts: ``config: `` and the request as JSON."""
    config = {
        "kernel": request.kernel,
        "cells": request.cells,
        "cell_timeout": request.cell_timeout,
        "total_timeout": request.total_timeout,
    }
    return f"config: \n{json.dumps(config, indent=2)}\n"


def driver_budget(total_timeout: float, max_timeout_s: float) -> float:
    """Seconds the request may take: ``total_timeout + 10``, capped (NaN or infinity: the cap)."""
    budget = total_timeout + DRIVER_GRACE_S
    if math.isnan(budget):
        return max_timeout_s
    return min(budget, max_timeout_s)


#: A kernel in a world writes the request's files itself (as ``restore_files`` does: relative to
#: its dir, parents made, ``null`` and ``IGNORE_THIS_FILE`` names skipped), then goes to its dir.
_WRITE_FILES = """
import base64, os
for name, content in FILES.items():
    if not isinstance(content, str) or "IGNORE_THIS_FILE" in name:
        continue
    path = os.path.join(CWD, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(base64.b64decode(content))
os.chdir(CWD)
"""
#: And copies the regular files asked for to ``OUT/<index>`` in its dir, for the server to read.
_COPY_FILES = """
import os, shutil
os.mkdir(os.path.join(CWD, OUT), 0o700)
for index, name in enumerate(NAMES):
    path = os.path.join(CWD, name)
    if os.path.isfile(path):
        try:
            shutil.copyfile(path, os.path.join(CWD, OUT, str(index)))
        except OSError:
            pass
"""


def _in_a_namespace(source: str, **names: Any) -> str:
    """A cell running ``source`` with ``names`` in a namespace of its own: the user's sees nothing."""
    return f"exec({source!r}, {names!r})"


_RUNTIME_PREFIX = "mocksandbox-jupyter-"
_OWNER_FILE = ".owner"


def _runtime_parent(tmp_root: str | None) -> str:
    """Where the kernels' runtime dirs are made: the temp root, where its paths are short enough
    for the kernels' sockets, else the system's temp dir."""
    base = tmp_root if tmp_root and len(tmp_root) <= _MAX_RUNTIME_DIR_LENGTH else None
    return base or tempfile.gettempdir()


def _runtime_root(tmp_root: str | None) -> tuple[Path, int]:
    """A new runtime dir for the kernels, and the descriptor of its ``.owner`` file, locked while
    this server lives: the dirs of servers killed without removing theirs are removed first."""
    parent = _runtime_parent(tmp_root)
    reclaim_stale_runtime_roots(parent)
    root, owner = make_locked_dir(parent, _RUNTIME_PREFIX, _OWNER_FILE)
    return Path(root), owner


def reclaim_stale_runtime_roots(parent: str) -> list[str]:
    """Remove the kernels' runtime dirs in ``parent`` whose server is gone (nobody holds the lock
    of their ``.owner`` file); what was removed."""
    return remove_unlocked_dirs(parent, _RUNTIME_PREFIX, _OWNER_FILE)


class CellRunner(Protocol):
    """What a request needs of its kernel (a :class:`~mocksandbox.jupyter.kernel.Kernel`)."""

    def run_setup(self, code: str, deadline: float) -> None: ...

    def run_cell(self, code: str, deadline: float) -> CellRunResult: ...


class Pool(Protocol):
    """What the service needs of its pool (a :class:`~mocksandbox.jupyter.pool.KernelPool`)."""

    def acquire(self, deadline: float) -> tuple[Any, bool]: ...

    def release(self, kernel: Any) -> None: ...

    def warm(self) -> None: ...

    def stats(self) -> dict[str, int]: ...

    def reset_stats(self) -> None: ...

    def close(self) -> None: ...


class JupyterService:
    """Answers ``/run_jupyter``; the kernel pool is created on first use (or by :meth:`warm`).

    ``pool_factory`` replaces the real pool (tests pass fakes).
    """

    def __init__(
        self,
        settings: Settings,
        pool_factory: Callable[[], Pool] | None = None,
        world: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self._pool_factory = pool_factory
        # What servers killed since (a --workers worker, SIGKILLed, that held kernels) left: now,
        # not at this server's first /run_jupyter, which may never come.
        reclaim_stale_runtime_roots(_runtime_parent(settings.tmp_root))
        #: Kernels get worlds of their own made of this (the engine's, under isolation lite: in the
        #: runs' user namespace too, where the engine's runs are).
        self.world = dict(world) if world is not None else None
        self._lock = threading.Lock()
        self._pool: Pool | None = None
        self._starter: KernelStarter | None = None
        #: The locked ``.owner`` file of the kernels' runtime dir, while there is one.
        self._owner: int | None = None
        self._closed = False
        #: Kernels run user Python as /run_code does: the same notes beside their answers.
        self.python_runtime = PythonRuntime(settings.python, settings.production_python)

    # -- lifecycle ------------------------------------------------------------------------------

    def _get_pool(self) -> Pool:
        with self._lock:
            if self._closed:
                raise RuntimeError("the Jupyter service is closed")
            if self._pool is None and self._pool_factory is not None:
                self._pool = self._pool_factory()
            if self._pool is None:
                settings = self.settings
                runtime_root, self._owner = _runtime_root(settings.tmp_root)
                env = kernel_environment(
                    program_environment(os.environ, settings.run_env_keep), settings.python
                )
                launcher = create_launcher(
                    settings.jupyter_launcher,
                    settings.python,
                    env,
                    marker=str(runtime_root),
                    startup_timeout=settings.jupyter_startup_timeout_s,
                    world=self.world,
                )
                # Output past the cap of /run_code's streams is dropped here too.
                self._starter = KernelStarter(launcher, runtime_root, settings.max_output_bytes)
                self._pool = KernelPool(
                    self._starter,
                    size=settings.jupyter_pool_size,
                    startup_timeout=settings.jupyter_startup_timeout_s,
                    kill_pending=self._starter.kill_all,
                )
            return self._pool

    @property
    def runtime_root(self) -> Path | None:
        """Where the kernels' connection files live (also in the command line of their processes)."""
        return self._starter.runtime_root if self._starter is not None else None

    def warm(self) -> None:
        """Start the pool's kernels now instead of at the first request."""
        self._get_pool().warm()

    def stats(self) -> dict[str, int]:
        """Warm and cold requests, kernels started, ready, starting and busy."""
        with self._lock:
            pool = self._pool
        return pool.stats() if pool is not None else {}

    def live_kernel_pids(self) -> list[int]:
        """Processes of kernels that are started and not yet killed."""
        with self._lock:
            starter = self._starter
        return starter.live_pids() if starter is not None else []

    def reset(self) -> None:
        """Forget the counts. Kernels need no reset: none serves two requests."""
        with self._lock:
            pool = self._pool
        if pool is not None:
            pool.reset_stats()

    def close(self) -> None:
        """Kill every kernel and the fork server; remove the runtime directory. Idempotent."""
        with self._lock:
            self._closed = True
            pool, starter = self._pool, self._starter
            self._pool = None
            owner, self._owner = self._owner, None
        if pool is not None:
            pool.close()
        if starter is not None:
            starter.close()  # removes the runtime dir
        if owner is not None:
            os.close(owner)

    # -- the endpoint ---------------------------------------------------------------------------

    def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        """Answer one validated request as SandboxFusion would; never raises."""
        started = time.monotonic()
        response = RunJupyterResponse(
            status=RunStatus.Success, message="", executor_pod_name=self.settings.pod_name
        )
        if math.isnan(request.total_timeout):
            # SandboxFusion's driver command gets the run_timeout NaN + 10, which fails as NaN fails
            # /run_code, before the driver starts; its handler then answers Failed with that result.
            response.status = RunStatus.Failed
            response.driver = nan_timeout_result("python main.py")
            return response
        deadline = started + driver_budget(request.total_timeout, self.settings.max_timeout_s)
        workdir: str | None = None
        try:
            if self.world is None:
                workdir = tempfile.mkdtemp(dir=self.settings.tmp_root)
                restore_files(workdir, request.files)
            else:  # written by the kernel, in its world; checked here first, as restore_files does
                for content in request.files.values():
                    if isinstance(content, str):
                        base64.b64decode(content)
            cells, files = self._run_cells(request, workdir, deadline)
        except DeadlineExceeded:
            response.status = RunStatus.Failed
            response.driver = CommandRunResult(
                status=CommandRunStatus.TimeLimitExceeded,
                execution_time=time.monotonic() - started,
                return_code=None,
                stdout="",  # the driver's own print was still in its buffer when it was killed
                stderr="",
            )
        except KernelDied as exc:
            response.status = RunStatus.Failed
            response.driver = CommandRunResult(
                status=CommandRunStatus.Finished,
                execution_time=time.monotonic() - started,
                return_code=1,
                stdout=driver_log(request),
                stderr=f"nbclient.exceptions.DeadKernelError: {exc}\n",
            )
        except Exception as exc:
            # SandboxFusion's handler turns any exception into this message; the trailing " None"
            # is the return value of traceback.print_tb that it interpolates.
            code_repr = "\n".join(request.cells)[:100]
            response.status = RunStatus.SandboxError
            response.message = f"exception on running jupyter {code_repr}: {exc} None"
        else:
            response.driver = CommandRunResult(
                status=CommandRunStatus.Finished,
                execution_time=time.monotonic() - started,
                return_code=0,
                stdout=driver_log(request),
                stderr="",
            )
            response.cells = cells
            response.files = files
            errors = (
                f"{error.get('ename')}: {error.get('evalue')}" for cell in cells for error in cell.error
            )
            self.python_runtime.note_outputs([*errors, *(cell.stderr for cell in cells)])
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
        return response

    def _run_cells(
        self, request: RunJupyterRequest, workdir: str | None, deadline: float
    ) -> tuple[list[CellRunResult], dict[str, str]]:
        if time.monotonic() >= deadline:
            raise DeadlineExceeded("no time left to start a kernel")
        pool = self._get_pool()
        kernel: CellRunner
        kernel, _warm = pool.acquire(deadline)
        try:
            work: tuple[Path, str] | None = getattr(kernel, "work", None)
            if work is None:
                assert workdir is not None
                # The kernel was started elsewhere; work where SandboxFusion's kernel starts, in the
                # request's directory. This bookkeeping cell is In[1], so user cells are In[2], ...
                kernel.run_setup(f"__import__('os').chdir({workdir!r})", deadline)
                cells = [kernel.run_cell(code, deadline) for code in request.cells]
                return cells, fetch_files(workdir, request.fetch_files)
            # In a world: the files are written, and read back, by the kernel itself, in its view
            # (absolute names land in its world, symlinks are followed there, never on the host).
            host_dir, view_dir = work
            kernel.run_setup(_in_a_namespace(_WRITE_FILES, FILES=dict(request.files), CWD=view_dir), deadline)
            cells = [kernel.run_cell(code, deadline) for code in request.cells]
            return cells, self._fetch_in_world(kernel, host_dir, view_dir, request.fetch_files, deadline)
        finally:
            pool.release(kernel)

    @staticmethod
    def _fetch_in_world(
        kernel: CellRunner, host_dir: Path, view_dir: str, names: list[str], deadline: float
    ) -> dict[str, str]:
        """``fetch_files`` of a kernel in a world: it copies each regular file it sees among
        ``names`` into a fresh dir of its work dir, read here without following any link."""
        if not names:
            return {}
        out = ".mocksandbox-fetch-" + secrets.token_hex(6)
        kernel.run_setup(_in_a_namespace(_COPY_FILES, NAMES=list(names), CWD=view_dir, OUT=out), deadline)
        fetched: dict[str, str] = {}
        try:
            out_fd = os.open(host_dir / out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return fetched
        try:
            for index, name in enumerate(names):
                try:
                    fd = os.open(str(index), os.O_RDONLY | os.O_NOFOLLOW, dir_fd=out_fd)
                except OSError:
                    continue  # not a regular file in the kernel's view
                with os.fdopen(fd, "rb") as handle:
                    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                        continue
                    fetched[name] = base64.b64encode(handle.read()).decode("ascii")
        finally:
            os.close(out_fd)
        return fetched

    def describe(self) -> dict[str, Any]:
        """The configuration, for the start-up banner."""
        return {
            "pool_size": self.settings.jupyter_pool_size,
            "launcher": self.settings.jupyter_launcher,
            "prewarm": self.settings.jupyter_prewarm,
        }
