"""What was asked, what was answered, when; plus the in-flight counter and its timeline."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mocksandbox.faults import FaultDecision

#: Bytes of each request and response body the journal keeps; a 8 MiB program output times ten
#: thousand entries must not become the server's memory.
BODY_LIMIT = 256 * 1024


@dataclass
class JournalEntry:
    """One request and its answer. Times are seconds since the journal was (re)started.

    Bodies are kept as bytes (up to :data:`BODY_LIMIT`) and parsed only when read: most entries
    are never looked at.
    """

    id: int
    method: str
    path: str
    query: str
    raw_body: bytes
    client: str
    started: float
    status: int | None = None
    raw_response: bytes | None = None
    ended: float | None = None
    #: Ids of the fault rules that fired, and the deciding action's type (``None`` if none).
    faults: list[str] = field(default_factory=list)
    fault_action: str | None = None
    #: ``"rejected"`` when the concurrency cap answered 429, ``"dropped"`` when no answer was sent.
    outcome: str = "answered"
    body_truncated: bool = False
    response_truncated: bool = False
    #: Which server process served it (``None`` with one process).
    worker: str | None = None
    #: The cassette recording that answered it (``cassette.jsonl:12``), ``None`` if it was not replayed.
    replayed: str | None = None
    #: Where SandboxFusion would have answered differently (``kind: detail``; see
    #: :mod:`mocksandbox.divergence`): beside the answer, never in it.
    divergences: list[str] = field(default_factory=list)

    @property
    def body(self) -> Any:
        """The request body: parsed JSON when it is JSON, else text."""
        return parse_body(self.raw_body)

    @property
    def response(self) -> Any:
        """The answer's body, parsed like :attr:`body`; ``None`` when none was sent."""
        return None if self.raw_response is None else parse_body(self.raw_response)

    @property
    def duration(self) -> float | None:
        return None if self.ended is None else self.ended - self.started

    @property
    def language(self) -> str | None:
        if b'"language"' not in self.raw_body:  # cheap: most filters look at every entry
            return None
        body = self.body
        return body.get("language") if isinstance(body, dict) else None

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("raw_body", "raw_response")}
        data["body"] = self.body
        data["response"] = self.response
        data["duration"] = self.duration
        return data

    def summary(self) -> str:
        """One line for failure messages."""
        lang = f" {self.language}" if self.language else ""
        fault = f" fault={self.fault_action}" if self.fault_action else ""
        replayed = f" replayed={self.replayed}" if self.replayed else ""
        diverged = f" divergences={len(self.divergences)}" if self.divergences else ""
        answer = f"{self.status}{fault}{replayed}{diverged}"
        return f"#{self.id} {self.method} {self.path}{lang} -> {answer} ({self.outcome})"

    def brief(self) -> dict[str, Any]:
        """The entry without its bodies, as plain values: what the console's live view streams
        (bodies, up to :data:`BODY_LIMIT` each, are fetched one entry at a time when looked at)."""
        return {
            "id": self.id,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "language": self.language,
            "client": self.client,
            "worker": self.worker,
            "started": self.started,
            "ended": self.ended,
            "status": self.status,
            "outcome": self.outcome,
            "faults": list(self.faults),
            "fault_action": self.fault_action,
            "divergences": list(self.divergences),
        }


def parse_body(raw: bytes) -> Any:
    """A body as the journal shows it: parsed JSON when it is JSON, else text."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep to parse
        return raw.decode("utf-8", errors="replace")


class Journal:
    """A bounded, thread-safe record of requests and answers, with counts that survive the bound."""

    def __init__(self, limit: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._entries: deque[JournalEntry] = deque(maxlen=self.limit)
            #: Begun and not yet finished, by id (an entry may leave the bounded deque meanwhile).
            self._pending: dict[int, JournalEntry] = {}
            self._ids = itertools.count(1)
            self._origin = self._clock()
            self.requests_total = 0
            self.by_path: Counter[str] = Counter()
            self.by_status: Counter[str] = Counter()
            self.faults_fired: Counter[str] = Counter()
            #: Divergence notes by kind (``output``, ``toolchain``, ...).
            self.divergences: Counter[str] = Counter()
            self.rejected = 0
            self.dropped = 0
            #: Requests answered from a cassette so far, by request key (the next one's turn).
            self.replay_turns: Counter[str] = Counter()

    def now(self) -> float:
        return self._clock() - self._origin

    def begin(
        self,
        method: str,
        path: str,
        query: str,
        body: bytes,
        client: str,
        worker: str | None = None,
        *,
        entry_id: int | None = None,
        at: float | None = None,
    ) -> JournalEntry:
        """Journal a request as it arrives. ``entry_id`` and ``at`` (a clock reading): when another
        process gave it its place in the order and saw it arrive (several workers, one journal);
        the entry then goes in id order, wherever it lands."""
        with self._lock:
            entry_id = next(self._ids) if entry_id is None else entry_id
            started = self.now() if at is None else at - self._origin
            entry = JournalEntry(entry_id, method, path, query, body[:BODY_LIMIT], client, started)
            entry.body_truncated = len(body) > BODY_LIMIT
            entry.worker = worker
            self._insert(entry)
            self._pending[entry.id] = entry
            if len(self._pending) > self.limit:  # requests that failed before their answer
                del self._pending[next(iter(self._pending))]
            self.requests_total += 1
            self.by_path[path] += 1
        return entry

    def _insert(self, entry: JournalEntry) -> None:
        """Put ``entry`` in id order: at the end, unless entries given their ids later by other
        processes arrived first (then a few places before it)."""
        entries = self._entries
        if not entries or entries[-1].id < entry.id:
            entries.append(entry)
            return
        index = len(entries)
        while index > 0 and entries[index - 1].id > entry.id:
            index -= 1
        if len(entries) == entries.maxlen:
            if index == 0:
                return  # older than everything the bounded journal still holds
            entries.popleft()
            index -= 1
        entries.insert(index, entry)

    def note_event(
        self, text: str, worker: str | None = None, *, entry_id: int | None = None
    ) -> JournalEntry:
        """Something that happened to the server itself (a worker died and was replaced), in the
        journal's order; not a request, so not counted as one."""
        with self._lock:
            entry_id = next(self._ids) if entry_id is None else entry_id
            entry = JournalEntry(entry_id, "EVENT", "", "", text.encode(), "", self.now())
            entry.worker, entry.outcome, entry.ended = worker, "event", entry.started
            self._insert(entry)
        return entry

    def note_faults(self, entry: JournalEntry, decision: FaultDecision) -> None:
        """Which rules fired on ``entry``, and the type of the deciding action."""
        with self._lock:
            entry.faults = list(decision.rule_ids)
            modifier = "output_mode" if decision.output_mode else None
            entry.fault_action = getattr(
                decision.action, "type", "delay" if decision.delay_seconds else modifier
            )

    def finish_id(
        self,
        entry_id: int,
        status: int | None,
        response: bytes | None,
        outcome: str = "answered",
        at: float | None = None,
        divergences: Iterable[str] = (),
    ) -> None:
        """:meth:`finish` for the entry begun with ``entry_id`` (ignored after a reset)."""
        with self._lock:
            entry = self._pending.get(entry_id)
        if entry is not None:
            self.finish(entry, status, response, outcome, at, divergences)

    def finish(
        self,
        entry: JournalEntry,
        status: int | None,
        response: bytes | None,
        outcome: str = "answered",
        at: float | None = None,
        divergences: Iterable[str] = (),
    ) -> None:
        """Record the answer to ``entry`` (``at``: a clock reading, when another process saw it),
        and where SandboxFusion would have answered differently."""
        with self._lock:
            if self._pending.pop(entry.id, None) is None:
                return  # finished already, or begun before a reset
            entry.status, entry.outcome = status, outcome
            entry.divergences = list(divergences)
            for text in entry.divergences:
                self.divergences[text.split(":", 1)[0]] += 1
            if response is not None:
                entry.raw_response = response[:BODY_LIMIT]
                entry.response_truncated = len(response) > BODY_LIMIT
            entry.ended = self.now() if at is None else at - self._origin
            self.by_status[str(status) if status is not None else "none"] += 1
            for rule_id in entry.faults:
                self.faults_fired[rule_id] += 1
            if outcome == "rejected":
                self.rejected += 1
            elif outcome == "dropped":
                self.dropped += 1

    def entries(self) -> list[JournalEntry]:
        with self._lock:
            return list(self._entries)

    def counts(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests_total": self.requests_total,
                "by_path": dict(self.by_path),
                "by_status": dict(self.by_status),
                "faults_fired": dict(self.faults_fired),
                "divergences": {"total": sum(self.divergences.values()), "by_kind": dict(self.divergences)},
                "rejected_by_cap": self.rejected,
                "dropped": self.dropped,
            }

    def after(
        self, seq: int, pending: Iterable[int] = (), limit: int = 200
    ) -> tuple[float, list[JournalEntry]]:
        """The entries with an id above ``seq`` (the newest ``limit`` of them) and those whose id is
        in ``pending``, oldest first, with the time of the last reset (which tells a reader that
        ids started again from 1).

        Reads from the newest end and stops at the first entry at or below both ``seq`` and every
        pending id, so a reader that keeps up costs a few entries per call, not the journal.
        """
        wanted = set(pending)
        floor = min(wanted, default=seq)
        newer: list[JournalEntry] = []
        older: list[JournalEntry] = []
        with self._lock:
            for entry in reversed(self._entries):
                if entry.id > seq:
                    if len(newer) < limit:
                        newer.append(entry)
                    elif not wanted:
                        break  # enough, and no older entry is asked for
                elif entry.id < floor:
                    break
                elif entry.id in wanted:
                    older.append(entry)
            origin = self._origin
        older.reverse()
        newer.reverse()
        return origin, older + newer

    def find(self, entry_id: int) -> JournalEntry | None:
        """The entry with this id, if the journal still holds it."""
        with self._lock:
            for entry in reversed(self._entries):
                if entry.id == entry_id:
                    return entry
                if entry.id < entry_id:
                    return None
        return None

    def arrivals(self, window: float, step: float) -> list[tuple[float, int]]:
        """Requests that arrived in each ``step`` of the last ``window`` seconds, as ``(end of the
        step, count)``, oldest first: the console's requests/s chart when it opens."""
        with self._lock:
            now = self.now()
            start = max(0.0, now - window)
            times, reached = [], False
            for entry in reversed(self._entries):
                if entry.started < start:
                    reached = True
                    break
                if entry.method != "EVENT":
                    times.append(entry.started)
            if not reached and len(self._entries) == self.limit and times:
                # The bounded journal no longer holds the window's start: count only what it holds
                # (from the first whole step), rather than show the steps before as idle.
                start = now - ((now - times[-1]) // step) * step
        counts = [0] * max(1, int((now - start) // step) + 1)
        for at in times:
            if at >= start:
                counts[min(len(counts) - 1, int((at - start) // step))] += 1
        return [(start + (i + 1) * step, count) for i, count in enumerate(counts)]

    def note_replay(self, entry_id: int | None, key: str, labels: list[str]) -> int:
        """Which of ``labels`` (the recordings of one request, in recorded order) answers the next
        request with ``key``: the first after a reset, then the next, the last once all were used.
        The entry begun with ``entry_id`` is marked with that label."""
        with self._lock:
            turn = self.replay_turns[key]
            self.replay_turns[key] += 1
            index = min(turn, len(labels) - 1)
            entry = self._pending.get(entry_id) if entry_id is not None else None
            if entry is not None:
                entry.replayed = labels[index]
        return index


class InFlight:
    """Requests being served right now, the most ever at once, and a timeline of changes."""

    def __init__(self, timeline_limit: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._timeline_limit = timeline_limit
        self._cond = threading.Condition()
        self.reset()

    def reset(self) -> None:
        with self._cond:
            self.current = 0
            self.maximum = 0
            self._origin = self._clock()
            self.timeline: deque[tuple[float, int]] = deque(maxlen=self._timeline_limit)
            self._cond.notify_all()

    def enter(self, cap: int | None = None, wait: float | None = 0.0) -> bool:
        """Count one more request in flight, if ``cap`` allows; with ``wait``, queue for a slot.

        ``wait=0`` rejects at once when full, ``None`` waits as long as it takes.
        """
        with self._cond:
            if cap is not None and self.current >= cap:
                if wait == 0.0:
                    return False
                deadline = None if wait is None else self._clock() + wait
                while self.current >= cap:
                    remaining = None if deadline is None else deadline - self._clock()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cond.wait(remaining)
            self.current += 1
            self.maximum = max(self.maximum, self.current)
            self.timeline.append((self._clock() - self._origin, self.current))
            return True

    def leave(self) -> None:
        with self._cond:
            # A reset while requests were in flight zeroes the count; never go below zero.
            self.current = max(0, self.current - 1)
            self.timeline.append((self._clock() - self._origin, self.current))
            self._cond.notify()

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            return {"in_flight": self.current, "max_in_flight": self.maximum}

    def timeline_points(self) -> list[tuple[float, int]]:
        with self._cond:
            return list(self.timeline)

    def peak_since(self, since: float) -> tuple[float, int, int]:
        """``(seconds since reset now, in flight now, most in flight at once after since)``: the
        live chart's point, which a burst shorter than the chart's step still reaches."""
        with self._cond:
            now = self._clock() - self._origin
            if since > now:  # a time from before the last reset
                since = -1.0
            peak = self.current
            for at, count in reversed(self.timeline):
                if at <= since:
                    break
                peak = max(peak, count)
            return now, self.current, peak

    def history(self, window: float, step: float) -> list[tuple[float, int]]:
        """The most in flight at once in each ``step`` of the last ``window`` seconds, as ``(end of
        the step, peak)``, oldest first: the console's chart when it opens."""
        with self._cond:
            now = self._clock() - self._origin
            start = max(0.0, now - window)
            level, changes = 0, []
            for at, count in reversed(self.timeline):
                if at < start:
                    level = count  # in flight as the window begins
                    break
                changes.append((at, count))
        changes.reverse()
        points, index = [], 0
        for step_index in range(max(1, int((now - start) // step) + 1)):
            end = start + (step_index + 1) * step
            peak = level
            while index < len(changes) and changes[index][0] < end:
                level = changes[index][1]
                peak = max(peak, level)
                index += 1
            points.append((end, peak))
        return points


def nearest(entries: Iterable[JournalEntry], count: int = 5) -> str:
    """The last ``count`` entries as lines, for assertion messages."""
    recent = list(entries)[-count:]
    if not recent:
        return "  (no requests were recorded)"
    return "\n".join(f"  {e.summary()}" for e in recent)
