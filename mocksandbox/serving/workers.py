"""``mocksandbox serve --workers N``: N server processes answering from one address, one state.

The process model: the *master* (the ``mocksandbox serve`` process) binds the listening socket,
holds the control state (:class:`~mocksandbox.control.pooled.PooledControlState`, served to the
workers by a :class:`~mocksandbox.control.shared.ControlStateServer`, its counters mapped by all)
and the sessions' state dir, and starts N *workers*: ``python -m mocksandbox.serving.workers``, each
inheriting the listening socket and accepting from it (the kernel hands each connection to one of
them), each with its own app, launcher and confinement, and a
:class:`~mocksandbox.control.shared.RemoteControlState`. The host's process budget is split between
them, and each worker keeps to its share of the cores (:mod:`mocksandbox.execution.affinity`).

Why this and not gunicorn: the server's own request handler (keep-alive with bodies read whole,
connection resets for faults, the launcher per process) stays as it is, and a worker is a new
interpreter, not a fork of a process that already runs threads and a launcher.

A worker that dies is replaced, and the journal says so (an ``EVENT`` entry). Ctrl-C (or SIGTERM)
stops the workers, then the master. Workers answer nothing that the master's state does not see.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from mocksandbox.control.handle import ControlHandle
from mocksandbox.control.pooled import PooledControlState
from mocksandbox.control.shared import ControlStateServer
from mocksandbox.execution.affinity import format_cpus, keep_to, parse_cpus, usable_cpus, worker_shares
from mocksandbox.execution.budget import (
    MemoryBudget,
    MemoryLimit,
    ProcessBudget,
    ProcessLimit,
    discover_memory_limits,
    discover_process_limits,
    plan_memory_budget,
    plan_process_budget,
)
from mocksandbox.settings import Settings

#: Environment variable carrying a worker's settings (JSON), so that no secret or long value shows
#: on its command line.
SETTINGS_VARIABLE = "MOCKSANDBOX_WORKER_SETTINGS"
#: How long a worker may take to be ready (engine, launcher, datasets, instances).
READY_TIMEOUT_S = 120.0
#: How often the master looks for workers that died.
WATCH_INTERVAL_S = 0.2


class WorkerStartError(RuntimeError):
    """A worker could not start; the message is its own reason."""


B = TypeVar("B", ProcessBudget, MemoryBudget)


def split_budget(budget: B, workers: int) -> B:
    """Each worker's share of a host budget (processes or memory): all runs of all workers together
    stay within what the budget gives runs, and no run of one gets more than its worker's share."""
    if budget.runs_total is None:
        return budget
    share = max(1, budget.runs_total // workers)
    return dataclasses.replace(budget, runs_total=share, per_run=min(budget.per_run, share))


def budget_to_json(budget: ProcessBudget | MemoryBudget) -> str:
    return json.dumps(dataclasses.asdict(budget))


def _budget_fields(text: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    data = json.loads(text)
    return data.pop("binding"), data


def process_budget_from_json(text: str) -> ProcessBudget:
    binding, fields = _budget_fields(text)
    return ProcessBudget(binding=None if binding is None else ProcessLimit(**binding), **fields)


def memory_budget_from_json(text: str) -> MemoryBudget:
    binding, fields = _budget_fields(text)
    return MemoryBudget(binding=None if binding is None else MemoryLimit(**binding), **fields)


def shared_listener(host: str, port: int) -> socket.socket:
    """The listening socket every worker accepts from (non-blocking: a worker that loses the race
    for a connection goes back to waiting instead of blocking in ``accept``)."""
    from mocksandbox.serving.single import bind_listener

    listener = bind_listener(host, port)
    listener.setblocking(False)
    listener.set_inheritable(True)
    return listener


class Worker:
    """One worker process and what the master knows of it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.name = f"worker-{index}"
        self.process: subprocess.Popen[bytes] | None = None
        #: After a failed replacement: when to try again, and how long to wait the next time.
        self.retry_at = 0.0
        self.retry_pause = 1.0


class WorkerPool:
    """The master's side: the listening socket, the state, and N workers kept alive."""

    #: ``serve --verbose``: the first worker's banner says everything, not a screenful.
    verbose_banner = False

    def __init__(
        self,
        settings: Settings,
        count: int,
        say: Callable[[str], None] = print,
    ) -> None:
        from mocksandbox.core import MockSandbox, capacity_from_settings
        from mocksandbox.sessions.manager import open_shared_state_dir

        self.count = count
        self.say = say
        self._stopping = threading.Event()
        self.budget = plan_process_budget(discover_process_limits(), settings.max_processes)
        self.worker_budget = split_budget(self.budget, count)
        self.memory_budget = plan_memory_budget(discover_memory_limits(), settings.max_memory_mb)
        self.worker_memory_budget = split_budget(self.memory_budget, count)
        self.listener = shared_listener(settings.host, settings.port)
        try:
            self.state = PooledControlState(settings.journal_limit, capacity_from_settings(settings))
        except BaseException:
            self.listener.close()
            raise
        try:
            self.state.reset(MockSandbox.configured_faults(settings), capacity_from_settings(settings))
            self.state_dir = open_shared_state_dir(settings)
        except BaseException:
            self.state.close()
            self.listener.close()
            raise
        self.control = ControlStateServer(self.state)
        # Workers see the shared state dir as configured, and bind nothing themselves.
        self.settings = settings.replace(state_dir=str(self.state_dir.path), workers=1)
        self.workers = [Worker(i + 1) for i in range(count)]
        #: Each worker's cores, when they are kept to a share (``pin_workers``; see
        #: :mod:`mocksandbox.execution.affinity`); ``None``: wherever the scheduler puts them.
        self.shares = worker_shares(usable_cpus(), count) if settings.pin_workers and count > 1 else None

    @property
    def url(self) -> str:
        host, port = self.listener.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}"

    def _spawn(self, worker: Worker, banner: bool) -> list[str]:
        """Start ``worker`` and wait until it is ready; its banner lines if asked for."""
        ready_read, ready_write = os.pipe()
        env = {**os.environ, SETTINGS_VARIABLE: self.settings.model_dump_json()}
        command = [
            sys.executable,
            "-m",
            "mocksandbox.serving.workers",
            "--listen-fd",
            str(self.listener.fileno()),
            "--ready-fd",
            str(ready_write),
            "--control",
            self.control.path,
            "--name",
            worker.name,
            "--budget",
            budget_to_json(self.worker_budget),
            "--memory-budget",
            budget_to_json(self.worker_memory_budget),
        ]
        if banner:
            command += ["--banner", "verbose" if self.verbose_banner else "short"]
        if self.shares is not None:
            command += ["--cpus", format_cpus(self.shares[worker.index - 1])]
        try:
            worker.process = subprocess.Popen(
                command, pass_fds=(self.listener.fileno(), ready_write), env=env, stdin=subprocess.DEVNULL
            )
        finally:
            os.close(ready_write)
        with os.fdopen(ready_read, "rb") as ready:
            line = _read_line(ready, READY_TIMEOUT_S)
        if not line:
            code = worker.process.poll()
            raise WorkerStartError(f"{worker.name} did not start (exit status {code})")
        message = json.loads(line)
        if "error" in message:
            worker.process.wait()
            raise WorkerStartError(message["error"])
        lines: list[str] = message.get("banner", [])
        return lines

    def start(self) -> list[str]:
        """Start every worker; the first one's description of the sandbox (banner lines)."""
        banner: list[str] = []
        for worker in self.workers:
            lines = self._spawn(worker, banner=worker.index == 1)
            if worker.index == 1:
                banner = lines
        return banner

    def watch(self, until: threading.Event | None = None) -> None:
        """Replace workers that die, until :meth:`stop` (or ``until`` is set); each replacement
        goes in the journal."""
        until = until if until is not None else threading.Event()  # (one that is never set)
        while not self._stopping.wait(WATCH_INTERVAL_S) and not until.is_set():
            for worker in self.workers:
                process = worker.process
                if process is None or process.poll() is None or self._stopping.is_set():
                    continue
                if time.monotonic() < worker.retry_at:
                    continue  # its last replacement failed: not in a tight loop
                status = process.returncode
                how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
                try:
                    self._spawn(worker, banner=False)
                except (WorkerStartError, OSError) as exc:
                    text = (
                        f"{worker.name} (pid {process.pid}) died ({how}); replacing it failed, "
                        f"trying again in {worker.retry_pause:g} s: {exc}"
                    )
                    worker.retry_at = time.monotonic() + worker.retry_pause
                    worker.retry_pause = min(worker.retry_pause * 2, 60.0)
                else:
                    worker.retry_pause = 1.0
                    assert worker.process is not None
                    text = (
                        f"{worker.name} (pid {process.pid}) died ({how}); "
                        f"replaced by pid {worker.process.pid}"
                    )
                self.state.note_event(text, worker.name)
                self.say(f"mocksandbox: {text}")

    def stop(self) -> None:
        """Stop the workers (SIGTERM, then SIGKILL after a grace period) and release everything."""
        self._stopping.set()
        for worker in self.workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for worker in self.workers:
            if worker.process is None:
                continue
            try:
                worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
        self.control.close()
        self.state.close()
        self.listener.close()
        self.state_dir.close()


def _read_line(stream: Any, timeout: float) -> bytes:
    """One line from a pipe, or what came before it closed; ``b""`` after ``timeout``."""
    result: list[bytes] = []
    reader = threading.Thread(target=lambda: result.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return result[0] if result else b""


def serve_workers(settings: Settings, verbose: bool = False) -> int:
    """``serve --workers N``: the master of N worker processes (see :mod:`mocksandbox.serving.workers`);
    ``verbose``: the banner says everything."""
    from mocksandbox import __version__
    from mocksandbox.serving.banner import stop_on_signals
    from mocksandbox.sessions import SessionError

    count = settings.worker_count()
    try:
        pool = WorkerPool(settings, count)
    except OSError as exc:
        print(
            f"mocksandbox: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    except SessionError as exc:
        print(f"mocksandbox: {exc}", file=sys.stderr)
        return 2
    pool.verbose_banner = verbose
    stop_requested = stop_on_signals()
    try:
        banner = pool.start()
        print(f"mocksandbox {__version__} serving on {pool.url} with {count} workers", flush=True)
        # The short banner's last line says where to read more: it stays last.
        more = banner.pop() if banner and banner[-1].startswith("  more:") else None
        for line in banner:
            # The first worker describes its share of the budgets: say the whole instead.
            if line.startswith("  process budget:"):
                line = f"  process budget: {pool.budget.describe()}"
            elif line.startswith("  memory budget:"):
                line = f"  memory budget: {pool.memory_budget.describe()}"
            print(line, flush=True)
        share, memory = pool.worker_budget, pool.worker_memory_budget
        shares = (
            f"; each worker's runs: "
            f"{share.runs_total if share.runs_total is not None else 'any number of'} processes "
            f"together, {share.per_run} per run"
            + ("" if memory.runs_total is None else f"; {memory.runs_total // (1 << 20)} MiB together")
        )
        print(f"  workers: {count}, one control state{shares if verbose else ''}", flush=True)
        if pool.shares is not None and verbose:
            cores = "; ".join(
                f"{worker.name} on {format_cpus(share)}"
                for worker, share in zip(pool.workers, pool.shares, strict=True)
            )
            print(f"  cores: {cores} (user programs on all; --no-pin-workers to let them roam)", flush=True)
        if more is not None:
            print(more, flush=True)
        print("  press Ctrl-C to stop", flush=True)
        pool.watch(until=stop_requested)
    except WorkerStartError as exc:
        print(f"mocksandbox: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    finally:
        # A second Ctrl-C (or a signal sent to the whole group as well as to us) must not break
        # the stop off half-way with a traceback: it is bounded (workers are killed after 30 s).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("\nmocksandbox: stopping", flush=True)
        pool.stop()
    return 0


# -- the worker process ------------------------------------------------------------------------------


def _worker_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m mocksandbox.serving.workers")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--budget", required=True)
    parser.add_argument("--memory-budget", required=True)
    parser.add_argument("--banner", choices=("short", "verbose"), help="describe the sandbox, so")
    parser.add_argument("--cpus", help="keep to these cores (0,2,...); user programs get all back")
    args = parser.parse_args(argv)
    if args.cpus:  # first, before any thread starts: every thread and child inherits it
        keep_to(parse_cpus(args.cpus))
    ready = os.fdopen(args.ready_fd, "w")

    def tell(message: dict[str, Any]) -> None:
        ready.write(json.dumps(message) + "\n")
        ready.flush()

    from mocksandbox.control.shared import RemoteControlState
    from mocksandbox.core import MockSandbox
    from mocksandbox.serving.banner import sandbox_banner, stop_on_signals
    from mocksandbox.serving.single import MockServer
    from mocksandbox.sessions import SessionError
    from mocksandbox.web import create_app

    settings = Settings.model_validate_json(os.environ.pop(SETTINGS_VARIABLE))
    budget = process_budget_from_json(args.budget)
    memory_budget = memory_budget_from_json(args.memory_budget)
    try:
        control = RemoteControlState(args.control)
        sandbox = MockSandbox.create(
            settings,
            control=control,
            worker_name=args.name,
            process_budget=budget,
            memory_budget=memory_budget,
            shared_state_dir=True,
        )
    except Exception as exc:
        tell({"error": f"{args.name}: cannot start: {exc}"})
        return 2
    try:
        banner = sandbox_banner(sandbox, settings).lines(args.banner == "verbose") if args.banner else []
    except SessionError as exc:
        sandbox.close()
        tell({"error": str(exc)})
        return 2
    server = MockServer.from_listener(args.listen_fd, create_app(sandbox), access_log=settings.access_log)

    server.stop_requested = stop_on_signals(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the master's Ctrl-C reaches the whole group
    tell({"ready": True, "banner": banner})
    ready.close()
    try:
        server.accept_forever()  # (SIGTERM's handler raises in it)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sandbox.close()
        control.close()
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))


# -- the pytest fixtures' view of a pool ----------------------------------------------------------------


class PoolControl(ControlHandle):
    """What the pytest fixtures do with a :class:`MockSandbox`, done on a running pool: the control
    state is held right here (the fixtures' process is the master), so reading it is exact and
    costs no HTTP; a reset goes through a worker (it also resets the workers' sessions)."""

    def __init__(self, pool: WorkerPool) -> None:
        from mocksandbox.core import MockSandbox, capacity_from_settings

        self.pool = pool
        self.settings = pool.settings
        self.control = pool.state
        self.url = pool.url
        self._baseline = MockSandbox.configured_faults(pool.settings)
        self._capacity = capacity_from_settings(pool.settings)
        self._watcher = threading.Thread(target=pool.watch, name="mocksandbox-pool-watch", daemon=True)

    def start(self) -> PoolControl:
        try:
            self.pool.start()
        except BaseException:
            self.pool.stop()  # the workers that did start, the socket, the state dir
            raise
        self._watcher.start()
        return self

    def close(self) -> None:
        self.pool.stop()
        self._watcher.join(timeout=10)
