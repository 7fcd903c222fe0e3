"""What ``mocksandbox serve`` says when it starts, whatever the shape that serves: the lines about a
sandbox after its URL (a screenful, or everything with ``--verbose``), and the foreground plumbing
the three shapes share (stopping on Ctrl-C and SIGTERM alike)."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mocksandbox.execution.protections import Protection, broken, protections, summary
from mocksandbox.extras import jupyter_missing as jupyter_missing_for

if TYPE_CHECKING:
    from mocksandbox.core import MockSandbox
    from mocksandbox.execution.confinement import Confinement
    from mocksandbox.execution.engine import ExecutionEngine
    from mocksandbox.runtime.production import RuntimeFacts
    from mocksandbox.sessions.executor import BackendProbe
    from mocksandbox.settings import Settings


def stop_on_signals(*signals: int) -> threading.Event:
    """Stop the same clean way on each of ``signals`` (default: Ctrl-C and SIGTERM, even when
    started with SIGINT ignored): each raises :class:`KeyboardInterrupt` in the main thread and
    sets the event returned, which the serving loops check too (:attr:`MockServer.stop_requested
    <mocksandbox.serving.single.MockServer.stop_requested>`). The exception alone is not enough:
    one raised while the main thread runs a finalizer (a ``__del__``, a weakref callback, under
    garbage collection) is printed as "Exception ignored" and dropped by Python, and the server
    would serve on.

    Only the first signal raises: a second (Ctrl-C pressed twice, or a SIGTERM from ``timeout`` and
    another from ``kill``) would otherwise break off the stop it is in, between closing the launcher
    and removing the runs' files, and leave them behind with a traceback. It is said, and that
    signal is ignored from then on; so are all of them once the process exits (``atexit``): the
    interpreter's end puts a Python handler back to the default, and a late signal would kill the
    process that had stopped cleanly."""
    stop = threading.Event()

    def interrupt(signum: int, frame: object) -> None:
        if not stop.is_set():
            stop.set()
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_IGN)
        try:  # (not print: a handler may run in the middle of another print)
            os.write(2, b"mocksandbox: still stopping (ending runs, removing their files)\n")
        except OSError:
            pass

    signals = signals or (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        signal.signal(signum, interrupt)
    atexit.register(_ignore, signals)
    return stop


def _ignore(signals: tuple[int, ...]) -> None:
    for signum in signals:
        signal.signal(signum, signal.SIG_IGN)


@dataclass(frozen=True)
class Banner:
    """What ``serve`` says about a sandbox after its URL, twice: ``short`` fits a screen (what
    holds, the runtime, every warning, and a line each for datasets, Jupyter and swedev), and
    ``verbose`` (``serve --verbose``) says everything: budgets, hidden paths, each dataset."""

    short: list[str]
    verbose: list[str]

    def lines(self, verbose: bool = False) -> list[str]:
        return self.verbose if verbose else self.short


def sandbox_banner(sandbox: MockSandbox, settings: Settings) -> Banner:
    """What ``serve`` says about a sandbox after its URL (:class:`Banner`). Raises
    :class:`~mocksandbox.sessions.SessionError` when the swedev backend or isolation cannot work
    (the server must not start then)."""
    backend = sandbox.sessions.check_backend()  # --swedev-backend: can the tests run there?
    return Banner(
        short_lines(sandbox, settings, backend),
        host_lines(sandbox.engine, sandbox.confinement, settings)
        + _service_lines(sandbox, settings, backend),
    )


def host_lines(engine: ExecutionEngine, confinement: Confinement, settings: Settings) -> list[str]:
    """What runs get on this host, in full: confinement, isolation, what holds and what does not,
    what is hidden, the budgets, the Python user code runs on (``serve --verbose`` and ``doctor``)."""
    rows = protections(engine.isolation, confinement, engine.proofs)
    lines = [
        f"  confinement: {engine.confinement_name}",
        f"  isolation: {engine.isolation.describe()}",
        f"  protections: {summary(rows)}",
        *_warnings(engine, rows),
        f"  {engine.isolation.describe_hidden()}",
        f"  process budget: {confinement.budget.describe()}",
        f"  memory budget: {confinement.memory_budget.describe()}",
        f"  user python: {settings.python} (exec mode: {settings.exec_mode})",
        f"  runs starting: {_starting_runs(engine)}",
        f"  python runtime: {engine.python_runtime.facts().describe()}",
    ]
    if shares_server_environment(settings.python):
        lines.append(f"  WARNING: {SHARES_SERVER_ENVIRONMENT}")
    lines.append(f"  runtime: {describe_runtime(settings)}")
    return lines


def _starting_runs(engine: ExecutionEngine) -> str:
    gate = getattr(engine.runner, "gate", None)
    return "no limit (starting_runs: 0)" if gate is None else f"{gate.describe()} (starting_runs)"


def short_lines(sandbox: MockSandbox, settings: Settings, backend: BackendProbe | None = None) -> list[str]:
    """The banner that fits a screen: one line of what holds, the runtime in two, every warning
    (as the full banner has it), then the rest as counts and the commands that say more."""
    engine = sandbox.engine
    rows = protections(engine.isolation, sandbox.confinement, engine.proofs)
    confinement = engine.confinement_name.split(" (")[0]
    lines = [f"  isolation: {engine.isolation.mode}, confinement: {confinement}; {held(rows)}"]
    lines += _warnings(engine, rows)
    facts = engine.python_runtime.facts()
    lines.append(f"  python: {_python_line(facts, settings.python)}")
    if shares_server_environment(settings.python):
        lines.append(f"  WARNING: {SHARES_SERVER_ENVIRONMENT}")
    lines.append(f"  runtime: {describe_runtime(settings, short=True)}")
    lines += _asked_for(sandbox, settings)
    notes = sandbox.datasets.startup_notes()
    noted = f"; {len(notes)} note(s) on what this host lacks" if notes else ""
    lines.append(
        f"  datasets: {len(sandbox.datasets.list_datasets())} (mocksandbox datasets lists them{noted})"
    )
    lines.append(f"  jupyter: {_jupyter(settings)}")
    sessions = sandbox.sessions
    state = sessions.state_dir or "a temporary dir"
    mode = sessions.isolation()[0]
    lines.append(
        f"  swedev: {len(sessions.registry)} instance(s), state in {state}, runs {sessions.executor.name}"
        f"{'' if mode == 'world' else f', sessions apart by {mode}'}"
    )
    if backend is not None:
        lines.append(f"  swedev backend: tests run with {backend.describe()}")
    console = "; console: /_mock/ui" if settings.control_api else ""
    lines.append(f"  more: mocksandbox serve --verbose, mocksandbox doctor, mocksandbox languages{console}")
    return lines


#: Said when user code runs on this server's own interpreter.
SHARES_SERVER_ENVIRONMENT = (
    "user code shares this server's environment (its packages and mocksandbox itself; SandboxFusion's "
    "runtime has pytest 7.4 and none of them): `mocksandbox runtime install --languages python` (as "
    "`make serve` does) gives it its own"
)


def held(rows: list[Protection]) -> str:
    """What holds, in a few words: how many protections, and those that do not or only partly."""
    whole = [row.name for row in rows if row.holds == "yes"]
    partly = [row.name for row in rows if row.holds == "partly"]
    missing = [row.name for row in rows if row.holds == "no"]
    if not partly and not missing:
        return f"all {len(rows)} protections of a run hold (mocksandbox doctor: which, how)"
    text = f"{len(whole)} of {len(rows)} protections hold"
    if partly:
        text += f"; partly: {', '.join(partly)}"
    if missing:
        text += f"; NOT: {', '.join(missing)}"
    return text + " (mocksandbox doctor: why, and what would give them)"


def _warnings(engine: ExecutionEngine, rows: list[Protection]) -> list[str]:
    """What ``auto`` could not give, and what the start-up run could do although configured not to."""
    lines = [f"  WARNING: not in force for runs: {missing}" for missing in engine.isolation.missing()]
    return lines + [f"  WARNING: {line}" for line in broken(rows)]


def _python_line(facts: RuntimeFacts, python: str) -> str:
    version = ".".join(map(str, facts.version)) if facts.version else "(does not run)"
    where = f"profile {facts.profile}" if facts.profile else python
    if not facts.same_minor:
        return (
            f"CPython {version} ({where}), NOT production's version ({facts.production}): answers carry "
            "a note; `mocksandbox runtime install --languages python` builds one"
        )
    return f"CPython {version} as production ({where})"


def _asked_for(sandbox: MockSandbox, settings: Settings) -> list[str]:
    """Lines for what was configured away from the defaults: cap, faults, replay, no control API."""
    lines = []
    if settings.max_in_flight:
        lines.append(f"  cap: {settings.max_in_flight} in flight, then {settings.overload}")
    if sandbox.fault_rules():
        lines.append(f"  faults: {len(sandbox.fault_rules())} rule(s) active")
    if not settings.control_api:
        lines.append("  control API: off")
    player = sandbox.cassette
    if player is not None and settings.replay_file:
        timing = ", recorded timing" if settings.replay_timing else ""
        size = getattr(player, "size", 0)
        lines.append(f"  replay: {settings.replay_file}, {size} recordings ({settings.replay_mode}{timing})")
    return lines


def _jupyter(settings: Settings) -> str:
    missing = jupyter_missing_for(settings.python)
    if missing:
        return f"off, {missing}"
    return (
        f"{settings.jupyter_pool_size} warm kernel(s) ({settings.jupyter_launcher}), "
        f"{'filling now' if settings.jupyter_prewarm else 'started at the first /run_jupyter'}"
    )


def _service_lines(sandbox: MockSandbox, settings: Settings, backend: BackendProbe | None) -> list[str]:
    """The rest of the full banner: what was configured, datasets by name, Jupyter, swedev."""
    lines = [line for line in _asked_for(sandbox, settings) if "control API" not in line]
    lines.insert(
        len([line for line in lines if line.startswith(("  cap:", "  faults:"))]),
        f"  control API: {'/_mock/' if settings.control_api else 'off'}",
    )
    lines.append(f"  datasets: {', '.join(sandbox.datasets.list_datasets())}")
    lines.extend(f"  datasets: {note}" for note in sandbox.datasets.startup_notes())
    lines.append(f"  jupyter: {_jupyter(settings)}")
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


def describe_runtime(settings: Settings, short: bool = False) -> str:
    """What ``serve`` found of the runtime (``mocksandbox languages`` says more); ``short``: the
    runtime dir and how many languages have their toolchains here."""
    from mocksandbox.runtime.layout import RuntimeDir
    from mocksandbox.runtime.report import runtime_summary

    text = runtime_summary(RuntimeDir(settings.runtime_dir), settings.python)
    if short:
        where, _, toolchains = text.partition("; toolchains for ")
        count = toolchains.split(" (")[0]
        return f"{where.split(' (')[0]}; toolchains for {count} here"
    return text
