"""Every fault type and the concurrency cap, observed by a real HTTP client over loopback."""

from __future__ import annotations

import http.client
import json
import socket
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
import requests

from mocksandbox.pytest_plugin import MockSandboxHandle

PRINT_1 = {"code": "print(1)", "language": "python"}


@pytest.fixture(autouse=True, params=[1, 2], ids=["one-process", "two-workers"])
def _served_by(request: pytest.FixtureRequest) -> None:
    """Every test here against one process and against ``serve --workers 2``: the fault
    schedules, the cap and the journal must hold alike (the handle follows the marker)."""
    if request.param > 1:
        request.node.add_marker(pytest.mark.mocksandbox_workers(request.param))


@pytest.fixture
def mocksandbox_url(mocksandbox: MockSandboxHandle) -> str:
    """The URL of the server behind this test's handle (one process or the workers)."""
    return mocksandbox.url


def post(url: str, body: dict = PRINT_1, timeout: float = 30) -> requests.Response:
    return requests.post(url + "/run_code", json=body, timeout=timeout)


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_status_faults(mocksandbox: MockSandboxHandle, mocksandbox_url: str, status: int) -> None:
    mocksandbox.fail(status, retry_after=2 if status == 429 else None, first=1)
    reply = post(mocksandbox_url)
    assert reply.status_code == status
    assert reply.json() == {"detail": reply.reason}
    if status == 429:
        assert reply.headers["Retry-After"] == "2"
    assert post(mocksandbox_url).status_code == 200  # `first: 1` is spent
    entries = mocksandbox.assert_requests(2, path="/run_code")
    assert [e.fault_action for e in entries] == ["status", None]


def test_custom_status_body_and_headers(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    mocksandbox.add_fault(
        action={
            "type": "status",
            "status": 503,
            "body": {"error": "gateway busy"},
            "headers": {"X-Gateway": "faas"},
        }
    )
    reply = post(mocksandbox_url)
    assert (reply.status_code, reply.json(), reply.headers["X-Gateway"]) == (
        503,
        {"error": "gateway busy"},
        "faas",
    )


def test_sandbox_error_fault(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    mocksandbox.sandbox_error("pod evicted")
    reply = post(mocksandbox_url)
    assert reply.status_code == 200
    assert reply.json() == {
        "status": "SandboxError",
        "message": "pod evicted",
        "compile_result": None,
        "run_result": None,
        "executor_pod_name": None,
        "files": {},
    }


def test_connection_reset(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    mocksandbox.drop("reset", first=1)
    with pytest.raises(requests.ConnectionError) as caught:
        post(mocksandbox_url)
    assert "reset" in str(caught.value).lower()
    assert post(mocksandbox_url).status_code == 200
    assert mocksandbox.stats()["dropped"] == 1


def test_connection_closed_without_answer(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    mocksandbox.drop("close", first=1)
    with pytest.raises(requests.ConnectionError) as caught:
        post(mocksandbox_url)
    assert "without response" in str(caught.value)


def test_truncated_json(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    mocksandbox.add_fault(action={"type": "truncate", "fraction": 0.5})
    reply = post(mocksandbox_url)
    assert reply.status_code == 200
    assert reply.text.startswith('{"status":"Success"')
    with pytest.raises(json.JSONDecodeError):
        json.loads(reply.text)


def test_malformed_json(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    mocksandbox.add_fault(action={"type": "malformed_json"})
    reply = post(mocksandbox_url)
    assert reply.headers["Content-Type"] == "application/json"
    with pytest.raises(requests.JSONDecodeError):
        reply.json()


def test_slow_body_arrives_in_pieces(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    mocksandbox.add_fault(action={"type": "slow_body", "chunk_bytes": 40, "interval_seconds": 0.01})
    parts = urlsplit(mocksandbox_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("POST", "/run_code", body=json.dumps(PRINT_1), headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    body = reply.read()
    assert json.loads(body)["status"] == "Success"
    # Whole body announced up front, sent 40 bytes at a time.
    assert int(reply.getheader("Content-Length")) == len(body)
    conn.close()


def test_delay_fault_is_journaled(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    mocksandbox.delay(0.2, first=1)
    assert post(mocksandbox_url).status_code == 200
    (entry,) = mocksandbox.assert_requests(1)
    assert entry.fault_action == "delay"
    assert entry.duration is not None and entry.duration >= 0.2


def test_faults_over_the_control_api(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    added = requests.post(
        mocksandbox_url + "/_mock/faults",
        json=[
            {"name": "cpp-down", "match": {"language": "cpp"}, "action": {"type": "status", "status": 500}}
        ],
    )
    assert added.status_code == 201
    listed = requests.get(mocksandbox_url + "/_mock/faults").json()["faults"]
    assert [f["id"] for f in listed] == ["cpp-down"]
    assert post(mocksandbox_url, {"code": "int main(){}", "language": "cpp"}).status_code == 500
    assert post(mocksandbox_url).status_code == 200
    assert requests.get(mocksandbox_url + "/_mock/faults").json()["faults"][0]["fired"] == 1
    assert requests.delete(mocksandbox_url + "/_mock/faults/cpp-down").status_code == 200
    assert requests.delete(mocksandbox_url + "/_mock/faults/cpp-down").status_code == 404
    bad = requests.post(
        mocksandbox_url + "/_mock/faults", json={"action": {"type": "status", "status": "many"}}
    )
    assert bad.status_code == 422
    assert "status" in bad.json()["detail"]


def test_cap_rejects_with_retry_after_and_reset_zeroes_stats(
    mocksandbox: MockSandboxHandle, mocksandbox_url: str
) -> None:
    mocksandbox.set_capacity(max_in_flight=3, retry_after_s=2)
    slow = {"code": "import time\ntime.sleep(1)\nprint('done')", "language": "python"}
    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda _: post(mocksandbox_url, slow), range(12)))
    codes = sorted(r.status_code for r in replies)
    assert 429 in codes and 200 in codes
    assert all(r.headers["Retry-After"] == "2" for r in replies if r.status_code == 429)
    stats = requests.get(mocksandbox_url + "/_mock/stats").json()
    assert stats["max_in_flight"] <= 3
    assert stats["rejected_by_cap"] == codes.count(429)
    assert requests.post(mocksandbox_url + "/_mock/reset").json() == {"reset": True}
    stats = requests.get(mocksandbox_url + "/_mock/stats").json()
    assert (stats["requests_total"], stats["max_in_flight"], stats["in_flight"]) == (0, 0, 0)


def test_cap_can_queue_instead(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    requests.put(
        mocksandbox_url + "/_mock/capacity", json={"max_in_flight": 2, "overload": "queue"}
    ).raise_for_status()
    slow = {"code": "import time\ntime.sleep(0.3)\nprint('done')", "language": "python"}
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda _: post(mocksandbox_url, slow), range(6)))
    assert [r.status_code for r in replies] == [200] * 6
    assert mocksandbox.stats()["max_in_flight"] == 2


def test_capacity_api_validates(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    bad = requests.put(mocksandbox_url + "/_mock/capacity", json={"max_in_flight": 0})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "max_in_flight"]


def test_journal_records_bodies_and_clients(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    post(mocksandbox_url)
    requests.get(mocksandbox_url + "/v1/ping")
    entries = requests.get(mocksandbox_url + "/_mock/journal").json()["entries"]
    assert [(e["method"], e["path"], e["status"]) for e in entries] == [
        ("POST", "/run_code", 200),
        ("GET", "/v1/ping", 200),
    ]
    assert entries[0]["body"] == PRINT_1
    assert entries[0]["response"]["run_result"]["stdout"] == "1\n"
    assert entries[0]["client"].startswith("127.0.0.1:")
    assert entries[0]["ended"] >= entries[0]["started"]
    only_ping = requests.get(mocksandbox_url + "/_mock/journal", params={"path": "/v1/ping"}).json()[
        "entries"
    ]
    assert len(only_ping) == 1


def test_assertion_message_shows_nearest_calls(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    post(mocksandbox_url)
    with pytest.raises(AssertionError) as caught:
        mocksandbox.assert_requests(2, path="/run_code")
    assert "#1 POST /run_code python -> 200" in str(caught.value)


def test_control_api_can_be_switched_off() -> None:
    from mocksandbox.core import MockSandbox
    from mocksandbox.serving.single import ServerThread
    from mocksandbox.settings import load_settings

    box = MockSandbox.create(load_settings(overrides={"control_api": False}))
    try:
        with ServerThread(box) as server:
            assert requests.get(server.url + "/_mock/stats").status_code == 404
            assert requests.get(server.url + "/v1/ping").status_code == 200
    finally:
        box.close()


def test_server_survives_a_client_that_vanishes(mocksandbox: MockSandboxHandle, mocksandbox_url: str) -> None:
    parts = urlsplit(mocksandbox_url)
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.sendall(b'POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"co')
    assert post(mocksandbox_url).status_code == 200


def test_the_requests_are_served_by_the_processes_asked_for(
    mocksandbox: MockSandboxHandle, mocksandbox_url: str, _served_by: None, request: pytest.FixtureRequest
) -> None:
    """(This module's parametrization at work: worker names in the journal with workers only.)"""
    assert post(mocksandbox_url).status_code == 200
    (entry,) = mocksandbox.assert_requests(1)
    if request.node.get_closest_marker("mocksandbox_workers"):
        assert entry.worker in ("worker-1", "worker-2")
    else:
        assert entry.worker is None
