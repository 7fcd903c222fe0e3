"""Which datasets exist, which class evaluates each, and their rows, read from JSON Lines files.

SandboxFusion loads ``sandbox/tests/datasets/samples/<table>.jsonl`` into SQLite tables named after
the files (``code_eval_mbpp``) and maps dataset ids to classes in code; the table of dataset ``x``
is ``code_eval_x``. Here:

* every ``*.jsonl`` file of the sample directory and of each ``--datasets DIR`` (later directories
  win) is a table; its dataset id is the file name without ``.jsonl`` and without a leading
  ``code_eval_`` (``code_eval_mbpp.jsonl`` and ``mbpp.jsonl`` both serve ``mbpp``);
* a few ids are registered with their class as in SandboxFusion (:data:`KNOWN_DATASETS`), with or
  without a file: without one, reading rows fails with SandboxFusion's database error (HTTP 500);
* any other file is registered with the class its first row's shape names (``test_list``: MBPP,
  ``entry_point``: HumanEval, ``test`` cases with ``input``/``output``: online judge); a file whose
  rows fit none is served only to requests that name a class in ``config.dataset_type``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mocksandbox.datasets.errors import DatasetHTTPError, DatasetLoadError, RowNotFound
from mocksandbox.datasets.kinds import KINDS, DatasetKind
from mocksandbox.datasets.models import TestConfig

#: Dataset ids SandboxFusion registers, with the class that evaluates them (a subset of its 53: the
#: ones whose class is implemented here).
KNOWN_DATASETS: dict[str, str] = {
    "mbpp": "MBPPDataset",
    "humaneval_python": "HumanEvalDataset",
    "code_contests": "CommonOJDataset",
}

#: The sample datasets: ``fixtures/datasets`` of the checkout, reached through the ``samples``
#: symlink beside this module, which wheels carry as a real directory.
SAMPLE_DATASETS_DIR = Path(__file__).resolve().parent / "samples"

_TABLE_PREFIX = "code_eval_"


def table_name(dataset: str) -> str:
    """SandboxFusion's table for ``dataset``."""
    return f"{_TABLE_PREFIX}{dataset}"


def _id_order(row: Mapping[str, Any]) -> tuple[int, Any]:
    # SQLite's ORDER BY puts numbers before text.
    value = row["id"]
    return (0, value) if isinstance(value, int | float) and not isinstance(value, bool) else (1, str(value))


def _same_id(row_id: Any, wanted: int | str) -> bool:
    # An INTEGER column compares equal to the text of its number ('12' finds 12), as in SQLite.
    return bool(row_id == wanted or str(row_id) == str(wanted))


@dataclass(frozen=True)
class DatasetTable:
    """The rows of one dataset file, ordered by id."""

    dataset: str
    path: Path
    rows: tuple[dict[str, Any], ...]


def read_table(path: Path) -> DatasetTable:
    """One JSON Lines file: an object with an ``id`` per non-blank line."""
    dataset = path.stem.removeprefix(_TABLE_PREFIX)
    rows: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetLoadError(f"cannot read dataset file {path}: {exc.strerror}") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetLoadError(f"{path}:{number}: not JSON: {exc}") from None
        if not isinstance(row, dict) or "id" not in row:
            raise DatasetLoadError(f"{path}:{number}: each line must be a JSON object with an 'id'")
        rows.append(row)
    try:
        rows.sort(key=_id_order)
    except TypeError:
        raise DatasetLoadError(f"{path}: ids must be numbers or strings") from None
    return DatasetTable(dataset, path, tuple(rows))


def discover_tables(directories: Iterable[str | Path]) -> dict[str, DatasetTable]:
    """Every ``*.jsonl`` file directly in ``directories``; a later directory's file wins."""
    tables: dict[str, DatasetTable] = {}
    for directory in directories:
        path = Path(directory)
        if not path.is_dir():
            raise DatasetLoadError(f"dataset directory {path} does not exist")
        for file in sorted(path.glob("*.jsonl")):
            table = read_table(file)
            tables[table.dataset] = table
    return tables


def _infer_kind(table: DatasetTable) -> DatasetKind | None:
    if not table.rows:
        return None
    first = table.rows[0]
    return next((kind for kind in KINDS.values() if kind.matches(first)), None)


def _query(columns: Sequence[str], table: str, tail: str) -> str:
    return f"SELECT {', '.join(columns)} FROM {table} {tail}"


class DatasetRegistry:
    """Dataset ids, their classes and their rows; read-only once built."""

    def __init__(self, tables: Mapping[str, DatasetTable], known: Mapping[str, str] | None = None) -> None:
        self.tables = dict(tables)
        self.kinds: dict[str, DatasetKind] = {
            dataset: KINDS[class_name]
            for dataset, class_name in (KNOWN_DATASETS if known is None else known).items()
        }
        for dataset, table in self.tables.items():
            if dataset not in self.kinds:
                kind = _infer_kind(table)
                if kind is not None:
                    self.kinds[dataset] = kind

    @classmethod
    def from_directories(
        cls, directories: Iterable[str | Path], known: Mapping[str, str] | None = None
    ) -> DatasetRegistry:
        return cls(discover_tables(directories), known)

    def dataset_ids(self) -> list[str]:
        """What ``/list_datasets`` answers: every registered id, sorted."""
        return sorted(self.kinds)

    def kind_for(self, dataset: str, config: TestConfig) -> DatasetKind:
        """The class for ``dataset``: registered, else ``config.dataset_type``; 400 otherwise."""
        kind = self.kinds.get(dataset)
        if kind is not None:
            return kind
        if config.dataset_type:
            named = KINDS.get(config.dataset_type)
            if named is None:
                raise DatasetHTTPError(400, f"eval class {config.dataset_type} not found")
            return named
        raise DatasetHTTPError(400, f"no eval class found for dataset {dataset}")

    def rows(
        self, dataset: str, config: TestConfig, offset: int, limit: int, columns: Sequence[str]
    ) -> list[dict[str, Any]]:
        """Rows ordered by id, ``offset`` and ``limit`` applied (SQLite: a negative limit means all),
        or ``config.provided_data`` as given."""
        if config.provided_data is not None:
            provided = config.provided_data
            return [provided] if isinstance(provided, dict) else list(provided)
        table = self.tables.get(dataset)
        if table is None:
            query = _query(columns, table_name(dataset), f"ORDER BY id LIMIT {offset}, {limit}")
            raise DatasetHTTPError(
                500,
                f"failed to request database with query {query}: "
                "'NoneType' object has no attribute 'fetch_all'",
            )
        start = max(offset, 0)
        stop = None if limit < 0 else start + limit
        return [dict(row) for row in table.rows[start:stop]]

    def row_by_id(
        self, dataset: str, config: TestConfig, row_id: int | str, columns: Sequence[str]
    ) -> dict[str, Any]:
        """The row with ``row_id``; ``config.provided_data`` (one row, or a list searched by id)
        bypasses the table. :class:`RowNotFound` when there is no such row."""
        provided = config.provided_data
        if isinstance(provided, dict):
            return dict(provided)
        if provided is not None:
            candidates: Iterable[Mapping[str, Any]] = provided
        else:
            table = self.tables.get(dataset)
            if table is None:
                query = _query(columns, table_name(dataset), f"WHERE id = {row_id!r}")
                raise DatasetHTTPError(
                    500,
                    f"failed to request database with query {query}: "
                    "'NoneType' object has no attribute 'fetch_one'",
                )
            candidates = table.rows
        for row in candidates:
            if _same_id(row.get("id"), row_id):
                return dict(row)
        raise RowNotFound
