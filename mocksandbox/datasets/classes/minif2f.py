"""``MiniF2FLean4Dataset``: miniF2F theorems to prove in Lean 4 with Mathlib.

Rows: ``{id, content, labels, ...}``; ``id`` is the theorem's name. The prompt asks for the proof of
``content`` (``locale`` ``en`` in English, else Chinese), or fills ``config.extra.prompt_template``
(``{column}`` fields). The proof, completed from the statement when the answer is a bare code
block, runs after SandboxFusion's Mathlib imports with ``lake build``; it must keep the theorem and
use no ``sorry``. A host without Lean and Mathlib answers as SandboxFusion's sandbox does without
them (the run fails, the answer is not accepted).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from mocksandbox.datasets.classes.texts import MINIF2F_HEADERS
from mocksandbox.datasets.extraction import default_extract_helper
from mocksandbox.datasets.kinds import DatasetClass, EvalContext, ensure_json, single_test_result
from mocksandbox.datasets.models import (
    EvalResult,
    GetPromptByIdRequest,
    GetPromptsRequest,
    Prompt,
    SubmitRequest,
    TestConfig,
)
from mocksandbox.models import RunCodeRequest, RunStatus

_WHOLE_MATHLIB = re.compile(r"\bimport\s+Mathlib\b(?!\.)")


def move_imports_and_opens_to_top(code: str) -> str:
    """Imports (but a whole-Mathlib one), then ``open`` lines, a blank line, the rest."""
    imports, opens, others = [], [], []
    for line in code.split("\n"):
        stripped = line.strip()
        if stripped.startswith("import "):
            if not _WHOLE_MATHLIB.search(stripped):
                imports.append(line)
        elif stripped.startswith("open "):
            opens.append(line)
        else:
            others.append(line)
    return "\n".join([*imports, *opens, "", *others]).strip()


def remove_imports(code: str) -> str:
    return "\n".join(line for line in code.split("\n") if not line.strip().startswith("import ")).strip()


def _template_fields(config: TestConfig) -> list[str]:
    return re.findall(r"{(\w+)}", config.extra["prompt_template"])


class MiniF2FLean4Dataset(DatasetClass):
    class_name: ClassVar[str] = "MiniF2FLean4Dataset"
    dataset_tables: ClassVar[dict[str, str]] = {
        "minif2f_lean4_test": "code_eval_minif2f_lean4_test",
        "minif2f_lean4_valid": "code_eval_minif2f_lean4_valid",
    }
    needs: ClassVar[str] = "lake (Lean 4 with Mathlib)"

    @staticmethod
    def _columns(config: TestConfig) -> list[str]:
        if "prompt_template" in config.extra:
            return ["id", "labels", *_template_fields(config)]
        return ["id", "labels", "content"]

    def get_prompts(self, request: GetPromptsRequest, ctx: EvalContext) -> list[Prompt]:
        return [self._prompt(row, request.config) for row in ctx.rows(request, self._columns(request.config))]

    def get_prompt_by_id(self, request: GetPromptByIdRequest, ctx: EvalContext) -> Prompt:
        return self._prompt(ctx.row(request, self._columns(request.config)), request.config)

    @staticmethod
    def _formatted(row: dict[str, Any], config: TestConfig) -> str:
        template: str = config.extra["prompt_template"]
        return template.format_map({field: row[field] for field in _template_fields(config)})

    def _prompt(self, row: dict[str, Any], config: TestConfig) -> Prompt:
        if "prompt_template" in config.extra:
            prompt = self._formatted(row, config)
        else:
            locale = config.locale or "zh-CN"
            prefix = (
                "Please finish the following theorem in Lean4:"
                if locale == "en"
                else "请使用 Lean4 完成下面的证明："
            )
            prompt = f"{prefix}\n\n```lean\n{row['content']}\n```"
        return Prompt(id=row["id"], prompt=prompt, labels=ensure_json(row, "labels"))

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        config = request.config
        row = ctx.row(request, self._columns(config))
        ensure_json(row, "labels")
        completion = request.completion
        theorem = f"theorem {row['id']}"
        if theorem in completion:
            code = default_extract_helper(completion, "lean", config.custom_extract_logic)
        elif completion.strip().startswith("```") or completion.strip().endswith("```"):
            # A bare proof block: the statement (without `sorry`) is put in front of it.
            prompt = (
                self._formatted(row, config)
                if "prompt_template" in config.extra
                else f"```lean\n{row['content']}\n"
            )
            prompt = prompt.replace("sorry", "")
            response = completion
            for prefix in ("```lean4", "```lean", "```"):
                if completion.strip().startswith(prefix):
                    response = completion[completion.find(prefix) + len(prefix) :]
                    break
            code = default_extract_helper(prompt + response, "lean", config.custom_extract_logic)
        else:
            code = default_extract_helper(completion, "lean", config.custom_extract_logic)
        full_code = move_imports_and_opens_to_top(f"{MINIF2F_HEADERS}\n\n{remove_imports(code)}")
        result = ctx.run(
            RunCodeRequest(code=full_code, language="lean", run_timeout=config.run_timeout or 300)
        )
        accepted = result.status == RunStatus.Success
        if accepted:
            run = result.run_result
            if theorem not in full_code:
                accepted = False
            if run is not None and run.return_code == 0 and "declaration uses 'sorry'" in (run.stdout or ""):
                accepted = False
        return single_test_result(request, result, code, full_code, accepted=accepted)
