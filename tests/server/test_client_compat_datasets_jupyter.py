"""The official ``sandbox-fusion`` client (PyPI, 0.3.x) against a real mock server on a loopback port:
``run_jupyter``, ``get_prompts``, ``get_prompt_by_id``, ``submit`` and ``submit_safe``, sync and async.

Nothing here asserts on wall-clock durations.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("sandbox_fusion", reason="the sandbox-fusion client is not installed")
pytest.importorskip("ipykernel", reason="the jupyter extra is not installed")
from sandbox_fusion import (
    CommandRunStatus,
    GetPromptByIdRequest,
    GetPromptsRequest,
    RunJupyterRequest,
    RunStatus,
    SubmitRequest,
    TestConfig,
    get_prompt_by_id,
    get_prompts,
    get_prompts_async,
    run_jupyter,
    run_jupyter_async,
    submit,
    submit_async,
    submit_safe,
)

pytestmark = pytest.mark.usefixtures("loopback_only")


# -- run_jupyter ------------------------------------------------------------------------------------


def test_run_jupyter(sf_endpoint: str) -> None:
    request = RunJupyterRequest(
        cells=[
            "a = 123",
            "a",
            "print(a)",
            'import sys; sys.stderr.write("stderr message")',
            'raise RuntimeError("error message")',
        ],
        files={"in.txt": "amZpbGU="},
        fetch_files=["in.txt"],
    )
    response = run_jupyter(request, max_attempts=1)
    assert response.status == RunStatus.Success
    assert response.driver is not None
    assert response.driver.status == CommandRunStatus.Finished
    assert response.driver.stdout.startswith("config: \n{")
    assert [cell.stdout for cell in response.cells] == ["", "", "123\n", "", ""]
    assert response.cells[1].display == [{"text/plain": "123"}]
    assert response.cells[3].stderr == "stderr message"
    assert response.cells[4].error[0]["ename"] == "RuntimeError"
    assert response.files == {"in.txt": "amZpbGU="}


def test_run_jupyter_timeout_is_failed_not_an_exception(sf_endpoint: str) -> None:
    response = run_jupyter(
        RunJupyterRequest(cells=["import time; time.sleep(30)"], total_timeout=-9.5), max_attempts=1
    )
    assert response.status == RunStatus.Failed
    assert response.driver is not None and response.driver.status == CommandRunStatus.TimeLimitExceeded
    assert response.cells == []


def test_run_jupyter_async(sf_endpoint: str) -> None:
    response = asyncio.run(run_jupyter_async(RunJupyterRequest(cells=["6 * 7"]), max_attempts=1))
    assert response.cells[0].display == [{"text/plain": "42"}]


# -- datasets -------------------------------------------------------------------------------------


def test_get_prompts(sf_endpoint: str) -> None:
    prompts = get_prompts(GetPromptsRequest(dataset="mbpp", config=TestConfig(), offset=0, limit=3))
    assert [prompt.id for prompt in prompts] == [11, 12, 13]
    assert all(prompt.prompt.startswith("You are an expert Python programmer") for prompt in prompts)
    assert prompts[1].labels["test_setup_code"] == ""
    judge = get_prompts(
        GetPromptsRequest(dataset="code_contests_sample", config=TestConfig(language="python"))
    )
    assert len(judge) == 5
    assert (
        asyncio.run(get_prompts_async(GetPromptsRequest(dataset="humaneval_sample", config=TestConfig())))[
            0
        ].id
        == "HumanEvalSample/0"  # SandboxFusion's HumanEval prompts carry the task id
    )


def test_get_prompts_errors_reach_the_caller(sf_endpoint: str) -> None:
    with pytest.raises(Exception, match=r"responded with code 400: .*no eval class found for dataset nope"):
        get_prompts(GetPromptsRequest(dataset="nope", config=TestConfig()))


def test_get_prompt_by_id(sf_endpoint: str) -> None:
    prompt = get_prompt_by_id(GetPromptByIdRequest(dataset="mbpp", config=TestConfig(), id=12))
    assert prompt.id == 12 and "sort_matrix" in prompt.prompt


def test_submit(sf_endpoint: str) -> None:
    completion = "```python\ndef sort_matrix(M):\n    return sorted(M, key=sum)\n```"
    result = submit(
        SubmitRequest(dataset="mbpp", id=12, completion=completion, config=TestConfig()), max_attempts=1
    )
    assert result.accepted is True
    assert result.extracted_code == "\ndef sort_matrix(M):\n    return sorted(M, key=sum)"
    assert result.tests[0].exec_info.status == RunStatus.Success
    wrong = submit(
        SubmitRequest(
            dataset="mbpp", id=12, completion="def sort_matrix(M):\n    return M\n", config=TestConfig()
        ),
        max_attempts=1,
    )
    assert wrong.accepted is False


def test_submit_provided_data_and_judge_async(sf_endpoint: str) -> None:
    row = {"id": 1, "content": "add", "labels": {"test_setup_code": ""}, "test_list": ["assert add(1,2)==3"]}
    config = TestConfig(provided_data=row)
    result = submit(
        SubmitRequest(dataset="mbpp", id=1, completion="def add(a, b):\n    return a + b\n", config=config),
        max_attempts=1,
    )
    assert result.accepted is True
    completion = "```python\nprint(' '.join(reversed(input().split())))\n```"
    judged = asyncio.run(
        submit_async(
            SubmitRequest(
                dataset="code_contests_sample",
                id=5,
                completion=completion,
                config=TestConfig(language="python"),
            ),
            max_attempts=1,
        )
    )
    assert judged.accepted is True
    assert judged.extracted_type is None  # as SandboxFusion's CommonOJDataset
    assert [test.passed for test in judged.tests] == [True, True]


def test_submit_safe_turns_a_500_into_a_rejection(sf_endpoint: str) -> None:
    result = submit_safe(
        SubmitRequest(dataset="mbpp", id=99999, completion="x", config=TestConfig()), max_attempts=1
    )
    assert (result.id, result.accepted, result.tests) == (99999, False, [])
