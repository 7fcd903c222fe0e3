"""The three evaluation kinds with a fake engine: which programs they build and how they judge."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest

from mocksandbox.datasets.errors import DatasetHTTPError
from mocksandbox.datasets.kinds import CommonOJKind, HumanEvalKind, MBPPKind, outputs_match
from mocksandbox.datasets.models import SubmitRequest, TestConfig
from mocksandbox.models import CommandRunResult, CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus


class FakeRunner:
    """Records requests; answers with ``answer(request)`` (a success printing nothing by default)."""

    def __init__(self, answer: Callable[[RunCodeRequest], RunCodeResponse] | None = None) -> None:
        self.requests: list[RunCodeRequest] = []
        self._answer = answer or (lambda request: ok(""))

    def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        self.requests.append(request)
        return self._answer(request)


def ok(stdout: str, files: dict[str, str] | None = None) -> RunCodeResponse:
    result = CommandRunResult(
        status=CommandRunStatus.Finished, execution_time=0.01, return_code=0, stdout=stdout, stderr=""
    )
    return RunCodeResponse(status=RunStatus.Success, message="", run_result=result, files=files or {})


def failed() -> RunCodeResponse:
    result = CommandRunResult(
        status=CommandRunStatus.Finished,
        execution_time=0.01,
        return_code=1,
        stdout="",
        stderr="AssertionError",
    )
    return RunCodeResponse(status=RunStatus.Failed, message="", run_result=result)


def submit(completion: str, row_id: int | str = 1, **config: Any) -> SubmitRequest:
    return SubmitRequest(
        dataset="d", id=row_id, completion=completion, config=TestConfig.model_validate(config)
    )


MBPP_ROW = {
    "id": 12,
    "content": "Write a function to sort a matrix by row sums.",
    "labels": '{"test_setup_code": "import math", "task_id": 12}',  # JSON text, as SQLite stores it
    "test_list": '["assert f(1) == 1", "assert f(2) == 2"]',
}

# -- MBPP -------------------------------------------------------------------------------------------


def test_mbpp_prompt_and_labels_from_json_text() -> None:
    prompt = MBPPKind().prompt(MBPP_ROW, "mbpp", TestConfig())
    assert prompt.id == 12
    assert prompt.prompt == (
        "You are an expert Python programmer, and here is your task: Write a function to sort a matrix by "
        "row sums. Your code should pass these tests:\n\nassert f(1) == 1\nassert f(2) == 2"
    )
    assert prompt.labels == {"test_setup_code": "import math", "task_id": 12}


def test_mbpp_program_is_setup_code_then_first_block_then_each_assert() -> None:
    runner = FakeRunner()
    result = MBPPKind().evaluate(
        MBPP_ROW, submit("```python\ndef f(x):\n    return x\n```\n```python\nno\n```", 12), runner
    )
    assert result.extracted_code == "import math\ndef f(x):\n    return x"
    assert result.full_code == "import math\ndef f(x):\n    return x\nassert f(1) == 1\n\nassert f(2) == 2\n"
    [request] = runner.requests
    assert (request.code, request.language, request.run_timeout) == (result.full_code, "python", 20)
    assert result.accepted and result.tests[0].passed
    assert (result.id, result.test_code, result.extracted_type, result.extra) == (12, None, None, None)


def test_mbpp_trims_done_marker_stop_words_and_main_guard() -> None:
    runner = FakeRunner()
    completion = "def f(x):\n    return x\n\nassert f(3) == 3\n[DONE] trailing chatter"
    assert (
        MBPPKind().evaluate(MBPP_ROW, submit(completion), runner).extracted_code
        == "import math\ndef f(x):\n    return x\n"
    )
    completion = '```python\ndef f(x):\n    return x\nif __name__ == "__main__":\n    f(1)\n```'
    assert (
        MBPPKind().evaluate(MBPP_ROW, submit(completion), runner).extracted_code
        == "import math\ndef f(x):\n    return x"
    )


def test_mbpp_fewshot_runs_only_the_last_test_and_config_timeout() -> None:
    runner = FakeRunner()
    result = MBPPKind().evaluate(
        MBPP_ROW, submit("def f(x):\n    return x\n", is_fewshot=True, run_timeout=3), runner
    )
    assert result.full_code is not None and result.full_code.endswith("\nassert f(2) == 2\n")
    assert "f(1)" not in result.full_code
    assert runner.requests[0].run_timeout == 3


def test_mbpp_failure_is_not_accepted() -> None:
    result = MBPPKind().evaluate(MBPP_ROW, submit("x"), FakeRunner(lambda r: failed()))
    assert not result.accepted
    assert result.tests[0].exec_info.status == RunStatus.Failed


def test_sandbox_error_becomes_http_500() -> None:
    def sandbox_error(request: RunCodeRequest) -> RunCodeResponse:
        return RunCodeResponse(status=RunStatus.SandboxError, message="runner exploded")

    with pytest.raises(DatasetHTTPError) as info:
        MBPPKind().evaluate(MBPP_ROW, submit("x"), FakeRunner(sandbox_error))
    assert (info.value.status, info.value.detail) == (500, "failed to request sandbox: runner exploded")


# -- HumanEval --------------------------------------------------------------------------------------

HUMANEVAL_ROW = {
    "id": 0,
    "task_id": "S/0",
    "prompt": 'def inc(x):\n    """Add one."""\n',
    "test": "def check(candidate):\n    assert candidate(1) == 2\n",
    "entry_point": "inc",
}


def test_humaneval_prompt_and_labels() -> None:
    prompt = HumanEvalKind().prompt(HUMANEVAL_ROW, "h", TestConfig())
    assert prompt.prompt == HUMANEVAL_ROW["prompt"]
    assert prompt.labels == {k: v for k, v in HUMANEVAL_ROW.items() if k != "prompt"}
    freeform = HumanEvalKind().prompt(HUMANEVAL_ROW, "h", TestConfig(extra={"is_freeform": True}))
    assert isinstance(freeform.prompt, str) and freeform.prompt.startswith(
        '```python\ndef inc(x):\n    """Add one."""\n\n```\n\n'
    )


def test_humaneval_completion_ends_at_first_unindented_line() -> None:
    runner = FakeRunner()
    result = HumanEvalKind().evaluate(HUMANEVAL_ROW, submit("    return x + 1\n\nprint(inc(1))\n"), runner)
    assert result.extracted_code == "    return x + 1\n"
    assert result.full_code is not None
    program = result.full_code.split("from collections import *\n", 1)[1]
    assert (
        program
        == 'def inc(x):\n    """Add one."""\n\n    return x + 1\n\ndef check(candidate):\n    assert candidate(1) == 2\n\ncheck(inc)'
    )
    assert result.full_code.startswith("import math\nimport re\n")
    assert result.extracted_type is None
    assert (runner.requests[0].run_timeout, runner.requests[0].compile_timeout) == (20, 20)


def test_humaneval_freeform_extracts_the_block() -> None:
    runner = FakeRunner()
    completion = "Here you go:\n```python\ndef inc(x):\n    return x + 1\n```"
    result = HumanEvalKind().evaluate(HUMANEVAL_ROW, submit(completion, extra={"is_freeform": True}), runner)
    assert result.extracted_code == "def inc(x):\n    return x + 1"
    assert result.extracted_type == "fenced"
    assert result.full_code is not None and result.full_code.endswith(
        "def inc(x):\n    return x + 1\ndef check(candidate):\n    assert candidate(1) == 2\n\ncheck(inc)"
    )


# -- online judge -----------------------------------------------------------------------------------

OJ_ROW = {
    "id": 3,
    "content": "Add two numbers.",
    "labels": {"name": "sum"},
    "test": [
        {"input": {"stdin": "1 2\n"}, "output": {"stdout": "3\n"}},
        {"input": {"stdin": "5 5\n"}, "output": {"stdout": "10\n"}},
    ],
}


def adder(request: RunCodeRequest) -> RunCodeResponse:
    a, b = map(int, (request.stdin or "0 0").split())
    return ok(f"{a + b}\n")


def test_oj_prompt_instruction_follows_language() -> None:
    python = CommonOJKind().prompt(OJ_ROW, "o", TestConfig(language="python"))
    assert isinstance(python.prompt, str) and python.prompt.startswith(
        "Add two numbers.\n\nWrite a complete Python program."
    )
    rust = CommonOJKind().prompt(OJ_ROW, "o", TestConfig(language="rust"))
    assert isinstance(rust.prompt, str) and "in rust with an entry point" in rust.prompt
    assert python.labels == {"name": "sum"}


def test_oj_needs_a_language() -> None:
    with pytest.raises(DatasetHTTPError) as info:
        CommonOJKind().evaluate(OJ_ROW, submit("x"), FakeRunner())
    assert (info.value.status, info.value.detail) == (
        400,
        "config.language field must exist for CommonOJDataset, got None",
    )


def test_oj_runs_every_case_with_its_stdin() -> None:
    runner = FakeRunner(adder)
    result = CommonOJKind().evaluate(
        OJ_ROW, submit("```python\nprint(sum(map(int, input().split())))\n```", language="python"), runner
    )
    assert result.accepted
    assert [t.passed for t in result.tests] == [True, True]
    assert [t.test_info for t in result.tests] == OJ_ROW["test"]
    assert sorted(r.stdin or "" for r in runner.requests) == ["1 2\n", "5 5\n"]
    assert {(r.language, r.run_timeout, r.compile_timeout) for r in runner.requests} == {("python", 10, 10)}
    assert (result.extracted_code, result.extracted_type, result.full_code) == (
        "print(sum(map(int, input().split())))",
        "fenced",
        None,
    )


def test_oj_one_wrong_case_rejects() -> None:
    def off_by_one(request: RunCodeRequest) -> RunCodeResponse:
        return ok("3\n") if request.stdin == "1 2\n" else ok("11\n")

    result = CommonOJKind().evaluate(OJ_ROW, submit("print(1)", language="python"), FakeRunner(off_by_one))
    assert not result.accepted
    assert [t.passed for t in result.tests] == [True, False]
    assert result.extracted_type == "empty"  # no fence, no definition: nothing to extract


def test_oj_program_failure_fails_the_case() -> None:
    result = CommonOJKind().evaluate(OJ_ROW, submit("x", language="python"), FakeRunner(lambda r: failed()))
    assert [t.passed for t in result.tests] == [False, False]


def test_oj_file_inputs_and_outputs() -> None:
    row = {**OJ_ROW, "test": [{"input": {"stdin": "", "data.txt": "4"}, "output": {"answer.txt": "8"}}]}

    def doubler(request: RunCodeRequest) -> RunCodeResponse:
        value = int(base64.b64decode(request.files["data.txt"] or ""))
        assert request.fetch_files == ["answer.txt"]
        return ok("", files={"answer.txt": base64.b64encode(f"{2 * value}\n".encode()).decode()})

    result = CommonOJKind().evaluate(row, submit("x", language="python"), FakeRunner(doubler))
    assert result.accepted


def test_oj_missing_output_file_fails() -> None:
    row = {**OJ_ROW, "test": [{"input": {"stdin": ""}, "output": {"answer.txt": "8"}}]}
    assert not CommonOJKind().evaluate(row, submit("x", language="python"), FakeRunner()).accepted


@pytest.mark.parametrize(
    ("expected", "actual", "same"),
    [
        ("3\n", "3\n", True),
        ("3\n", "3", True),
        ("YES\nno\n", "yes\nNO\n\n", True),
        ("1 2\n", " 1 2 \n", True),
        ("3.141593\n", "3.14159265\n", True),
        ("3.14\n", "3.15\n", False),
        ("1 2\n", "1  2\n", False),
        ("a\nb\n", "a\n", False),
        ("0.0\n", "-0.0\n", True),
    ],
)
def test_outputs_match(expected: str, actual: str, same: bool) -> None:
    assert outputs_match(expected, actual) is same


def test_oj_cases_as_json_text_and_kind_matching() -> None:
    import json

    row = {**OJ_ROW, "test": json.dumps(OJ_ROW["test"])}
    assert CommonOJKind().matches(row)
    assert CommonOJKind().evaluate(row, submit("x", language="python"), FakeRunner(adder)).accepted
    assert not CommonOJKind().matches({"id": 1, "test": "def check(): pass"})
    assert not MBPPKind().matches(OJ_ROW)
    assert HumanEvalKind().matches(HUMANEVAL_ROW)
