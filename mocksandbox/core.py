"""The composition root: one object owns settings, engine, faults, journal and the in-flight cap.

The HTTP layer (including the ``/_mock/`` control endpoints), the CLI and the pytest fixtures all
reach the core through a :class:`MockSandbox`; nothing is created at import time.
"""

from __future__ import annotations

import shutil
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mocksandbox.control.state import (
    CapacityPolicy,
    ControlState,
    LocalControlState,
    ServerError,
    assert_request_count,
    select_entries,
    wait_idle,
)
from mocksandbox.datasets import DatasetService
from mocksandbox.execution.budget import MemoryBudget, ProcessBudget
from mocksandbox.execution.confinement import Confinement
from mocksandbox.execution.engine import ExecutionEngine, create_engine
from mocksandbox.execution.languages import LANGUAGES, TOOLCHAIN_BINARIES
from mocksandbox.faults import FaultRule, FaultSpec, load_fault_file, parse_fault_specs, validate_fault_spec
from mocksandbox.journal import JournalEntry
from mocksandbox.jupyter import JupyterService
from mocksandbox.recording import CassetteHandler, player_from_settings
from mocksandbox.sessions import SessionManager
from mocksandbox.settings import Settings, load_settings


def capacity_from_settings(settings: Settings) -> CapacityPolicy:
    """The cap a server starts with (and returns to on reset)."""
    return CapacityPolicy(
        settings.max_in_flight, settings.overload, settings.queue_timeout_s, settings.retry_after_s
    )


class MockSandbox:
    """Everything one mock server holds. Build it with :meth:`create`; :meth:`close` when done."""

    def __init__(
        self,
        settings: Settings,
        engine: ExecutionEngine,
        confinement: Confinement,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        baseline_faults: list[FaultSpec] | None = None,
        sessions: SessionManager | None = None,
        datasets: DatasetService | None = None,
        control: ControlState | None = None,
        worker_name: str | None = None,
        cassette: CassetteHandler | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        #: Dataset endpoints (/list_datasets, /get_prompts, /submit, ...); programs run on the engine.
        self.datasets = datasets if datasets is not None else DatasetService.from_settings(settings, engine)
        #: /run_jupyter; its kernel pool starts on first use (at once with ``jupyter_prewarm``).
        self.jupyter = JupyterService(settings, world=engine.world)
        #: swedev sessions (/start_instance, /process_action, /postprocess, /compute_reward).
        in_worlds = engine.isolation.mode == "lite"
        self.sessions = (
            sessions
            if sessions is not None
            else SessionManager.create(
                settings, engine.runner, runs_in_worlds=in_worlds, run_owner=engine.isolation.run_owner()
            )
        )
        self.confinement = confinement
        self.sleep = sleep
        self._baseline_faults = (
            baseline_faults if baseline_faults is not None else self.configured_faults(settings)
        )
        #: Journal, in-flight count and cap, fault rules, server errors: one state however many
        #: processes serve (DESIGN seam 6). Given: shared with others; else this process's own,
        #: set to the configured baseline.
        if control is None:
            control = LocalControlState(settings.journal_limit, capacity_from_settings(settings), clock)
            control.reset(self._baseline_faults, capacity_from_settings(settings))
        self.control: ControlState = control
        #: Which server process this is, in the journal (``None`` with one process).
        self.worker_name = worker_name
        #: Answers from a cassette (``serve --replay``) or records through to a deployment (the
        #: pytest plugin's ``--mocksandbox-record``); ``None``: all runs here. A test may swap it;
        #: :meth:`reset` restores the configured one.
        self.cassette = cassette if cassette is not None else player_from_settings(settings)
        self._baseline_cassette = self.cassette
        #: Called by close(), last added first (e.g. the launcher process).
        self._closers: list[Callable[[], None]] = []

    @classmethod
    def create(
        cls,
        settings: Settings | None = None,
        control: ControlState | None = None,
        worker_name: str | None = None,
        process_budget: ProcessBudget | None = None,
        shared_state_dir: bool = False,
        memory_budget: MemoryBudget | None = None,
    ) -> MockSandbox:
        """A sandbox with the real engine, confined as the host allows.

        One of several worker processes (see :mod:`mocksandbox.serving.workers`) passes the ``control``
        state they share, its ``worker_name``, its share of the host's ``process_budget`` and
        ``memory_budget``, and ``shared_state_dir`` (the sessions' state dir, prepared by the
        process that started it).
        """
        settings = settings or load_settings()
        baseline = cls.configured_faults(settings)  # fail on a bad fault file before any set-up
        cassette = player_from_settings(settings)  # and on a cassette that cannot be read
        engine, confinement, launcher = create_engine(settings, process_budget, memory_budget)
        try:  # instances are loaded and checked, a configured state dir is opened (and locked)
            datasets = DatasetService.from_settings(settings, engine)  # dataset files are read and checked
            sessions = SessionManager.create(
                settings,
                engine.runner,
                shared_state_dir=shared_state_dir,
                runs_in_worlds=engine.isolation.mode == "lite",
                run_owner=engine.isolation.run_owner(),
            )
        except BaseException:
            launcher.close()
            confinement.close()
            raise
        box = cls(
            settings,
            engine,
            confinement,
            baseline_faults=baseline,
            sessions=sessions,
            datasets=datasets,
            control=control,
            worker_name=worker_name,
            cassette=cassette,
        )
        box._closers.append(launcher.close)
        box._closers.append(engine.close)
        if settings.jupyter_prewarm:
            box.jupyter.warm()  # in the background: start-up does not wait for kernels
        return box

    @staticmethod
    def configured_faults(settings: Settings) -> list[FaultSpec]:
        """The fault rules ``settings`` start with (and a reset restores)."""
        specs = parse_fault_specs(settings.faults, source="settings.faults")
        if settings.faults_file:
            specs += load_fault_file(settings.faults_file)
        return specs

    # -- state ---------------------------------------------------------------------------------

    def reset(self) -> None:
        """Back to the configured baseline: journal, stats, in-flight maximum, faults, cap, errors,
        cassette, and no swedev sessions (live ones are ended, their work dirs and all records removed;
        instances stay loaded)."""
        self.sessions.reset()
        self.cassette = self._baseline_cassette
        self.jupyter.reset()  # counts only: no kernel ever serves two requests
        self.control.reset(self._baseline_faults, capacity_from_settings(self.settings))

    def close(self) -> None:
        """Release host resources: helper processes, then the per-run cgroup parents."""
        self.sessions.close()  # a temporary state dir goes; a configured one is kept for a restart
        self.jupyter.close()  # every kernel and the kernel fork server
        while self._closers:
            self._closers.pop()()
        self.confinement.close()
        self.control.close()

    # -- faults and cap ------------------------------------------------------------------------

    def add_fault(self, spec: FaultSpec | Mapping[str, Any] | None = None, **parts: Any) -> FaultRule:
        """Add a fault rule: a spec, or its parts (``match=..., action=..., schedule=...``)."""
        (rule,) = self.add_faults([spec if spec is not None else parts])
        return rule

    def add_faults(self, specs: Iterable[FaultSpec | Mapping[str, Any]]) -> list[FaultRule]:
        """Add several rules, all or none (:class:`~mocksandbox.faults.FaultError` if one is wrong)."""
        return self.control.add_faults([validate_fault_spec(spec) for spec in specs])

    def fault_rules(self) -> list[FaultRule]:
        """The rules in force, with how often each matched and fired."""
        return self.control.fault_rules()

    def remove_fault(self, rule_id: str) -> bool:
        return self.control.remove_fault(rule_id)

    def clear_faults(self) -> list[str]:
        """Remove every rule (start-up ones too, until the next reset); the ids removed."""
        return self.control.clear_faults()

    @property
    def capacity(self) -> CapacityPolicy:
        """The cap in force."""
        return self.control.capacity()

    def set_capacity(self, **changes: Any) -> CapacityPolicy:
        """Change the cap (``max_in_flight``, ``overload``, ``queue_timeout_s``, ``retry_after_s``)."""
        policy = self.control.capacity().changed(**changes)
        self.control.set_capacity(policy)
        return policy

    # -- what happened -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counts since the last reset: requests, in flight now and at most, by path and status."""
        return self.control.stats()

    def timeline(self) -> list[tuple[float, int]]:
        """``(seconds since reset, requests in flight)`` at every change."""
        return self.control.timeline()

    def requests(
        self,
        path: str | None = None,
        method: str | None = None,
        language: str | None = None,
        status: int | None = None,
    ) -> list[JournalEntry]:
        """Journal entries that match every given filter, oldest first."""
        return select_entries(self.control.entries(), path, method, language, status)

    def assert_requests(self, count: int, **filters: Any) -> list[JournalEntry]:
        """Assert that exactly ``count`` requests match ``filters``; the message shows the nearest."""
        return assert_request_count(self.control.entries(), count, **filters)

    def record_error(self, path: str, exc: BaseException) -> None:
        """Keep an unexpected server-side exception for the test to re-raise."""
        self.control.record_error(ServerError(path, exc, "".join(traceback.format_exception(exc))))

    def take_errors(self) -> list[ServerError]:
        """The server-side exceptions since the last call, forgotten once taken."""
        return self.control.take_errors()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no request is in flight (e.g. before reading the journal from another thread)."""
        return wait_idle(self.control, timeout)

    def journal_entry(self, entry_id: int) -> JournalEntry | None:
        """One journal entry with its bodies, if the journal still holds it."""
        return self.control.entry(entry_id)


def describe_entries(entries: Iterable[JournalEntry]) -> list[dict[str, Any]]:
    """Journal entries as JSON data."""
    return [e.to_dict() for e in entries]


def language_toolchains() -> list[dict[str, Any]]:
    """Every language of the table, with the toolchain binary that runs it and whether this host
    has it on ``PATH`` (a language without one still answers, as SandboxFusion does: rc 127)."""
    return [
        {"name": name, "toolchain": TOOLCHAIN_BINARIES.get(name), "available": _on_path(name)}
        for name in LANGUAGES
    ]


def _on_path(language: str) -> bool:
    binary = TOOLCHAIN_BINARIES.get(language)
    return binary is not None and shutil.which(binary) is not None
