"""The control state of a Ray fleet: one named Ray actor holds it, every replica is its client.

The third backend of :class:`~mocksandbox.control.state.ControlState` (DESIGN seam 6), beside the
in-process one and the Unix-socket one of ``serve --workers``. As there, the guarantees are exact
across the fleet because they are computed in one place, by one
:class:`~mocksandbox.control.state.LocalControlState` under its own locks: the journal's arrival
order and ids, the in-flight count, its maximum and the cap, the fault schedules' counters.

What a cluster adds, and this actor keeps beside that state:

* **Leases.** Every admission is tagged with the replica that asked for it. The actor watches
  its replicas (Ray's own report of an actor's death, never a timeout: a busy replica is not a
  dead one) and, when one dies, gives back the permits it held and closes its open journal
  entries as ``lost``, with an ``EVENT`` entry saying so. The fleet never ends with fewer
  slots than its cap.
* **The replica registry and the session index.** A swedev session lives in one replica's state
  dir (a *slot*); the index maps a session id to its slot and a slot to the replica holding it
  now, so that any replica can send a session's request to its owner. A replica that Serve
  restarts on the same node takes the dead one's slot, and with it the sessions whose state dir
  survived.

Why an actor and not the Unix-socket state server: replicas run on several machines, and Ray
already gives them a named, reachable, monitored place to meet.

**The fast path.** A request seldom costs the actor a call: the replica admits it by itself and
tells the actor what happened in batches, one way (:class:`FastPath`); every read drains the
replicas first (a signal they long-poll, answered with all they hold), and puts their requests in
the journal in the order they arrived. The fault rules' schedules (``first: 3``) are counted in
one place, the actor: every replica holds the matches of the rules in force (sent with the
signal; a change is in force once every replica has answered), and asks the actor which rules
fire (``decide``, one call) only for a request one of them matches. What a replica that dies had
not told yet (at most ``TELL_EVERY_S`` of requests) is lost with it; what it had told and not
finished is closed as ``lost``, its permits given back. While the path changes (a new cap, a
reset), replicas ask the actor for every admission (``admit``, ``finish``).

**Cap permits in blocks.** With a cap in force (the path is *leased*), the actor holds
the cap's permits in a pool and leases them to replicas in blocks (a replica asks for as many as it
has in use, so its block grows with its load): a request takes a permit its replica holds, and its
permit stays with the replica when it ends, for the next one. So the cap is never exceeded
fleet-wide (the permits leased never pass it), and a replica calls the actor only when its block
runs out. Permits come back: those a replica left unused for ``TELL_EVERY_S``, all it holds when
it dies (on Ray's report) or when the cap changes, and, when the pool is empty, all its unused ones
at once (the actor recalls them before it refuses a request, and leases one permit at a time
until its answer is in, so a refusal is exact: every permit is in use), one by one as they free
while a request queues for one (``overload: queue``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from mocksandbox.control.shared import ControlStateUnavailable, _error_from_wire, _error_to_wire
from mocksandbox.control.state import (
    Admission,
    CapacityPolicy,
    IncomingRequest,
    LocalControlState,
    ServerError,
)
from mocksandbox.faults import FaultDecision, FaultMatch, FaultRule, FaultSpec, RequestInfo
from mocksandbox.journal import BODY_LIMIT, JournalEntry

#: Admissions the control actor runs at once (each waiting one holds a thread).
ADMISSION_THREADS = 1024
#: Replicas' long polls the control actor holds at once (one each).
SIGNAL_THREADS = 1024
#: Threads applying what replicas tell (drains wait for them).
TOLD_THREADS = 16
#: How long a read waits for the replicas' events before it answers with what it has.
DRAIN_TIMEOUT_S = 2.0
#: How long a replica's long poll waits before it asks again.
POLL_TIMEOUT_S = 10.0
#: A replica tells its events at least this often while it has some, and at once past this many.
TELL_EVERY_S = 1.0
TELL_AT_EVENTS = 1024
#: How often the actor asks Ray whether its replicas are alive (on the fast path: the second one).
WATCH_INTERVAL_S = 0.25
WATCH_INTERVAL_FAST_S = 1.0
#: How long one look at a replica may take before it is left for the next look (not declared dead:
#: only Ray's report of its death does that).
WATCH_TIMEOUT_S = 2.0
#: How long a request queued for a permit waits before the actor recalls unused ones again (a
#: request that ended before the cap was set gives its slot back only once its end is told).
RECALL_EVERY_S = 1.0
#: How long a recall of the replicas' unused permits waits for every live one to answer before the
#: cap refuses: until they all have, the cap is not known to be full (a busy replica, on a loaded
#: machine, may take longer than a read's DRAIN_TIMEOUT_S). Past this, one that still has not
#: answered is taken to be using all it holds.
RECALL_TIMEOUT_S = 30.0

#: The paths a replica's admissions take: by itself with no cap (``fast``), by itself on leased
#: cap permits (``leased``), through the actor (``slow``: while the path changes).
PathMode = str


@dataclass
class ReplicaRecord:
    """What the control actor knows of one replica."""

    key: str
    #: The replica's own Ray actor handle: how its death is noticed.
    handle: Any
    node_id: str
    #: Where the replica answers forwarded session requests (``http://host:port``).
    url: str
    #: Its state dir's slot (sessions live there; a successor on the same node takes it over).
    slot: int
    alive: bool = True
    #: Cap permits it holds now.
    held: int = 0
    #: Journal entries it admitted and has not finished.
    open_entries: set[int] = field(default_factory=set)
    #: Its Ray actor's id: a restarted actor (the fleet's node servers are) registers again under a
    #: new key, which is how its previous life's death is known for sure.
    actor_id: str = ""

    def describe(self, leased: int = 0) -> dict[str, Any]:
        """Plain values; ``held`` counts its permits admitted one by one and those leased to it."""
        return {
            "key": self.key,
            "node_id": self.node_id,
            "url": self.url,
            "slot": self.slot,
            "alive": self.alive,
            "held": self.held + leased,
        }


class FastEntry(NamedTuple):
    """A request a replica admitted by itself, once its ``begin`` is in the journal."""

    entry_id: int
    #: The lease epoch of its permit (0: none, the path was fast).
    epoch: int
    #: False when the cap refused it (it was never in flight).
    admitted: bool


@dataclass(frozen=True)
class PathWord:
    """What a replica's long poll answers: the signal it acknowledges, the path its admissions
    take, the lease epoch (permits of another epoch are void), whether to give back its unused
    permits now (``recall``) and each permit as its request ends (``tight``: a request queues for
    one), and the matches of the fault rules in force (the actor decides on what one accepts)."""

    signal: int
    mode: PathMode
    epoch: int
    recall: bool = False
    tight: bool = False
    matches: tuple[FaultMatch, ...] = ()


class ControlActor:
    """The fleet's one control state (run as a threaded Ray actor; use it through
    :class:`RayControlState`). Everything that can block (``admit`` with ``overload: queue``)
    blocks one of the actor's threads only."""

    def __init__(self, journal_limit: int, capacity: CapacityPolicy, faults: list[FaultSpec]) -> None:
        #: Calls of the request path so far, by method (what ``bench_fleet.py`` divides by requests).
        self.calls: Counter[str] = Counter()
        self.state = LocalControlState(journal_limit, capacity)
        self.state.reset(faults, capacity)
        self._lock = threading.Lock()
        # The fast path (see FastPath): replicas admit by themselves while no rule or cap is in
        # force, and tell their requests in batches; every read drains them first.
        self._signal_cond = threading.Condition()
        #: Bumped by every drain and every change of the fast path; replicas long-poll it.
        self._signal = 0
        self._mode: PathMode = "slow"
        self._matches: tuple[FaultMatch, ...] = ()
        #: Per subscribed replica: the last signal it acknowledged, and the batches it said it sent
        #: and the batches applied (a drain waits until those meet).
        self._acked: dict[str, int] = {}
        self._sent: dict[str, int] = {}
        self._applied: dict[str, int] = {}
        #: Events told and not yet in the journal, and fast entries by (replica, local id).
        self._pending_events: list[tuple[Any, ...]] = []
        self._fast_ids: dict[tuple[str, int], FastEntry] = {}
        #: Told batches that arrived before an earlier one of the same replica: applied in order.
        self._early: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
        self._replicas: dict[str, ReplicaRecord] = {}
        #: Replicas declared dead (what they told before is still applied; what is open then, lost).
        self._dead: set[str] = set()
        #: Session id -> slot of the replica whose state dir holds it.
        self._sessions: dict[str, int] = {}
        # The cap's permit pool while the path is leased (see the module's docstring). The cap less
        # what is leased, admitted here on a pool permit, or carried (in flight when the epoch began,
        # admitted otherwise: each gives its slot back as it leaves) is free.
        self._pool = threading.Condition()
        self._lease_epoch = 0
        self._leased: dict[str, int] = {}
        self._lease_holders: set[str] = set()
        self._pool_admitted: set[int] = set()
        self._carried = 0
        #: Requests queued for a permit right now, and whether replicas give each one back at its end.
        self._queued = 0
        self._tight = False
        #: Requests whose permit waits on a recall of the replicas' unused ones: meanwhile a lease
        #: is one permit, not a block (see _take_permits).
        self._recalling = 0
        self._recall = False
        #: Recalls (drains that take unused permits back) started and done: a recall waits for one
        #: that started after it asked.
        self._recalls_started = 0
        self._recalls_done = 0
        self._drain_lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch_forever, name="fleet-watch", daemon=True)
        self._watcher.start()
        threading.Thread(target=self._apply_forever, name="fleet-apply", daemon=True).start()
        self._open_fast_path_if_allowed()

    # -- the request path, tagged with the replica ------------------------------------------------

    # Admissions have threads of their own: one that waits for a slot (overload: queue) must never
    # keep the finish that frees the slot from running.
    @ray.method(concurrency_group="admission")  # type: ignore[untyped-decorator]
    def admit(self, request: IncomingRequest, replica: str) -> Admission:
        self.calls["admit"] += 1
        admission = self.state.admit(request, self._pool_permit if self._mode == "leased" else None)
        if admission.admitted:
            with self._lock:
                record = self._replicas.get(replica)
                if record is None:
                    return admission  # not a registered replica: no lease to keep
                if record.alive:
                    record.held += 1
                    record.open_entries.add(admission.entry_id)
                    return admission
            # Admitted after its replica was declared dead (it waited in the queue): nobody will
            # ever give this permit back, so it goes back now.
            self.state.finish(admission.entry_id, None, None, outcome="lost")
            self._slot_back(admission.entry_id)
        return admission

    def _pool_permit(self, entry_id: int, policy: CapacityPolicy) -> bool:
        """The cap for a request admitted here while the path is leased: a permit of the pool."""

        def take(count: int) -> bool:
            self._pool_admitted.add(entry_id)
            self.state.in_flight.enter()
            return True

        granted = self._take_permits(1, policy.wait_seconds(), None, take)
        if granted < 0:  # the path closed meanwhile: the in-flight count is the cap again
            return self.state.in_flight.enter(policy.max_in_flight, policy.wait_seconds())
        return granted > 0

    def finish(
        self,
        entry_id: int,
        status: int | None,
        response: bytes | None,
        outcome: str,
        leave: bool,
        replica: str,
        divergences: tuple[str, ...] = (),
    ) -> None:
        self.calls["finish"] += 1
        with self._lock:
            record = self._replicas.get(replica)
            if record is not None:
                record.open_entries.discard(entry_id)
                if not record.alive:
                    return  # its permits went back when it was declared dead
                if leave:
                    record.held = max(0, record.held - 1)
        self.state.finish(entry_id, status, response, outcome, leave, divergences)
        if leave:
            self._slot_back(entry_id)

    def leave(self, replica: str, entry_id: int | None = None) -> None:
        self.calls["leave"] += 1
        with self._lock:
            record = self._replicas.get(replica)
            if record is not None:
                if not record.alive:
                    return
                record.held = max(0, record.held - 1)
        self.state.leave()
        self._slot_back(entry_id)

    # -- the rest of the protocol, as LocalControlState has it ---------------------------------------

    def add_faults(self, specs: list[FaultSpec]) -> list[FaultRule]:
        try:
            return self.state.add_faults(specs)
        finally:
            self._publish_matches()  # in force once every replica sends what they match here

    def remove_fault(self, rule_id: str) -> bool:
        removed = self.state.remove_fault(rule_id)
        self._publish_matches()
        return removed

    def clear_faults(self) -> list[str]:
        cleared = self.state.clear_faults()
        self._publish_matches()
        return cleared

    def _publish_matches(self) -> None:
        """Send every replica the matches of the rules in force, and wait for their answers."""
        matches = self._rule_matches()
        with self._signal_cond:
            if matches == self._matches:
                return
            self._matches = matches
        if self._mode != "slow":
            self._signal_replicas()

    @ray.method(concurrency_group="admission")  # type: ignore[untyped-decorator]
    def decide(self, method: str, path: str, body: bytes) -> FaultDecision:
        """Which fault rules fire on a request a replica admitted by itself (one a rule matches):
        the schedules are counted here, once for the fleet."""
        self.calls["decide"] += 1
        return self.state.faults.decide(RequestInfo(method, path, body))

    def fault_rules(self) -> list[FaultRule]:
        return self.state.fault_rules()

    def capacity(self) -> CapacityPolicy:
        return self.state.capacity()

    def set_capacity(self, policy: CapacityPolicy) -> None:
        self._close_fast_path()
        try:
            self.state.set_capacity(policy)
        finally:
            self._open_fast_path_if_allowed()

    def entries(self) -> list[JournalEntry]:
        self._drain()
        return self.state.entries()

    def stats(self) -> dict[str, Any]:
        self._drain()
        return self.state.stats()

    def timeline(self) -> list[tuple[float, int]]:
        self._drain()
        return self.state.timeline()

    def record_error(self, error: tuple[str, str, str, str]) -> None:
        self.state.record_error(_error_from_wire(error))

    def take_errors(self) -> list[tuple[str, str, str, str]]:
        return [_error_to_wire(error) for error in self.state.take_errors()]

    def reset(self, faults: list[FaultSpec], capacity: CapacityPolicy) -> None:
        self._close_fast_path()  # everything told so far is in; later news of it is dropped
        try:
            with self._lock:
                # The in-flight count goes to zero: so do the permits counted against each replica.
                for record in self._replicas.values():
                    record.held = 0
                    record.open_entries.clear()
                self._sessions.clear()
                with self._signal_cond:
                    self._fast_ids.clear()
                    self._pending_events.clear()
                self.state.reset(faults, capacity)
        finally:
            self._open_fast_path_if_allowed()

    def live_view(self, after: int, pending: list[int], since: float, limit: int) -> dict[str, Any]:
        self._drain()
        return self.state.live_view(after, pending, since, limit)

    def entry(self, entry_id: int) -> JournalEntry | None:
        self._drain()
        return self.state.entry(entry_id)

    def next_replay(self, entry_id: int | None, key: str, labels: list[str], replica: str = "") -> int:
        if entry_id is not None and entry_id < 0:  # a fast entry: its journal id, once drained
            self._drain()
            with self._signal_cond:
                fast = self._fast_ids.get((replica, entry_id))
            entry_id = None if fast is None else fast.entry_id
        return self.state.next_replay(entry_id, key, labels)

    # -- the fast path: replicas admit by themselves, tell in batches, reads drain ------------------

    def _rule_matches(self) -> tuple[FaultMatch, ...]:
        """What the fault rules in force match (what replicas send the actor to decide on)."""
        return tuple(rule.spec.match for rule in self.state.fault_rules())

    def _mode_allowed(self) -> PathMode:
        """``fast`` with no cap, ``leased`` with one."""
        return "fast" if self.state.capacity().max_in_flight is None else "leased"

    @ray.method(concurrency_group="signals")  # type: ignore[untyped-decorator]
    def await_signal(self, replica: str, seen: int, timeout: float) -> PathWord:
        """A replica's long poll: the :class:`PathWord` once the signal is past ``seen`` (a drain,
        the path opened or closed, a request queued for a permit), or after ``timeout`` seconds."""
        with self._signal_cond:
            self._acked.setdefault(replica, seen)
            self._signal_cond.wait_for(lambda: self._signal > seen, timeout)
            return self.path_word()

    def path_word(self) -> PathWord:
        """What a replica's long poll would answer now (without subscribing anyone)."""
        with self._signal_cond:
            return PathWord(
                self._signal, self._mode, self._lease_epoch, self._recall, self._tight, self._matches
            )

    # -- the cap's permits, leased in blocks -------------------------------------------------------

    @ray.method(concurrency_group="admission")  # type: ignore[untyped-decorator]
    def lease(self, replica: str, epoch: int, want: int) -> tuple[int, int, float]:
        """Up to ``want`` permits for ``replica`` (at least one if any can be had, waiting as the
        cap's policy says): ``(epoch, granted, retry_after_s)``; ``granted`` is 0 when the cap
        refuses, -1 when the path is not leased (or ``epoch`` is over): then ask :meth:`admit`."""
        self.calls["lease"] += 1
        policy = self.state.capacity()

        def take(count: int) -> bool:
            if replica not in self._lease_holders:
                return False  # declared dead while it waited
            self._leased[replica] = self._leased.get(replica, 0) + count
            return True

        granted = self._take_permits(want, policy.wait_seconds(), epoch, take)
        return epoch, granted, policy.retry_after_s

    def give_back(self, replica: str, epoch: int, count: int) -> None:
        """``replica`` gives back ``count`` unused permits of ``epoch`` (one way)."""
        self._permits_back(replica, epoch, count)

    def _permits_back(self, replica: str, epoch: int, count: int) -> None:
        if count <= 0:
            return
        with self._pool:
            if epoch != self._lease_epoch or replica not in self._lease_holders:
                return  # void: the pool took every lease of that epoch (or of that replica) back
            self._leased[replica] = max(0, self._leased.get(replica, 0) - count)
            self._pool.notify_all()

    def _free_permits(self) -> int:
        """(Under the pool's lock.)"""
        cap = self.state.capacity().max_in_flight or 0
        return cap - self._carried - sum(self._leased.values()) - len(self._pool_admitted)

    def _take_permits(
        self, want: int, wait: float | None, epoch: int | None, take: Callable[[int], bool]
    ) -> int:
        """Take up to ``want`` permits of the pool (``take`` accounts for them, under its lock, and
        may refuse them: -1); when it is empty, recall the replicas' unused ones first, then wait
        as long as ``wait`` says. The count taken, 0 when refused, -1 when the path is not leased
        (or ``epoch`` is over)."""
        deadline = None if wait is None else time.monotonic() + wait
        recalled = recalling = False
        try:
            while True:
                with self._pool:
                    if self._mode != "leased" or (epoch is not None and epoch != self._lease_epoch):
                        return -1
                    free = self._free_permits()
                    if free > 0:
                        # While a request waits on a recall, a lease is one permit, not a block: a
                        # block leased now could sit unused with a replica that has answered the
                        # recall already, and the cap would refuse with permits unused.
                        count = 1 if self._recalling else min(max(1, want), free)
                        return count if take(count) else -1
                    if recalled:
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            return 0  # every permit is in use: the cap refuses, exactly
                        if self._tight:  # replicas give each permit back as it frees: wait for one
                            self._queued += 1
                            try:
                                pause = RECALL_EVERY_S
                                if remaining is not None:
                                    pause = min(remaining, RECALL_EVERY_S)
                                woken = self._pool.wait(pause)
                            finally:
                                self._queued -= 1
                            recalled = woken  # (none came for a while: recall again, ends told since)
                            continue
                    if not recalling:
                        self._recalling += 1
                        recalling = True
                if not recalled:
                    self._drain(recall=True)
                    recalled = True
                else:
                    self._tighten()
        finally:
            if recalling:
                with self._pool:
                    self._recalling -= 1

    def _tighten(self) -> None:
        """A request queues for a permit: replicas give each permit back as its request ends."""
        with self._signal_cond:
            if self._tight:
                return
            self._tight = True
            self._signal += 1
            self._signal_cond.notify_all()

    def _slot_back(self, entry_id: int | None) -> None:
        """A request left: its permit goes back to the pool (one admitted here on a pool permit),
        or the slot it was carried in (one admitted before this lease epoch; ``None`` says so)."""
        with self._pool:
            if entry_id is not None and entry_id in self._pool_admitted:
                self._pool_admitted.discard(entry_id)
            elif self._carried > 0:
                self._carried -= 1
            else:
                return
            self._pool.notify_all()

    def _start_lease_epoch(self) -> None:
        """The path becomes leased: a new epoch, every permit in the pool but for the requests in
        flight now (carried: each frees its slot as it leaves)."""
        with self._pool:
            self._lease_epoch += 1
            self._leased.clear()
            self._pool_admitted.clear()
            self._carried = self.state.in_flight.snapshot()["in_flight"]
            self._pool.notify_all()

    # Its own threads: drains wait for these calls, and must never hold every thread that could
    # run them.
    @ray.method(concurrency_group="told")  # type: ignore[untyped-decorator]
    def told(
        self,
        replica: str,
        batch: int,
        events: list[tuple[Any, ...]],
        ack: int | None,
        returned: int = 0,
        epoch: int = 0,
    ) -> None:
        """A replica's events (``begin``, ``finish``, ``leave`` of its fast entries), batch number
        ``batch`` (they are applied in order); with ``ack``, it has sent all it had by that signal,
        and gives back ``returned`` unused permits of lease epoch ``epoch``."""
        with self._lock:
            record = self._replicas.get(replica)
            if record is not None and not record.alive:
                return  # declared dead: what it was serving is closed as lost already
        self._permits_back(replica, epoch, returned)
        with self._signal_cond:
            self._early[(replica, batch)] = events
            applied = self._applied.get(replica, 0)
            while (replica, applied + 1) in self._early:
                applied += 1
                self._pending_events.extend(self._early.pop((replica, applied)))
            self._applied[replica] = applied
            if ack is not None:
                self._acked[replica] = max(self._acked.get(replica, 0), ack)
                self._sent[replica] = max(self._sent.get(replica, 0), batch)
            self._signal_cond.notify_all()

    def _signal_replicas(self, timeout: float = DRAIN_TIMEOUT_S) -> None:
        """Raise the signal and wait until every live subscribed replica has acknowledged it and
        its batches up to then are applied (a replica that does not answer in time is left out:
        what it has comes later)."""
        with self._lock:
            alive = {key: record for key, record in self._replicas.items() if record.alive}
        with self._signal_cond:
            self._signal += 1
            target = self._signal
            self._signal_cond.notify_all()
            waiting = [alive[key] for key in self._acked if key in alive]

            def all_in() -> bool:
                return all(
                    not record.alive  # (declared dead meanwhile: its permits came back)
                    or (
                        self._acked.get(record.key, 0) >= target
                        and self._applied.get(record.key, 0) >= self._sent.get(record.key, 0)
                    )
                    for record in waiting
                )

            self._signal_cond.wait_for(all_in, timeout)

    def _drain(self, recall: bool = False) -> None:
        """Bring every replica's told events into the journal, in the order they happened; with
        ``recall``, their unused permits come back with them (several recalls at once share one
        drain: any that started after they asked), and it waits up to RECALL_TIMEOUT_S for them."""
        asked = self._recalls_started
        with self._drain_lock:
            if recall:
                if self._recalls_done > asked:
                    return
                self._recalls_started += 1
            try:
                if self._mode != "slow" or self._pending_events:
                    with self._signal_cond:
                        self._recall = recall
                    self._signal_replicas(RECALL_TIMEOUT_S if recall else DRAIN_TIMEOUT_S)
                with self._signal_cond:
                    self._recall = False
                    events, self._pending_events = self._pending_events, []
                if events:
                    self._apply(events)
            finally:
                if recall:
                    self._recalls_done = self._recalls_started

    def _apply_forever(self) -> None:
        """Put in the journal, every second, what the replicas told long enough ago that nothing
        older can still come (each tells at least every ``TELL_EVERY_S`` while it has something):
        with nobody reading, told requests must not pile up here."""
        while not self._stop.wait(1.0):
            settled = time.time() - 2 * TELL_EVERY_S - 1.0
            with self._drain_lock:
                with self._signal_cond:
                    old = [e for e in self._pending_events if e[2] < settled]
                    if not old:
                        continue
                    self._pending_events = [e for e in self._pending_events if e[2] >= settled]
                self._apply(old)

    def _apply(self, events: list[tuple[Any, ...]]) -> None:
        offset = time.time() - time.monotonic()  # the replicas' wall clocks -> this clock
        journal, in_flight = self.state.journal, self.state.in_flight
        begun: list[tuple[str, int]] = []
        # A request that waited for a permit arrived (its journal entry) before it entered the
        # in-flight count: two moments, each in its place in time order.
        entering = [("enter", e[1], e[11], e[3]) for e in events if e[0] == "begin" and e[9]]
        for event in sorted(events + entering, key=lambda e: e[2]):
            kind, replica, wall, local = event[0], event[1], event[2], event[3]
            if kind == "begin":
                method, path, query, body, client, admitted, epoch = event[4:11]
                entry = journal.begin(method, path, query, body, client, replica, at=wall - offset)
                with self._signal_cond:
                    self._fast_ids[(replica, local)] = FastEntry(entry.id, epoch, admitted)
                begun.append((replica, local))
                continue
            if kind == "enter":
                in_flight.enter()
                continue
            if kind == "faults":
                with self._signal_cond:
                    fast = self._fast_ids.get((replica, local))
                noted = None if fast is None else journal.find(fast.entry_id)
                if noted is not None:
                    journal.note_faults(noted, event[4])
                continue
            with self._signal_cond:
                fast = self._fast_ids.get((replica, local))
            if fast is None:
                continue  # begun before the last reset
            if kind == "finish":
                status, response, outcome, leave, divergences = event[4:9]
                journal.finish_id(fast.entry_id, status, response, outcome, wall - offset, divergences)
                if fast.admitted and not leave:
                    continue
            with self._signal_cond:
                self._fast_ids.pop((replica, local), None)
            if not fast.admitted:
                continue
            in_flight.leave()
            if fast.epoch != self._lease_epoch:
                self._slot_back(None)  # (a permit of this epoch stays with its replica)
        # Told by a replica that died before they were in: nothing more of them will come.
        with self._lock:
            orphans = [key for key in begun if key[0] in self._dead]
        for key in orphans:
            with self._signal_cond:
                fast = self._fast_ids.pop(key, None)
            if fast is None:
                continue
            self.state.finish(fast.entry_id, None, None, outcome="lost", leave=fast.admitted)
            if fast.admitted and fast.epoch != self._lease_epoch:
                self._slot_back(None)

    def _close_fast_path(self) -> None:
        with self._signal_cond:
            was_open, self._mode = self._mode != "slow", "slow"
        with self._pool:
            self._pool.notify_all()  # requests queued for a permit: ask the actor's admit instead
        if was_open:
            self._signal_replicas()  # each one stops admitting by itself before it answers
        self._drain()

    def _open_fast_path_if_allowed(self) -> None:
        mode = self._mode_allowed()
        matches = self._rule_matches()
        if mode == self._mode and matches == self._matches:
            return
        if mode == "leased" and self._mode != "leased":
            self._start_lease_epoch()  # (before any replica hears that the path is leased)
        with self._signal_cond:
            self._mode, self._matches = mode, matches
        self._signal_replicas()

    def call_counts(self) -> dict[str, int]:
        """The request path's calls so far, by method (``admit``, ``finish``, ``leave``, ``lease``,
        ``decide``)."""
        return dict(self.calls)

    def ping(self) -> str:
        return "pong"

    # -- replicas and their leases --------------------------------------------------------------

    def register(self, key: str, handle: Any, node_id: str, url: str, actor_id: str = "") -> int:
        """A replica arrives; its slot: a dead replica's on the same node if there is one (its
        state dir, and the sessions in it, are there), else a new one. A replica registering from
        an actor that an alive record already names is that actor restarted by Ray: its previous
        life died (a look at the handle cannot tell, as the restarted actor answers it)."""
        with self._lock:
            previous = [
                r.key for r in self._replicas.values() if actor_id and r.alive and r.actor_id == actor_id
            ]
        for old in previous:
            self._declare_dead(old, "died (Ray restarted its actor)")
        # Serve starts a successor once it knows its predecessor is dead, which may be before the
        # watcher's next look: ask Ray about this node's replicas now.
        with self._lock:
            neighbours = [
                (r.key, r.handle)
                for r in self._replicas.values()
                if r.alive and r.node_id == node_id and not (actor_id and r.actor_id == actor_id)
            ]
        self._look(neighbours)
        with self._lock:
            taken = {r.slot for r in self._replicas.values() if r.alive}
            reusable = sorted(
                r.slot
                for r in self._replicas.values()
                if not r.alive and r.node_id == node_id and r.slot not in taken
            )
            used = {r.slot for r in self._replicas.values()}
            slot = reusable[0] if reusable else next(i for i in range(1, len(used) + 2) if i not in used)
            for old in [k for k, r in self._replicas.items() if r.slot == slot]:
                del self._replicas[old]  # its successor is here: forget the dead one
            self._replicas[key] = ReplicaRecord(key, handle, node_id, url, slot, actor_id=actor_id)
        with self._pool:
            self._lease_holders.add(key)
        self.state.journal.note_event(f"replica {key} joined on node {node_id[:12]} (slot {slot})", key)
        return slot

    def deregister(self, key: str) -> None:
        """A replica stops on purpose (scale-down, shutdown): as a death, without the noise."""
        self._declare_dead(key, "stopped")

    def replicas(self) -> list[dict[str, Any]]:
        """Every replica known, alive or not (with their actor handles, for tests that kill one)."""
        with self._lock, self._pool:
            leased = self._leased
            return [{**r.describe(leased.get(r.key, 0)), "handle": r.handle} for r in self._replicas.values()]

    def _declare_dead(self, key: str, how: str) -> None:
        with self._lock:
            record = self._replicas.get(key)
            if record is None or not record.alive:
                return
            record.alive = False
            self._dead.add(key)
            with self._signal_cond:  # no drain waits for it any more; its open fast entries are lost
                self._acked.pop(key, None)
                self._sent.pop(key, None)
                self._applied.pop(key, None)
                fast_lost = [(k, v) for k, v in self._fast_ids.items() if k[0] == key]
                for fast_key, _ in fast_lost:
                    del self._fast_ids[fast_key]
                self._signal_cond.notify_all()  # (a drain waiting for its answer waits no more)
            slow_lost, slow_held = sorted(record.open_entries), record.held
            lost = sorted(slow_lost + [fast.entry_id for _, fast in fast_lost])
            record.held = 0
            record.open_entries.clear()
        with self._pool:  # its leased permits, used or not, go back to the pool
            self._lease_holders.discard(key)
            leased = self._leased.pop(key, 0)
            self._pool.notify_all()
        for entry_id in lost:
            self.state.finish(entry_id, None, None, outcome="lost", leave=False)
        for _ in range(slow_held):
            self.state.leave()
        for entry_id in slow_lost:
            self._slot_back(entry_id)
        held = slow_held + leased
        for _, fast in fast_lost:
            if fast.admitted:
                self.state.leave()
                if fast.epoch != self._lease_epoch:  # (one of this epoch's is counted in leased)
                    held += 1
                    self._slot_back(None)
        if how != "stopped" or held or lost:
            self.state.journal.note_event(
                f"replica {key} {how}; {len(lost)} request(s) it was serving lost, "
                f"{held} cap permit(s) given back",
                key,
            )

    def _watch_forever(self) -> None:
        # On the fast path no replica holds a permit: a death noticed a little later costs nothing
        # but the time its open requests wait to be called lost, and the looks cost the actor CPU.
        while not self._stop.wait(WATCH_INTERVAL_S if self._mode != "fast" else WATCH_INTERVAL_FAST_S):
            with self._lock:
                watched = [(r.key, r.handle) for r in self._replicas.values() if r.alive]
            self._look(watched)
            self._loosen()

    def _loosen(self) -> None:
        """No request queues for a permit any more: replicas keep theirs again as they free."""
        with self._pool:
            if self._queued:
                return
        with self._signal_cond:
            if not self._tight:
                return
            self._tight = False
            self._signal += 1
            self._signal_cond.notify_all()

    def _look(self, replicas: list[tuple[str, Any]]) -> None:
        """Declare dead those of ``replicas`` whose actor Ray reports dead. A replica that does not
        answer in time is busy, not dead: only Ray's own report counts."""
        refs = {}
        for key, handle in replicas:
            try:
                refs[key] = handle.__ray_ready__.remote()
            except ActorUnavailableError:
                continue  # unreachable for now (restarting, an RPC failed): not a death
            except RayActorError:
                self._declare_dead(key, "died")
            except Exception:
                continue  # not an actor handle (a test's stand-in)
        if not refs:
            return
        # One wait for all of them: a busy replica costs the look WATCH_TIMEOUT_S once, not each.
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=WATCH_TIMEOUT_S)
        answered = set(ready)
        for key, ref in refs.items():
            if ref not in answered:
                continue  # busy, not dead
            try:
                ray.get(ref, timeout=0)
            except ActorUnavailableError:
                continue  # unreachable for now (restarting, an RPC failed): not a death
            except RayActorError:
                self._declare_dead(key, "died")
            except Exception:
                continue

    # -- sessions --------------------------------------------------------------------------------

    def place_session(self, sid: str, replica: str) -> None:
        """``sid`` was started by ``replica``: it lives in that replica's slot."""
        with self._lock:
            record = self._replicas.get(replica)
            if record is not None:
                self._sessions[sid] = record.slot

    def route_session(self, sid: str) -> tuple[int, str | None, str | None] | None:
        """Where ``sid`` lives: ``(slot, key, url)`` of the live replica holding its slot now
        (``key`` and ``url`` ``None`` while that slot has none), or ``None`` for an unknown sid."""
        with self._lock:
            slot = self._sessions.get(sid)
            if slot is None:
                return None
            for record in self._replicas.values():
                if record.slot == slot and record.alive:
                    return slot, record.key, record.url
            return slot, None, None

    def shutdown(self) -> None:
        self._stop.set()


def start_control_actor(
    name: str,
    namespace: str,
    journal_limit: int,
    capacity: CapacityPolicy,
    faults: list[FaultSpec],
    detached: bool = True,
) -> Any:
    """Create the fleet's control actor ``name`` (an error if one by that name is running)."""
    # Every request waiting for a slot (overload: queue) holds one of the admission threads; more
    # wait in Ray's queue. The other calls are short and have threads of their own.
    options: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "max_concurrency": 64,
        "num_cpus": 0,
    }
    if detached:
        options["lifetime"] = "detached"
    groups = {"admission": ADMISSION_THREADS, "signals": SIGNAL_THREADS, "told": TOLD_THREADS}
    actor_class = ray.remote(concurrency_groups=groups)(ControlActor)
    handle = actor_class.options(**options).remote(journal_limit, capacity, faults)
    ray.get(handle.ping.remote())
    return handle


class FastPath:
    """A replica's side of the fast path: while the control actor says the path is open (it is
    closed only while it changes), the replica admits by itself (an entry gets a local id, below
    0) and keeps what happened (``begin``, ``finish``, ``leave``, with the wall-clock time) to tell
    the actor in numbered batches, one way: every ``TELL_EVERY_S`` while it has some, at once past
    ``TELL_AT_EVENTS``. A thread long-polls the actor's signal: at each one (a read that drains,
    the path opening or closing, the fault rules changing, a request queued for a permit) it takes
    the actor's word (:class:`PathWord`), then tells all it has and acknowledges, in one call. So a
    read sees every request answered before it, in the order they arrived (the actor sorts by time
    when it drains), and once a rule is added every request it matches is decided by the actor
    (which waits for every acknowledgement first).

    With a cap in force (the path is leased), each admission takes one of the permits this
    replica holds, and asks the actor for a block when it holds none; a permit stays here when
    its request ends, and goes back when the actor recalls it, when the actor says a request
    queues for one (at once, as it frees), or when it was not used for ``TELL_EVERY_S``."""

    def __init__(self, actor: Any, replica: str) -> None:
        self.actor = actor
        self.replica = replica
        self.lock = threading.Lock()
        #: The actor's word (see :class:`PathWord`).
        self.mode: PathMode = "slow"
        self.epoch = 0
        self.tight = False
        self.matches: tuple[FaultMatch, ...] = ()
        #: Permits held and not in use, the fewest there were since the last look, and the epoch of
        #: the permit each request in flight holds.
        self.unused = 0
        self._fewest_unused = 0
        self._permits: dict[int, int] = {}
        self._events: list[tuple[Any, ...]] = []
        self._local_ids = itertools.count(1)
        self._batches = itertools.count(1)
        self._seen = -1  # (the first poll answers at once: which path is open now)
        self._stop = threading.Event()
        self._wake = threading.Event()
        for target, name in ((self._poll, "fleet-fast-poll"), (self._tell_often, "fleet-fast-tell")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def admit(self, request: IncomingRequest) -> Admission | None:
        """The request admitted (or refused by the cap) here, under a local id, with the fault
        rules' decision (the actor's, for a request a rule matches); ``None``: the actor admits."""
        arrived = time.time()
        admission = self._admit(request, arrived)
        if admission is None or not admission.admitted or not self.matches:
            return admission
        info = RequestInfo(request.method, request.path, request.body)
        if not any(match.accepts(info) for match in self.matches):
            return admission
        try:
            decision: FaultDecision = ray.get(
                self.actor.decide.remote(request.method, request.path, request.body)
            )
        except Exception:
            decision = FaultDecision()  # (the actor is gone: the fleet is stopping)
        if decision.applied:
            with self.lock:
                self._events.append(("faults", self.replica, time.time(), admission.entry_id, decision))
        return Admission(admission.entry_id, True, admission.retry_after_s, decision)

    def _admit(self, request: IncomingRequest, arrived: float) -> Admission | None:
        with self.lock:
            mode, epoch = self.mode, self.epoch
            if mode == "fast":
                return self._begin(request, arrived, 0, True, 1.0)
            if mode == "slow":
                return None
            if self.unused > 0:
                self.unused -= 1
                self._fewest_unused = min(self._fewest_unused, self.unused)
                return self._begin(request, arrived, epoch, True, 1.0)
            want = max(1, len(self._permits))  # (a block as large as what is in use: it doubles)
        try:
            lease = self.actor.lease.remote(self.replica, epoch, want)
            epoch_granted, granted, retry_after_s = ray.get(lease)
        except Exception:
            return None  # (the actor's admit says what went wrong)
        with self.lock:
            if granted < 0 or self.mode != "leased" or self.epoch != epoch_granted:
                if granted > 0:
                    self.actor.give_back.remote(self.replica, epoch_granted, granted)
                return None
            if granted == 0:
                return self._begin(request, arrived, 0, False, retry_after_s)
            self.unused += granted - 1
            return self._begin(request, arrived, epoch, True, retry_after_s)

    def _begin(
        self, request: IncomingRequest, at: float, epoch: int, admitted: bool, retry_after_s: float
    ) -> Admission:
        """(Under the lock.)"""
        local = -next(self._local_ids)
        body = request.body[: BODY_LIMIT + 1]  # (the journal keeps no more, and sees it was cut)
        # (Its arrival, and when it had its permit: the journal's order and the in-flight count's.)
        self._events.append(
            ("begin", self.replica, at, local, request.method, request.path, request.query, body,
             request.client, admitted, epoch, max(at, time.time()))
        )  # fmt: skip
        if admitted and epoch:
            self._permits[local] = epoch
        if len(self._events) >= TELL_AT_EVENTS:
            self._wake.set()
        return Admission(local, admitted, retry_after_s)

    def _release(self, local: int) -> None:
        """(Under the lock.) The request ``local`` left: its permit stays here for the next one,
        or goes back at once while a request queues for one; one of a past epoch is void."""
        epoch = self._permits.pop(local, None)
        if epoch is None or epoch != self.epoch or self.mode != "leased":
            return
        if self.tight:
            self.actor.give_back.remote(self.replica, epoch, 1)
        else:
            self.unused += 1

    def finish(
        self, local: int, status: int | None, response: bytes | None, outcome: str, leave: bool,
        divergences: tuple[str, ...],
    ) -> None:  # fmt: skip
        kept = None if response is None else response[: BODY_LIMIT + 1]
        with self.lock:
            self._events.append(
                ("finish", self.replica, time.time(), local, status, kept, outcome, leave, tuple(divergences))
            )
            if leave:
                self._release(local)

    def leave(self, local: int) -> None:
        with self.lock:
            self._events.append(("leave", self.replica, time.time(), local))
            self._release(local)

    def _tell_often(self) -> None:
        last_look = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(TELL_EVERY_S)
            self._wake.clear()
            with self.lock:
                if time.monotonic() - last_look >= TELL_EVERY_S:
                    last_look = time.monotonic()
                    idle, self._fewest_unused = self._fewest_unused, 0
                    if idle and self.mode == "leased":  # unused all along: back to the pool
                        self.unused -= idle
                        self.actor.give_back.remote(self.replica, self.epoch, idle)
                    self._fewest_unused = self.unused
                if not self._events:
                    continue
                batch, events = next(self._batches), self._events
                self._events = []
                # (Sent under the lock: batch numbers reach the actor in the order they were
                # given, and an acknowledgement never overtakes the batch before it.)
                self.actor.told.remote(self.replica, batch, events, None)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                poll = self.actor.await_signal.remote(self.replica, self._seen, POLL_TIMEOUT_S)
                word: PathWord = ray.get(poll)
            except Exception:  # the actor is gone (the fleet stops), or busy restarting
                if self._stop.wait(1.0):
                    return
                continue
            if word.signal <= self._seen:
                continue
            with self.lock:
                if word.mode != "leased" or word.epoch != self.epoch:
                    self.unused = 0  # the pool took every lease of the last epoch back
                self.mode, self.epoch, self.tight = word.mode, word.epoch, word.tight
                self.matches = word.matches
                returned = 0
                if self.mode == "leased" and (word.recall or word.tight):
                    returned, self.unused = self.unused, 0
                self._fewest_unused = min(self._fewest_unused, self.unused)
                batch, events = next(self._batches), self._events
                self._events = []
                ref = self.actor.told.remote(self.replica, batch, events, word.signal, returned, self.epoch)
            try:
                ray.get(ref)
            except Exception:
                continue
            self._seen = word.signal

    def close(self) -> None:
        self._stop.set()
        self._wake.set()


class RayControlState:
    """The :class:`~mocksandbox.control.state.ControlState` of one replica (or of the driver, with
    ``replica`` ``None``): calls go to the fleet's control actor, but for a replica's admissions
    and answers while no rule or cap is in force (:class:`FastPath`)."""

    def __init__(self, actor: Any, replica: str | None = None) -> None:
        self.actor = actor
        #: The replica whose admissions these are (their permits are its leases).
        self.replica = replica or "driver"
        #: A replica's fast path (the driver's calls, reads and rules, always go to the actor).
        self.fast_path = FastPath(actor, replica) if replica is not None else None

    @classmethod
    def attach(cls, name: str, namespace: str, replica: str | None = None) -> RayControlState:
        """The client of the running control actor ``name``."""
        try:
            actor = ray.get_actor(name, namespace=namespace)
        except ValueError:
            raise ControlStateUnavailable(
                f"no mocksandbox fleet control state named {name!r} in Ray namespace {namespace!r}"
            ) from None
        return cls(actor, replica)

    def _call(self, method: str, *arguments: Any) -> Any:
        try:
            return ray.get(getattr(self.actor, method).remote(*arguments))
        except RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None
            raise
        except RayActorError as exc:
            raise ControlStateUnavailable(f"the fleet's control state is gone: {exc}") from None

    def admit(self, request: IncomingRequest) -> Admission:
        if self.fast_path is not None:
            fast = self.fast_path.admit(request)
            if fast is not None:
                return fast
        admission: Admission = self._call("admit", request, self.replica)
        return admission

    def call_counts(self) -> dict[str, int]:
        """The control actor's request-path calls so far, by method."""
        counts: dict[str, int] = self._call("call_counts")
        return counts

    def finish(
        self,
        entry_id: int,
        status: int | None,
        response: bytes | None,
        outcome: str = "answered",
        leave: bool = True,
        divergences: tuple[str, ...] = (),
    ) -> None:
        if entry_id < 0 and self.fast_path is not None:
            self.fast_path.finish(entry_id, status, response, outcome, leave, divergences)
            return
        self._call("finish", entry_id, status, response, outcome, leave, self.replica, tuple(divergences))

    def leave(self, entry_id: int | None = None) -> None:
        if entry_id is not None and entry_id < 0 and self.fast_path is not None:
            self.fast_path.leave(entry_id)
            return
        self._call("leave", self.replica, entry_id)

    def add_faults(self, specs: list[FaultSpec]) -> list[FaultRule]:
        return list(self._call("add_faults", specs))

    def remove_fault(self, rule_id: str) -> bool:
        return bool(self._call("remove_fault", rule_id))

    def clear_faults(self) -> list[str]:
        return list(self._call("clear_faults"))

    def fault_rules(self) -> list[FaultRule]:
        return list(self._call("fault_rules"))

    def capacity(self) -> CapacityPolicy:
        policy: CapacityPolicy = self._call("capacity")
        return policy

    def set_capacity(self, policy: CapacityPolicy) -> None:
        self._call("set_capacity", policy)

    def entries(self) -> list[JournalEntry]:
        return list(self._call("entries"))

    def stats(self) -> dict[str, Any]:
        return dict(self._call("stats"))

    def timeline(self) -> list[tuple[float, int]]:
        return list(self._call("timeline"))

    def record_error(self, error: ServerError) -> None:
        self._call("record_error", _error_to_wire(error))

    def take_errors(self) -> list[ServerError]:
        return [_error_from_wire(error) for error in self._call("take_errors")]

    def reset(self, faults: list[FaultSpec], capacity: CapacityPolicy) -> None:
        self._call("reset", faults, capacity)

    def close(self) -> None:
        """Stop the fast path's threads (the actor belongs to the fleet, not to this client)."""
        if self.fast_path is not None:
            self.fast_path.close()

    def live_view(self, after: int, pending: list[int], since: float, limit: int = 200) -> dict[str, Any]:
        return dict(self._call("live_view", after, list(pending), since, limit))

    def entry(self, entry_id: int) -> JournalEntry | None:
        found: JournalEntry | None = self._call("entry", entry_id)
        return found

    def next_replay(self, entry_id: int | None, key: str, labels: list[str]) -> int:
        return int(self._call("next_replay", entry_id, key, list(labels), self.replica))

    # -- the fleet's own calls (not part of the protocol) -------------------------------------------

    def register(self, handle: Any, node_id: str, url: str, actor_id: str = "") -> int:
        return int(self._call("register", self.replica, handle, node_id, url, actor_id))

    def deregister(self) -> None:
        self._call("deregister", self.replica)

    def replicas(self) -> list[dict[str, Any]]:
        return list(self._call("replicas"))

    def place_session(self, sid: str) -> None:
        self._call("place_session", sid, self.replica)

    def route_session(self, sid: str) -> tuple[int, str | None, str | None] | None:
        found: tuple[int, str | None, str | None] | None = self._call("route_session", sid)
        return found


if TYPE_CHECKING:  # the client is a ControlState: mypy checks every method of the protocol
    from mocksandbox.control.state import ControlState

    _IS_A_CONTROL_STATE: type[ControlState] = RayControlState
