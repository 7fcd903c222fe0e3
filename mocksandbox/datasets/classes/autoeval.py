"""``AutoEvalDataset``: free-form questions in any language, with tests and files in the row.

Rows: ``{id, content, labels: {programming_language, execution_language?, context?, fewshot?,
prompt_template?}, test: {code, asset?}}``; ``config.extra`` may override ``context``, ``fewshot``
and ``prompt_template`` (``$question``, ``$fewshot``, ``$context``, ``$locale``). The answer's best
block (Java: NaturalCodeBench's extraction, run as JUnit classes) replaces ``#<INSERT>`` in
``test.code`` or comes before it; an HTML answer without an insertion point becomes ``index.html``.
``config.extra.append_flag`` makes a Python program print a random flag that must appear in its
output; Jest runs answer their cases in ``extra.jest_cases``.
"""

from __future__ import annotations

import base64
import json
import secrets
import string
from collections.abc import Sequence
from string import Template
from typing import Any, ClassVar

from mocksandbox.datasets.classes.humaneval import merge_go_imports
from mocksandbox.datasets.classes.small import extract_java_code, java_files_listing, java_test_files
from mocksandbox.datasets.extraction import default_extract_helper, remove_entrypoints
from mocksandbox.datasets.kinds import DatasetClass, EvalContext, ensure_json, single_test_result
from mocksandbox.datasets.models import (
    EvalResult,
    Prompt,
    SubmitRequest,
    TestConfig,
)
from mocksandbox.models import RunCodeRequest, RunCodeResponse, RunStatus

_COLUMNS = ("id", "labels", "content")


def append_test(code: str, test: str, repr_code: bool = False) -> str:
    """``code`` at ``#<INSERT>`` in ``test`` (as a Python literal with ``repr_code``), else before it."""
    if "#<INSERT>" in test:
        parts = test.split("#<INSERT>")
        return parts[0] + (repr(code) if repr_code else code) + parts[1]
    if "if __name__ ==" in code:
        code = code[: code.index("if __name__ ==")]
    return (repr(code) if repr_code else code) + "\n" + test


def parse_jest_cases(report: str | dict[str, Any]) -> list[dict[str, Any]]:
    """Jest's JSON report as one entry per test case."""
    data = json.loads(report) if isinstance(report, str) else report
    return [
        {
            "passed": case["status"] == "passed",
            "full_name": case["fullName"],
            "file": suite["testFilePath"],
            "suite": " > ".join(case["ancestorTitles"]),
            "test": case["title"],
            "failure_messages": case["failureMessages"],
        }
        for suite in data["testResults"]
        for case in suite["testResults"]
    ]


class AutoEvalDataset(DatasetClass):
    class_name: ClassVar[str] = "AutoEvalDataset"

    prompt_columns: ClassVar[Sequence[str]] = _COLUMNS

    @staticmethod
    def build_prompt(row: dict[str, Any], config: TestConfig) -> Prompt:
        labels = ensure_json(row, "labels")
        question = row["content"]
        context = config.extra.get("context", labels.get("context"))
        fewshot = config.extra.get("fewshot", labels.get("fewshot")) if config.is_fewshot else None
        template = config.extra.get("prompt_template", labels.get("prompt_template"))
        if config.is_fewshot and fewshot is None:
            raise ValueError(f"Missing fewshot for id {row['id']}")
        if template:
            prompt = Template(template).safe_substitute(
                question=question, fewshot=fewshot or "", context=context or "", locale=config.locale
            )
        else:
            if config.locale == "zh":
                q_hint, a_hint = "问题：", "答案："
            elif config.locale == "en":
                q_hint, a_hint = "Question:", "Answer:"
            elif context or fewshot:  # SandboxFusion never set the hints for another locale
                raise UnboundLocalError(
                    "cannot access local variable 'q_hint' where it is not associated with a value"
                )
            separator = "----------------"
            if context and fewshot:
                prompt = f"{context}\n\n{separator}\n\n{fewshot}\n\n{q_hint}{question}\n\n{a_hint}\n"
            elif context:
                prompt = f"{context}\n\n{q_hint}{question}\n\n{a_hint}\n"
            elif fewshot:
                prompt = f"{fewshot}\n\n{q_hint}{question}\n\n{a_hint}\n"
            else:
                prompt = question
        return Prompt(id=row["id"], prompt=prompt, labels=labels)

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        row = ctx.row(request, ("test", "labels"))
        labels = ensure_json(row, "labels")
        test = ensure_json(row, "test")
        asset = test.get("asset")
        if isinstance(asset, str):
            asset = json.loads(asset)
        if not isinstance(asset, dict):
            asset = {}
        config = request.config
        language = labels["programming_language"]
        execution_language = labels.get("execution_language", language)
        append_flag = bool(config.extra.get("append_flag")) and execution_language == "python"
        flag = ""
        fetch_files: list[str] = []
        if language == "java":
            codes = extract_java_code(request.completion)
            code = "\n\n".join(codes)
            files = java_test_files(codes, test["code"])
            full_code = java_files_listing(files)
            run = RunCodeRequest(
                code="",
                language="junit",
                compile_timeout=config.compile_timeout or 40,
                run_timeout=config.run_timeout or 20,
                files={**asset, **files},
                fetch_files=fetch_files,
            )
        else:
            code = remove_entrypoints(default_extract_helper(request.completion, language), language)
            if language == "html" and "#<INSERT>" not in test["code"]:
                # The page goes to index.html as it is, not escaped into the test.
                asset["index.html"] = base64.b64encode(code.encode("utf-8")).decode("utf-8")
                full_code = test["code"]
            else:
                full_code = append_test(code, test["code"], bool(config.extra.get("repr_code", False)))
            if execution_language == "jest":
                fetch_files.append("jest-report.json")
            if execution_language in ("go", "go_test"):
                full_code = merge_go_imports(full_code)
            if append_flag:
                flag = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(20))
                full_code += f'\n\nprint("{flag}")'
            run = RunCodeRequest(
                code=full_code,
                language=execution_language,
                compile_timeout=config.compile_timeout or 40,
                run_timeout=config.run_timeout or 20,
                files=asset,
                fetch_files=fetch_files,
            )
        result = ctx.run(run)
        accepted = result.status == RunStatus.Success
        if append_flag and flag not in _stdout(result):
            accepted = False
        extra: dict[str, Any] = {}
        if execution_language == "jest" and "jest-report.json" in result.files:
            report = base64.b64decode(result.files["jest-report.json"]).decode("utf-8")
            extra["jest_cases"] = parse_jest_cases(report)
        return single_test_result(request, result, code, full_code, accepted=accepted, extra=extra)


def _stdout(result: RunCodeResponse) -> str:
    if result.run_result is None or result.run_result.stdout is None:
        raise AttributeError("'NoneType' object has no attribute 'stdout'")
    return result.run_result.stdout
