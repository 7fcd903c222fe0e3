"""Smaller single-program classes: Aider's benchmark, MHPP, PAL-Math and NaturalCodeBench.

* ``AiderBenchmarkDataset``: rows ``{id, content, labels: {reference}, test: {code, asset}}``; the
  best Python block replaces ``#<INSERT>`` in ``test.code``, whose unit tests are ``test.asset``.
* ``MHPPDataset``: rows ``{id, content, test, labels: {difficulty_type, ...}}``; the prompt is the
  function's docstring with the first test as an example; the best Python block (else the prompt
  plus the completion) runs followed by the tests. Pass@k by difficulty type as a metrics function.
* ``PalMathDataset``: rows ``{id, content, labels, test: {asset}}``; the ``def solution():`` block
  of a ``python`` fence runs inside PAL-Math's answer checker.
* ``NaturalCodeBenchDataset``: rows ``{id, content, labels, test: {code, asset}}``; Python answers
  run as a pytest file, Java ones as JUnit classes split into files.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from mocksandbox.datasets.classes.texts import PALMATH_TEST_CODE
from mocksandbox.datasets.extraction import default_extract_helper
from mocksandbox.datasets.kinds import (
    PASS_AT_K_BY_CATEGORY,
    DatasetClass,
    EvalContext,
    ensure_json,
    single_test_result,
)
from mocksandbox.datasets.models import (
    EvalResult,
    Prompt,
    SubmitRequest,
    TestConfig,
)
from mocksandbox.models import RunCodeRequest

_LABELED_COLUMNS = ("id", "labels", "content")


class _LabeledPrompts(DatasetClass):
    """Prompts that are the row's ``content`` with its ``labels``."""

    prompt_columns: ClassVar[Sequence[str]] = _LABELED_COLUMNS

    def build_prompt(self, row: dict[str, Any], config: TestConfig) -> Prompt:
        return Prompt(id=row["id"], prompt=row["content"], labels=ensure_json(row, "labels"))


class AiderBenchmarkDataset(_LabeledPrompts):
    class_name: ClassVar[str] = "AiderBenchmarkDataset"
    dataset_tables: ClassVar[dict[str, str]] = {"aider_benchmark_v1": "code_eval_aider_benchmark_v1"}

    def build_prompt(self, row: dict[str, Any], config: TestConfig) -> Prompt:
        labels = ensure_json(row, "labels")
        prompt = (
            f"\n{row['content']}\n\nPlease generate the code in the following format:\n"
            f"```python\n{labels['reference']}\n```\n"
        )
        if config.extra.get("autoeval_wrap_prompt"):
            prompt = (
                "Please answer in English with Markdown format. Below is the problem:\n"
                f"{prompt}\nYour response here:\n"
            )
        return Prompt(id=row["id"], prompt=prompt, labels=labels)

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        row = ctx.row(request, ("id", "labels", "content", "test"))
        test = ensure_json(row, "test")
        asset = test["asset"]
        unit_tests = [base64.b64decode(content).decode("utf-8") for content in asset.values()]
        code = default_extract_helper(request.completion, "python", request.config.custom_extract_logic)
        full_code = test["code"].replace("#<INSERT>", code)
        result = ctx.run(
            RunCodeRequest(
                code=full_code, language="python", run_timeout=request.config.run_timeout or 60, files=asset
            )
        )
        return single_test_result(request, result, code, full_code, test_code="\n\n".join(unit_tests))


class MHPPDataset(DatasetClass):
    class_name: ClassVar[str] = "MHPPDataset"
    dataset_tables: ClassVar[dict[str, str]] = {"mhpp": "code_eval_mhpp"}
    prompt_columns: ClassVar[Sequence[str]] = ("id", "labels", "content", "test")

    @staticmethod
    def build_prompt(row: dict[str, Any], config: TestConfig) -> Prompt:
        first_test = row["test"].split("\n")[0]
        prompt = (
            default_extract_helper(row["content"], "python")
            if config.extra.get("pretrain_mode")
            else row["content"]
        )
        prompt = prompt[: prompt.rfind('"""')]
        return Prompt(
            id=row["id"], prompt=f'{prompt}\n    e.g. {first_test} """', labels=ensure_json(row, "labels")
        )

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        row = ctx.row(request, ("id", "content", "test", "labels"))
        labels = ensure_json(row, "labels")
        logic = request.config.custom_extract_logic
        code = default_extract_helper(request.completion, "python", logic)
        if not code.strip():
            code = default_extract_helper(row["content"] + "\n" + request.completion, "python", logic)
        full_code = f"{code}\n{row['test']}"
        result = ctx.run(
            RunCodeRequest(code=full_code, language="python", run_timeout=request.config.run_timeout or 20)
        )
        return single_test_result(request, result, code, full_code, test_info=labels)

    def metrics_function(self) -> str | None:
        categories = '''def get_categories(results):
    """Results grouped by the difficulty type their first test carries."""
    from collections import defaultdict
    categories = defaultdict(list)
    for result in results:
        categories[result.tests[0].test_info["difficulty_type"]].append(result)
    return categories'''
        return PASS_AT_K_BY_CATEGORY.format(categories=categories)


_PAL_SOLUTION = re.compile(r"```python\n(.*?)def solution\(\):\n(.*?)```", re.DOTALL)


class PalMathDataset(_LabeledPrompts):
    """PAL-Math (adapted by SandboxFusion from DeepSeek-Coder's evaluation)."""

    class_name: ClassVar[str] = "PalMathDataset"
    dataset_tables: ClassVar[dict[str, str]] = {"palmath": "code_eval_palmath"}

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        row = ctx.row(request, ("test",))
        match = _PAL_SOLUTION.search(request.completion)
        code = match.group(1) + "def solution():\n" + match.group(2) if match else ""
        full_code = PALMATH_TEST_CODE.replace("#<INSERT>", code)
        result = ctx.run(
            RunCodeRequest(
                code=full_code,
                language="python",
                files=ensure_json(row, "test")["asset"],
                compile_timeout=request.config.compile_timeout or 20,
                run_timeout=request.config.run_timeout or 20,
            )
        )
        return single_test_result(request, result, code, full_code)


# -- NaturalCodeBench (and AutoEval's Java) ---------------------------------------------------------


def extract_python_code(completion: str) -> str:
    """NaturalCodeBench's extraction: ``[Python]`` tags, fences, else from the first statement;
    ``NaN`` when nothing is found; always behind ``import pytest``."""
    code = "NaN"
    try:
        if match := re.search(r"\[Python\](.*?)\[/Python\]", completion, re.DOTALL):
            if "```" not in match.group(1):
                code = match.group(1)
            elif "[Python]" in completion and "```python" not in completion:
                found = re.search(r"\[Python\](.*?)```", completion, re.DOTALL) or re.search(
                    r"\[Python\](.*?)", completion, re.DOTALL
                )
                code = found.group(1) if found else code
        elif "```python" in completion:
            code = _group(re.search(r"```python[\n\r](.*?)[\n\r]```", completion, re.DOTALL), 1)
        elif "```" in completion:
            code = _group(re.search(r"```[\n\r](.*?)[\n\r]```", completion, re.DOTALL), 1)
        elif "from " in completion and "import " in completion:
            pattern = (
                r"from\s(.*)" if completion.find("from") < completion.find("import") else r"import\s(.*)"
            )
            code = _group(re.search(pattern, completion, re.DOTALL), 0)
        elif "import " in completion:
            code = _group(re.search(r"import\s(.*)", completion, re.DOTALL), 0)
        elif "from " in completion:
            code = _group(re.search(r"from\s(.*)", completion, re.DOTALL), 0)
        elif "class " in completion:
            code = _group(re.search(r"class\s(.*)", completion, re.DOTALL), 0)
        elif "def " in completion:
            code = _group(re.search(r"def\s(.*)", completion, re.DOTALL), 0)
    except _NoMatch:
        pass
    return "import pytest\n" + code


class _NoMatch(Exception):
    pass


def _group(match: re.Match[str] | None, index: int) -> str:
    if match is None:
        raise _NoMatch
    return match.group(index)


def extract_java_code(completion: str) -> list[str]:
    """NaturalCodeBench's Java extraction: ``[Java]`` tags, every fenced block, else from the first
    ``import``/``public``/``interface``/``class`` to ``}}``; ``["NaN"]`` when nothing is found."""
    code = ["NaN"]
    try:
        if "[Java]" in completion:
            code = [_group(re.search(r"\[Java\](.*?)\[/Java\]", completion, re.DOTALL), 1)]
        elif any(fence in completion for fence in ("```java", "```Java", "```")):
            code = re.findall(r"```java[\n\r](.*?)[\n\r]```", completion, re.DOTALL)
            completion = re.sub(r"```java.*?```", "", completion, flags=re.DOTALL)
            code += re.findall(r"```Java(.*?)```", completion, re.DOTALL)
            completion = re.sub(r"```Java.*?```", "", completion, flags=re.DOTALL)
            code += re.findall(r"```[\n\r](.*?)[\n\r]```", completion, re.DOTALL)
        elif "import " in completion:
            code = [_group(re.search(r"import\s(.*?)}}", completion, re.DOTALL), 0)]
        elif any(word in completion for word in ("public ", "interface ", "class ")):
            positions = {word: completion.find(word) for word in ("public ", "interface ", "class ")}
            first = min(
                (word for word, at in positions.items() if at != -1), key=lambda word: positions[word]
            )
            pattern = {"public ": r"public\s(.*?)}}", "interface ": r"interface\s(.*?)}}"}.get(
                first, r"class\s(.*?)}}"
            )
            code = [_group(re.search(pattern, completion, re.DOTALL), 0)]
    except _NoMatch:
        pass
    return code


_JAVA_PATTERNS = (
    (r"((@.*?)?(\n[^\n]*)?interface .*?[;}]\s*\n+})", r"interface (.*?)\s"),
    (r"((@.*?)?(\n[^\n]*)?class .*?[;}]\s*\n+})", r"class (.*?)\s"),
    (r"((@.*?)?(\n[^\n]*)?enum .*?[;}]?\s*\n+})", r"enum (.*?)\s"),
)


def java_test_files(code: list[str], test: str) -> dict[str, str]:
    """One ``<Name>.java`` per interface, class and enum of the answer and the tests, each with
    JUnit's imports and its source's imports; base64-encoded."""
    files: dict[str, str] = {}
    for source in [*code, test]:
        source = "\n" + source
        imports = [found[1] for found in re.findall(r"(\n|^)(import .*?)\n", source, re.MULTILINE)]
        for pattern, name_pattern in _JAVA_PATTERNS:
            for found in re.findall(pattern, source, re.DOTALL):
                item = found[0]
                name = _group(re.search(name_pattern, item, re.DOTALL), 1)
                files[f"{name}.java"] = (
                    "import org.junit.jupiter.api.Test;\nimport static org.junit.jupiter.api.Assertions.*;\n"
                    + "\n".join(imports)
                    + "\n"
                    + item
                    + "\n"
                )
    return {name: base64.b64encode(text.encode("utf-8")).decode("utf-8") for name, text in files.items()}


def java_files_listing(files: dict[str, str]) -> str:
    """What ``full_code`` shows for a JUnit run: each file's name and source."""
    return "".join(
        f"// {name}\n\n{base64.b64decode(content.encode('utf-8')).decode('utf-8')}\n\n"
        for name, content in files.items()
    )


class NaturalCodeBenchDataset(_LabeledPrompts):
    class_name: ClassVar[str] = "NaturalCodeBenchDataset"
    dataset_tables: ClassVar[dict[str, str]] = {
        "ncb_python_zh": "code_eval_ncb_python_zh",
        "ncb_python_en": "code_eval_ncb_python_en",
        "ncb_java_zh": "code_eval_ncb_java_zh",
        "ncb_java_en": "code_eval_ncb_java_en",
    }

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        row = ctx.row(request, ("test", "labels"))
        ensure_json(row, "labels")
        test = ensure_json(row, "test")
        asset = test.get("asset")
        if isinstance(asset, str):
            asset = json.loads(asset)
        if not isinstance(asset, dict):
            asset = {}
        if "python" in request.dataset:
            code = extract_python_code(request.completion)
            full_code = f"import pytest\n\n{code}\n\n{test['code']}"
            files: dict[str, str] = {}
            language = "pytest"
        else:
            codes = extract_java_code(request.completion)
            code = "\n\n".join(codes)
            files = java_test_files(codes, test["code"])
            full_code = java_files_listing(files)
            language = "junit"
        # One Python problem needs more time (SandboxFusion's exception for id 52).
        default_timeout = 40 if language == "pytest" and request.id == 52 else 20
        result = ctx.run(
            RunCodeRequest(
                code=full_code if language == "pytest" else "",
                language=language,
                run_timeout=request.config.run_timeout or default_timeout,
                files={**asset, **files},
            )
        )
        return single_test_result(request, result, code, full_code)
