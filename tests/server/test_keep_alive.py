"""HTTP/1.1 keep-alive on the real server: answers on one connection, closes where they must."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator

import pytest

from mocksandbox.core import MockSandbox
from mocksandbox.serving.single import ServerThread
from mocksandbox.settings import Settings

PRINT = json.dumps({"code": "print(1)", "language": "python"}).encode()
HEADERS = {"Content-Type": "application/json"}


@pytest.fixture
def served() -> Iterator[tuple[MockSandbox, ServerThread]]:
    box = MockSandbox.create(Settings(pod_name=None))
    server = ServerThread(box, "127.0.0.1", 0).start()
    try:
        yield box, server
    finally:
        server.stop()
        box.close()


def _connect(server: ServerThread) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", server.server.port, timeout=30)


def _post(connection: http.client.HTTPConnection, body: bytes, **headers: str) -> http.client.HTTPResponse:
    connection.request("POST", "/run_code", body, {**HEADERS, **headers})
    response = connection.getresponse()
    response.read()
    return response


def test_several_requests_share_one_connection(served: tuple[MockSandbox, ServerThread]) -> None:
    box, server = served
    connection = _connect(server)
    try:
        answers = []
        for _ in range(3):
            response = _post(connection, PRINT)
            answers.append(response.status)
            assert not response.will_close
            assert response.getheader("Connection") is None
        # Every request came from the same client port: one TCP connection.
        peers = {entry.client for entry in box.requests()}
    finally:
        connection.close()
    assert answers == [200, 200, 200]
    assert len(peers) == 1


def test_body_left_unread_by_the_app_does_not_become_the_next_request(
    served: tuple[MockSandbox, ServerThread],
) -> None:
    _, server = served
    connection = _connect(server)
    try:
        # A 404 route never reads its body; the next request on the connection must still parse.
        connection.request("POST", "/no/such/route", b"GET / HTTP/1.1\r\n\r\n" * 10, HEADERS)
        first = connection.getresponse()
        first.read()
        second = _post(connection, PRINT)
    finally:
        connection.close()
    assert first.status == 404
    assert second.status == 200


def test_client_asking_to_close_gets_connection_close(served: tuple[MockSandbox, ServerThread]) -> None:
    _, server = served
    connection = _connect(server)
    try:
        response = _post(connection, PRINT, Connection="close")
    finally:
        connection.close()
    assert response.status == 200
    assert response.will_close


def _post_until_closed(server: ServerThread, request_head: bytes) -> tuple[bytes, bytes]:
    """POST ``PRINT`` on a raw connection with ``request_head`` (its request line and headers but
    Content-Length) and read until the server closes it: the answer's head and body."""
    with socket.create_connection(("127.0.0.1", server.server.port), timeout=30) as raw:
        raw.sendall(request_head + f"Content-Length: {len(PRINT)}\r\n\r\n".encode() + PRINT)
        received = b""
        while chunk := raw.recv(65536):  # ends because the server closes the connection
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return head, body


def test_http_1_0_request_is_answered_and_closed(served: tuple[MockSandbox, ServerThread]) -> None:
    _, server = served
    head, body = _post_until_closed(server, b"POST /run_code HTTP/1.0\r\nContent-Type: application/json\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert json.loads(body)["run_result"]["stdout"] == "1\n"


def test_asked_to_close_the_answer_is_whole_and_the_connection_ends(
    served: tuple[MockSandbox, ServerThread],
) -> None:
    box, server = served
    head, body = _post_until_closed(
        server,
        b"POST /run_code HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\n",
    )
    assert head.startswith(b"HTTP/1.1 200")
    assert b"\r\nConnection: close" in head
    assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) == len(body)
    assert json.loads(body)["run_result"]["stdout"] == "1\n"
    assert len(box.requests()) == 1


@pytest.mark.parametrize("connection_header", ["", "Connection: close\r\n"], ids=["keep-alive", "close"])
def test_client_leaving_halfway_through_its_body_gets_no_answer(
    served: tuple[MockSandbox, ServerThread], connection_header: str
) -> None:
    box, server = served
    with socket.create_connection(("127.0.0.1", server.server.port), timeout=30) as raw:
        raw.sendall(
            b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + connection_header.encode()
            + b"Content-Length: 100\r\n\r\n"
            + PRINT[:10]
        )
        raw.shutdown(socket.SHUT_WR)
        assert raw.recv(65536) == b""  # closed without an answer
    connection = _connect(server)
    try:
        assert _post(connection, PRINT).status == 200
    finally:
        connection.close()
    assert len(box.requests()) == 1  # the cut request never reached the app


def test_reset_fault_still_drops_a_kept_connection(served: tuple[MockSandbox, ServerThread]) -> None:
    box, server = served
    connection = _connect(server)
    try:
        assert _post(connection, PRINT).status == 200
        box.add_fault({"match": {"path": "/run_code"}, "action": {"type": "reset"}, "schedule": {"first": 1}})
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
            _post(connection, PRINT)
    finally:
        connection.close()
    # The fault was for the first matching request only: a new connection is answered.
    connection = _connect(server)
    try:
        assert _post(connection, PRINT).status == 200
    finally:
        connection.close()


def test_stopping_the_server_ends_idle_kept_connections() -> None:
    box = MockSandbox.create(Settings(pod_name=None))
    server = ServerThread(box, "127.0.0.1", 0).start()
    connection = _connect(server)
    try:
        assert _post(connection, PRINT).status == 200
        server.stop()
        # The handler that kept the connection has left: nothing answers on it any more.
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
            _post(connection, PRINT)
    finally:
        connection.close()
        box.close()
