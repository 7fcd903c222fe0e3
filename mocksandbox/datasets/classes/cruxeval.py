"""``CruxEvalDataset``: CRUXEval and CRUXEval-X, predicting a function's input or output.

Rows: ``{id, code, input, output}`` (CRUXEval-X adds ``gt``; its ids start with the language,
``cpp_12``). ``/get_prompts`` answers every row in ``input`` mode, then every row in ``output``
mode, unless ``config.extra.mode`` picks one; ``/get_prompt_by_id`` defaults to ``output``. The
submission's ``config.extra.mode`` is required; the answer between ``[ANSWER]`` tags completes the
assertion, which runs in the row's language. CRUXEval-X's few-shot examples come from
SandboxFusion's ``assets/cruxeval_x_utils/examples.json`` (``--dataset-assets DIR``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from mocksandbox.datasets.classes import texts
from mocksandbox.datasets.kinds import DatasetClass, EvalContext, single_test_result
from mocksandbox.datasets.models import (
    EvalResult,
    GetPromptByIdRequest,
    GetPromptsRequest,
    Prompt,
    SubmitRequest,
    TestConfig,
)
from mocksandbox.models import RunCodeRequest

#: How CRUXEval-X writes the call whose input is asked for, by language.
CALL_TEMPLATES: dict[str, str] = {
    "cpp": "candidate(????)",
    "csharp": "F(????)",
    "D_ut": "candidate(????)",
    "go_test": "candidate(????)",
    "java": "f(????)",
    "julia": "candidate(????)",
    "nodejs": "candidate(????)",
    "lua": "candidate(????)",
    "php": "candidate(????)",
    "python": "candidate(????)",
    "perl": "$candidate->(????)",
    "R": "candidate(????)",
    "ruby": "candidate.call(????)",
    "racket": "(candidate ????)",
    "rust": "candidate(????)",
    "scala": "f(????)",
    "bash": "$(candidate ????)",
    "swift": "f(????)",
    "typescript": "candidate(????)",
}

_WRAP_INSTRUCTION = "Please respond in English and use Markdown format.####Instruction:"
_WRAP_RESPONSE = "Response:"
_COLUMNS = ("id", "input", "output", "code")


def _x_language(row_id: str) -> str:
    return "_".join(row_id.split("_")[:-1])


def _x_prompt(language: str, examples: list[dict[str, str]], snippet: str, mode: str) -> str:
    shown = ""
    for item in examples:
        if mode == "input":
            question, answer = item["code"].replace(item["inputs"], CALL_TEMPLATES[language]), item["inputs"]
        else:
            question, answer = item["code"].replace(item["outputs"], "????"), item["outputs"]
        shown += f"```{language}\n{question.strip()}\n```\n[ANSWER]\n{answer}\n[/ANSWER]\n"
    template = texts.CRUX_X_INPUT if mode == "input" else texts.CRUX_X_OUTPUT
    return template.format(language=language, examples=shown.rstrip(), code_snippet=snippet)


class CruxEvalDataset(DatasetClass):
    class_name: ClassVar[str] = "CruxEvalDataset"
    dataset_tables: ClassVar[dict[str, str]] = {
        "cruxeval": "code_eval_cruxeval",
        "cruxeval_x": "code_eval_cruxeval_x",
    }

    def get_prompts(self, request: GetPromptsRequest, ctx: EvalContext) -> list[Prompt]:
        rows = ctx.rows(request, _COLUMNS)
        modes = [request.config.extra["mode"]] if request.config.extra.get("mode") else ["input", "output"]
        if request.dataset == "cruxeval_x":
            examples = self._examples(ctx)
            return [self._prompt_x(row, examples, request.config, mode) for mode in modes for row in rows]
        return [self._prompt(row, request.config, mode) for mode in modes for row in rows]

    def get_prompt_by_id(self, request: GetPromptByIdRequest, ctx: EvalContext) -> Prompt:
        row = ctx.row(request, _COLUMNS)
        return self._prompt(row, request.config, request.config.extra.get("mode", "output"))

    @staticmethod
    def _examples(ctx: EvalContext) -> dict[str, list[dict[str, str]]]:
        path = Path(ctx.assets_dir or "assets") / "cruxeval_x_utils" / "examples.json"
        with open(path) as file:  # missing: SandboxFusion's 500 ("No such file or directory")
            examples: dict[str, list[dict[str, str]]] = json.load(file)
        return examples

    @staticmethod
    def _wrapped(prompt: str, config: TestConfig) -> str:
        if config.extra.get("coding_wrap_prompt") is True:
            return f"{_WRAP_INSTRUCTION}\n{prompt}\n{_WRAP_RESPONSE}\n"
        return prompt

    def _prompt_x(
        self, row: dict[str, Any], examples: dict[str, Any], config: TestConfig, mode: str
    ) -> Prompt:
        language = _x_language(row["id"])
        snippet = row["code"] + (row["input"] if mode == "input" else row["output"])
        prompt = _x_prompt(language, examples[language], snippet, mode)
        return Prompt(id=row["id"], prompt=self._wrapped(prompt, config), labels={"mode": mode})

    def _prompt(self, row: dict[str, Any], config: TestConfig, mode: str) -> Prompt:
        code = row["code"]
        if config.extra.get("use_cot"):
            if mode == "input":
                prompt = texts.CRUX_INPUT_COT.format(code=code, expected_output=row["output"])
            else:
                prompt = texts.CRUX_OUTPUT_COT.format(code=code, test_input=row["input"])
        elif mode == "input":
            prompt = texts.CRUX_INPUT_DIRECT.format(code=code, expected_output=row["output"])
        elif config.extra.get("phind_output"):
            prompt = texts.CRUX_PHIND_OUTPUT.format(code=code, test_input=row["input"])
        else:
            prompt = texts.CRUX_OUTPUT_DIRECT.format(code=code, test_input=row["input"])
        return Prompt(id=row["id"], prompt=self._wrapped(prompt, config), labels={"mode": mode})

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        row = ctx.row(request, ("input", "output", "code", "id"))
        mode = request.config.extra["mode"]
        completion = request.completion
        for stop in ("# done", "[/ANSWER]"):
            completion = completion.split(stop)[0]
        if "[ANSWER]" in completion:
            completion = completion.split("[ANSWER]")[1].strip()
        if mode not in ("input", "output"):
            raise AssertionError(f"Invalid code_mode: {mode}")
        code = row["code"]
        if request.dataset == "cruxeval_x":
            language = _x_language(row["id"])
            if mode == "input":
                call = CALL_TEMPLATES[language]
                if call[: call.index("????")] not in completion:
                    completion = call.replace("????", completion)
                completion = row["input"].replace(call, completion)
            else:
                completion = row["output"].replace("????", completion)
            full_code = code + completion
        else:
            language = "python"
            if "assert f" in completion:
                completion = "f" + completion.split("assert f")[1].strip()
            if "==" in completion:
                completion = completion.split("==")[0 if mode == "input" else 1].strip()
            if mode == "input":
                full_code = f"{code}\nassert {completion} == {row['output']}"
            else:
                full_code = f"{code}\nassert {completion} == f({row['input']})"
        result = ctx.run(
            RunCodeRequest(code=full_code, language=language, compile_timeout=30, run_timeout=30)
        )
        return single_test_result(request, result, completion, full_code)
