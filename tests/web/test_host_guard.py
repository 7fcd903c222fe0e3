"""No code from a browser page: requests for other hosts (DNS rebinding) and from other sites' pages
get 403; clients that are not browsers are unaffected."""

from __future__ import annotations

import contextlib
import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from mocksandbox.core import MockSandbox
from mocksandbox.serving.single import ServerThread
from mocksandbox.settings import Settings
from mocksandbox.web import create_app
from mocksandbox.web.host_guard import HostPolicy, is_loopback_host, split_host

PRINT_42 = {"code": "print(6*7)", "language": "python"}


@pytest.fixture(scope="module")
def sandbox() -> Iterator[MockSandbox]:
    box = MockSandbox.create(Settings(allowed_hosts=["sandbox.internal", "*.cluster.local"]))
    yield box
    box.close()


@pytest.fixture
def client(sandbox: MockSandbox) -> FlaskClient:
    sandbox.reset()
    return create_app(sandbox).test_client()


def _run(client: FlaskClient, **headers: str) -> tuple[int, dict[str, object]]:
    reply = client.post("/run_code", json=PRINT_42, headers=headers)
    return reply.status_code, reply.get_json()


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:8080",
        "127.0.0.1:8080",
        "127.1.2.3",
        "[::1]:8080",
        "LOCALHOST.:8080",
        "app.localhost:8080",
        "[::ffff:127.0.0.1]:8080",
        "sandbox.internal:8080",
        "node-3.cluster.local",
    ],
)
def test_loopback_configured_and_allowed_hosts_are_answered(client: FlaskClient, host: str) -> None:
    status, body = _run(client, Host=host)
    assert status == 200, body
    assert body["run_result"]["stdout"] == "42\n"  # type: ignore[index]


@pytest.mark.parametrize(
    "host",
    ["evil.example:8080", "evil.example", "127.0.0.1.evil.example", "localhost.evil.example", "10.0.0.5:8080"],
)
def test_a_request_for_another_host_is_refused_and_nothing_runs(
    client: FlaskClient, sandbox: MockSandbox, host: str
) -> None:
    status, body = _run(client, Host=host)
    assert status == 403
    detail = str(body["detail"])
    assert f"Host {host!r} is not allowed" in detail
    assert f"--allow-host {split_host(host)}" in detail  # says how to allow it
    assert sandbox.stats()["requests_total"] == 0  # it never reached the sandbox


@pytest.mark.parametrize("path", ["/v1/ping", "/_mock/stats", "/_mock/journal", "/nowhere"])
def test_every_path_is_guarded(client: FlaskClient, path: str) -> None:
    assert client.get(path, headers={"Host": "evil.example:8080"}).status_code == 403


@pytest.mark.parametrize(
    "origin", ["http://evil.example", "https://evil.example:8443", "null", "file://", "chrome-extension://abc"]
)
def test_a_page_of_another_site_is_refused(client: FlaskClient, origin: str) -> None:
    status, body = _run(client, Origin=origin)
    assert status == 403
    assert f"Origin {origin!r} is not allowed" in str(body["detail"])


@pytest.mark.parametrize(
    "origin", ["http://localhost:3000", "http://127.0.0.1:8080", "http://[::1]:8080", "https://sandbox.internal"]
)
def test_pages_of_this_machine_and_allowed_hosts_are_answered(client: FlaskClient, origin: str) -> None:
    status, body = _run(client, Origin=origin)
    assert status == 200, body


def test_allow_any_host_answers_everything(sandbox: MockSandbox) -> None:
    box = MockSandbox(sandbox.settings.replace(allow_any_host=True), sandbox.engine, sandbox.confinement)
    client = create_app(box).test_client()
    reply = client.post("/run_code", json=PRINT_42, headers={"Host": "evil.example", "Origin": "http://evil.example"})
    assert reply.status_code == 200


def test_the_configured_host_is_allowed() -> None:
    policy = HostPolicy.from_settings(Settings(host="10.0.0.5", allowed_hosts=["Build-Box."]))
    assert policy.allows_host("10.0.0.5")
    assert policy.allows_host("build-box")
    assert not policy.allows_host("10.0.0.6")


def test_loopback_names() -> None:
    assert is_loopback_host("127.255.0.1") and is_loopback_host("::1") and is_loopback_host("x.localhost")
    assert not is_loopback_host("localhost.example") and not is_loopback_host("0.0.0.0")


def test_allowed_hosts_from_the_environment() -> None:
    from mocksandbox.settings import load_settings

    settings = load_settings(environ={"MOCKSANDBOX_ALLOWED_HOSTS": "a.example, b.example"})
    assert settings.allowed_hosts == ["a.example", "b.example"]


def test_dns_rebinding_over_a_real_socket(tmp_path: Path) -> None:
    """What a rebound page sends (its own name in Host, its origin), on a real connection: 403, and
    the program, which would leave a file behind, never runs. The same connection, sent the way a
    plain client sends it, is answered. (Isolation none: under lite no program leaves anything on
    the host, so there would be nothing to look at.)"""
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('pwned'); print('ran')"
    sandbox = MockSandbox.create(Settings(isolation="none"))
    with contextlib.closing(sandbox), ServerThread(sandbox) as server:
        port = server.server.port
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = json.dumps({"code": code, "language": "python"})
        connection.request(
            "POST",
            "/run_code",
            body=body,
            headers={
                "Host": f"evil.example:{port}",
                "Origin": f"http://evil.example:{port}",
                "Content-Type": "application/json",
            },
        )
        reply = connection.getresponse()
        assert reply.status == 403
        assert "--allow-host evil.example" in json.loads(reply.read())["detail"]
        assert not marker.exists()
        connection.request("POST", "/run_code", body=body, headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        assert reply.status == 200 and json.loads(reply.read())["run_result"]["stdout"] == "ran\n"
        assert marker.read_text() == "pwned"
        connection.close()
