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
keeps the single-process code as it is. A request costs two round trips (``admit``, ``finish``),
each a few tens of microseconds on a Unix socket.

Wire format: a 4-byte big-endian length, then a :mod:`marshal` payload (plain values only:
``marshal`` builds no objects of other types, so a message cannot run code in the state server).
A call is ``(operation, arguments)``; an answer ``(True, value)`` or ``(False, kind, message)``.
Each client thread keeps its own connection, so a request waiting for a slot (``overload:
queue``) blocks no other.
"""

from __future__ import annotations

import marshal
import os
import socket
import struct
import tempfile
import threading
from collections.abc import Callable
from dataclasses import astuple
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from mocksandbox.control.state import (
    Admission,
    CapacityPolicy,
    IncomingRequest,
    LocalControlState,
    ServerError,
)
from mocksandbox.faults import FaultAction, FaultDecision, FaultError, FaultRule, FaultSpec
from mocksandbox.journal import JournalEntry

_LENGTH = struct.Struct(">I")
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
        }
        # The console's live view (plain values already) and one entry's detail.
        self._operations["live_view"] = state.live_view
        self._operations["entry"] = lambda entry_id: _entry_to_wire(state.entry(entry_id))
        self._operations["next_replay"] = state.next_replay  # which recording answers (replay)
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
        self._call("ping")  # fail at start-up, not at the first request

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
        entry_id, admitted, retry_after_s, delay, action, rule_ids = self._call(
            "admit", request.method, request.path, request.query, request.body, request.client, request.worker
        )
        decision = FaultDecision(
            delay, None if action is None else _ACTION.validate_python(action), tuple(rule_ids)
        )
        return Admission(entry_id, admitted, retry_after_s, decision)

    def finish(
        self,
        entry_id: int,
        status: int | None,
        response: bytes | None,
        outcome: str = "answered",
        leave: bool = True,
    ) -> None:
        self._call("finish", entry_id, status, response, outcome, leave)

    def leave(self) -> None:
        self._call("leave")

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

    def live_view(self, after: int, pending: list[int], since: float, limit: int = 200) -> dict[str, Any]:
        view: dict[str, Any] = self._call("live_view", after, list(pending), since, limit)
        return view

    def entry(self, entry_id: int) -> JournalEntry | None:
        data = self._call("entry", entry_id)
        return None if data is None else _entry_from_wire(data)

    def next_replay(self, entry_id: int | None, key: str, labels: list[str]) -> int:
        return int(self._call("next_replay", entry_id, key, list(labels)))
