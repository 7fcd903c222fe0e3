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
already gives them a named, reachable, monitored place to meet. A request costs two actor calls
(``admit``, ``finish``), each well under a millisecond on one machine.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from mocksandbox.control.shared import ControlStateUnavailable, _error_from_wire, _error_to_wire
from mocksandbox.control.state import (
    Admission,
    CapacityPolicy,
    IncomingRequest,
    LocalControlState,
    ServerError,
)
from mocksandbox.faults import FaultRule, FaultSpec
from mocksandbox.journal import JournalEntry

#: Admissions the control actor runs at once (each waiting one holds a thread).
ADMISSION_THREADS = 1024
#: How often the actor asks Ray whether its replicas are alive.
WATCH_INTERVAL_S = 0.25
#: How long one look at a replica may take before it is left for the next look (not declared dead:
#: only Ray's report of its death does that).
WATCH_TIMEOUT_S = 2.0


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

    def describe(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "node_id": self.node_id,
            "url": self.url,
            "slot": self.slot,
            "alive": self.alive,
            "held": self.held,
        }


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
        self._replicas: dict[str, ReplicaRecord] = {}
        #: Session id -> slot of the replica whose state dir holds it.
        self._sessions: dict[str, int] = {}
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch_forever, name="fleet-watch", daemon=True)
        self._watcher.start()

    # -- the request path, tagged with the replica ------------------------------------------------

    # Admissions have threads of their own: one that waits for a slot (overload: queue) must never
    # keep the finish that frees the slot from running.
    @ray.method(concurrency_group="admission")  # type: ignore[untyped-decorator]
    def admit(self, request: IncomingRequest, replica: str) -> Admission:
        self.calls["admit"] += 1
        admission = self.state.admit(request)
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
        return admission

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

    def leave(self, replica: str) -> None:
        self.calls["leave"] += 1
        with self._lock:
            record = self._replicas.get(replica)
            if record is not None:
                if not record.alive:
                    return
                record.held = max(0, record.held - 1)
        self.state.leave()

    # -- the rest of the protocol, as LocalControlState has it ---------------------------------------

    def add_faults(self, specs: list[FaultSpec]) -> list[FaultRule]:
        return self.state.add_faults(specs)

    def remove_fault(self, rule_id: str) -> bool:
        return self.state.remove_fault(rule_id)

    def clear_faults(self) -> list[str]:
        return self.state.clear_faults()

    def fault_rules(self) -> list[FaultRule]:
        return self.state.fault_rules()

    def capacity(self) -> CapacityPolicy:
        return self.state.capacity()

    def set_capacity(self, policy: CapacityPolicy) -> None:
        self.state.set_capacity(policy)

    def entries(self) -> list[JournalEntry]:
        return self.state.entries()

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    def timeline(self) -> list[tuple[float, int]]:
        return self.state.timeline()

    def record_error(self, error: tuple[str, str, str, str]) -> None:
        self.state.record_error(_error_from_wire(error))

    def take_errors(self) -> list[tuple[str, str, str, str]]:
        return [_error_to_wire(error) for error in self.state.take_errors()]

    def reset(self, faults: list[FaultSpec], capacity: CapacityPolicy) -> None:
        with self._lock:
            # The in-flight count goes to zero: so do the permits counted against each replica.
            for record in self._replicas.values():
                record.held = 0
                record.open_entries.clear()
            self._sessions.clear()
            self.state.reset(faults, capacity)

    def live_view(self, after: int, pending: list[int], since: float, limit: int) -> dict[str, Any]:
        return self.state.live_view(after, pending, since, limit)

    def entry(self, entry_id: int) -> JournalEntry | None:
        return self.state.entry(entry_id)

    def next_replay(self, entry_id: int | None, key: str, labels: list[str]) -> int:
        return self.state.next_replay(entry_id, key, labels)

    def call_counts(self) -> dict[str, int]:
        """The request path's calls so far, by method (``admit``, ``finish``, ``leave``)."""
        return dict(self.calls)

    def ping(self) -> str:
        return "pong"

    # -- replicas and their leases --------------------------------------------------------------

    def register(self, key: str, handle: Any, node_id: str, url: str) -> int:
        """A replica arrives; its slot: a dead replica's on the same node if there is one (its
        state dir, and the sessions in it, are there), else a new one."""
        # Serve starts a successor once it knows its predecessor is dead, which may be before the
        # watcher's next look: ask Ray about this node's replicas now.
        with self._lock:
            neighbours = [
                (r.key, r.handle) for r in self._replicas.values() if r.alive and r.node_id == node_id
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
            self._replicas[key] = ReplicaRecord(key, handle, node_id, url, slot)
        self.state.journal.note_event(f"replica {key} joined on node {node_id[:12]} (slot {slot})", key)
        return slot

    def deregister(self, key: str) -> None:
        """A replica stops on purpose (scale-down, shutdown): as a death, without the noise."""
        self._declare_dead(key, "stopped")

    def replicas(self) -> list[dict[str, Any]]:
        """Every replica known, alive or not (with their actor handles, for tests that kill one)."""
        with self._lock:
            return [{**r.describe(), "handle": r.handle} for r in self._replicas.values()]

    def _declare_dead(self, key: str, how: str) -> None:
        with self._lock:
            record = self._replicas.get(key)
            if record is None or not record.alive:
                return
            record.alive = False
            held, lost = record.held, sorted(record.open_entries)
            record.held = 0
            record.open_entries.clear()
        for entry_id in lost:
            self.state.finish(entry_id, None, None, outcome="lost", leave=False)
        for _ in range(held):
            self.state.leave()
        if how != "stopped" or held or lost:
            self.state.journal.note_event(
                f"replica {key} {how}; {len(lost)} request(s) it was serving lost, "
                f"{held} cap permit(s) given back",
                key,
            )

    def _watch_forever(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_S):
            with self._lock:
                watched = [(r.key, r.handle) for r in self._replicas.values() if r.alive]
            self._look(watched)

    def _look(self, replicas: list[tuple[str, Any]]) -> None:
        """Declare dead those of ``replicas`` whose actor Ray reports dead. A replica that does not
        answer in time is busy, not dead: only Ray's own report counts."""
        refs = {}
        for key, handle in replicas:
            try:
                refs[key] = handle.__ray_ready__.remote()
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
    actor_class = ray.remote(concurrency_groups={"admission": ADMISSION_THREADS})(ControlActor)
    handle = actor_class.options(**options).remote(journal_limit, capacity, faults)
    ray.get(handle.ping.remote())
    return handle


class RayControlState:
    """The :class:`~mocksandbox.control.state.ControlState` of one replica (or of the driver, with
    ``replica`` ``None``): every call goes to the fleet's control actor."""

    def __init__(self, actor: Any, replica: str | None = None) -> None:
        self.actor = actor
        #: The replica whose admissions these are (their permits are its leases).
        self.replica = replica or "driver"

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
        self._call("finish", entry_id, status, response, outcome, leave, self.replica, tuple(divergences))

    def leave(self, entry_id: int | None = None) -> None:
        self._call("leave", self.replica)

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
        """Nothing to release here: the actor belongs to the fleet, not to this client."""
        return None

    def live_view(self, after: int, pending: list[int], since: float, limit: int = 200) -> dict[str, Any]:
        return dict(self._call("live_view", after, list(pending), since, limit))

    def entry(self, entry_id: int) -> JournalEntry | None:
        found: JournalEntry | None = self._call("entry", entry_id)
        return found

    def next_replay(self, entry_id: int | None, key: str, labels: list[str]) -> int:
        return int(self._call("next_replay", entry_id, key, list(labels)))

    # -- the fleet's own calls (not part of the protocol) -------------------------------------------

    def register(self, handle: Any, node_id: str, url: str) -> int:
        return int(self._call("register", self.replica, handle, node_id, url))

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
