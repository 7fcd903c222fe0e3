"""The dataset registry: files found, classes known or inferred, rows served, SandboxFusion's errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mocksandbox.datasets.errors import DatasetHTTPError, DatasetLoadError, RowNotFound
from mocksandbox.datasets.models import TestConfig
from mocksandbox.datasets.registry import (
    KNOWN_DATASETS,
    SAMPLE_DATASETS_DIR,
    DatasetRegistry,
    discover_tables,
    read_table,
)
from mocksandbox.datasets.service import dataset_directories

MBPP_ROW = {"id": 1, "content": "c", "labels": {"test_setup_code": ""}, "test_list": ["assert True"]}
HUMANEVAL_ROW = {"id": 0, "prompt": "def f():\n", "test": "def check(c): pass", "entry_point": "f"}
OJ_ROW = {
    "id": 5,
    "content": "c",
    "labels": {},
    "test": [{"input": {"stdin": "1"}, "output": {"stdout": "1"}}],
}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def config(**fields: Any) -> TestConfig:
    return TestConfig.model_validate(fields)


# -- files --------------------------------------------------------------------------------------------


def test_table_name_drops_the_code_eval_prefix_and_sorts_rows_by_id(tmp_path: Path) -> None:
    rows = [{"id": 3}, {"id": "b"}, {"id": 1}, {"id": "a"}, {"id": 2}]
    table = read_table(write_jsonl(tmp_path / "code_eval_things.jsonl", rows))
    assert table.dataset == "things"
    assert [row["id"] for row in table.rows] == [1, 2, 3, "a", "b"]  # SQLite: numbers before text
    assert read_table(write_jsonl(tmp_path / "plain.jsonl", rows)).dataset == "plain"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json}\n", ":1: not JSON"),
        ('\n{"no_id": 1}\n', ":2: each line must be a JSON object"),
        ("[1]\n", ":1:"),
    ],
)
def test_bad_files_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(DatasetLoadError, match=message):
        read_table(path)


def test_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetLoadError, match="does not exist"):
        discover_tables([tmp_path / "nope"])


def test_later_directories_win(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_jsonl(tmp_path / "a" / "code_eval_x.jsonl", [{"id": 1}])
    write_jsonl(tmp_path / "b" / "x.jsonl", [{"id": 2}])
    tables = discover_tables([tmp_path / "a", tmp_path / "b"])
    assert [row["id"] for row in tables["x"].rows] == [2]


def test_sample_directory_comes_first_and_can_be_left_out(tmp_path: Path) -> None:
    assert dataset_directories([str(tmp_path)], include_samples=True) == [SAMPLE_DATASETS_DIR, tmp_path]
    assert dataset_directories([str(tmp_path)], include_samples=False) == [tmp_path]


# -- classes ----------------------------------------------------------------------------------------


def test_known_ids_are_listed_with_or_without_data(tmp_path: Path) -> None:
    registry = DatasetRegistry.from_directories([])
    assert registry.dataset_ids() == sorted(KNOWN_DATASETS)


def test_unknown_files_get_the_class_their_rows_fit(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "code_eval_m.jsonl", [MBPP_ROW])
    write_jsonl(tmp_path / "code_eval_h.jsonl", [HUMANEVAL_ROW])
    write_jsonl(tmp_path / "code_eval_o.jsonl", [OJ_ROW])
    write_jsonl(tmp_path / "code_eval_odd.jsonl", [{"id": 1, "question": "?"}])
    registry = DatasetRegistry.from_directories([tmp_path], known={})
    assert registry.dataset_ids() == ["h", "m", "o"]  # "odd" needs config.dataset_type
    assert registry.kind_for("m", config()).class_name == "MBPPDataset"
    assert registry.kind_for("h", config()).class_name == "HumanEvalDataset"
    assert registry.kind_for("o", config()).class_name == "CommonOJDataset"
    assert registry.kind_for("odd", config(dataset_type="MBPPDataset")).class_name == "MBPPDataset"


def test_registered_class_wins_over_dataset_type() -> None:
    registry = DatasetRegistry.from_directories([])
    assert registry.kind_for("mbpp", config(dataset_type="CommonOJDataset")).class_name == "MBPPDataset"


def test_unknown_dataset_and_unknown_class_are_400() -> None:
    registry = DatasetRegistry.from_directories([])
    with pytest.raises(DatasetHTTPError) as no_class:
        registry.kind_for("nope", config())
    assert (no_class.value.status, no_class.value.detail) == (400, "no eval class found for dataset nope")
    with pytest.raises(DatasetHTTPError) as bad_class:
        registry.kind_for("nope", config(dataset_type="NoSuchClass"))
    assert (bad_class.value.status, bad_class.value.detail) == (400, "eval class NoSuchClass not found")
    assert bad_class.value.traceback_lines is None


# -- rows ---------------------------------------------------------------------------------------------


@pytest.fixture
def registry(tmp_path: Path) -> DatasetRegistry:
    write_jsonl(tmp_path / "code_eval_mbpp.jsonl", [{**MBPP_ROW, "id": n} for n in (12, 11, 13)])
    return DatasetRegistry.from_directories([tmp_path])


def test_rows_with_offset_and_limit(registry: DatasetRegistry) -> None:
    def ids(offset: int, limit: int) -> list[Any]:
        return [r["id"] for r in registry.rows("mbpp", config(), offset, limit, ("id",))]

    assert ids(0, 1000000) == [11, 12, 13]
    assert ids(1, 1) == [12]
    assert ids(5, 1) == []
    assert ids(1, -1) == [12, 13]  # SQLite: a negative LIMIT means no limit


def test_rows_are_copies(registry: DatasetRegistry) -> None:
    registry.rows("mbpp", config(), 0, 1, ("id",))[0]["content"] = "changed"
    assert registry.rows("mbpp", config(), 0, 1, ("id",))[0]["content"] == "c"


def test_registered_dataset_without_data_fails_like_the_database() -> None:
    registry = DatasetRegistry.from_directories([])
    with pytest.raises(DatasetHTTPError) as info:
        registry.rows("humaneval_python", config(), 0, 1, ("*",))
    assert info.value.status == 500
    assert info.value.detail == (
        "failed to request database with query SELECT * FROM code_eval_humaneval_python ORDER BY id "
        "LIMIT 0, 1: 'NoneType' object has no attribute 'fetch_all'"
    )
    with pytest.raises(DatasetHTTPError, match=r"SELECT id, content FROM code_eval_mbpp WHERE id = 3"):
        registry.row_by_id("mbpp", config(), 3, ("id", "content"))


def test_row_by_id_matches_numbers_given_as_text(registry: DatasetRegistry) -> None:
    assert registry.row_by_id("mbpp", config(), 12, ("id",))["id"] == 12
    assert registry.row_by_id("mbpp", config(), "12", ("id",))["id"] == 12
    with pytest.raises(RowNotFound, match="'NoneType' object is not iterable"):
        registry.row_by_id("mbpp", config(), 99999, ("id",))


def test_provided_data_bypasses_the_table(registry: DatasetRegistry) -> None:
    one = {"id": 1, "content": "inline"}
    many = [{"id": 7}, {"id": 8}]
    assert registry.rows("mbpp", config(provided_data=many), 0, 1, ("id",)) == many  # as given
    assert registry.rows("mbpp", config(provided_data=one), 0, 10, ("id",)) == [one]
    assert registry.row_by_id("mbpp", config(provided_data=one), 12345, ("id",)) == one
    assert registry.row_by_id("mbpp", config(provided_data=many), 8, ("id",)) == {"id": 8}
    with pytest.raises(RowNotFound):
        registry.row_by_id("mbpp", config(provided_data=many), 9, ("id",))
    # also for a registered dataset without any file
    assert registry.rows("humaneval_python", config(provided_data=many), 0, 1, ("*",)) == many
