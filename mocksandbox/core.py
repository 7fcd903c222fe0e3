"""The composition root: one object owns settings, engine, faults, journal and the in-flight cap.

The HTTP layer (including the ``/_mock/`` control endpoints), the CLI and the pytest fixtures all
reach the core through a :class:`MockSandbox`; nothing is created at import time.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from mocksandbox.datasets import DatasetService
from mocksandbox.execution.confinement import Confinement
from mocksandbox.execution.engine import ExecutionEngine, create_engine
from mocksandbox.faults import FaultInjector, FaultRule, FaultSpec, load_fault_file, parse_fault_specs
from mocksandbox.journal import InFlight, Journal, JournalEntry, nearest
from mocksandbox.jupyter import JupyterService
from mocksandbox.sessions import SessionManager
from mocksandbox.settings import Settings, load_settings


@dataclass(frozen=True)
class CapacityPolicy:
    """The server-side concurrency cap, as a FaaS gateway in front of SandboxFusion applies it."""

    max_in_flight: int | None = None
    overload: Literal["reject", "queue"] = "reject"
    queue_timeout_s: float | None = None
    retry_after_s: float = 1.0

    @classmethod
    def from_settings(cls, settings: Settings) -> CapacityPolicy:
        return cls(
            settings.max_in_flight, settings.overload, settings.queue_timeout_s, settings.retry_after_s
        )

    def wait_seconds(self) -> float | None:
        """How long an over-cap request may wait for a slot (0: not at all; None: forever)."""
        if self.overload == "reject":
            return 0.0
        return self.queue_timeout_s


@dataclass(frozen=True)
class ServerError:
    """An unexpected exception inside the server, kept so that the test that caused it sees it."""

    path: str
    exception: BaseException
    traceback: str


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
    ) -> None:
        self.settings = settings
        self.engine = engine
        #: Dataset endpoints (/list_datasets, /get_prompts, /submit, ...); programs run on the engine.
        self.datasets = datasets if datasets is not None else DatasetService.from_settings(settings, engine)
        #: /run_jupyter; its kernel pool starts on first use (at once with ``jupyter_prewarm``).
        self.jupyter = JupyterService(settings)
        #: swedev sessions (/start_instance, /process_action, /postprocess, /compute_reward).
        self.sessions = sessions if sessions is not None else SessionManager.create(settings, engine.runner)
        self.confinement = confinement
        self.sleep = sleep
        self.faults = FaultInjector(clock)
        self.journal = Journal(settings.journal_limit, clock)
        self.in_flight = InFlight(clock=clock)
        self.capacity = CapacityPolicy.from_settings(settings)
        self._baseline_faults = (
            baseline_faults if baseline_faults is not None else self._configured_faults(settings)
        )
        self._errors: list[ServerError] = []
        #: Called by close(), last added first (e.g. the launcher process).
        self._closers: list[Callable[[], None]] = []
        self._errors_lock = threading.Lock()
        self.faults.add_all(self._baseline_faults)

    @classmethod
    def create(cls, settings: Settings | None = None) -> MockSandbox:
        """A sandbox with the real engine, confined as the host allows."""
        settings = settings or load_settings()
        baseline = cls._configured_faults(settings)  # fail on a bad fault file before any set-up
        engine, confinement, launcher = create_engine(settings)
        try:  # instances are loaded and checked, a configured state dir is opened (and locked)
            datasets = DatasetService.from_settings(settings, engine)  # dataset files are read and checked
            sessions = SessionManager.create(settings, engine.runner)
        except BaseException:
            launcher.close()
            confinement.close()
            raise
        box = cls(
            settings, engine, confinement, baseline_faults=baseline, sessions=sessions, datasets=datasets
        )
        box._closers.append(launcher.close)
        if settings.jupyter_prewarm:
            box.jupyter.warm()  # in the background: start-up does not wait for kernels
        return box

    @staticmethod
    def _configured_faults(settings: Settings) -> list[FaultSpec]:
        specs = parse_fault_specs(settings.faults, source="settings.faults")
        if settings.faults_file:
            specs += load_fault_file(settings.faults_file)
        return specs

    # -- state ---------------------------------------------------------------------------------

    def reset(self) -> None:
        """Back to the configured baseline: journal, stats, in-flight maximum, faults, cap, errors,
        and no swedev sessions (live ones are ended, their work dirs and all records removed;
        instances stay loaded)."""
        self.sessions.reset()
        self.jupyter.reset()  # counts only: no kernel ever serves two requests
        self.journal.reset()
        self.in_flight.reset()
        self.faults.reset()
        self.faults.add_all(self._baseline_faults)
        self.capacity = CapacityPolicy.from_settings(self.settings)
        with self._errors_lock:
            self._errors.clear()

    def close(self) -> None:
        """Release host resources: helper processes, then the per-run cgroup parents."""
        self.sessions.close()  # a temporary state dir goes; a configured one is kept for a restart
        self.jupyter.close()  # every kernel and the kernel fork server
        while self._closers:
            self._closers.pop()()
        self.confinement.close()

    # -- faults and cap ------------------------------------------------------------------------

    def add_fault(self, spec: FaultSpec | Mapping[str, Any] | None = None, **parts: Any) -> FaultRule:
        """Add a fault rule: a spec, or its parts (``match=..., action=..., schedule=...``)."""
        return self.faults.add(spec if spec is not None else parts)

    def set_capacity(self, **changes: Any) -> CapacityPolicy:
        """Change the cap (``max_in_flight``, ``overload``, ``queue_timeout_s``, ``retry_after_s``)."""
        policy = replace(self.capacity, **changes)
        if policy.max_in_flight is not None and policy.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1 (or None for no cap)")
        if policy.overload not in ("reject", "queue"):
            raise ValueError("overload must be 'reject' or 'queue'")
        self.capacity = policy
        return policy

    # -- what happened -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counts since the last reset: requests, in flight now and at most, by path and status."""
        return {
            **self.journal.counts(),
            **self.in_flight.snapshot(),
            "max_in_flight_cap": self.capacity.max_in_flight,
        }

    def requests(
        self,
        path: str | None = None,
        method: str | None = None,
        language: str | None = None,
        status: int | None = None,
    ) -> list[JournalEntry]:
        """Journal entries that match every given filter, oldest first."""
        return [
            e
            for e in self.journal.entries()
            if (path is None or e.path == path)
            and (method is None or e.method == method.upper())
            and (language is None or e.language == language)
            and (status is None or e.status == status)
        ]

    def assert_requests(self, count: int, **filters: Any) -> list[JournalEntry]:
        """Assert that exactly ``count`` requests match ``filters``; the message shows the nearest."""
        found = self.requests(**filters)
        if len(found) != count:
            wanted = ", ".join(f"{k}={v!r}" for k, v in filters.items()) or "any request"
            raise AssertionError(
                f"expected {count} request(s) with {wanted}, found {len(found)}.\n"
                f"Last requests seen:\n{nearest(self.journal.entries())}"
            )
        return found

    def record_error(self, path: str, exc: BaseException) -> None:
        """Keep an unexpected server-side exception for the test to re-raise."""
        with self._errors_lock:
            self._errors.append(ServerError(path, exc, "".join(traceback.format_exception(exc))))

    def take_errors(self) -> list[ServerError]:
        """The server-side exceptions since the last call, forgotten once taken."""
        with self._errors_lock:
            errors, self._errors = self._errors, []
        return errors

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no request is in flight (e.g. before reading the journal from another thread)."""
        deadline = time.monotonic() + timeout
        while self.in_flight.snapshot()["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self.in_flight.snapshot()["in_flight"]


def describe_entries(entries: Iterable[JournalEntry]) -> list[dict[str, Any]]:
    """Journal entries as JSON data."""
    return [e.to_dict() for e in entries]
