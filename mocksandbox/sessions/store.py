"""The session records, in SQLite under the state dir: a restart loses no session and no result.

One row per session. ``state`` is ``live`` (work dir present, actions accepted), ``finished``
(post-processed: work dir freed, patch and result kept) or ``leaked`` (never post-processed by its
client: reclaimed after ``session_ttl_s`` idle, or its work dir was lost). Thread-safe: one
connection, one lock, a commit per write (WAL journal, so readers are not blocked).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

SessionState = Literal["live", "finished", "leaked"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    sid TEXT PRIMARY KEY,
    instance_id TEXT NOT NULL,
    instance_hash TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    root TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_active_at REAL NOT NULL,
    ended_at REAL,
    actions INTEGER NOT NULL DEFAULT 0,
    agent_finished INTEGER NOT NULL DEFAULT 0,
    patch TEXT,
    patch_taken INTEGER NOT NULL DEFAULT 0,
    result TEXT,
    result_for TEXT
);
CREATE INDEX IF NOT EXISTS sessions_state ON sessions (state);
"""


@dataclass
class SessionRecord:
    """One session as stored."""

    sid: str
    instance_id: str
    instance_hash: str
    state: str
    reason: str | None
    #: The session's directory (``workspace/``, ``tmp/``, ``ctl/``).
    root: str
    created_at: float
    last_active_at: float
    ended_at: float | None
    actions: int
    agent_finished: bool
    #: The model's patch once it is frozen (post-processed or reclaimed); ``None`` before.
    patch: str | None
    patch_taken: bool
    #: The last reward answer (JSON) and the patch it was computed for.
    result: str | None
    result_for: str | None

    def describe(self) -> dict[str, Any]:
        """What ``GET /_mock/sessions`` shows for this session."""
        result = json.loads(self.result) if self.result else None
        return {
            "sid": self.sid,
            "instance_id": self.instance_id,
            "instance_hash": self.instance_hash,
            "state": self.state,
            "reason": self.reason,
            "created_at": self.created_at,
            "last_active_at": self.last_active_at,
            "ended_at": self.ended_at,
            "actions": self.actions,
            "agent_finished": self.agent_finished,
            "patch_bytes": None if self.patch is None else len(self.patch.encode("utf-8", "surrogateescape")),
            "result": None if result is None else {k: v for k, v in result.items() if k != "log"},
        }


_COLUMNS = [f.name for f in fields(SessionRecord)]


class SessionStore:
    """The ``sessions`` table of ``<state_dir>/sessions.sqlite3``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (reentrant within a thread): all or nothing."""
        with self._lock:
            if self._db.in_transaction:
                yield self._db
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @staticmethod
    def _record(row: sqlite3.Row) -> SessionRecord:
        data = {name: row[name] for name in _COLUMNS}
        data["agent_finished"] = bool(data["agent_finished"])
        data["patch_taken"] = bool(data["patch_taken"])
        return SessionRecord(**data)

    def insert(self, record: SessionRecord) -> None:
        values = [getattr(record, name) for name in _COLUMNS]
        with self.transaction() as db:
            db.execute(
                f"INSERT INTO sessions ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                values,
            )

    def get(self, sid: str) -> SessionRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM sessions WHERE sid = ?", (sid,)).fetchone()
        return None if row is None else self._record(row)

    def update(self, sid: str, **changes: Any) -> None:
        unknown = set(changes) - set(_COLUMNS)
        if unknown:
            raise ValueError(f"unknown session field(s): {sorted(unknown)}")
        assignments = ", ".join(f"{name} = ?" for name in changes)
        with self.transaction() as db:
            db.execute(f"UPDATE sessions SET {assignments} WHERE sid = ?", [*changes.values(), sid])

    def touch(self, sid: str, now: float, actions: int = 0) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE sessions SET last_active_at = ?, actions = actions + ? WHERE sid = ?",
                (now, actions, sid),
            )

    def count(self, state: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT COUNT(*) FROM sessions WHERE state = ?", (state,)).fetchone()
        return int(row[0])

    def all(self, state: str | None = None) -> list[SessionRecord]:
        with self._lock:
            if state is None:
                rows = self._db.execute("SELECT * FROM sessions ORDER BY created_at, sid").fetchall()
            else:
                rows = self._db.execute(
                    "SELECT * FROM sessions WHERE state = ? ORDER BY created_at, sid", (state,)
                ).fetchall()
        return [self._record(row) for row in rows]

    def idle_since(self, before: float) -> list[str]:
        """Live sessions whose last activity was before ``before``."""
        with self._lock:
            rows = self._db.execute(
                "SELECT sid FROM sessions WHERE state = 'live' AND last_active_at < ?", (before,)
            ).fetchall()
        return [str(row[0]) for row in rows]

    def clear(self) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM sessions")
