"""The console over HTTP, without a browser: the page and its assets with their Content-Security-
Policy, its endpoints, ``GET /``, the host and origin checks, ``--no-control-api``, and the live
feed of a two-worker server showing both workers' requests."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from flask.testing import FlaskClient

from mocksandbox.core import MockSandbox
from mocksandbox.execution.languages import LANGUAGES
from mocksandbox.settings import Settings
from mocksandbox.web import create_app
from mocksandbox.web.console import CONTENT_SECURITY_POLICY

NO_PROXY = {"http": "", "https": ""}


@pytest.fixture(scope="module")
def sandbox() -> Iterator[MockSandbox]:
    box = MockSandbox.create(Settings())
    yield box
    box.close()


@pytest.fixture
def client(sandbox: MockSandbox) -> FlaskClient:
    sandbox.reset()
    return create_app(sandbox).test_client()


def test_the_page_and_its_assets_allow_only_their_own_origin(client: FlaskClient) -> None:
    page = client.get("/_mock/ui")
    assert page.status_code == 200 and page.content_type == "text/html; charset=utf-8"
    assert page.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY and "unsafe-inline" not in CONTENT_SECURITY_POLICY
    html = page.get_data(as_text=True)
    # No inline script, no inline style, no third-party URL: the page works offline under its CSP.
    assert re.findall(r"<script\b[^>]*>", html) == ['<script src="/_mock/ui/console.js" defer>']
    assert "style=" not in html and "<style" not in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html)
    for name, kind in (("console.js", "text/javascript"), ("console.css", "text/css")):
        asset = client.get(f"/_mock/ui/{name}")
        assert asset.status_code == 200 and asset.content_type.startswith(kind)
        assert asset.headers["X-Content-Type-Options"] == "nosniff"
        assert b"http://" not in asset.get_data() and b"https://" not in asset.get_data()
    assert client.get("/_mock/ui/index.html").status_code == 404
    assert client.get("/_mock/ui/../console.py").status_code == 404


def test_the_root_links_to_the_console_and_control_paths_are_not_journaled(
    client: FlaskClient, sandbox: MockSandbox
) -> None:
    root = client.get("/")
    assert root.status_code == 200 and 'href="/_mock/ui"' in root.get_data(as_text=True)
    client.get("/_mock/ui")
    client.get("/_mock/languages")
    assert [e.path for e in sandbox.requests()] == ["/"]


def test_journal_entry_languages_and_fault_schema(client: FlaskClient) -> None:
    client.post("/run_code", json={"code": "print(6*7)", "language": "python"})
    (entry_id,) = [e["id"] for e in client.get("/_mock/journal").get_json()["entries"]]
    detail = client.get(f"/_mock/journal/{entry_id}").get_json()
    assert detail["body"]["code"] == "print(6*7)" and detail["response"]["run_result"]["stdout"] == "42\n"
    assert client.get(f"/_mock/journal/{entry_id + 1}").status_code == 404

    languages = client.get("/_mock/languages").get_json()["languages"]
    assert [lang["name"] for lang in languages] == list(LANGUAGES)
    python = next(lang for lang in languages if lang["name"] == "python")
    assert python == {"name": "python", "toolchain": "python3", "available": True}

    schema = client.get("/_mock/faults/schema").get_json()
    assert set(schema["properties"]) == {"match", "action", "schedule", "name"}
    assert "status" in schema["properties"]["action"]["discriminator"]["mapping"]


def test_a_page_of_another_site_or_host_gets_nothing(client: FlaskClient) -> None:
    assert client.get("/_mock/ui", headers={"Host": "evil.example:8080"}).status_code == 403
    assert client.get("/_mock/events", headers={"Origin": "http://evil.example"}).status_code == 403
    assert client.get("/_mock/ui", headers={"Host": "127.0.0.1:8080"}).status_code == 200


def test_no_control_api_no_console() -> None:
    box = MockSandbox.create(Settings(control_api=False))
    try:
        client = create_app(box).test_client()
        for path in ("/_mock/ui", "/_mock/ui/console.js", "/_mock/events", "/_mock/languages", "/"):
            assert client.get(path).status_code == 404, path
    finally:
        box.close()


def test_the_event_stream_over_the_test_client(client: FlaskClient) -> None:
    client.post("/run_code", json={"code": "print(1)", "language": "python"})
    reply = client.get("/_mock/events", buffered=False)
    assert reply.content_type == "text/event-stream"
    assert reply.headers["Cache-Control"] == "no-store"
    chunks = iter(reply.response)
    assert next(chunks) == b"retry: 1000\n\n"
    update = json.loads(next(chunks).decode().split("data: ", 1)[1])
    assert [e["path"] for e in update["entries"]] == ["/run_code"]
    reply.close()


@pytest.mark.mocksandbox_workers(2)
def test_the_live_feed_of_two_workers_shows_both(mocksandbox: Any) -> None:
    """The feed reads the one control state: every worker's requests are in it, whichever worker
    serves the feed."""
    stream = requests.get(f"{mocksandbox.url}/_mock/events", stream=True, timeout=30, proxies=NO_PROXY)
    seen: dict[int, dict[str, Any]] = {}
    lock = threading.Lock()

    def read() -> None:
        with contextlib.suppress(requests.RequestException, AttributeError, ValueError):  # closed
            for line in stream.iter_lines():
                if line.startswith(b"data: "):
                    with lock:
                        seen.update((e["id"], e) for e in json.loads(line[6:])["entries"])

    threading.Thread(target=read, daemon=True).start()
    # New connections each time, so that the kernel spreads them over both workers' accepts; until
    # the journal shows that both served some.
    sent = 0
    while len({e.worker for e in mocksandbox.requests(path="/run_code")}) < 2:
        assert sent < 400, "the kernel never gave the second worker a connection"
        reply = requests.post(
            f"{mocksandbox.url}/run_code",
            json={"code": f"print({sent})", "language": "python"},
            timeout=30,
            proxies=NO_PROXY,
            headers={"Connection": "close"},
        )
        assert reply.status_code == 200
        sent += 1
    journal = {e.id: e.worker for e in mocksandbox.requests(path="/run_code")}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with lock:
            answered = {i: e["worker"] for i, e in seen.items() if e["status"] == 200}
        if answered == journal:
            break
        time.sleep(0.05)
    stream.close()
    assert answered == journal  # every request, with the worker that served it
    assert set(answered.values()) == {"worker-1", "worker-2"}


def test_a_live_sessions_diff_so_far(client: FlaskClient, sandbox: MockSandbox) -> None:
    """The console shows the model's change while the session is still live (its work tree against
    its base), and the frozen patch once it has ended."""
    from mocksandbox.sessions.scripted import diff_block

    instance = next(i for i in sandbox.sessions.registry.all() if i.instance_id == "sciutils__unitconv-311")
    sid = client.post("/start_instance", json={"instance_id": instance.instance_id}).get_json()["sid"]
    assert client.get(f"/_mock/sessions/{sid}/patch").get_json() == {"sid": sid, "patch": ""}  # no change yet
    client.post("/process_action", json={"sid": sid, "content": diff_block(instance.patch)})
    live = client.get(f"/_mock/sessions/{sid}/patch").get_json()["patch"]
    added = [
        line for line in instance.patch.splitlines() if line.startswith("+") and not line.startswith("+++")
    ]
    assert added and all(line in live.splitlines() for line in added)
    assert client.get(f"/_mock/sessions/{sid}").get_json()["state"] == "live"
    client.post("/postprocess", json={"sid": sid})
    assert client.get(f"/_mock/sessions/{sid}/patch").get_json()["patch"] == live
    assert client.get("/_mock/sessions/12/patch").status_code == 404
    assert client.get("/_mock/sessions/nope/patch").status_code == 404
