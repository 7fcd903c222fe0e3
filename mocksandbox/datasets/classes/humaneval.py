"""The HumanEval family: a function completed from its signature and docstring, checked by tests.

* ``HumanEvalDataset`` (HumanEval in any language, MultiPL-E's format, BigCodeBench): rows
  ``{id, task_id, prompt, test | tests, entry_point, language?, stop_tokens?}``; every column is a
  label. Pretrain mode appends the completion (cut at a stop token) to the prompt; free-form mode
  (``config.extra.is_freeform``) takes the code block of the answer instead.
* ``MultiPLEDataset``: MultiPL-E rows (``name``, ``prompt``, ``tests``, ``stop_tokens``), same logic
  with its own dataset ids.
* ``EvoEvalDataset``: rows ``{id, content, test, labels: {entry_point, ...}}`` (SandboxFusion's older
  HumanEval class), with a pass@k-per-category metrics function.

Programs get a language's usual imports first (``IMPORT_HELPER``); Python ones end with
``check(entry_point)``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from mocksandbox.datasets.extraction import default_extract_helper, extract_code_from_freeform_completion
from mocksandbox.datasets.kinds import (
    PASS_AT_K_BY_CATEGORY,
    DatasetClass,
    EvalContext,
    ensure_json,
    single_test_result,
)
from mocksandbox.datasets.models import (
    EvalResult,
    GetPromptByIdRequest,
    GetPromptsRequest,
    Prompt,
    SubmitRequest,
    TestConfig,
)
from mocksandbox.models import RunCodeRequest

#: Lines put before a program, by extraction language (SandboxFusion's ``IMPORT_HELPER``).
IMPORT_HELPER: dict[str, tuple[str, ...]] = {
    "python": (
        "import math",
        "import re",
        "import sys",
        "import copy",
        "import datetime",
        "import itertools",
        "import collections",
        "import heapq",
        "import statistics",
        "import functools",
        "import hashlib",
        "import numpy",
        "import numpy as np",
        "import string",
        "from typing import *",
        "from collections import *",
    ),
    "cpp": (
        "using namespace std;",
        "#include<optional>",
        "#include<cassert>",
        "#include<stdlib.h>",
        "#include<algorithm>",
        "#include<cmath>",
        "#include<math.h>",
        "#include<numeric>",
        "#include<stdio.h>",
        "#include<vector>",
        "#include<set>",
        "#include<map>",
        "#include<queue>",
        "#include<stack>",
        "#include<list>",
        "#include<deque>",
        "#include<boost/any.hpp>",
        "#include<string>",
        "#include<climits>",
        "#include<cstring>",
        "#include<iostream>",
        "#include<sstream>",
        "#include<fstream>",
    ),
    "java": (
        "import java.util.*;",
        "import java.lang.reflect.*;",
        "import org.javatuples.*;",
        "import java.security.*;",
        "import java.math.*;",
        "import java.io.*;",
        "import java.util.stream.*;",
    ),
    "csharp": (
        "using System;",
        "using System.Numerics;",
        "using System.Diagnostics;",
        "using System.Collections.Generic;",
        "using System.Linq;",
        "using System.Text;",
        "using System.Security.Cryptography;",
        "using System.Collections.Generic;",
    ),
    "go": ('import ("fmt")',),
    "d": ("import std.array;", "import std.algorithm;"),
}

#: A pretrain completion ends with the first of these (kept), by extraction language.
END_TOKENS: dict[str, tuple[str, ...]] = {
    "julia": ("\nend",),
    "lua": ("\nend",),
    "ruby": ("\nend",),
    **{
        language: ("\n}",)
        for language in ("cpp", "csharp", "typescript", "perl", "r", "d", "go", "js", "php")
    },
}

FREEFORM_INSTRUCTIONS = {
    "zh": "请按照docstring的要求补全如上代码，写出完整的代码，代码要用markdown语法包裹。"
    "代码不要包含`Main`函数",
    "en": "Please complete the above code according to the requirements in the docstring. Write the complete "
    "code and wrap it in markdown syntax. The code should not contain `Main` function.",
}


def stop_token_trim(text: str, row: dict[str, Any], excepts: tuple[str, ...] = ("\n\n",)) -> str:
    """Cut ``text`` at each of the row's ``stop_tokens`` (``re:`` marks a regular expression)."""
    for token in row.get("stop_tokens") or ():
        if token in excepts:
            continue
        if token.startswith("re:"):
            match = re.compile(token[3:].strip()).search(text)
            if match:
                text = text[: match.start()]
        else:
            index = text.find(token)
            if index != -1:
                text = text[:index]
    return text


def stop_after_stop_token(text: str, language: str) -> str:
    """Keep up to and including the language's end token (``\\n}``, ``\\nend``)."""
    for token in END_TOKENS.get(language, ()):
        index = text.find(token)
        if index != -1:
            text = text[:index] + token
    return text


def merge_go_imports(code: str, languages: tuple[str, ...] = ("go",)) -> str:
    """Go: one ``package`` line per package and every import once, at the top."""
    packages = set(re.findall(r"package\s+(\w+)", code))
    code = re.sub(r"package\s+(\w+)", "", code)
    single = re.findall(r'import\s+("\w+")', code)
    grouped = [
        line.strip()
        for block in re.findall(r"import\s+\((.*?)\)", code, flags=re.DOTALL)
        for line in block.split("\n")
    ]
    imports = set(single + grouped) - {""}
    code = re.sub(r'import\s+("\w+")', "", code)
    code = re.sub(r"import\s+\((.*?)\)", "", code, flags=re.DOTALL)
    header = "\n".join(f"package {package}" for package in packages)
    return header + "\n\n" + "\n".join(f"import {name}" for name in imports) + "\n\n" + code


def remove_main(code: str, language: str) -> str:
    tokens = {"d": ("void main",), "csharp": ("public static void Main",)}.get(language, ())
    for token in tokens:
        index = code.find(token)
        if index != -1:
            code = code[:index]
    return code


def _freeform_prompt(prompt: str, language: str, config: TestConfig) -> str:
    instruction = FREEFORM_INSTRUCTIONS["zh" if config.locale == "zh" else "en"]
    return f"```{language}\n{prompt}\n```\n\n{instruction}"


class _MultiPLEStyle(DatasetClass):
    """HumanEval and MultiPL-E: rows read whole, every column but the prompt a label."""

    run_languages: ClassVar[dict[str, str]]
    extract_languages: ClassVar[dict[str, str]]
    default_language: ClassVar[str]
    #: Datasets whose free-form answers are whole functions (taken with the default extraction).
    function_datasets: ClassVar[frozenset[str]]

    def get_prompts(self, request: GetPromptsRequest, ctx: EvalContext) -> list[Prompt]:
        return [self._prompt(row, request.dataset, request.config) for row in ctx.rows(request)]

    def get_prompt_by_id(self, request: GetPromptByIdRequest, ctx: EvalContext) -> Prompt:
        return self._prompt(ctx.row(request), request.dataset, request.config)

    def _language(self, dataset: str, row: dict[str, Any], fallback: str | None) -> str:
        language = self.extract_languages.get(dataset)
        if language is None:
            language = row.get("language", fallback) if fallback is not None else row.get("language")
        if not isinstance(language, str):  # SandboxFusion then fails on `None.split`
            raise AttributeError(f"'{type(language).__name__}' object has no attribute 'split'")
        return language.split(".")[0]

    def _prompt(self, row: dict[str, Any], dataset: str, config: TestConfig) -> Prompt:
        prompt = row["prompt"]
        if config.extra.get("is_freeform"):
            prompt = _freeform_prompt(prompt, self._language(dataset, row, "python"), config)
        return Prompt(
            id=row.get("task_id", row.get("name")),
            prompt=prompt,
            labels={key: value for key, value in row.items() if key != "prompt"},
        )

    def _pretrain_code(self, request: SubmitRequest, row: dict[str, Any]) -> tuple[str, str]:
        completion = stop_token_trim(request.completion, row)
        completion = stop_after_stop_token(completion, self._language(request.dataset, row, None))
        prompt = self._prompt(row, request.dataset, request.config).prompt
        return completion, f"{prompt}\n{completion}\n{row['tests']}"

    def _sft_stop_token_code(self, request: SubmitRequest, row: dict[str, Any]) -> tuple[str, str]:
        language = self._language(request.dataset, row, None)
        completion, _ = extract_code_from_freeform_completion(
            request.completion, language, first_block_only=True
        )
        completion = remove_main(stop_token_trim(completion, row), language)
        return completion, f"{completion}\n{row['tests']}"

    def _sft_function_code(self, request: SubmitRequest, row: dict[str, Any]) -> tuple[str, str]:
        language = self._language(request.dataset, row, "python")
        completion = remove_main(default_extract_helper(request.completion, language), language)
        return completion, f"{completion}\n{row['tests']}"

    def _is_function_answer(self, request: SubmitRequest, row: dict[str, Any]) -> bool:
        return request.dataset in self.function_datasets

    def _finish(self, request: SubmitRequest, row: dict[str, Any], full_code: str) -> str:
        return full_code

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        row = ctx.row(request)
        self._complete_row(row)
        if request.config.extra.get("is_freeform"):
            if self._is_function_answer(request, row):
                completion, full_code = self._sft_function_code(request, row)
            else:
                completion, full_code = self._sft_stop_token_code(request, row)
        else:
            completion, full_code = self._pretrain_code(request, row)
        language = self._language(request.dataset, row, self.default_language)
        full_code = "\n".join(IMPORT_HELPER.get(language, ())) + "\n" + full_code
        full_code = self._finish(request, row, full_code)
        if language == "go":
            full_code = merge_go_imports(full_code)
        run_language = self.run_languages.get(request.dataset, language)
        config = request.config
        run_timeout = config.run_timeout or (60 if request.dataset == "bigcodebench" else 20)
        result = ctx.run(
            RunCodeRequest(
                code=full_code,
                language=run_language,
                compile_timeout=config.compile_timeout or 20,
                run_timeout=run_timeout,
            )
        )
        return single_test_result(request, result, completion, full_code)

    def _complete_row(self, row: dict[str, Any]) -> None:
        pass


class HumanEvalDataset(_MultiPLEStyle):
    class_name: ClassVar[str] = "HumanEvalDataset"
    dataset_tables: ClassVar[dict[str, str]] = {
        "humaneval_python": "code_eval_humaneval_python",
        "humaneval_cpp": "code_eval_humaneval_cpp",
        "humaneval_typescript": "code_eval_humaneval_typescript",
        "humaneval_bash": "code_eval_humaneval_bash",
        "humaneval_csharp": "code_eval_humaneval_csharp",
        "humaneval_go": "code_eval_humaneval_go",
        "humaneval_java": "code_eval_humaneval_java",
        "shadow_humaneval_python": "code_eval_shadow_humaneval_python",
        "bigcodebench": "code_eval_bigcodebench",
    }
    run_languages: ClassVar[dict[str, str]] = {
        "humaneval_python": "python",
        "humaneval_cpp": "cpp",
        "humaneval_typescript": "typescript",
        "humaneval_bash": "bash",
        "humaneval_csharp": "csharp",
        "humaneval_go": "go_test",
        "humaneval_java": "java",
        "humaneval_lua": "lua",
        "humaneval_javascript": "nodejs",
        "humaneval_php": "php",
        "humaneval_perl": "perl",
        "humaneval_racket": "racket",
        "humaneval_r": "R",
        "humaneval_rust": "rust",
        "humaneval_scala": "scala",
        "humaneval_swift": "swift",
        "humaneval_ruby": "ruby",
        "humaneval_d": "D_ut",
        "humaneval_julia": "julia",
        "shadow_humaneval_python": "python",
        "evoeval": "python",
    }
    extract_languages: ClassVar[dict[str, str]] = {
        **run_languages,
        "humaneval_go": "go",
        "humaneval_js": "js",
        "humaneval_r": "r",
        "humaneval_d": "d",
    }
    default_language: ClassVar[str] = "python"
    function_datasets: ClassVar[frozenset[str]] = frozenset(
        {
            "humaneval_python",
            "humaneval_typescript",
            "humaneval_go",
            "humaneval_form_go",
            "evoeval",
            "humaneval_perl",
            "humaneval_racket",
            "humaneval_lua",
            "humaneval_julia",
            "humaneval_d",
            "humaneval_javascript",
            "humaneval_php",
            "humaneval_r",
            "humaneval_ruby",
        }
    )

    def matches(self, row: dict[str, Any]) -> bool:
        return "entry_point" in row and "prompt" in row and ("test" in row or "tests" in row)

    def _complete_row(self, row: dict[str, Any]) -> None:
        if "tests" not in row:  # the original HumanEval's columns
            row["tests"] = row["test"]
            row["language"] = "python"
            row["stop_tokens"] = [r"re:\n(?!\s|\n)(?=.|\n)"]

    def _is_function_answer(self, request: SubmitRequest, row: dict[str, Any]) -> bool:
        return request.dataset in self.function_datasets or row["language"] in ("go", "go_test")

    def _finish(self, request: SubmitRequest, row: dict[str, Any], full_code: str) -> str:
        if request.dataset in ("humaneval_python", "shadow_humaneval_python", "evoeval"):
            full_code = f"{full_code}\ncheck({row['entry_point']})"
        if request.dataset in ("humaneval_java", "humaneval_form_java") or row["language"] == "java":
            full_code = full_code.replace("class Problem", "class Main")
        return full_code


class MultiPLEDataset(_MultiPLEStyle):
    class_name: ClassVar[str] = "MultiPLEDataset"
    dataset_tables: ClassVar[dict[str, str]] = {
        # sic: `multiple_rs` reads `code_eval_multiple_re`, as SandboxFusion registers it
        f"multiple_{suffix}": f"code_eval_multiple_{'re' if suffix == 'rs' else suffix}"
        for suffix in (
            "cpp",
            "ts",
            "sh",
            "cs",
            "go",
            "java",
            "lua",
            "js",
            "php",
            "pl",
            "rkt",
            "r",
            "rs",
            "scala",
            "swift",
            "rb",
            "d",
            "jl",
        )
    }
    run_languages: ClassVar[dict[str, str]] = {
        "multiple_cpp": "cpp",
        "multiple_ts": "typescript",
        "multiple_sh": "bash",
        "multiple_cs": "csharp",
        "multiple_go": "go_test",
        "multiple_java": "java",
        "multiple_lua": "lua",
        "multiple_js": "nodejs",
        "multiple_php": "php",
        "multiple_pl": "perl",
        "multiple_rkt": "racket",
        "multiple_r": "R",
        "multiple_rs": "rust",
        "multiple_scala": "scala",
        "multiple_swift": "swift",
        "multiple_rb": "ruby",
        "multiple_d": "D_ut",
        "multiple_jl": "julia",
    }
    extract_languages: ClassVar[dict[str, str]] = {
        **run_languages,
        "multiple_go": "go",
        "multiple_js": "js",
        "multiple_r": "r",
        "multiple_d": "d",
    }
    default_language: ClassVar[str] = "cpp"
    function_datasets: ClassVar[frozenset[str]] = frozenset(
        {
            "multiple_ts",
            "multiple_go",
            "multiple_pl",
            "multiple_rkt",
            "multiple_lua",
            "multiple_jl",
            "multiple_d",
            "multiple_js",
            "multiple_php",
            "multiple_r",
            "multiple_rb",
        }
    )

    def _finish(self, request: SubmitRequest, row: dict[str, Any], full_code: str) -> str:
        if request.dataset == "multiple_java":
            full_code = full_code.replace("class Problem", "class Main")
        return full_code


def _evoeval_categories() -> str:
    return '''def get_categories(results):
    """Results grouped by the category in their id (EvoEval_<category>_EvoEval/<n>)."""
    import re
    from collections import defaultdict
    categories = defaultdict(list)
    for result in results:
        categories[re.findall(r"EvoEval_(.*)_EvoEval", result.id)[0]].append(result)
    return categories'''


class EvoEvalDataset(DatasetClass):
    """EvoEval, on SandboxFusion's older HumanEval class (``content``/``labels`` rows)."""

    class_name: ClassVar[str] = "EvoEvalDataset"
    dataset_tables: ClassVar[dict[str, str]] = {"evoeval": "code_eval_EvoEval"}
    _PROMPT_COLUMNS = ("id", "labels", "content")
    _FREEFORM_INSTRUCTIONS: ClassVar[dict[str, str]] = {
        "zh": "请按照docstring的要求补全如上代码，写出完整的代码，代码要用markdown语法包裹。",
        "en": "Please complete the above code according to the requirements in the docstring. "
        "Write the complete code and wrap it in markdown syntax.",
    }
    _RUN_LANGUAGES: ClassVar[dict[str, str]] = {
        "humaneval_python": "python",
        "humaneval_cpp": "cpp",
        "humaneval_typescript": "typescript",
        "humaneval_bash": "bash",
        "humaneval_csharp": "csharp",
        "humaneval_go": "go_test",
        "humaneval_java": "java",
        "shadow_humaneval_python": "python",
        "humaneval_form_cpp": "cpp",
        "humaneval_form_go": "go",
        "humaneval_form_javascript": "nodejs",
        "humaneval_form_java": "java",
        "evoeval": "python",
        "bigcodebench": "pytest",
    }
    _EXTRACT_LANGUAGES: ClassVar[dict[str, str]] = {
        **_RUN_LANGUAGES,
        "humaneval_go": "go",
        "bigcodebench": "python",
    }

    def get_prompts(self, request: GetPromptsRequest, ctx: EvalContext) -> list[Prompt]:
        return [
            self._prompt(row, request.dataset, request.config)
            for row in ctx.rows(request, self._PROMPT_COLUMNS)
        ]

    def get_prompt_by_id(self, request: GetPromptByIdRequest, ctx: EvalContext) -> Prompt:
        return self._prompt(ctx.row(request, self._PROMPT_COLUMNS), request.dataset, request.config)

    def _language(self, dataset: str, row: dict[str, Any]) -> Any:
        return self._EXTRACT_LANGUAGES.get(dataset, row["labels"].get("programming_language"))

    def _prompt(self, row: dict[str, Any], dataset: str, config: TestConfig) -> Prompt:
        prompt = row["content"]
        labels = ensure_json(row, "labels")
        if config.extra.get("is_freeform"):
            instruction = self._FREEFORM_INSTRUCTIONS["zh" if config.locale == "zh" else "en"]
            prompt = f"```{self._language(dataset, row)}\n{prompt}\n```\n\n{instruction}"
        return Prompt(id=row["id"], prompt=prompt, labels=labels)

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        row = ctx.row(request, ("id", "content", "test", "labels"))
        labels = ensure_json(row, "labels")
        language = self._language(request.dataset, row)
        if request.config.extra.get("is_freeform"):
            if request.dataset in (
                "humaneval_python",
                "humaneval_typescript",
                "humaneval_go",
                "humaneval_form_go",
                "evoeval",
            ) or (labels.get("programming_language") == "go"):
                completion = default_extract_helper(request.completion, language)
            else:
                completion, _ = extract_code_from_freeform_completion(request.completion, language)
                completion = stop_token_trim(completion, row)
            full_code = f"{completion}\n{row['test']}"
        else:
            # EvoEval's pretrain mode: the prompt and the completion together, first block.
            completion = request.completion
            prompt = self._prompt(row, request.dataset, request.config).prompt
            code, _ = extract_code_from_freeform_completion(
                f"{prompt}\n{completion}", self._EXTRACT_LANGUAGES[request.dataset], first_block_only=True
            )
            full_code = f"{code}\n{row['test']}"
        if request.dataset in ("humaneval_python", "shadow_humaneval_python", "evoeval"):
            full_code = f"{full_code}\ncheck({labels['entry_point']})"
        if (
            request.dataset in ("humaneval_java", "humaneval_form_java")
            or labels.get("programming_language") == "java"
        ):
            full_code = full_code.replace("class Problem", "class Main")
        config = request.config
        run_timeout = config.run_timeout or (60 if request.dataset == "bigcodebench" else 20)
        result = ctx.run(
            RunCodeRequest(
                code=full_code,
                language=self._RUN_LANGUAGES.get(request.dataset, labels.get("programming_language")),
                compile_timeout=config.compile_timeout or 20,
                run_timeout=run_timeout,
            )
        )
        return single_test_result(request, result, completion, full_code)

    def metrics_function(self) -> str | None:
        return PASS_AT_K_BY_CATEGORY.format(categories=_evoeval_categories())
