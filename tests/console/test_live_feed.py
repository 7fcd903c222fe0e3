"""The console's live feed over the control state, for both backends (one process; a state server
shared by workers): what an update lists, that it resumes from its cursor, that a reset is seen,
and that an idle feed stays quiet. No sockets but the state server's Unix socket; no sleeps."""

from __future__ import annotations

import json

import pytest

from mocksandbox.control.state import CapacityPolicy, ControlState, IncomingRequest, LocalControlState
from mocksandbox.faults import FaultSpec
from mocksandbox.journal import InFlight, Journal
from mocksandbox.live import BACKLOG, ENTRIES_PER_UPDATE, LiveCursor, LiveFeed, sse_event


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def begin(state: ControlState, n: int, language: str = "python") -> int:
    body = json.dumps({"code": f"print({n})", "language": language}).encode()
    admission = state.admit(IncomingRequest("POST", "/run_code", "", body, f"127.0.0.1:{n}"))
    assert admission.admitted
    return admission.entry_id


def finish(state: ControlState, entry_id: int, status: int = 200) -> None:
    state.finish(entry_id, status, b'{"status":"Success"}')


def test_first_update_lists_the_tail_then_only_what_changed(state: ControlState) -> None:
    done = []
    for n in range(3):
        done.append(begin(state, n))
        finish(state, done[-1])
    running = begin(state, 3, language="cpp")
    feed = LiveFeed(state)

    first = feed.poll()
    assert first is not None and first["reset"] is True  # a new console starts from the tail
    assert [e["id"] for e in first["entries"]] == [*done, running]
    assert first["entries"][-1]["language"] == "cpp" and first["entries"][-1]["ended"] is None
    assert first["in_flight"] == 1 and first["stats"]["requests_total"] == 4
    assert "body" not in first["entries"][0] and "raw_body" not in first["entries"][0]

    assert feed.poll() is None  # nothing happened

    finish(state, running, status=500)
    new = begin(state, 4)
    update = feed.poll()
    assert update is not None and update["reset"] is False
    # The running entry again, now answered, then the new one: each entry once it changed.
    assert [(e["id"], e["status"]) for e in update["entries"]] == [(running, 500), (new, None)]
    assert update["in_flight"] == 1 and update["peak"] == 1


def test_the_peak_counts_a_burst_between_two_looks(state: ControlState) -> None:
    feed = LiveFeed(state)
    feed.poll()
    burst = [begin(state, n) for n in range(5)]
    for entry_id in burst:
        finish(state, entry_id)
    update = feed.poll()
    assert update is not None
    assert update["in_flight"] == 0 and update["peak"] == 5  # gone by the look, still on the chart


def test_a_reconnecting_browser_resumes_without_loss_or_repeats(state: ControlState) -> None:
    seen = [begin(state, n) for n in range(2)]
    finish(state, seen[0])
    feed = LiveFeed(state)
    assert feed.poll() is not None
    event_id = feed.cursor.event_id()

    finish(state, seen[1])  # while the browser was away
    later = begin(state, 9)
    resumed = LiveFeed(state, last_event_id=event_id)
    update = resumed.poll()
    assert update is not None and update["reset"] is False
    assert [e["id"] for e in update["entries"]] == [seen[1], later]


def test_a_reset_starts_the_console_over(state: ControlState) -> None:
    for n in range(3):
        finish(state, begin(state, n))
    feed = LiveFeed(state)
    feed.poll()
    state.reset([], CapacityPolicy())
    fresh = begin(state, 7)  # ids start again from 1
    update = feed.poll()
    assert update is not None and update["reset"] is True
    assert [e["id"] for e in update["entries"]] == [fresh] == [1]


def test_an_update_lists_at_most_its_share_of_a_flood(state: ControlState) -> None:
    feed = LiveFeed(state)
    feed.poll()
    ids = [begin(state, n) for n in range(ENTRIES_PER_UPDATE + 30)]
    for entry_id in ids:
        finish(state, entry_id)
    update = feed.poll()
    assert update is not None
    assert [e["id"] for e in update["entries"]] == ids[-ENTRIES_PER_UPDATE:]  # the newest
    assert update["stats"]["requests_total"] == len(ids)  # the counts see all of them
    assert update["peak"] == len(ids)
    calm = feed.poll()  # the peak falls back: one more point for the chart, no entries
    assert calm is not None and calm["entries"] == [] and calm["peak"] == 0
    assert feed.poll() is None


def test_the_stream_sends_updates_and_a_quiet_heartbeat(state: ControlState) -> None:
    clock = FakeClock()
    finish(state, begin(state, 1))
    stream = iter(LiveFeed(state, interval=0.2, lifetime=5.0, clock=clock, sleep=clock.sleep))
    assert next(stream) == b"retry: 1000\n\n"
    first = next(stream).decode()
    head, data = first.split("data: ", 1)
    assert head.startswith("id: 1:@") and "event: update\n" in head
    assert json.loads(data)["entries"][0]["id"] == 1
    # The next look sees the in-flight peak fall back to 0 (a change): sent at once.
    started = clock.now
    assert json.loads(next(stream).decode().split("data: ", 1)[1])["peak"] == 0
    assert clock.now - started == pytest.approx(0.2)
    # Then nothing changes: the next event is the heartbeat, a second after the last one.
    started = clock.now
    heartbeat = json.loads(next(stream).decode().split("data: ", 1)[1])
    assert clock.now - started == pytest.approx(1.0)
    assert heartbeat["entries"] == [] and heartbeat["reset"] is False
    rest = list(stream)  # and the feed ends after its lifetime (the browser reconnects)
    assert clock.now - 100.0 == pytest.approx(5.0) and len(rest) == 3


def test_one_entry_with_its_bodies(state: ControlState) -> None:
    entry_id = begin(state, 5)
    finish(state, entry_id)
    entry = state.entry(entry_id)
    assert entry is not None and entry.body["code"] == "print(5)" and entry.response == {"status": "Success"}
    assert state.entry(entry_id + 100) is None


def test_cursor_round_trip_and_garbage() -> None:
    cursor = LiveCursor(after=12, pending=[9, 11], epoch=1234.5)
    assert LiveCursor.parse(cursor.event_id()) == cursor
    for garbage in (None, "", "x", "1:2@", "a:b@c", "1@2@3"):
        assert LiveCursor.parse(garbage) is None


def test_sse_event_keeps_data_on_one_line() -> None:
    event = sse_event("update", {"text": "two\nlines"}, "7:@1.0").decode()
    assert event == 'id: 7:@1.0\nevent: update\ndata: {"text":"two\\nlines"}\n\n'


def test_journal_after_reads_only_the_newest_end() -> None:
    journal = Journal(limit=5)
    entries = [journal.begin("POST", "/run_code", "", b"{}", "c") for _ in range(8)]
    # The bounded journal holds ids 4..8; id 2 (pending) has left it and is not found.
    _, found = journal.after(6, pending=[2, 5])
    assert [e.id for e in found] == [5, 7, 8]
    _, newest = journal.after(0, limit=2)
    assert [e.id for e in newest] == [7, 8]
    assert journal.find(entries[-1].id) is entries[-1] and journal.find(1) is None


def test_in_flight_peak_since() -> None:
    clock = FakeClock()
    in_flight = InFlight(clock=clock)
    in_flight.enter()
    clock.now += 1
    in_flight.enter()
    in_flight.leave()
    now, current, peak = in_flight.peak_since(0.5)
    assert (now, current, peak) == (1.0, 1, 2)
    assert in_flight.peak_since(now) == (1.0, 1, 1)
    assert in_flight.peak_since(50.0)[2] == 2  # a time from before a reset: the whole timeline


def test_fault_rules_reach_the_feed_counts(state: ControlState) -> None:
    state.add_faults([FaultSpec.model_validate({"action": {"type": "status", "status": 503}})])
    feed = LiveFeed(state)
    entry_id = begin(state, 1)
    finish(state, entry_id, status=503)
    update = feed.poll()
    assert update is not None
    (entry,) = update["entries"]
    assert entry["fault_action"] == "status" and entry["faults"] == ["fault-1"]
    assert update["stats"]["faults_fired"] == {"fault-1": 1}


def test_backlog_is_bounded() -> None:
    state = LocalControlState()
    ids = [begin(state, n) for n in range(BACKLOG + 10)]
    update = LiveFeed(state).poll()
    assert update is not None and [e["id"] for e in update["entries"]] == ids[-BACKLOG:]


def test_a_first_look_brings_the_last_minute() -> None:
    clock = FakeClock()
    state = LocalControlState(clock=clock)
    state.reset([], CapacityPolicy())
    held = []
    for second in range(70):  # a request a second, the in-flight count climbing to 3 then steady
        clock.now += 1.0
        held.append(begin(state, second))
        if len(held) > 3:
            finish(state, held.pop(0))
    clock.now += 0.5
    feed = LiveFeed(state, clock=clock, sleep=clock.sleep)
    first = feed.poll()
    assert first is not None
    in_flight, arrivals = first["history"]["in_flight"], first["history"]["arrivals"]
    # The last 60 s only, in 0.2 s steps for the in-flight peaks and 1 s steps for arrivals.
    assert in_flight[0][0] == pytest.approx(first["t"] - 60 + 0.2) and len(in_flight) in (300, 301)
    assert {peak for _, peak in in_flight} == {3, 4}  # 3 held, 4 for the moment a 4th arrives
    assert sum(count for _, count in arrivals) == 60 and len(arrivals) in (60, 61)
    again = feed.poll()
    assert again is None or "history" not in again  # only a first look brings it


def test_history_of_an_idle_state() -> None:
    in_flight = InFlight(clock=FakeClock())
    assert in_flight.history(60.0, 0.2) == [(0.2, 0)]
    assert Journal(clock=FakeClock()).arrivals(60.0, 1.0) == [(1.0, 0)]


def test_arrivals_cover_only_what_the_bounded_journal_holds() -> None:
    clock = FakeClock()
    journal = Journal(limit=20, clock=clock)
    for _ in range(50):  # 10 a second for 5 s; the journal keeps the last 20 (2 s)
        clock.now += 0.1
        journal.begin("POST", "/run_code", "", b"{}", "c")
    arrivals = journal.arrivals(60.0, 1.0)
    assert arrivals[0][0] > 5.0 - 3.0  # no idle-looking steps before what it holds
    assert all(count == 10 for _, count in arrivals[:-1]) and sum(c for _, c in arrivals) <= 20
