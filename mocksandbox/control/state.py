"""The control state: what the control API guarantees, held once per deployment (DESIGN seam 6).

The in-flight count and the cap, the journal in arrival order, the fault rules with their schedule
counters, the stats and the timeline, and the server errors a test re-raises: every guarantee the
``/_mock/`` API and the pytest fixtures give lives behind :class:`ControlState`, never in a copy of
its own. One backend per deployment shape:

* :class:`LocalControlState` (this module): one server process; plain objects and locks.
* :class:`~mocksandbox.control.shared.RemoteControlState`: worker processes on one machine, each a
  client of one :class:`LocalControlState` served by the process that started them.

Features are written once against the protocol, so a guarantee that holds for one process holds
for N workers (and, with a cluster-wide backend, for N replicas).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from mocksandbox.faults import FaultDecision, FaultError, FaultInjector, FaultRule, FaultSpec, RequestInfo
from mocksandbox.journal import InFlight, Journal, JournalEntry, nearest


@dataclass(frozen=True)
class CapacityPolicy:
    """The server-side concurrency cap, as a FaaS gateway in front of SandboxFusion applies it."""

    max_in_flight: int | None = None
    overload: Literal["reject", "queue"] = "reject"
    queue_timeout_s: float | None = None
    retry_after_s: float = 1.0

    def wait_seconds(self) -> float | None:
        """How long an over-cap request may wait for a slot (0: not at all; None: forever)."""
        if self.overload == "reject":
            return 0.0
        return self.queue_timeout_s

    def changed(self, **changes: Any) -> CapacityPolicy:
        """A copy with ``changes``, checked; raises ``ValueError`` for values that cannot hold."""
        policy = replace(self, **changes)
        if policy.max_in_flight is not None and policy.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1 (or None for no cap)")
        if policy.overload not in ("reject", "queue"):
            raise ValueError("overload must be 'reject' or 'queue'")
        return policy


@dataclass(frozen=True)
class ServerError:
    """An unexpected exception inside the server, kept so that the test that caused it sees it."""

    path: str
    exception: BaseException
    traceback: str


@dataclass(frozen=True)
class IncomingRequest:
    """What the outermost layer knows of a request before anything answers it."""

    method: str
    path: str
    query: str
    body: bytes
    client: str
    #: Which server process took it (``None`` with one process).
    worker: str | None = None


@dataclass(frozen=True)
class Admission:
    """What the control state decided for one request: its journal entry, whether the cap lets it
    in, and, if so, the faults that fire on it."""

    entry_id: int
    admitted: bool
    retry_after_s: float = 1.0
    decision: FaultDecision = field(default_factory=FaultDecision)


class ControlState(Protocol):
    """Every guarantee of the control API, whatever the deployment shape."""

    # -- the request path (the outermost WSGI layer) ------------------------------------------

    def admit(self, request: IncomingRequest) -> Admission:
        """Journal ``request`` in arrival order, apply the cap (waiting for a slot where the policy
        queues) and, if admitted, decide the faults that fire on it."""
        ...

    def finish(
        self,
        entry_id: int,
        status: int | None,
        response: bytes | None,
        outcome: str = "answered",
        leave: bool = True,
        divergences: tuple[str, ...] = (),
    ) -> None:
        """Record the answer (and where SandboxFusion would have answered differently); with
        ``leave``, the request also leaves the in-flight count."""
        ...

    def leave(self, entry_id: int | None = None) -> None:
        """The admitted request ``entry_id`` leaves the in-flight count (after
        ``finish(leave=False)``, or when it failed before its answer)."""
        ...

    # -- faults ---------------------------------------------------------------------------------

    def add_faults(self, specs: list[FaultSpec]) -> list[FaultRule]:
        """Add rules, all or none (raises :class:`~mocksandbox.faults.FaultError`)."""
        ...

    def remove_fault(self, rule_id: str) -> bool: ...

    def clear_faults(self) -> list[str]:
        """Remove every rule; the ids removed."""
        ...

    def fault_rules(self) -> list[FaultRule]:
        """The rules in force, with their counters as they are now."""
        ...

    # -- the cap --------------------------------------------------------------------------------

    def capacity(self) -> CapacityPolicy: ...

    def set_capacity(self, policy: CapacityPolicy) -> None: ...

    # -- what happened --------------------------------------------------------------------------

    def entries(self) -> list[JournalEntry]:
        """The journal, oldest first."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counts since the last reset, in flight now and at most, and the cap."""
        ...

    def timeline(self) -> list[tuple[float, int]]:
        """``(seconds since reset, requests in flight)`` at every change."""
        ...

    def record_error(self, error: ServerError) -> None: ...

    def take_errors(self) -> list[ServerError]:
        """The server errors since the last call, forgotten once taken."""
        ...

    # -- all of it ----------------------------------------------------------------------------

    def reset(self, faults: list[FaultSpec], capacity: CapacityPolicy) -> None:
        """Back to a baseline: journal, stats, in-flight maximum and errors cleared, ``faults``
        in force and ``capacity`` the cap."""
        ...

    def close(self) -> None: ...

    # -- the console's live view ----------------------------------------------------------------

    def live_view(self, after: int, pending: list[int], since: float, limit: int = 200) -> dict[str, Any]:
        """What the console's live view needs since its last look, in one call (one round trip to
        the state server with several workers), as plain values: ``epoch`` (when the journal was
        last reset: ids start again from 1 after one), ``t`` (seconds since then), ``in_flight``
        now and ``peak`` (the most at once after ``since``), ``stats`` and ``entries``, bodiless
        summaries (:meth:`~mocksandbox.journal.JournalEntry.brief`) of the newest ``limit`` entries
        after id ``after`` and of those whose id is in ``pending``, oldest first. A first look
        (``since`` below 0) adds ``history``: the last minute's in-flight peaks and arrivals."""
        ...

    def entry(self, entry_id: int) -> JournalEntry | None:
        """One journal entry with its bodies, if the journal still holds it."""
        ...

    # -- replay (mocksandbox.recording) ---------------------------------------------------------

    def next_replay(self, entry_id: int | None, key: str, labels: list[str]) -> int:
        """Which of ``labels`` (the recordings of one request, in recorded order) answers this
        request: the next unused one for ``key`` since the last reset, the last once all were used.
        Counted in one place, so the order is exact across workers; marks the journal entry."""
        ...


class LocalControlState:
    """The control state of one process: a journal, an in-flight counter, the fault rules, the cap."""

    def __init__(
        self,
        journal_limit: int = 10_000,
        capacity: CapacityPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.journal = Journal(journal_limit, clock)
        self.in_flight = InFlight(clock=clock)
        self.faults = FaultInjector(clock)
        self._capacity = capacity or CapacityPolicy()
        self._errors: list[ServerError] = []
        self._errors_lock = threading.Lock()
        # Adding several rules must be all or nothing, and no request may see half of them.
        self._faults_lock = threading.Lock()

    def admit(
        self, request: IncomingRequest, permit: Callable[[int, CapacityPolicy], bool] | None = None
    ) -> Admission:
        """See :meth:`ControlState.admit`. ``permit``, if given, applies the cap instead of the
        in-flight count (the fleet's permit pool): called with the entry's id and the policy, it may
        wait, answers whether the request has a slot and, if so, has counted it in flight."""
        entry = self.journal.begin(
            request.method, request.path, request.query, request.body, request.client, request.worker
        )
        return self._decide(entry, request, permit)

    def _decide(
        self,
        entry: JournalEntry,
        request: IncomingRequest,
        permit: Callable[[int, CapacityPolicy], bool] | None = None,
    ) -> Admission:
        """The cap's and the fault rules' verdict on ``request``, journaled as ``entry``."""
        policy = self._capacity
        if permit is not None:
            if not permit(entry.id, policy):
                return Admission(entry.id, False, policy.retry_after_s)
        elif not self.in_flight.enter(policy.max_in_flight, policy.wait_seconds()):
            return Admission(entry.id, False, policy.retry_after_s)
        decision = self.faults.decide(RequestInfo(request.method, request.path, request.body))
        self.journal.note_faults(entry, decision)
        return Admission(entry.id, True, policy.retry_after_s, decision)

    def finish(
        self,
        entry_id: int,
        status: int | None,
        response: bytes | None,
        outcome: str = "answered",
        leave: bool = True,
        divergences: tuple[str, ...] = (),
    ) -> None:
        self.journal.finish_id(entry_id, status, response, outcome, divergences=divergences)
        if leave:
            self.in_flight.leave()

    def leave(self, entry_id: int | None = None) -> None:
        self.in_flight.leave()

    def add_faults(self, specs: list[FaultSpec]) -> list[FaultRule]:
        added: list[FaultRule] = []
        with self._faults_lock:
            try:
                for spec in specs:
                    added.append(self.faults.add(spec))
            except FaultError:
                for rule in added:
                    self.faults.remove(rule.id)
                raise
        return added

    def remove_fault(self, rule_id: str) -> bool:
        return self.faults.remove(rule_id)

    def clear_faults(self) -> list[str]:
        return [rule.id for rule in self.faults.rules() if self.faults.remove(rule.id)]

    def fault_rules(self) -> list[FaultRule]:
        return self.faults.rules()

    def capacity(self) -> CapacityPolicy:
        return self._capacity

    def set_capacity(self, policy: CapacityPolicy) -> None:
        self._capacity = policy

    def entries(self) -> list[JournalEntry]:
        return self.journal.entries()

    def stats(self) -> dict[str, Any]:
        return {
            **self.journal.counts(),
            **self.in_flight.snapshot(),
            "max_in_flight_cap": self._capacity.max_in_flight,
        }

    def timeline(self) -> list[tuple[float, int]]:
        return self.in_flight.timeline_points()

    def record_error(self, error: ServerError) -> None:
        with self._errors_lock:
            self._errors.append(error)

    def take_errors(self) -> list[ServerError]:
        with self._errors_lock:
            errors, self._errors = self._errors, []
        return errors

    def reset(self, faults: list[FaultSpec], capacity: CapacityPolicy) -> None:
        self.journal.reset()
        self.in_flight.reset()
        with self._faults_lock:
            self.faults.reset()
            self.faults.add_all(faults)
        self._capacity = capacity
        with self._errors_lock:
            self._errors.clear()

    def close(self) -> None:
        return None

    def live_view(self, after: int, pending: list[int], since: float, limit: int = 200) -> dict[str, Any]:
        epoch, entries = self.journal.after(after, pending, limit)
        t, in_flight, peak = self.in_flight.peak_since(since)
        view = {
            "epoch": epoch,
            "t": t,
            "in_flight": in_flight,
            "peak": peak,
            "stats": self.stats(),
            "entries": [entry.brief() for entry in entries],
        }
        if since < 0:  # a first look: the last minute too, so that the charts open full
            view["history"] = {
                "in_flight": self.in_flight.history(60.0, 0.2),
                "arrivals": self.journal.arrivals(60.0, 1.0),
            }
        return view

    def entry(self, entry_id: int) -> JournalEntry | None:
        return self.journal.find(entry_id)

    def next_replay(self, entry_id: int | None, key: str, labels: list[str]) -> int:
        return self.journal.note_replay(entry_id, key, labels)


def select_entries(
    entries: Iterable[JournalEntry],
    path: str | None = None,
    method: str | None = None,
    language: str | None = None,
    status: int | None = None,
) -> list[JournalEntry]:
    """Entries that match every given filter, in their order."""
    return [
        e
        for e in entries
        if (path is None or e.path == path)
        and (method is None or e.method == method.upper())
        and (language is None or e.language == language)
        and (status is None or e.status == status)
    ]


def assert_request_count(entries: list[JournalEntry], count: int, **filters: Any) -> list[JournalEntry]:
    """Assert that exactly ``count`` of ``entries`` match ``filters``; the message shows the last
    requests seen."""
    found = select_entries(entries, **filters)
    if len(found) != count:
        wanted = ", ".join(f"{k}={v!r}" for k, v in filters.items()) or "any request"
        raise AssertionError(
            f"expected {count} request(s) with {wanted}, found {len(found)}.\n"
            f"Last requests seen:\n{nearest(entries)}"
        )
    return found


def wait_idle(state: ControlState, timeout: float = 10.0) -> bool:
    """Wait until no request is in flight; whether that happened within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while state.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.005)
    return not state.stats()["in_flight"]
