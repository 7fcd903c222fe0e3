"""The server's connection threads: reused from one connection to the next (a client that opens a
connection per request, as verl's ``requests.post`` does, must not pay for a thread each time),
never a cap on connections at once, and gone when idle."""

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


@pytest.fixture
def server() -> Iterator[tuple[MockServer, threading.Event]]:
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
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv, gate
    gate.set()
    srv.shutdown()
    thread.join(10)


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


def test_connections_one_after_another_reuse_one_thread(server: tuple[MockServer, threading.Event]) -> None:
    srv, _ = server
    served_by = set()
    for _ in range(20):
        served_by.add(_ask(srv.port))
        _wait_until(lambda: srv._handlers.idle == 1, "the thread did not go back to waiting")
    assert len(served_by) == 1, served_by
    assert srv._handlers.threads == 1


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
    assert srv._handlers.threads == 40 and srv._handlers.idle == 0
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
