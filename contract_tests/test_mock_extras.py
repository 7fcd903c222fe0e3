"""mocksandbox's own extras over HTTP: faults, journal, cap, reset. Skipped against other targets."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from contract_support import Target

pytestmark = pytest.mark.mock_only


@pytest.fixture(autouse=True)
def _reset(target: Target) -> Iterator[None]:
    target.post("/_mock/reset").raise_for_status()
    yield
    target.post("/_mock/reset").raise_for_status()


def test_status_fault_then_normal_service(target: Target) -> None:
    rule = {
        "match": {"path": "/run_code"},
        "action": {"type": "status", "status": 504},
        "schedule": {"first": 1},
    }
    assert target.post("/_mock/faults", rule).status_code == 201
    first = target.post("/run_code", {"code": "print(1)", "language": "python"})
    assert first.status_code == 504
    assert target.run_code("print(1)")["status"] == "Success"


def test_journal_and_stats(target: Target) -> None:
    target.run_code("print(1)")
    stats = target.get("/_mock/stats").json()
    assert stats["requests_total"] == 1
    assert stats["by_path"] == {"/run_code": 1}
    entries = target.get("/_mock/journal").json()["entries"]
    assert entries[0]["body"]["code"] == "print(1)"


def test_cap_answers_429_with_retry_after(target: Target) -> None:
    target.session.put(target.url + "/_mock/capacity", json={"max_in_flight": 2}).raise_for_status()
    slow = {"code": "import time\ntime.sleep(0.5)", "language": "python"}
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: target.post("/run_code", slow), range(8)))
    rejected = [r for r in replies if r.status_code == 429]
    assert rejected and all(r.headers.get("Retry-After") for r in rejected)
    assert target.get("/_mock/stats").json()["max_in_flight"] <= 2
