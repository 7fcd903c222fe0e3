"""What ``mocksandbox serve`` says when it starts, whatever the shape that serves: the lines about a
sandbox after its URL, and the foreground plumbing the three shapes share (stopping on Ctrl-C and
SIGTERM alike)."""

from __future__ import annotations

import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from mocksandbox.execution.protections import protections, summary
from mocksandbox.extras import jupyter_missing as jupyter_missing_for

if TYPE_CHECKING:
    from mocksandbox.core import MockSandbox
    from mocksandbox.settings import Settings


def stop_on_signals(*signals: int) -> threading.Event:
    """Stop the same clean way on each of ``signals`` (default: Ctrl-C and SIGTERM, even when
    started with SIGINT ignored): each raises :class:`KeyboardInterrupt` in the main thread and
    sets the event returned, which the serving loops check too (:attr:`MockServer.stop_requested
    <mocksandbox.serving.single.MockServer.stop_requested>`). The exception alone is not enough:
    one raised while the main thread runs a finalizer (a ``__del__``, a weakref callback, under
    garbage collection) is printed as "Exception ignored" and dropped by Python, and the server
    would serve on."""
    stop = threading.Event()

    def interrupt(signum: int, frame: object) -> None:
        stop.set()
        raise KeyboardInterrupt

    for signum in signals or (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, interrupt)
    return stop


def sandbox_banner(sandbox: MockSandbox, settings: Settings) -> list[str]:
    """What ``serve`` says about a sandbox after its URL: confinement, budgets, extras, sessions.
    Raises :class:`~mocksandbox.sessions.SessionError` when the swedev backend or isolation
    cannot work (the server must not start then)."""
    backend = sandbox.sessions.check_backend()  # --swedev-backend: can the tests run there?
    rows = protections(sandbox.engine.isolation, sandbox.confinement)
    lines = [
        f"  confinement: {sandbox.engine.confinement_name}",
        f"  isolation: {sandbox.engine.isolation.describe()}",
        f"  protections: {summary(rows)}",
        *(f"  WARNING: not in force for runs: {missing}" for missing in sandbox.engine.isolation.missing()),
        f"  {sandbox.engine.isolation.describe_hidden()}",
        f"  process budget: {sandbox.confinement.budget.describe()}",
    ]
    lines.append(f"  memory budget: {sandbox.confinement.memory_budget.describe()}")
    lines.append(f"  user python: {settings.python} (exec mode: {settings.exec_mode})")
    lines.append(f"  python runtime: {sandbox.engine.python_runtime.facts().describe()}")
    if shares_server_environment(settings.python):
        lines.append(
            "  user python: user code shares this server's environment (its packages and mocksandbox "
            "itself; SandboxFusion's runtime has pytest 7.4 and none of them): "
            "`mocksandbox runtime install --languages python` (as `make serve` does) gives it its own"
        )
    lines.append(f"  runtime: {describe_runtime(settings)}")
    if settings.max_in_flight:
        lines.append(f"  cap: {settings.max_in_flight} in flight, then {settings.overload}")
    if sandbox.fault_rules():
        lines.append(f"  faults: {len(sandbox.fault_rules())} rule(s) active")
    lines.append(f"  control API: {'/_mock/' if settings.control_api else 'off'}")
    player = sandbox.cassette
    if player is not None and settings.replay_file:
        timing = ", recorded timing" if settings.replay_timing else ""
        size = getattr(player, "size", 0)
        lines.append(f"  replay: {settings.replay_file}, {size} recordings ({settings.replay_mode}{timing})")
    lines.append(f"  datasets: {', '.join(sandbox.datasets.list_datasets())}")
    lines.extend(f"  datasets: {note}" for note in sandbox.datasets.startup_notes())
    jupyter_missing = jupyter_missing_for(settings.python)
    if jupyter_missing:
        lines.append(f"  jupyter: off, {jupyter_missing}")
    else:
        lines.append(
            f"  jupyter: {settings.jupyter_pool_size} warm kernel(s) ({settings.jupyter_launcher}), "
            f"{'filling now' if settings.jupyter_prewarm else 'started at the first /run_jupyter'}"
        )
    sessions = sandbox.sessions
    state = sessions.state_dir or "a temporary dir (--state-dir DIR keeps sessions across restarts)"
    lines.append(
        f"  swedev: {len(sessions.registry)} instance(s), state in {state}, runs {sessions.executor.name}"
    )
    if backend is not None:
        lines.append(f"  swedev backend: tests run with {backend.describe()}")
    lines.append(f"  swedev isolation: {sessions.isolation()[1]}")
    return lines


def shares_server_environment(python: str) -> bool:
    """Whether ``python`` is this server's own environment (its venv, or the system Python it runs
    in): user code run with it imports the server's packages."""
    executable = Path(python)
    if not executable.is_absolute():
        found = shutil.which(python)
        if found is None:
            return False
        executable = Path(found)
    return executable.absolute().parent.parent == Path(sys.prefix).absolute()


def describe_runtime(settings: Settings) -> str:
    """What ``serve`` found of the runtime (``mocksandbox languages`` says more)."""
    from mocksandbox.runtime.layout import RuntimeDir
    from mocksandbox.runtime.report import runtime_summary

    return runtime_summary(RuntimeDir(settings.runtime_dir), settings.python)
