"""Tables as SandboxFusion's SQLite keeps them, and the registry of classes (no sockets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mocksandbox.datasets import DatasetHTTPError, DatasetLoadError
from mocksandbox.datasets.errors import RowNotFound
from mocksandbox.datasets.models import TestConfig
from mocksandbox.datasets.registry import DatasetRegistry
from mocksandbox.datasets.tables import TableStore, read_jsonl


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def store(tmp_path: Path) -> TableStore:
    write_jsonl(
        tmp_path / "code_eval_things.jsonl",
        [
            {"id": 2, "name": "b", "labels": {"k": 1}, "score": 1.5},
            {"id": "12", "name": 7, "labels": [1], "score": None},
            {"id": 1, "name": "a", "labels": {}, "score": True},
        ],
    )
    return TableStore.from_directories([tmp_path])


def test_rows_are_stored_as_sqlite_does(store: TableStore) -> None:
    rows = store.rows(TestConfig(), "code_eval_things", None, 0, -1)
    # INT column: "12" becomes 12; TEXT column: 7 becomes "7"; nested values and floats are JSON text.
    assert [row["id"] for row in rows] == [1, 2, 12]
    assert rows[1] == {"id": 2, "name": "b", "labels": '{"k": 1}', "score": "1.5"}
    assert rows[2]["name"] == "7" and rows[0]["score"] == "true"
    assert [r["id"] for r in store.rows(TestConfig(), "code_eval_things", ("id",), 1, 1)] == [2]


def test_row_by_id_and_its_errors(store: TableStore) -> None:
    assert store.row_by_id(TestConfig(), "code_eval_things", "2", ("id", "name")) == {"id": 2, "name": "b"}
    with pytest.raises(RowNotFound, match="'NoneType' object is not iterable"):
        store.row_by_id(TestConfig(), "code_eval_things", 99, None)
    with pytest.raises(DatasetHTTPError) as info:
        store.row_by_id(TestConfig(), "code_eval_things", 1, ("id", "name", "labels", "score", "nope"))
    # More columns than the table has: SandboxFusion asks its (absent) MySQL backend.
    assert info.value.status == 500
    assert info.value.detail.endswith("WHERE id = 1: 'NoneType' object has no attribute 'fetch_one'")
    with pytest.raises(DatasetHTTPError, match="no such column: nope"):
        store.rows(TestConfig(), "code_eval_things", ("nope", "id"), 0, 10)
    with pytest.raises(DatasetHTTPError, match=r"FROM code_eval_missing ORDER BY id LIMIT 0, 5"):
        store.rows(TestConfig(), "code_eval_missing", ("id",), 0, 5)


def test_provided_data_bypasses_the_tables(store: TableStore) -> None:
    many = TestConfig(provided_data=[{"id": 8, "x": 1}])
    assert store.rows(many, "anything", ("id",), 0, 1) == [{"id": 8}]
    one = TestConfig(provided_data={"id": 5, "x": 2})
    assert store.row_by_id(one, "anything", 12345, None) == {"id": 5, "x": 2}
    with pytest.raises(DatasetHTTPError, match="should be a list") as info:
        store.rows(one, "anything", None, 0, 1)
    assert info.value.status == 400
    with pytest.raises(DatasetHTTPError, match="should be a dict"):
        store.row_by_id(many, "anything", 8, None)


def test_bad_files_fail_at_load(tmp_path: Path) -> None:
    (tmp_path / "code_eval_bad.jsonl").write_text('{"id": 1}\nnot json\n')
    with pytest.raises(DatasetLoadError, match=r"code_eval_bad\.jsonl:2: not JSON"):
        read_jsonl(tmp_path / "code_eval_bad.jsonl")
    with pytest.raises(DatasetLoadError, match="does not exist"):
        TableStore.from_directories([tmp_path / "nope"])


def test_registry_order_classes_and_tables(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "code_eval_mine.jsonl", [{"id": 1, "content": "c", "labels": {}, "test_list": []}])
    write_jsonl(tmp_path / "code_eval_other.jsonl", [{"id": 1, "odd": True}])
    registry = DatasetRegistry(TableStore.from_directories([tmp_path]))
    ids = registry.dataset_ids()
    assert ids[:3] == ["aider_benchmark_v1", "code_contests", "cruxeval"] and ids[-1] == "mine"
    assert "other" not in ids and len(ids) == 54
    assert registry.class_for("mine", TestConfig()).class_name == "MBPPDataset"
    assert (
        registry.class_for("evoeval", TestConfig(dataset_type="MBPPDataset")).class_name == "EvoEvalDataset"
    )
    assert (
        registry.class_for("other", TestConfig(dataset_type="AutoEvalDataset")).class_name
        == "AutoEvalDataset"
    )
    evoeval = registry.classes["EvoEvalDataset"]
    assert registry.table_for(evoeval, "evoeval") == "code_eval_EvoEval"
    assert registry.table_for(registry.classes["MultiPLEDataset"], "multiple_rs") == "code_eval_multiple_re"
    assert registry.table_for(registry.classes["AutoEvalDataset"], "x") == "code_eval_x"
    with pytest.raises(DatasetHTTPError, match="no eval class found for dataset other"):
        registry.class_for("other", TestConfig())
    with pytest.raises(DatasetHTTPError, match="eval class AutoEvalV4Dataset not found"):
        registry.class_for("other", TestConfig(dataset_type="AutoEvalV4Dataset"))
