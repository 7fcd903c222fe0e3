"""The journal: bounded, lazily parsed, with counts that survive the bound."""

from __future__ import annotations

import json

from mocksandbox.journal import BODY_LIMIT, InFlight, Journal


def test_bodies_are_capped_and_parsed_when_read() -> None:
    journal = Journal(limit=10)
    body = json.dumps({"code": "print(1)", "language": "python"}).encode()
    entry = journal.begin("POST", "/run_code", "", body, "127.0.0.1:1")
    huge = b'{"run_result": {"stdout": "' + b"x" * (BODY_LIMIT + 10) + b'"}}'
    journal.finish(entry, 200, huge)
    assert entry.body == {"code": "print(1)", "language": "python"}
    assert entry.language == "python"
    assert entry.response_truncated and len(entry.raw_response or b"") == BODY_LIMIT
    assert isinstance(entry.response, str)  # no longer JSON once cut: shown as text
    data = entry.to_dict()
    assert "raw_body" not in data and data["body"]["language"] == "python"


def test_the_bound_drops_old_entries_but_not_counts() -> None:
    journal = Journal(limit=3)
    for n in range(5):
        journal.finish(journal.begin("GET", "/v1/ping", "", b"", f"c{n}"), 200, b'"pong"')
    assert [e.client for e in journal.entries()] == ["c2", "c3", "c4"]
    assert journal.counts()["requests_total"] == 5
    assert journal.counts()["by_status"] == {"200": 5}


def test_in_flight_cap_rejects_and_queues() -> None:
    in_flight = InFlight()
    assert in_flight.enter(cap=1) and not in_flight.enter(cap=1, wait=0.0)
    assert not in_flight.enter(cap=1, wait=0.01)  # queued, then gave up
    in_flight.leave()
    assert in_flight.enter(cap=1, wait=0.01)
    assert in_flight.snapshot() == {"in_flight": 1, "max_in_flight": 1}
