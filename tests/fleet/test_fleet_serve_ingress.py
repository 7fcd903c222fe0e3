"""The fleet behind Ray Serve's proxies (``deploy(ingress="serve")``), on a local Ray instance: it
answers, journals once per request, keeps a ``first: 1`` schedule exact, and answers a ``reset``
fault with a 502 that says so (the proxy holds the client's connection)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import requests

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def fleet() -> Iterator[Any]:
    pytest.importorskip("ray.serve")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    from mocksandbox.serving.fleet import deploy
    from mocksandbox.settings import load_settings

    if ray.is_initialized():
        ray.shutdown()
    started = deploy(
        load_settings(overrides={"host": "127.0.0.1", "port": 0}),
        replicas=2,
        name="serve-ingress",
        ingress="serve",
    )
    yield started
    started.stop()


def _post(url: str, body: dict[str, Any]) -> requests.Response:
    with requests.Session() as session:
        session.trust_env = False
        return session.post(url + "/run_code", json=body, timeout=120)


def test_the_serve_ingress_answers_and_keeps_its_guarantees(fleet: Any) -> None:
    body = {"code": "print(6 * 7)", "language": "python"}
    assert _post(fleet.url, body).json()["run_result"]["stdout"] == "42\n"
    fleet.add_fault(action={"type": "status", "status": 503}, schedule={"first": 1})
    assert [_post(fleet.url, body).status_code for _ in range(3)] == [503, 200, 200]
    fleet.clear_faults()
    fleet.add_fault(action={"type": "reset"}, schedule={"first": 1})
    dropped = _post(fleet.url, body)
    assert dropped.status_code == 502 and "connection reset (fault)" in dropped.json()["detail"]
    assert [e.status for e in fleet.requests(path="/run_code")] == [200, 503, 200, 200, None]
    assert fleet.stats()["requests_total"] == 5
