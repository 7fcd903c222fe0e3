"""Every example of the contract's §3 (/run_jupyter) and §4 (dataset endpoints) through the Flask
test client, from ``fixtures/corpus/datasets_jupyter.jsonl``, plus the wire details: key order,
content types, and that SandboxFusion's expected 500s are not reported as server errors.

A case's ``expect.body`` is the whole answer, keys in order. Placeholders: ``"<FLOAT>"`` (any
number: durations), ``"<ANY>"`` (anything), ``"<CONTAINS>text"`` (a string containing ``text``).
Cases marked ``"slow"`` reproduce a long wait as measured (the 11 s timeout) and run with ``-m slow``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from mocksandbox.contract.corpus import load_corpus, request_parts
from mocksandbox.core import MockSandbox
from mocksandbox.settings import Settings
from mocksandbox.web import create_app

CASES = load_corpus("datasets_jupyter")


@pytest.fixture(scope="module")
def box() -> Iterator[MockSandbox]:
    box = MockSandbox.create(Settings(pod_name=None))
    yield box
    box.close()


@pytest.fixture(scope="module")
def app(box: MockSandbox) -> Flask:
    return create_app(box)


@pytest.fixture
def client(app: Flask, box: MockSandbox) -> Iterator[FlaskClient]:
    yield app.test_client()
    errors = box.take_errors()
    assert not errors, f"unexpected server errors: {[e.traceback for e in errors]}"


def mismatches(expected: Any, actual: Any, path: str = "$") -> list[str]:
    """Where ``actual`` differs from ``expected`` (placeholders honoured, dict key order compared)."""
    if expected == "<ANY>":
        return []
    if expected == "<FLOAT>":
        ok = isinstance(actual, int | float) and not isinstance(actual, bool)
        return [] if ok else [f"{path}: expected a number, got {actual!r}"]
    if isinstance(expected, str) and expected.startswith("<CONTAINS>"):
        needle = expected.removeprefix("<CONTAINS>")
        ok = isinstance(actual, str) and needle in actual
        return [] if ok else [f"{path}: expected a string containing {needle!r}, got {actual!r}"]
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: expected an object, got {actual!r}"]
        if list(expected) != list(actual):
            return [f"{path}: keys {list(actual)} (expected {list(expected)})"]
        return [
            problem for key in expected for problem in mismatches(expected[key], actual[key], f"{path}.{key}")
        ]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: expected {len(expected)} items, got {actual!r}"]
        return [
            p
            for i, (e, a) in enumerate(zip(expected, actual, strict=True))
            for p in mismatches(e, a, f"{path}[{i}]")
        ]
    if type(expected) is not type(actual) or expected != actual:
        return [f"{path}: expected {expected!r}, got {actual!r}"]
    return []


def _param(case: dict[str, Any]) -> Any:
    marks = [pytest.mark.slow] if case.get("slow") else []
    return pytest.param(case, id=case["name"], marks=marks)


@pytest.mark.parametrize("case", [_param(case) for case in CASES])
def test_corpus_case(client: FlaskClient, case: dict[str, Any]) -> None:
    method, path, body, content_type = request_parts(case["request"])
    response = client.open(path, method=method, data=body, content_type=content_type)
    expect = case["expect"]
    raw = response.get_data(as_text=True)
    assert response.status_code == expect["http_status"], raw
    assert response.headers["Content-Type"] == "application/json"
    problems = mismatches(expect["body"], json.loads(raw))
    assert not problems, (
        f"case {case['name']} ({case['source']}):\n  " + "\n  ".join(problems) + f"\n  raw: {raw}"
    )


def test_corpus_is_well_formed() -> None:
    names = [case["name"] for case in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    for case in CASES:
        assert set(case) <= {"name", "source", "note", "slow", "request", "expect"}, case["name"]
        assert case["source"].startswith("§"), case["name"]
        assert set(case["expect"]) == {"http_status", "body"}, case["name"]


def test_corpus_covers_the_contract_examples() -> None:
    """A case dropped from the corpus by accident fails here, not silently."""
    required = {
        "jupyter_success", "jupyter_total_timeout", "jupyter_total_timeout_fast", "jupyter_cell_raises",
        "jupyter_files_and_fetch_files", "jupyter_kernel_not_python3", "jupyter_files_null_not_allowed",
        "list_datasets", "list_ids_mbpp", "get_prompts_unknown_dataset", "get_prompts_unknown_class",
        "get_prompts_registered_without_data", "submit_mbpp_accepted", "submit_mbpp_rejected",
        "submit_unknown_id", "submit_missing_config", "submit_provided_data", "get_metrics_mbpp",
        "get_metrics_function_mbpp",
    }  # fmt: skip
    assert required <= {case["name"] for case in CASES}


# -- wire details -------------------------------------------------------------------------------------


def _ordered(raw: bytes) -> Any:
    return json.loads(raw, object_pairs_hook=lambda pairs: pairs)


def test_run_jupyter_keys_in_order(client: FlaskClient) -> None:
    body = _ordered(client.post("/run_jupyter", json={"cells": ["1/0"]}).get_data())
    assert [k for k, _ in body] == ["status", "message", "driver", "cells", "executor_pod_name", "files"]
    driver = dict(body)["driver"]
    assert [k for k, _ in driver] == ["status", "execution_time", "return_code", "stdout", "stderr"]
    [cell] = dict(body)["cells"]
    assert [k for k, _ in cell] == ["stdout", "stderr", "display", "error"]
    [error] = dict(cell)["error"]
    assert [k for k, _ in error] == ["traceback", "ename", "evalue"]


def test_eval_result_keys_in_order(client: FlaskClient) -> None:
    raw = client.post(
        "/submit", json={"dataset": "mbpp", "id": "13", "config": {}, "completion": "x"}
    ).get_data()
    body = _ordered(raw)
    assert [k for k, _ in body] == [
        "id", "accepted", "extracted_code", "full_code", "test_code", "tests", "extracted_type", "extra",
    ]  # fmt: skip
    assert dict(body)["id"] == "13"  # echoed as sent (the row was found by its number)
    [test] = dict(body)["tests"]
    assert [k for k, _ in test] == ["passed", "exec_info", "test_info"]


def test_prompt_keys_in_order(client: FlaskClient) -> None:
    body = _ordered(
        client.post("/get_prompt_by_id", json={"dataset": "mbpp", "config": {}, "id": 11}).get_data()
    )
    assert [k for k, _ in body] == ["id", "prompt", "labels"]


def test_judge_results_list_the_cases_in_order(client: FlaskClient) -> None:
    completion = "```python\nt = int(input())\nfor _ in range(t):\n    a, b = map(int, input().split())\n    print(a + b)"
    body = client.post(
        "/submit",
        json={
            "dataset": "code_contests_sample",
            "id": 1,
            "config": {"language": "python"},
            "completion": completion,
        },
    ).get_json()
    assert body["accepted"] is True
    assert body["extracted_type"] is None  # SandboxFusion's judge does not say how it found the code
    assert [t["test_info"]["input"]["stdin"] for t in body["tests"]] == [
        "2\n1 2\n10 -4\n",
        "1\n0 0\n",
        "3\n5 5\n-1 -1\n100 23\n",
    ]


def test_judge_without_language_is_400(client: FlaskClient) -> None:
    response = client.post(
        "/submit", json={"dataset": "code_contests_sample", "id": 1, "config": {}, "completion": "x"}
    )
    assert response.status_code == 400
    assert response.get_json() == {"detail": "config.language field must exist for CommonOJDataset, got None"}


def test_dataset_type_serves_unregistered_inline_data(client: FlaskClient) -> None:
    rows = [{"id": "a", "content": "c", "labels": {}, "test_list": ["assert f() == 1"]}]
    response = client.post(
        "/get_prompts",
        json={"dataset": "my_own", "config": {"dataset_type": "MBPPDataset", "provided_data": rows}},
    )
    assert response.status_code == 200
    assert [p["id"] for p in response.get_json()] == ["a"]
