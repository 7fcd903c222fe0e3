"""The server's connection threads: reused from one connection to the next (a client that opens a
connection per request, as verl's ``requests.post`` does, must not pay for a thread each time),
never a cap on connections at once, and gone when idle. Both ways of serving: a loop that accepts
and hands each connection to a thread (``serve_forever``, for servers in a thread), and threads
that each accept and serve (``serve_by_acceptors``, ``mocksandbox serve``)."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mocksandbox.serving.single import MockServer, _HandlerThreads

#: The threads serving ``/hold`` requests of the current test right now, while they wait at its gate.
HOLDING: set[threading.Thread] = set()
_HOLDING_LOCK = threading.Lock()


def _threads(srv: MockServer) -> Any:
    """The server's connection threads, whichever way it serves."""
    return srv._acceptors if srv._acceptors is not None else srv._handlers


@pytest.fixture(params=["serve_forever", "serve_by_acceptors"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[MockServer, threading.Event]]:
    """A server whose app answers with the id of the thread serving the connection; ``/hold``
    waits for the gate first (noted in :data:`HOLDING` meanwhile)."""
    gate = threading.Event()
    HOLDING.clear()

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        if environ["PATH_INFO"] == "/hold":
            with _HOLDING_LOCK:
                HOLDING.add(threading.current_thread())
            gate.wait(120)
        body = str(threading.get_ident()).encode()
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    srv = MockServer("127.0.0.1", 0, app)
    thread = threading.Thread(target=getattr(srv, request.param), daemon=True)
    thread.start()
    _wait_until(lambda: request.param == "serve_forever" or srv._acceptors is not None, "not serving")
    yield srv, gate
    gate.set()
    if request.param == "serve_forever":
        srv.shutdown()
    else:
        srv.stop_requested.set()
    thread.join(10)
    assert not thread.is_alive()
    srv.server_close()
    if request.param == "serve_by_acceptors":  # the listener shut down: every thread has ended
        _wait_until(lambda: srv._acceptors.threads == 0, "connection threads served on after the stop")


def _ask(port: int, path: str = "/") -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path, headers={"Connection": "close"})
        return connection.getresponse().read().decode()
    finally:
        connection.close()


def _wait_until(condition: Callable[[], bool], message: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(0.005)


def test_connections_one_after_another_reuse_their_threads(
    server: tuple[MockServer, threading.Event],
) -> None:
    """One thread serves them all (a loop that hands them out), or two in turn (threads that
    accept: the one that takes a connection while none other waits starts one)."""
    srv, _ = server
    threads = 1 if srv._acceptors is None else 2
    served_by = set()
    for _ in range(20):
        served_by.add(_ask(srv.port))
        _wait_until(lambda: _threads(srv).idle == threads, "the thread did not go back to waiting")
    assert 1 <= len(served_by) <= threads, served_by
    assert _threads(srv).threads == threads


def test_connections_at_once_each_get_a_thread(server: tuple[MockServer, threading.Event]) -> None:
    srv, gate = server
    answers: list[str] = []
    held = [threading.Thread(target=lambda: answers.append(_ask(srv.port, "/hold"))) for _ in range(40)]
    for thread in held:
        thread.start()
    # Forty threads, each holding one of the forty requests at once: no cap. (Compared as thread
    # objects: a thread's id may be another's once that one has ended, as idle threads of the
    # servers of earlier tests do, 30 s after their last connection.)
    _wait_until(lambda: len(HOLDING) == 40, "forty connections were not served at once")
    waiting = 0 if srv._acceptors is None else 1  # (one always waits in accept)
    assert (_threads(srv).threads, _threads(srv).idle) == (40 + waiting, waiting)
    gate.set()
    for thread in held:
        thread.join(30)
    assert len(answers) == 40


def test_idle_threads_end_and_nothing_queued_is_lost() -> None:
    served: list[int] = []
    done = threading.Semaphore(0)

    def serve(request: Any, client_address: Any) -> None:
        served.append(request)
        done.release()

    handlers = _HandlerThreads(serve, idle_s=0.05)
    for n in range(5):
        handlers.serve(n, None)
    for _ in range(5):
        assert done.acquire(timeout=10)
    _wait_until(lambda: handlers.threads == 0, "idle threads did not end")
    assert handlers.idle == 0
    handlers.serve(5, None)  # after they all left, a new one serves
    assert done.acquire(timeout=10)
    assert sorted(served) == list(range(6))


def test_accepting_threads_beyond_the_idle_bound_end() -> None:
    """Threads that accept and serve: once their connections are done, no more than ``max_idle``
    stay waiting; the others end, and a new connection is still served."""
    gate = threading.Event()
    holding: list[int] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        holding.append(1)
        gate.wait(60)
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
        return [b"ok"]

    srv = MockServer("127.0.0.1", 0, app)
    thread = threading.Thread(target=srv.serve_by_acceptors, kwargs={"max_idle": 3}, daemon=True)
    thread.start()
    try:
        answers: list[str] = []
        held = [threading.Thread(target=lambda: answers.append(_ask(srv.port))) for _ in range(10)]
        for asking in held:
            asking.start()
        _wait_until(lambda: len(holding) == 10, "ten connections were not served at once")
        assert srv._acceptors is not None and srv._acceptors.threads == 11
        gate.set()
        for asking in held:
            asking.join(30)
        assert answers == ["ok"] * 10
        _wait_until(lambda: srv._acceptors.threads == 3, "threads beyond the bound did not end")
        assert srv._acceptors.idle == 3
        assert _ask(srv.port) == "ok"
    finally:
        gate.set()
        srv.stop_requested.set()
        thread.join(10)
        srv.server_close()


def test_accepting_threads_serve_on_where_no_thread_can_be_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no new thread can be started (the process budget is spent), the thread that took a
    connection serves it all the same, and the next ones after it, one at a time."""
    srv = MockServer("127.0.0.1", 0, lambda environ, start_response: _answer_ok(start_response))
    started = threading.Thread.start

    def start_only_the_first(thread: threading.Thread) -> None:
        if (
            thread.name == "mocksandbox-connection"
            and srv._acceptors is not None
            and srv._acceptors.threads > 1
        ):
            raise RuntimeError("can't start new thread")
        started(thread)

    monkeypatch.setattr(threading.Thread, "start", start_only_the_first)
    thread = threading.Thread(target=srv.serve_by_acceptors, daemon=True)
    started(thread)
    try:
        _wait_until(lambda: srv._acceptors is not None and srv._acceptors.idle == 1, "not serving")
        for _ in range(3):
            assert _ask(srv.port) == "ok"
            _wait_until(lambda: srv._acceptors.idle == 1, "the thread did not go back to waiting")
        assert srv._acceptors.threads == 1
    finally:
        srv.stop_requested.set()
        thread.join(10)
        srv.server_close()


def _answer_ok(start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]
