"""``VerilogDataset`` (VerilogEval): a module body completed after its header, run by a testbench.

Rows: ``{id, task_id, code_preface, description, canonical_solution, test, labels: {system_prompt,
question_prompt, fewshot}}``. The prompt is the system and question prompts, the description and
the header in a verilog block (few-shot: the examples first). The first block of the completion
(v2 extraction: ``module ... endmodule`` reduced to its body) follows the header, after the
testbench; ``iverilog`` compiles and runs it.
"""

from __future__ import annotations

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
from mocksandbox.models import RunCodeRequest

_COLUMNS = ("id", "code_preface", "description", "labels")


class VerilogDataset(DatasetClass):
    class_name: ClassVar[str] = "VerilogDataset"
    dataset_tables: ClassVar[dict[str, str]] = {
        "verilogeval_human": "code_eval_verilogeval_human",
        "verilogeval_machine": "code_eval_verilogeval_machine",
    }
    needs: ClassVar[str] = "iverilog"

    def get_prompts(self, request: GetPromptsRequest, ctx: EvalContext) -> list[Prompt]:
        rows = ctx.rows(request, _COLUMNS)
        for row in rows:
            ensure_json(row, "labels")
        return [self._prompt(row, request.config) for row in rows]

    def get_prompt_by_id(self, request: GetPromptByIdRequest, ctx: EvalContext) -> Prompt:
        row = ctx.row(request, _COLUMNS)
        ensure_json(row, "labels")
        return self._prompt(row, request.config)

    @staticmethod
    def _prompt(row: dict[str, Any], config: TestConfig) -> Prompt:
        labels = row["labels"]
        question = (
            f"{labels['system_prompt']}\n{labels['question_prompt']}\n{row['description']}\n"
            f"```verilog\n{row['code_preface']}```"
        )
        fewshot = labels["fewshot"] if config.is_fewshot else None
        prompt = f"{fewshot}\n\n----------------\n\nQuestion:\n{question}\n\nAnswer:" if fewshot else question
        return Prompt(id=row["id"], prompt=prompt)

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        row = ctx.row(request, ("task_id", "code_preface", "canonical_solution", "test"))
        completion, _ = extract_code_from_freeform_completion_v2(
            request.completion, language="verilog", first_block_only=True
        )
        full_code = f"{row['code_preface']}\n{completion}"
        test_code = row["test"]
        result = ctx.run(
            RunCodeRequest(
                code=f"{test_code}\n{full_code}",
                language="verilog",
                compile_timeout=request.config.compile_timeout or 60,
                run_timeout=request.config.run_timeout or 30,
            )
        )
        return single_test_result(request, result, completion, full_code, test_code=test_code)
