"""One control state for several server processes on one machine: a state server and its clients.

The process that starts the workers holds a :class:`~mocksandbox.control.state.LocalControlState`
and serves it on a Unix socket in a private directory (:class:`ControlStateServer`); every worker
reaches it through a :class:`RemoteControlState`, which implements the same
:class:`~mocksandbox.control.state.ControlState` protocol. Every guarantee is then exact across
workers because it is computed in one place, under the same locks as with one process: the
journal's arrival order and ids, the in-flight count and its maximum (a request over the cap is
refused, and counted, once), the fault schedules' counters and seeded random streams.

Why a state server rather than shared memory or SQLite: the journal holds bodies of any size and
the fault rules are objects with their own counters and random streams; one process that owns them
keeps the single-process code as it is. A call costs a round trip, a few tens of microseconds on a
Unix socket plus a thread switch in both processes.

A request need not pay it. When the state is a :class:`~mocksandbox.control.pooled.PooledControlState`,
its ids and in-flight count live in :class:`~mocksandbox.control.counters.SharedCounters` that the
clients map: a client admits by itself while no fault rule is in force and the cap rejects rather
than queues, and *tells* the server each request, its answer and the in-flight changes on a channel
of its own, one way, without waiting (see that module for why reads stay exact).

Wire format: a 4-byte big-endian length, then a :mod:`marshal` payload (plain values only:
``marshal`` builds no objects of other types, so a message cannot run code in the state server).
A call is ``(operation, arguments)``; an answer ``(True, value)`` or ``(False, kind, message)``. A
connection whose first call is ``("channel", ())`` becomes a channel: it carries what a client
tells, and nothing is answered on it.
Each client thread keeps its own connection, so a request waiting for a slot (``overload:
queue``) blocks no other.
"""

from __future__ import annotations

import marshal
import os
import select
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import astuple
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from mocksandbox.control.counters import SharedCounters
from mocksandbox.control.pooled import PooledControlState
from mocksandbox.control.state import (
    Admission,
    CapacityPolicy,
    IncomingRequest,
    LocalControlState,
    ServerError,
)
from mocksandbox.faults import FaultAction, FaultDecision, FaultError, FaultRule, FaultSpec
from mocksandbox.journal import BODY_LIMIT, JournalEntry

_LENGTH = struct.Struct(">I")
#: How long a channel's follower lets told messages gather before it applies them: one wake-up
#: for several requests, and short enough that a burst of large bodies does not fill the buffer.
FOLLOW_BATCH_S = 0.005
#: The send buffer a client asks for on its channel.
_CHANNEL_BUFFER = 4 << 20
_ACTION: TypeAdapter[Any] = TypeAdapter(FaultAction)


class ControlStateUnavailable(ConnectionError):
    """The process holding the control state cannot be reached (it stopped or died)."""


class RemoteServerError(RuntimeError):
    """An exception raised inside another server process, as far as it can cross: its type name,
    message and traceback text."""


# -- framing -----------------------------------------------------------------------------------------


def _send(sock: socket.socket, value: Any) -> None:
    payload = marshal.dumps(value)
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    while view:
        received = sock.recv_into(view)
        if not received:
            raise EOFError("connection closed")
        view = view[received:]
    return bytes(buffer)


#: What one ``recv`` asks for: every call and answer but the journal's longest fits, so a frame
#: usually arrives in one system call instead of two (length, then payload).
_FIRST_READ = 64 * 1024


def _receive(sock: socket.socket) -> Any:
    # One message at a time on a connection (a call, then its answer): nothing follows a frame.
    head = sock.recv(_FIRST_READ)
    if not head:
        raise EOFError("connection closed")
    if len(head) < _LENGTH.size:
        head += _receive_exactly(sock, _LENGTH.size - len(head))
    (size,) = _LENGTH.unpack_from(head)
    payload = head[_LENGTH.size :]
    if len(payload) < size:
        payload += _receive_exactly(sock, size - len(payload))
    return marshal.loads(payload)


def _told_at(message: tuple[Any, ...]) -> float:
    """When what ``message`` tells happened: every message carries its clock reading third."""
    at: float = message[2]
    return at


class _Channel:
    """The server's end of a client's channel: the bytes read so far that do not yet make a whole
    message."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = bytearray()
        self.open = True

    def pump(self, apply: Callable[[Any], None]) -> bool:
        """Read all there is without waiting and ``apply`` each whole message, in order; whether
        the channel is still open. The caller holds the state's feed lock."""
        while self.open:
            try:
                data = self.sock.recv(_FIRST_READ)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.open = False
                break
            self.pending += data
        pending, start = self.pending, 0
        while len(pending) - start >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(pending, start)
            end = start + _LENGTH.size + size
            if len(pending) < end:
                break
            apply(marshal.loads(pending[start + _LENGTH.size : end]))
            start = end
        del pending[:start]
        return self.open


# -- values as they cross ----------------------------------------------------------------------------


def _rule_to_wire(rule: FaultRule) -> tuple[Any, ...]:
    return (rule.id, rule.spec.model_dump(mode="json"), rule.added_at, rule.matched, rule.fired)


def _rule_from_wire(data: tuple[Any, ...]) -> FaultRule:
    rule_id, spec, added_at, matched, fired = data
    return FaultRule(
        id=rule_id, spec=FaultSpec.model_validate(spec), added_at=added_at, matched=matched, fired=fired
    )


def _entry_from_wire(data: tuple[Any, ...]) -> JournalEntry:
    return JournalEntry(*data)


def _entry_to_wire(entry: JournalEntry | None) -> tuple[Any, ...] | None:
    return None if entry is None else astuple(entry)


def _error_to_wire(error: ServerError) -> tuple[str, str, str, str]:
    exc = error.exception
    return (error.path, type(exc).__name__, str(exc), error.traceback)


def _error_from_wire(data: tuple[str, str, str, str]) -> ServerError:
    path, kind, message, trace = data
    exc = RemoteServerError(f"{kind}: {message}")
    exc.add_note(f"raised in another server process; its traceback:\n{trace}")
    return ServerError(path, exc, trace)


# -- the server --------------------------------------------------------------------------------------


class ControlStateServer:
    """Serves ``state`` to other processes on a Unix socket in a private directory."""

    def __init__(self, state: LocalControlState, directory: str | None = None) -> None:
        self.state = state
        self._directory = Path(tempfile.mkdtemp(prefix="mocksandbox-control-", dir=directory))
        os.chmod(self._directory, 0o700)  # the state is the server's business only
        #: Where the clients connect.
        self.path = str(self._directory / "control.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(256)
        self._closed = False
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._operations: dict[str, Callable[..., Any]] = {
            "admit": self._admit,
            "finish": state.finish,
            "leave": state.leave,
            "add_faults": self._add_faults,
            "remove_fault": state.remove_fault,
            "clear_faults": state.clear_faults,
            "fault_rules": lambda: [_rule_to_wire(rule) for rule in state.fault_rules()],
            "capacity": lambda: astuple(state.capacity()),
            "set_capacity": lambda *policy: state.set_capacity(CapacityPolicy(*policy)),
            "entries": lambda: [astuple(entry) for entry in state.entries()],
            "stats": state.stats,
            "timeline": state.timeline,
            "record_error": lambda *error: state.record_error(_error_from_wire(error)),
            "take_errors": lambda: [_error_to_wire(error) for error in state.take_errors()],
            "reset": self._reset,
            "ping": lambda: "pong",
            # What a new client needs: where the shared counters are (None: every call goes here).
            "hello": lambda: state.counters.path if isinstance(state, PooledControlState) else None,
        }
        # The console's live view (plain values already) and one entry's detail.
        self._operations["live_view"] = state.live_view
        self._operations["entry"] = lambda entry_id: _entry_to_wire(state.entry(entry_id))
        self._operations["next_replay"] = state.next_replay  # which recording answers (replay)
        self._channels: list[_Channel] = []
        if isinstance(state, PooledControlState):
            state.drain = self.drain
        self._thread = threading.Thread(target=self._accept_loop, name="mocksandbox-control", daemon=True)
        self._thread.start()

    def _admit(self, *request: Any) -> tuple[Any, ...]:
        admission = self.state.admit(IncomingRequest(*request))
        decision = admission.decision
        action = None if decision.action is None else decision.action.model_dump(mode="json")
        return (
            admission.entry_id,
            admission.admitted,
            admission.retry_after_s,
            decision.delay_seconds,
            action,
            decision.rule_ids,
            decision.output_mode,
        )

    def _add_faults(self, specs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        rules = self.state.add_faults([FaultSpec.model_validate(spec) for spec in specs])
        return [_rule_to_wire(rule) for rule in rules]

    def _reset(self, specs: list[dict[str, Any]], policy: tuple[Any, ...]) -> None:
        self.state.reset([FaultSpec.model_validate(spec) for spec in specs], CapacityPolicy(*policy))

    def _accept_loop(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    connection.close()
                    return
                self._connections.add(connection)
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        try:
            while True:
                try:
                    operation, arguments = _receive(connection)
                except (EOFError, OSError, ValueError):
                    return
                if operation == "channel" and isinstance(self.state, PooledControlState):
                    self._follow(connection, self.state)
                    return
                try:
                    answer: tuple[Any, ...] = (True, self._operations[operation](*arguments))
                except FaultError as exc:
                    answer = (False, "fault", str(exc))
                except ValueError as exc:
                    answer = (False, "value", str(exc))
                except Exception as exc:  # a bug: said to the caller, who raises it
                    answer = (False, "error", f"{type(exc).__name__}: {exc}")
                try:
                    _send(connection, answer)
                except OSError:
                    return
        finally:
            with self._lock:
                self._connections.discard(connection)
            connection.close()

    # -- channels: what clients tell, one way -----------------------------------------------------

    def _follow(self, connection: socket.socket, state: PooledControlState) -> None:
        """Make ``connection`` a channel and apply what comes on it as it comes, until the client
        closes it. Registered before the client hears so: every drain after that reads it."""
        channel = _Channel(connection)
        connection.setblocking(False)  # a drain reads it too, and must never wait on it
        poller = select.poll()
        poller.register(connection, select.POLLIN)
        with self._lock:
            self._channels.append(channel)
        try:
            try:
                _send(connection, (True, None))  # a few bytes into an empty buffer: never blocks
            except OSError:
                return
            while True:
                try:
                    poller.poll()
                except OSError:
                    return  # closed under us (the server is stopping)
                if not state.queueing:
                    # Let a batch gather: one wake-up per batch, not per request, and nothing
                    # waits on it (reads drain first). Requests queued for a slot wait for the
                    # leaves told here: then every message is applied at once.
                    time.sleep(FOLLOW_BATCH_S)
                self.drain()
                if not channel.open:
                    return
        finally:
            with self._lock:
                if channel in self._channels:
                    self._channels.remove(channel)

    def drain(self) -> None:
        """Apply everything clients have told and this server has not read yet. A client tells
        before it answers its own client, so after this every answered request is in the state.

        What every channel holds is applied together, in the order it happened (each message is
        stamped with a clock reading, taken inside the counters' lock where order matters): the
        journal and the timeline then grow at their ends instead of taking each client's batch
        between the other's entries."""
        state = self.state
        if not isinstance(state, PooledControlState):
            return
        with state.feed_lock:
            with self._lock:
                channels = list(self._channels)
            messages: list[tuple[Any, ...]] = []
            for channel in channels:
                channel.pump(messages.append)
            messages.sort(key=_told_at)
            for message in messages:
                state.told(message)

    def close(self) -> None:
        """Stop serving; clients' next calls raise :class:`ControlStateUnavailable`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            connections = list(self._connections)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)
        try:
            os.unlink(self.path)
            self._directory.rmdir()
        except OSError:
            pass


# -- the client ----------------------------------------------------------------------------------------


class RemoteControlState:
    """The :class:`~mocksandbox.control.state.ControlState` of a worker: every call goes to the
    state server at ``path``. Thread-safe: a call takes a connection of its own from a pool (so a
    request waiting for a slot holds one, and the others go on) and gives it back after."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        # Fails at start-up, not at the first request, if the server is not there.
        counters_path = self._call("hello")
        #: The shared counters and the channel, when the server holds a pooled state (fast path).
        self._counters: SharedCounters | None = None
        self._channel: socket.socket | None = None
        self._channel_lock = threading.Lock()
        if counters_path is not None:
            self._counters = SharedCounters.open(counters_path)
            self._channel = self._take()
            # Room for what the server's follower has not read yet (it reads in batches): a
            # journal entry carries up to 256 KiB of body each way. The kernel caps it at wmem_max.
            self._channel.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _CHANNEL_BUFFER)
            _send(self._channel, ("channel", ()))
            _receive(self._channel)  # registered: from now on every read there sees what we tell

    def _tell(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` on the channel, one way: it is in the server's socket buffer when this
        returns, which is all a read there needs (it drains the channels first)."""
        assert self._channel is not None
        payload = marshal.dumps(message)
        try:
            with self._channel_lock:
                self._channel.sendall(_LENGTH.pack(len(payload)) + payload)
        except OSError as exc:
            raise ControlStateUnavailable(f"the control state at {self.path} went away: {exc}") from None

    def _take(self) -> socket.socket:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise ControlStateUnavailable(f"cannot reach the control state at {self.path}: {exc}") from None
        return sock

    def _give_back(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(sock)
                return
        sock.close()

    def _call(self, operation: str, *arguments: Any) -> Any:
        sock = self._take()
        try:
            _send(sock, (operation, arguments))
            answer = _receive(sock)
        except (OSError, EOFError) as exc:
            sock.close()
            raise ControlStateUnavailable(f"the control state at {self.path} went away: {exc}") from None
        self._give_back(sock)
        if answer[0]:
            return answer[1]
        _, kind, message = answer
        if kind == "fault":
            raise FaultError(message)
        if kind == "value":
            raise ValueError(message)
        raise RemoteServerError(f"in the control state server: {message}")

    def admit(self, request: IncomingRequest) -> Admission:
        fast = self._counters.admit() if self._counters is not None else None
        if fast is not None:
            change = None if fast.change is None else tuple(fast.change)
            self._tell(
                (
                    "begin",
                    fast.epoch,
                    fast.at,
                    fast.entry_id,
                    request.method,
                    request.path,
                    request.query,
                    request.body[: BODY_LIMIT + 1],  # the journal keeps no more, and sees it was cut
                    request.client,
                    request.worker,
                    change,
                )
            )
            return Admission(fast.entry_id, fast.admitted, fast.retry_after_s)
        entry_id, admitted, retry_after_s, delay, action, rule_ids, output_mode = self._call(
            "admit", request.method, request.path, request.query, request.body, request.client, request.worker
        )
        decision = FaultDecision(
            delay, None if action is None else _ACTION.validate_python(action), tuple(rule_ids), output_mode
        )
        return Admission(entry_id, admitted, retry_after_s, decision)

    def finish(
        self,
        entry_id: int,
        status: int | None,
        response: bytes | None,
        outcome: str = "answered",
        leave: bool = True,
        divergences: tuple[str, ...] = (),
    ) -> None:
        if self._counters is None:
            self._call("finish", entry_id, status, response, outcome, leave, tuple(divergences))
            return
        change = self._counters.leave() if leave else None
        kept = None if response is None else response[: BODY_LIMIT + 1]
        at = time.monotonic() if change is None else change.at
        change_wire = None if change is None else tuple(change)
        self._tell(("finish", None, at, entry_id, status, kept, outcome, change_wire, tuple(divergences)))

    def leave(self, entry_id: int | None = None) -> None:
        if self._counters is None:
            self._call("leave")
            return
        change = self._counters.leave()
        self._tell(("leave", None, change.at, tuple(change)))

    def add_faults(self, specs: list[FaultSpec]) -> list[FaultRule]:
        wire = [spec.model_dump(mode="json") for spec in specs]
        return [_rule_from_wire(rule) for rule in self._call("add_faults", wire)]

    def remove_fault(self, rule_id: str) -> bool:
        return bool(self._call("remove_fault", rule_id))

    def clear_faults(self) -> list[str]:
        return list(self._call("clear_faults"))

    def fault_rules(self) -> list[FaultRule]:
        return [_rule_from_wire(rule) for rule in self._call("fault_rules")]

    def capacity(self) -> CapacityPolicy:
        return CapacityPolicy(*self._call("capacity"))

    def set_capacity(self, policy: CapacityPolicy) -> None:
        self._call("set_capacity", *astuple(policy))

    def entries(self) -> list[JournalEntry]:
        return [_entry_from_wire(entry) for entry in self._call("entries")]

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self._call("stats")
        return stats

    def timeline(self) -> list[tuple[float, int]]:
        return list(self._call("timeline"))

    def record_error(self, error: ServerError) -> None:
        self._call("record_error", *_error_to_wire(error))

    def take_errors(self) -> list[ServerError]:
        return [_error_from_wire(error) for error in self._call("take_errors")]

    def reset(self, faults: list[FaultSpec], capacity: CapacityPolicy) -> None:
        self._call("reset", [spec.model_dump(mode="json") for spec in faults], astuple(capacity))

    def close(self) -> None:
        """Close this client's connections (the state server goes on)."""
        with self._lock:
            self._closed = True
            sockets, self._idle = self._idle, []
        for sock in sockets:
            sock.close()
        with self._channel_lock:
            if self._channel is not None:
                self._channel.close()
        if self._counters is not None:
            self._counters.close()

    def live_view(self, after: int, pending: list[int], since: float, limit: int = 200) -> dict[str, Any]:
        view: dict[str, Any] = self._call("live_view", after, list(pending), since, limit)
        return view

    def entry(self, entry_id: int) -> JournalEntry | None:
        data = self._call("entry", entry_id)
        return None if data is None else _entry_from_wire(data)

    def next_replay(self, entry_id: int | None, key: str, labels: list[str]) -> int:
        return int(self._call("next_replay", entry_id, key, list(labels)))
