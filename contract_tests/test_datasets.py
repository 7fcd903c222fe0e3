"""Dataset endpoints (contract §4), when the target has them."""

from __future__ import annotations

import pytest
from contract_support import Target, check_run_code_response, check_validation_error

pytestmark = pytest.mark.needs_endpoint("/list_datasets")

EVAL_RESULT_KEYS = {
    "id",
    "accepted",
    "extracted_code",
    "full_code",
    "test_code",
    "tests",
    "extracted_type",
    "extra",
}
ADD_ROW = {
    "id": 1,
    "content": "add two numbers",
    "labels": {"test_setup_code": ""},
    "test_list": ["assert add(1,2)==3"],
}


def test_list_datasets(target: Target) -> None:
    reply = target.get("/list_datasets")
    assert reply.status_code == 200
    names = reply.json()
    assert isinstance(names, list) and names and all(isinstance(n, str) for n in names)


def check_eval_result(result: dict) -> None:
    assert set(result) == EVAL_RESULT_KEYS
    assert isinstance(result["accepted"], bool)
    assert isinstance(result["extracted_code"], str)
    assert result["extracted_type"] in ("fenced", "incomplete_fenced", "heuristic", "empty", None)
    for test in result["tests"]:
        assert isinstance(test["passed"], bool)
        check_run_code_response(test["exec_info"])


def submit(target: Target, completion: str) -> dict:
    reply = target.post(
        "/submit",
        {"dataset": "mbpp", "id": 1, "config": {"provided_data": ADD_ROW}, "completion": completion},
    )
    assert reply.status_code == 200, reply.text[:300]
    result = reply.json()
    check_eval_result(result)
    return result


def test_submit_with_provided_data(target: Target) -> None:
    result = submit(target, "```python\ndef add(a, b):\n    return a + b\n```")
    assert result["accepted"] is True
    assert "def add" in result["extracted_code"]


def test_wrong_completion_is_not_accepted(target: Target) -> None:
    result = submit(target, "```python\ndef add(a, b):\n    return a - b\n```")
    assert result["accepted"] is False
    assert result["tests"][0]["exec_info"]["status"] == "Failed"


def test_mbpp_prompts(target: Target) -> None:
    if "mbpp" not in target.get("/list_datasets").json():
        pytest.skip("the target lists no mbpp dataset")
    reply = target.post("/get_prompts", {"dataset": "mbpp", "config": {}, "limit": 2})
    if reply.status_code == 500:
        pytest.skip("mbpp is registered but has no data on this target")
    assert reply.status_code == 200
    for prompt in reply.json():
        assert {"id", "prompt", "labels"} <= set(prompt)


def test_metrics_function_of_mbpp(target: Target) -> None:
    reply = target.post("/get_metrics_function", {"dataset": "mbpp", "config": {}})
    assert reply.status_code == 200
    assert reply.json() == {"function": None}


def test_unknown_dataset_is_400(target: Target) -> None:
    reply = target.post("/get_prompts", {"dataset": "no-such-dataset", "config": {}})
    assert reply.status_code == 400
    assert isinstance(reply.json()["detail"], str)


def test_submit_needs_a_config(target: Target) -> None:
    reply = target.post("/submit", {"dataset": "mbpp", "id": 11, "completion": "x"})
    check_validation_error(reply, [("missing", ["body", "config"])])
