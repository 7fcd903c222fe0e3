"""The console's live feed: the control state's changes as server-sent events.

One feed per open console. It asks the control state for what changed (one call,
:meth:`~mocksandbox.control.state.ControlState.live_view`) every ``interval`` seconds and sends one
``update`` event when something did, so its cost does not grow with the request rate: a burst of a
thousand requests is one event listing them, not a thousand wake-ups, and the request path itself
is not touched at all (nothing is notified per request). The cost of an open console is measured
by ``benchmarks/bench_console.py``.

Because it reads the one control state, the feed shows every worker's requests under
``serve --workers N``. Each event's id is a cursor (the last entry sent, the entries still in
flight, the journal's epoch): a browser that reconnects sends it back as ``Last-Event-ID`` and the
feed resumes where it left off, with nothing lost or repeated.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mocksandbox.control.shared import ControlStateUnavailable
from mocksandbox.control.state import ControlState

#: Seconds between looks at the control state: fast enough to follow by eye.
LIVE_INTERVAL_S = 0.2
#: Seconds after which a quiet feed still sends an update (the chart's clock moves on).
IDLE_UPDATE_S = 1.0
#: A feed ends after this long and the browser reconnects (an abandoned one cannot linger).
FEED_LIFETIME_S = 300.0
#: Entries one update lists at most (the newest; the console shows only the latest few hundred).
ENTRIES_PER_UPDATE = 200
#: Entries still in flight a cursor remembers across a reconnect.
PENDING_IN_CURSOR = 256
#: The entries the first update of a new console lists (the journal's tail).
BACKLOG = 200


@dataclass
class LiveCursor:
    """Where a feed is: entries up to ``after`` were sent, those in ``pending`` unfinished, all in
    the journal epoch ``epoch`` (``None``: not known yet)."""

    after: int = 0
    pending: list[int] = field(default_factory=list)
    epoch: float | None = None

    def event_id(self) -> str:
        pending = ",".join(str(i) for i in self.pending[-PENDING_IN_CURSOR:])
        return f"{self.after}:{pending}@{self.epoch!r}"

    @classmethod
    def parse(cls, text: str | None) -> LiveCursor | None:
        """The cursor an event id names (``None`` for anything else: the feed starts afresh)."""
        if not text:
            return None
        try:
            position, epoch = text.rsplit("@", 1)
            after, pending = position.split(":", 1)
            return cls(int(after), [int(i) for i in pending.split(",") if i], float(epoch))
        except ValueError:
            return None


def sse_event(event: str, data: Any, event_id: str | None = None) -> bytes:
    """One server-sent event (JSON data on one line: ``json.dumps`` escapes every newline)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class LiveFeed:
    """An iterator of server-sent events for one console (see the module's docstring)."""

    def __init__(
        self,
        control: ControlState,
        last_event_id: str | None = None,
        interval: float = LIVE_INTERVAL_S,
        lifetime: float = FEED_LIFETIME_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.control = control
        self.interval = interval
        self.lifetime = lifetime
        self._clock = clock
        self._sleep = sleep
        resumed = LiveCursor.parse(last_event_id)
        self.cursor = resumed or LiveCursor()
        #: A new console is first sent the journal's tail; a resumed one only what it missed.
        self._backlog = resumed is None
        self._since = -1.0
        self._last_sent: tuple[Any, ...] | None = None
        #: The last update without its entries: what a quiet second repeats.
        self._last_update: dict[str, Any] = {}

    def __iter__(self) -> Iterator[bytes]:
        # The browser retries a second after the feed ends (its lifetime, a restart).
        yield b"retry: 1000\n\n"
        started = last_sent = self._clock()
        while True:
            try:
                update = self.poll()
            except ControlStateUnavailable:
                return  # the process holding the state stopped: so does the server
            now = self._clock()
            if update is not None or now - last_sent >= IDLE_UPDATE_S:
                if update is None:
                    update = self._last_update
                yield sse_event("update", update, self.cursor.event_id())
                last_sent = now
            if now - started >= self.lifetime:
                return
            self._sleep(self.interval)

    def poll(self) -> dict[str, Any] | None:
        """One look at the control state: the update to send, or ``None`` when nothing changed."""
        cursor = self.cursor
        # A new console is sent the newest BACKLOG entries: the journal's tail.
        limit = BACKLOG if self._backlog else ENTRIES_PER_UPDATE
        view = self.control.live_view(cursor.after, cursor.pending, self._since, limit)
        reset = cursor.epoch is not None and view["epoch"] != cursor.epoch
        if reset:  # ids start again from 1: look again from the start of the new journal
            view = self.control.live_view(0, [], -1.0, BACKLOG)
            cursor.after, cursor.pending = 0, []
        entries: list[dict[str, Any]] = view["entries"]
        cursor.epoch = view["epoch"]
        # Entries still in flight are asked for again until they finish (and sent again then); one
        # not returned has left the bounded journal (or a reset emptied it) and is forgotten.
        was_pending = set(cursor.pending)
        cursor.pending = [e["id"] for e in entries if e["ended"] is None]
        cursor.after = max([cursor.after, *(e["id"] for e in entries)])
        entries = [e for e in entries if e["ended"] is not None or e["id"] not in was_pending]
        self._since = view["t"]
        update = {
            "t": view["t"],
            "in_flight": view["in_flight"],
            "peak": view["peak"],
            "stats": view["stats"],
            "entries": entries,
            "reset": reset or self._backlog,
        }
        if "history" in view:  # a first look: the last minute, for the charts
            update["history"] = view["history"]
        self._backlog = False
        self._last_update = {**update, "entries": [], "reset": False, "history": None}
        state = (view["in_flight"], view["peak"], json.dumps(view["stats"], sort_keys=True))
        if not entries and not update["reset"] and "history" not in update and state == self._last_sent:
            return None
        self._last_sent = state
        return update
