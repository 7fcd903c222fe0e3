"""RepoBench: predict the next line of a file in a repository (``RepobenchCDataset``, ``RepobenchPDataset``).

Rows: ``{id, repo_name, file_path, context, import_statement, code, next_line, ...}``; C's rows
carry a ready ``prompt``, P's are assembled here from the cross-file ``context`` snippets (the gold
one first, then others while they fit ``config.extra.max_prompt_length`` GPT-2 tokens, ordered by
MD5) and the file's last 60 lines. The dataset id ends in its language (``_python``, ``_java``).
The first line of the completion that is not a comment is compared with ``next_line`` word by word,
by a program in that language, as SandboxFusion does (its Java program asserts with assertions
disabled, so Java answers always pass).
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

from mocksandbox.datasets.kinds import DatasetClass, EvalContext, ensure_json, single_test_result
from mocksandbox.datasets.models import (
    EvalResult,
    GetPromptByIdRequest,
    GetPromptsRequest,
    Prompt,
    SubmitRequest,
    TestConfig,
)
from mocksandbox.datasets.tokenizer import MISSING_TOKENIZER
from mocksandbox.models import RunCodeRequest

# The trailing space after the first assignment is SandboxFusion's (full_code is answered as is).
_JAVA_EQUAL = """
public class Main {
    public static void main(String[] args) {
        String completion = "some value";\x20
        String nextLine = "some value";
        assert completion.equals(nextLine);
    }
}"""
_JAVA_DIFFERENT = _JAVA_EQUAL.replace('nextLine = "some value"', 'nextLine = "some other value"')

_COMMENTS = {"python": ("#", ('"""', "'''"), ('"""', "'''")), "java": ("//", ("/*",), ("*/",))}


def first_line_not_comment(code: str, language: str = "python") -> str:
    """The first non-blank line outside comments; the first line if there is none."""
    if language not in _COMMENTS:
        raise AssertionError("language must be one of [python, java]")
    line_comment, opens, closes = _COMMENTS[language]
    lines = code.lstrip("\n").split("\n")
    in_block = False
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        if not in_block and stripped.startswith(opens):
            in_block = True
            continue
        if in_block and stripped.endswith(closes):
            in_block = False
            continue
        if in_block or stripped.startswith(line_comment):
            continue
        return line
    return lines[0]


def _next_line_check(request: SubmitRequest, ctx: EvalContext, row: dict[str, Any]) -> EvalResult:
    language = request.dataset.split("_")[-1]
    completion = first_line_not_comment(request.completion, language)
    expected = row["next_line"]
    if language == "python":
        full_code = f"\ndef check():\n    assert {completion.split()} == {expected.split()}\ncheck()    \n"
    else:  # SandboxFusion leaves full_code unset for other languages and fails on it
        full_code = _JAVA_EQUAL if completion.split() == expected.split() else _JAVA_DIFFERENT
    result = ctx.run(RunCodeRequest(code=full_code, language=language, run_timeout=30))
    return single_test_result(request, result, completion, full_code)


class RepobenchCDataset(DatasetClass):
    class_name: ClassVar[str] = "RepobenchCDataset"
    dataset_tables: ClassVar[dict[str, str]] = {
        "repobench_c_python": "code_eval_repobench_c_python_sampled",
        "repobench_c_java": "code_eval_repobench_c_java_sampled",
    }
    _COLUMNS = ("id", "file_path", "context", "import_statement", "code", "prompt", "next_line")

    def get_prompts(self, request: GetPromptsRequest, ctx: EvalContext) -> list[Prompt]:
        return [self._prompt(row) for row in ctx.rows(request, self._COLUMNS)]

    def get_prompt_by_id(self, request: GetPromptByIdRequest, ctx: EvalContext) -> Prompt:
        return self._prompt(ctx.row(request, self._COLUMNS))

    @staticmethod
    def _prompt(row: dict[str, Any]) -> Prompt:
        return Prompt(id=row["id"], prompt=row["prompt"], labels={"next_line": row["next_line"]})

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        row = ctx.row(request, self._COLUMNS[1:])
        return _next_line_check(request, ctx, row)


def _commented(code: str, language: str) -> str:
    if language == "python":
        return "\n".join(f"# {line}" for line in code.split("\n"))
    if language == "java":
        return "\n".join(f"// {line}" for line in code.split("\n"))
    raise ValueError("language must be one of [python, java]")


class RepobenchPDataset(DatasetClass):
    class_name: ClassVar[str] = "RepobenchPDataset"
    dataset_tables: ClassVar[dict[str, str]] = {
        "repobench_p_python": "code_eval_repobench_p_python_sampled",
        "repobench_p_java": "code_eval_repobench_p_java_sampled",
    }
    needs: ClassVar[str] = "a GPT-2 tokenizer for prompts"
    _COLUMNS = ("id", "file_path", "context", "import_statement", "code", "gold_snippet_index", "next_line")

    def get_prompts(self, request: GetPromptsRequest, ctx: EvalContext) -> list[Prompt]:
        rows = ctx.rows(request, self._COLUMNS)
        for row in rows:
            row["lang"] = request.dataset.split("_")[-1]
            ensure_json(row, "context")
        return [self._prompt(row, request.config, ctx) for row in rows]

    def get_prompt_by_id(self, request: GetPromptByIdRequest, ctx: EvalContext) -> Prompt:
        row = ctx.row(request, self._COLUMNS)
        row["lang"] = request.dataset.split("_")[-1]
        ensure_json(row, "context")
        return self._prompt(row, request.config, ctx)

    @staticmethod
    def _prompt(row: dict[str, Any], config: TestConfig, ctx: EvalContext) -> Prompt:
        tokenizer = ctx.tokenizer
        if tokenizer is None:
            raise OSError(MISSING_TOKENIZER)
        mode = config.extra.get("retrieval_mode", "oracle-filled")
        max_prompt_length = config.extra.get("max_prompt_length", 8000)
        language = row["lang"]

        code = "\n".join(row["code"].split("\n")[-60:])  # the file's last 60 lines at most
        path, imports = row["file_path"], row["import_statement"]
        if language == "python":
            code = f"# Path: {path}\n{imports}\n{code}"
        elif language == "java":
            lines = code.split("\n")
            if lines[0].startswith("package"):
                code = "\n".join([*lines[:1], imports, *lines[1:]])
                code = f"// Path: {path}\n{code}\n"
            else:
                code = f"// Path: {path}\n{imports}\n{code}\n"
        tokens = tokenizer.encode(code)
        if len(tokens) > 1600:  # the file itself gets at most 1600 tokens
            code = tokenizer.decode(tokens[-1600:])
        budget_used = len(tokenizer.encode(code))
        parts = [code]

        if mode == "oracle-filled":
            snippets: dict[int, tuple[str, int]] = {}
            for index, snippet in enumerate(row["context"]):
                text = _commented(snippet["snippet"], language)
                marker = "#" if language == "python" else "//"
                text = f"{marker} Path: {snippet['path']}\n{text}\n"
                snippets[index] = text, len(tokenizer.encode(text))
            gold = row["gold_snippet_index"]
            if gold > 0:
                budget_used += snippets[gold][1]
                parts.append(snippets[gold][0])
            for index, (text, size) in snippets.items():
                if index == gold:
                    continue
                if size + budget_used > max_prompt_length:
                    break
                budget_used += size
                parts.append(text)

        contexts = sorted(parts[1:], key=lambda text: hashlib.md5(text.encode("utf8")).hexdigest())
        return Prompt(
            id=row["id"], prompt="".join(contexts) + parts[0], labels={"next_line": row["next_line"]}
        )

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        return _next_line_check(request, ctx, ctx.row(request, self._COLUMNS))
