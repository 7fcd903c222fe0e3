"""Dataset tables as SandboxFusion keeps them: JSON Lines files loaded into an in-memory SQLite.

SandboxFusion reads every ``*.jsonl`` file of its sample directory into a SQLite table named after
the file (``code_eval_mbpp.jsonl`` → table ``code_eval_mbpp``), and its evaluators query those
tables with SQL. The mock does the same with the standard library's :mod:`sqlite3`, because what
clients see depends on SQLite itself:

* a value that is neither an integer, a string nor ``null`` is stored as JSON text (the evaluators
  parse ``labels`` and ``test`` back), a float included;
* a column's type comes from the file's first row (``INT`` or ``TEXT``), and SQLite's affinity
  rules then turn ``"12"`` into ``12`` in an ``INT`` column and ``12`` into ``"12"`` in a ``TEXT`` one;
* rows come back ordered by ``id`` (numbers before text), ``LIMIT offset, limit`` with a negative
  limit meaning all;
* a column that does not exist, or a table that was never loaded, is a 500 whose ``detail`` quotes
  the query.

``config.provided_data`` bypasses the tables entirely, with SandboxFusion's checks. Unlike
SandboxFusion the id is bound as a parameter rather than pasted into the SQL (the quoted query in
error messages still reads as SandboxFusion's), and the connection is read-only once loaded.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mocksandbox.datasets.errors import DatasetHTTPError, DatasetLoadError, RowNotFound
from mocksandbox.datasets.models import TestConfig

Row = dict[str, Any]

_SQL_TYPES: dict[type, str] = {int: "INT", str: "TEXT", type(None): "TEXT"}


def _stored(value: Any) -> Any:
    # `type(value)`, not isinstance: a bool is not an int here (SandboxFusion stores `true`).
    return value if type(value) in _SQL_TYPES else json.dumps(value)


def read_jsonl(path: Path) -> list[Row]:
    """The objects of one JSON Lines file (blank lines skipped); :class:`DatasetLoadError` names the
    file and line of anything else that is not a JSON object."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetLoadError(f"cannot read dataset file {path}: {exc.strerror}") from None
    rows: list[Row] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetLoadError(f"{path}:{number}: not JSON: {exc}") from None
        if not isinstance(row, dict) or not row:
            raise DatasetLoadError(f"{path}:{number}: each line must be a non-empty JSON object")
        rows.append(row)
    return rows


def discover_files(directories: Iterable[str | Path]) -> dict[str, Path]:
    """Table name → file for every ``*.jsonl`` directly in ``directories``; a later directory's
    file of the same name wins."""
    files: dict[str, Path] = {}
    for directory in directories:
        path = Path(directory)
        if not path.is_dir():
            raise DatasetLoadError(f"dataset directory {path} does not exist")
        for file in sorted(path.glob("*.jsonl")):
            files[file.stem] = file
    return files


class TableStore:
    """Named tables of rows, queried the way SandboxFusion's ``database.py`` queries them."""

    def __init__(self) -> None:
        # One connection shared by request threads: sqlite3 serialises on it, the lock makes a
        # cursor's execute-and-fetch atomic.
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._lock = threading.Lock()
        self._columns: dict[str, list[str]] = {}
        self._sizes: dict[str, int] = {}

    @classmethod
    def from_directories(cls, directories: Iterable[str | Path]) -> TableStore:
        store = cls()
        for name, path in discover_files(directories).items():
            rows = read_jsonl(path)
            if rows:
                store.load(name, rows, source=str(path))
        store.freeze()
        return store

    def load(self, table: str, rows: Sequence[Row], source: str = "") -> None:
        """Create ``table`` from ``rows``: columns and their types from the first row."""
        stored = [{key: _stored(value) for key, value in row.items()} for row in rows]
        first = stored[0]
        columns = list(first)
        ddl = ", ".join(f'"{key}" {_SQL_TYPES[type(value)]}' for key, value in first.items())
        placeholders = ", ".join(f":{key}" for key in columns)
        with self._lock:
            try:
                self._db.execute(f'DROP TABLE IF EXISTS "{table}"')
                self._db.execute(f'CREATE TABLE "{table}" ({ddl})')
                self._db.executemany(f'INSERT INTO "{table}" VALUES ({placeholders})', stored)
            except sqlite3.Error as exc:
                raise DatasetLoadError(f"{source or table}: {exc}") from None
        self._columns[table] = columns
        self._sizes[table] = len(stored)

    def freeze(self) -> None:
        """No more writes: every later statement is a query."""
        with self._lock:
            self._db.execute("PRAGMA query_only = ON")

    def table_names(self) -> list[str]:
        return list(self._columns)

    def size(self, table: str) -> int:
        return self._sizes.get(table, 0)

    def first_row(self, table: str) -> Row | None:
        """The table's first row as stored (JSON columns still text), or ``None``."""
        if table not in self._columns:
            return None
        return self._fetch(f'SELECT * FROM "{table}" LIMIT 1', ())[0] if self._sizes[table] else None

    def _cached(self, table: str, columns: Sequence[str] | None) -> bool:
        # SandboxFusion asks its (absent) MySQL backend when the table is not cached, or when the
        # cache has strictly fewer columns than asked for.
        cached = self._columns.get(table)
        if cached is None:
            return False
        return not (columns is not None and set(cached) < set(columns))

    def _fetch(self, query: str, parameters: Sequence[Any]) -> list[Row]:
        with self._lock:
            cursor = self._db.execute(query, parameters)
            names = [description[0] for description in cursor.description]
            return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]

    def rows(
        self, config: TestConfig, table: str, columns: Sequence[str] | None, offset: int, limit: int
    ) -> list[Row]:
        """SandboxFusion's ``get_rows_in_table``: ``provided_data`` (a list) or the table's rows."""
        provided = config.provided_data
        if provided:
            if not isinstance(provided, list):
                raise DatasetHTTPError(
                    400, "request.config.provided_data should be a list of str -> str | int"
                )
            if columns:
                return [{key: row[key] for key in columns} for row in provided]
            return [dict(row) for row in provided]
        selected = ", ".join(columns) if columns else "*"
        if not self._cached(table, columns):
            query = f"SELECT {selected} FROM {table} ORDER BY id LIMIT {offset}, {limit}"
            raise DatasetHTTPError(
                500,
                f"failed to request database with query {query}: "
                "'NoneType' object has no attribute 'fetch_all'",
            )
        query = f'SELECT {selected} FROM "{table}" ORDER BY id LIMIT {offset}, {limit}'
        try:
            return self._fetch(query, ())
        except sqlite3.Error as exc:
            raise DatasetHTTPError(500, f"failed to request database with query {query}: {exc}") from None

    def row_by_id(
        self, config: TestConfig, table: str, row_id: int | str, columns: Sequence[str] | None
    ) -> Row:
        """SandboxFusion's ``get_row_by_id_in_table``: ``provided_data`` (one row) or the row whose
        ``id`` is ``row_id``; :class:`RowNotFound` when there is none."""
        provided = config.provided_data
        if provided:
            if not isinstance(provided, dict):
                raise DatasetHTTPError(
                    400, "request.config.provided_data should be a dict with str -> str | int"
                )
            if columns:
                return {key: provided[key] for key in columns}
            return dict(provided)
        selected = ", ".join(columns) if columns else "*"
        literal = str(row_id) if isinstance(row_id, int) else f"'{row_id}'"
        if not self._cached(table, columns):
            query = f"SELECT {selected} FROM {table} WHERE id = {literal}"
            raise DatasetHTTPError(
                500,
                f"failed to request database with query {query}: "
                "'NoneType' object has no attribute 'fetch_one'",
            )
        query = f'SELECT {selected} FROM "{table}" WHERE id = {literal}'
        try:
            found = self._fetch(f'SELECT {selected} FROM "{table}" WHERE id = ? LIMIT 1', (row_id,))
        except sqlite3.Error as exc:
            raise DatasetHTTPError(500, f"failed to request database with query {query}: {exc}") from None
        if not found:
            raise RowNotFound
        return found[0]
