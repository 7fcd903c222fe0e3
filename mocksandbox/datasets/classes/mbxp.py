"""``MBXPDataset``: MBXP, HumanEval-DS and OOD tests, many languages, tests in the row.

Rows: ``{id, content, canonical_solution, labels: {task_id, programming_language,
execution_language, docs?, fewshot?}, test: {code, asset?}}``. The prompt is the question, with
context (``labels.docs``), few-shot examples (``labels.fewshot`` or
``config.extra.autoeval_custom_fewshot``) and question/answer hints in the dataset's locale (ids
with ``_en`` are English). The first block in the row's language (v2 extraction; or every block
with ``config.extra.autoeval_extract_code_mode = "all"``) replaces ``#<INSERT>`` in ``test.code``;
the files of ``test.asset`` are written beside it. Python and C++ answers that call ``exit(0)`` are
rejected; Racket answers fail on ``FAILURE`` in stderr.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from mocksandbox.datasets.extraction import extract_code_from_freeform_completion_v2
from mocksandbox.datasets.kinds import DatasetClass, EvalContext, ensure_json, single_test_result
from mocksandbox.datasets.models import (
    EvalResult,
    GetPromptByIdRequest,
    GetPromptsRequest,
    Prompt,
    SubmitRequest,
    TestConfig,
)
from mocksandbox.models import RunCodeRequest, RunCodeResponse

_COLUMNS = ("id", "labels", "content")
_EXIT_ZERO = re.compile(r"exit\(\s*0\s*\)")
#: Execution languages whose answers may not end the program early with ``exit(0)`` (anti-hack).
ANTI_HACK_LANGUAGES = frozenset({"python", "cpp"})

_HINTS = {
    "zh": ("问题：", "答案：", "请用中文回答，并用Markdown格式。####Instruction:", "Response:"),
    "en": (
        "Question:",
        "Answer:",
        "Please answer in English with Markdown format. ####Instruction:",
        "Response:",
    ),
}


def build_question_prompt(
    question: str, fewshot: str | None, context: str | None, wrap: bool, locale: str
) -> str:
    """Context, few-shot examples and question, top to bottom (SandboxFusion's four cases)."""
    q_hint, a_hint, wrap_instruction, wrap_response = _HINTS[locale]
    separator = "----------------"
    if context and fewshot:
        return f"{context}\n\n{separator}\n\n{fewshot}\n\n{q_hint}{question}\n\n{a_hint}\n"
    if context:
        if wrap:
            return f"{context}\n\n{wrap_instruction}\n{question}\n{wrap_response}\n"
        return f"{context}\n\n{q_hint}{question}\n\n{a_hint}\n"
    if fewshot:
        return f"{fewshot}\n\n{q_hint}{question}\n\n{a_hint}\n"
    return f"{wrap_instruction}\n{question}\n{wrap_response}\n" if wrap else question


def test_assets(test: dict[str, Any]) -> dict[str, Any]:
    """``test.asset`` as files (an object or its JSON text), without null entries."""
    asset = test.get("asset")
    if isinstance(asset, str):
        asset = json.loads(asset)
    if not isinstance(asset, dict):
        asset = {}
    return {name: content for name, content in asset.items() if content is not None}


class MBXPDataset(DatasetClass):
    class_name: ClassVar[str] = "MBXPDataset"
    dataset_tables: ClassVar[dict[str, str]] = {
        "mbxp_v1_en": "code_eval_mbxp_v1_en",
        "humanevalds_v1_en": "code_eval_humanevalds_v1_en",
        "oodtest_v1_zh": "code_eval_oodtest_v1_zh",
        "humanevalds_v2_en": "code_eval_humanevalds_v2_en",
        "mbxp_v2_en": "code_eval_mbxp_v2_en",
    }

    def get_prompts(self, request: GetPromptsRequest, ctx: EvalContext) -> list[Prompt]:
        rows = ctx.rows(request, _COLUMNS)
        for row in rows:
            ensure_json(row, "labels")
        locale = "en" if "_en" in request.dataset else "zh"
        return [self._prompt(row, request.config, locale) for row in rows]

    def get_prompt_by_id(self, request: GetPromptByIdRequest, ctx: EvalContext) -> Prompt:
        row = ctx.row(request, _COLUMNS)
        ensure_json(row, "labels")
        return self._prompt(row, request.config, "en" if "_en" in request.dataset else "zh")

    @staticmethod
    def _prompt(row: dict[str, Any], config: TestConfig, locale: str) -> Prompt:
        labels = row["labels"]
        task_id = labels["task_id"]
        fewshot = None
        if config.is_fewshot:
            custom = config.extra.get("autoeval_custom_fewshot", {})
            if not isinstance(custom, dict):
                raise AssertionError()
            task_type = task_id.split("/")[0]
            if task_type in custom:
                fewshot = custom[task_type]
            elif "default" in custom:
                fewshot = custom["default"]
            elif "fewshot" in labels:
                fewshot = labels["fewshot"]
            else:
                raise ValueError(f"Missing fewshot of {task_id}")
        wrap = config.extra.get("autoeval_wrap_prompt") is True
        prompt = build_question_prompt(row["content"], fewshot, labels.get("docs"), wrap, locale)
        return Prompt(id=row["id"], prompt=prompt, labels=labels)

    @staticmethod
    def _inner_function_only(dataset: str, language: str) -> bool:
        return language == "csharp" or (language == "java" and dataset.startswith("humanevalds"))

    @staticmethod
    def _post_judge(language: str, result: RunCodeResponse) -> bool | None:
        # Racket's test runner exits 0 when a check fails; it only says FAILURE on stderr.
        run = result.run_result
        if language == "racket" and run and run.stderr and "FAILURE" in run.stderr:
            return False
        return None

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        row = ctx.row(request, ("test", "labels"))
        labels = ensure_json(row, "labels")
        test = ensure_json(row, "test")
        asset = test_assets(test)
        mode = request.config.extra.get("autoeval_extract_code_mode", "first")
        if mode not in ("first", "all"):
            raise AssertionError(f"Invalid autoeval_extract_code_mode: {mode}")
        first_block_only = mode == "first"
        language = labels["programming_language"]
        code, extracted_type = extract_code_from_freeform_completion_v2(
            request.completion,
            language,
            first_block_only,
            no_removal=True,
            exactly_match=first_block_only,
            inner_function_only=self._inner_function_only(request.dataset, language),
        )
        test_code = test["code"]
        parts = test_code.split("#<INSERT>")
        full_code = parts[0] + code + parts[1]
        execution_language = labels["execution_language"]
        result = ctx.run(
            RunCodeRequest(
                code=full_code, language=execution_language, compile_timeout=30, run_timeout=30, files=asset
            )
        )
        accepted = result.status == "Success"
        if execution_language in ANTI_HACK_LANGUAGES:
            accepted = accepted and not _EXIT_ZERO.search(code)
        post = self._post_judge(language, result)
        if post is not None:
            accepted = post
        return single_test_result(
            request,
            result,
            code,
            full_code,
            accepted=accepted,
            test_code=test_code,
            extracted_type=extracted_type,
        )
