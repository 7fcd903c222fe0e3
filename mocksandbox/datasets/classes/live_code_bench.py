"""``LiveCodeBenchDataset``: LiveCodeBench problems, judged by LiveCodeBench's own harness.

Rows: ``{id, content, labels, test: {input_output: JSON of {inputs, outputs, fn_name?}}}`` (``test``
may also be base64 of a zlib-compressed pickle, as LiveCodeBench ships its private cases). The
prompt is ``content`` (few-shot: three solved questions, then the question and its starter code).
The best Python block is written as ``code.py`` beside the cases and the harness, and the test
program exits 0 when every case passes; the run gets ``(timeout + 1) * cases + 5`` seconds, at most
160, ``timeout`` being ``config.run_timeout`` or 6 per case.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import re
import zlib
from collections.abc import Sequence
from typing import Any, ClassVar

from mocksandbox.datasets.classes.texts import LCB_FEWSHOT_PREFIX, LCB_TEST_CODE, LCB_TESTING_UTIL
from mocksandbox.datasets.extraction import default_extract_helper
from mocksandbox.datasets.kinds import DatasetClass, EvalContext, ensure_json, single_test_result
from mocksandbox.datasets.models import (
    EvalResult,
    Prompt,
    SubmitRequest,
    TestConfig,
)
from mocksandbox.models import RunCodeRequest

_COLUMNS = ("id", "labels", "content")


class _DataOnlyUnpickler(pickle.Unpickler):
    """Lists, dicts, strings and numbers only: a row's cases are data, and a pickle that names a
    class or function (which could run code in this process) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global '{module}.{name}' is forbidden")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("utf-8")


def fewshot_prompt(prompt: str) -> str:
    """The question and starter code of ``prompt`` behind LiveCodeBench's few-shot examples."""
    question = re.search(r"### Question:\n(.*)\n\n### Format:", prompt, re.DOTALL)
    starter = re.search(r"### Format: .*\n```python\n(.*)\n```\n\n", prompt, re.DOTALL)
    if question is None or starter is None:
        raise AssertionError()
    starter_code: str | None = starter.group(1)
    if starter_code == "# YOUR CODE HERE":
        starter_code = None
    text = LCB_FEWSHOT_PREFIX + question.group(1) + "\n\n"
    if starter_code:
        text += (
            "### Format: You will use the following starter code to write the solution to the problem and "
            f"enclose your code within delimiters.\n```python\n{starter_code}\n```"
        )
    else:
        text += (
            "### Format: Read the inputs from stdin solve the problem and write the answer to stdout (do not "
            "directly test on the sample inputs). Enclose your code within delimiters as follows."
            "\n```python\n```"
        )
    return text + "\n\n### Answer: (use the provided format with backticks)\n"


class LiveCodeBenchDataset(DatasetClass):
    class_name: ClassVar[str] = "LiveCodeBenchDataset"
    dataset_tables: ClassVar[dict[str, str]] = {"live_code_bench_v1": "code_eval_live_code_bench_v1"}

    prompt_columns: ClassVar[Sequence[str]] = _COLUMNS

    @staticmethod
    def build_prompt(row: dict[str, Any], config: TestConfig) -> Prompt:
        prompt = fewshot_prompt(row["content"]) if config.is_fewshot else row["content"]
        return Prompt(id=row["id"], prompt=prompt, labels=ensure_json(row, "labels"))

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        row = ctx.row(request, ("id", "labels", "content", "test"))
        ensure_json(row, "labels")
        timeout = int(request.config.run_timeout or 6)
        try:
            cases = ensure_json(row, "test")
        except (ValueError, TypeError):
            packed = zlib.decompress(base64.b64decode(row["test"]))
            cases = _DataOnlyUnpickler(io.BytesIO(packed)).load()
        case_count = len(json.loads(cases["input_output"])["inputs"])
        code = default_extract_helper(request.completion, "python", request.config.custom_extract_logic)
        test_code = LCB_TEST_CODE % {"timeout": timeout}
        files = {
            "test_cases.txt": _b64(json.dumps(cases)),
            "code.py": _b64(code),
            "testing_util.py": _b64(LCB_TESTING_UTIL),
        }
        result = ctx.run(
            RunCodeRequest(
                code=test_code,
                language="python",
                run_timeout=min((timeout + 1) * case_count + 5, 160),
                files=files,
            )
        )
        return single_test_result(request, result, code, code, test_code=test_code)
