"""``CommonOJDataset``: online-judge problems judged on stdin/stdout cases.

Rows: ``{id, content, labels, test: [{input: {stdin}, output: {stdout}}, ...]}``. The prompt is the
statement plus an instruction for ``config.language`` (``locale`` ``zh`` or English). A submission
needs ``config.language``; the best block of the completion (see
:func:`~mocksandbox.datasets.extraction.default_extract_helper`) runs once per case,
``max_runner_concurrency`` cases at a time, and the verdict stops at the first failing case unless
``config.extra.run_all_cases``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from mocksandbox.datasets.errors import DatasetHTTPError
from mocksandbox.datasets.extraction import default_extract_helper
from mocksandbox.datasets.kinds import DatasetClass, EvalContext, check_stdio_cases, ensure_json
from mocksandbox.datasets.models import (
    EvalResult,
    Prompt,
    SubmitRequest,
    TestConfig,
)

_PROMPT_COLUMNS = ("id", "labels", "content")

#: Instructions by locale and language (SandboxFusion's texts).
LANGUAGE_PROMPTS: dict[str, dict[str, str]] = {
    "en": {
        "default": "Please implement complete executable code with an entry point in {language}. "
        "Your program should read input from standard input and write output to standard output.",
        "cpp": "Please implement complete executable code including a main function in C++. "
        "Your program should read input from standard input and write output to standard output.",
        "python": "Please implement a complete Python script. "
        "Your program should read input from standard input and write output to standard output.",
        "java": "Please implement a complete Java program with a public class named Main. "
        "Your class should include a public static void main(String[] args) method. "
        "Your program should read input from System.in and write output to System.out.",
    },
    "zh": {
        "default": "请使用 {language} 实现一个完整的可执行程序，包含程序入口。"
        "你的程序应该从标准输入读取数据，并将结果输出到标准输出。",
        "cpp": "请使用 C++ 实现一个完整的可执行程序，包含 main 函数。"
        "你的程序应该从标准输入读取数据，并将结果输出到标准输出。",
        "python": "请编写一个完整的 Python 脚本。你的程序应该从标准输入读取数据，并将结果输出到标准输出。",
        "java": "请实现一个完整的 Java 程序，包含一个名为 Main 的公共类。"
        "你的类中应包含 public static void main(String[] args) 方法。"
        "你的程序应该从 System.in 读取输入，并将结果输出到 System.out。",
    },
}


class CommonOJDataset(DatasetClass):
    class_name: ClassVar[str] = "CommonOJDataset"
    dataset_tables: ClassVar[dict[str, str]] = {"code_contests": "code_eval_code_contests"}

    def matches(self, row: dict[str, Any]) -> bool:
        try:
            cases = ensure_json(dict(row), "test")
        except (KeyError, ValueError):
            return False
        return (
            "content" in row
            and isinstance(cases, list)
            and all(isinstance(case, dict) and "input" in case and "output" in case for case in cases)
        )

    prompt_columns: ClassVar[Sequence[str]] = _PROMPT_COLUMNS

    @staticmethod
    def build_prompt(row: dict[str, Any], config: TestConfig) -> Prompt:
        prompts = LANGUAGE_PROMPTS.get(config.locale or "", LANGUAGE_PROMPTS["en"])
        instruction = prompts.get(config.language or "", prompts["default"])
        prompt = f"{row['content']}\n\n{instruction.format(language=config.language)}"
        return Prompt(id=row["id"], prompt=prompt, labels=ensure_json(row, "labels"))

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        config = request.config
        if not config.language:
            raise DatasetHTTPError(400, "config.language field must exist for CommonOJDataset, got None")
        row = ctx.row(request, ("test",))
        cases = ensure_json(row, "test")
        code = default_extract_helper(request.completion, config.language, config.custom_extract_logic)
        outcomes = check_stdio_cases(code, cases, config, ctx)
        return EvalResult(
            id=request.id,
            accepted=all(outcome.passed for outcome in outcomes),
            extracted_code=code,
            tests=outcomes,
        )
