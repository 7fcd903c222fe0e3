"""``MBPPDataset``: assert-based Python tests.

Rows: ``{id, content, labels: {test_setup_code, ...}, test_list: [assert, ...]}``. The prompt asks
for a function that passes the asserts (few-shot: three solved tasks first, then the first two
asserts and ``[BEGIN]``). A completion is cut at ``[DONE]``, its first block taken, and cut again at
the first ``assert`` or docstring after it; the setup code, the code and every assert (few-shot:
only the last) run as one program.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from mocksandbox.datasets.classes.texts import MBPP_FEWSHOT_TASKS
from mocksandbox.datasets.extraction import extract_code_from_freeform_completion
from mocksandbox.datasets.kinds import DatasetClass, EvalContext, ensure_json, single_test_result
from mocksandbox.datasets.models import (
    EvalResult,
    Prompt,
    SubmitRequest,
    TestConfig,
)
from mocksandbox.models import RunCodeRequest

_COLUMNS = ("id", "content", "labels", "test_list")
_STOP_WORDS = ("\nassert", '\n"""')


def mbpp_completion_code(completion: str) -> str:
    """The code of a completion: up to ``[DONE]``, first block, cut at the first stop word."""
    if "[DONE]" in completion:
        completion = completion[: completion.index("[DONE]")]
    code, _ = extract_code_from_freeform_completion(completion, "python", first_block_only=True)
    for stop in _STOP_WORDS:
        index = code.find(stop)
        if index != -1:
            code = code[:index]
    return code


class MBPPDataset(DatasetClass):
    class_name: ClassVar[str] = "MBPPDataset"
    dataset_tables: ClassVar[dict[str, str]] = {"mbpp": "code_eval_mbpp"}

    def matches(self, row: dict[str, Any]) -> bool:
        return "test_list" in row and "content" in row and "labels" in row

    prompt_columns: ClassVar[Sequence[str]] = _COLUMNS

    @staticmethod
    def build_prompt(row: dict[str, Any], config: TestConfig) -> Prompt:
        ensure_json(row, "labels")
        tests: list[str] = ensure_json(row, "test_list")
        intro = f"You are an expert Python programmer, and here is your task: {row['content']} "
        if config.is_fewshot:
            task = f"{intro}Your code should pass these tests:\n\n{tests[0]}\n{tests[1]}\n[BEGIN]\n"
            prompt = "\n".join([*MBPP_FEWSHOT_TASKS, task])
        else:
            joined = "\n".join(tests)
            prompt = f"{intro}Your code should pass these tests:\n\n{joined}"
        return Prompt(id=row["id"], prompt=prompt, labels=row["labels"])

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        row = ctx.row(request, _COLUMNS)
        labels = ensure_json(row, "labels")
        tests: list[str] = ensure_json(row, "test_list")
        code = "\n".join([labels["test_setup_code"], mbpp_completion_code(request.completion)])
        if "if __name__ ==" in code:
            code = code[: code.index("if __name__ ==")]
        run_tests = [tests[-1]] if request.config.is_fewshot else tests
        full_code = code + "".join(f"\n{test}\n" for test in run_tests)
        result = ctx.run(
            RunCodeRequest(code=full_code, language="python", run_timeout=request.config.run_timeout or 20)
        )
        return single_test_result(request, result, code, full_code)
