"""Dataset classes: how a row becomes a prompt, and how a completion for it is evaluated.

Three evaluation kinds, named after the SandboxFusion classes whose rows and answers they follow:

* :class:`MBPPKind` (``MBPPDataset``): assert-based tests. Row ``{id, content, labels:
  {test_setup_code, ...}, test_list: [assert, ...]}``; the first extracted block (after the setup
  code) followed by every assert runs as one Python program.
* :class:`HumanEvalKind` (``HumanEvalDataset``): function tests. Row ``{id, prompt, test,
  entry_point, ...}``; the prompt plus the completion (cut at its first unindented line) plus
  ``test`` and ``check(entry_point)`` run as one program. With ``config.extra.is_freeform`` the
  completion is a whole answer whose code block replaces the prompt.
* :class:`CommonOJKind` (``CommonOJDataset``): online-judge cases. Row ``{id, content, labels, test:
  [{input: {stdin: ...}, output: {stdout: ...}}, ...]}``; the program runs once per case, in
  ``config.language``, and its output is compared line by line.

Every program runs through the same engine as ``/run_code`` (in-process, as SandboxFusion does).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Protocol

from mocksandbox.datasets.errors import DatasetHTTPError
from mocksandbox.datasets.extraction import extract_best_block, extract_first_block
from mocksandbox.datasets.models import (
    EvalResult,
    EvalTestCase,
    Prompt,
    SubmitRequest,
    TestConfig,
)
from mocksandbox.models import Language, RunCodeRequest, RunCodeResponse, RunStatus

Row = Mapping[str, Any]

#: Standard-library imports put before HumanEval-style programs (reference solutions often rely on them).
PYTHON_IMPORT_PRELUDE = (
    "import math",
    "import re",
    "import sys",
    "import copy",
    "import datetime",
    "import itertools",
    "import collections",
    "import heapq",
    "import functools",
    "import hashlib",
    "import string",
    "from typing import *",
    "from collections import *",
)

#: How many stdin/stdout cases of one submission run at once.
MAX_PARALLEL_CASES = 4


class CodeRunner(Protocol):
    """What evaluation needs from the engine."""

    def run_code(self, request: RunCodeRequest) -> RunCodeResponse: ...


def json_field(row: Row, key: str) -> Any:
    """A column that may hold JSON text (as SandboxFusion's SQLite tables do) or the value itself."""
    value = row[key]
    if isinstance(value, str | bytes):
        return json.loads(value)
    return value


def run_in_sandbox(runner: CodeRunner, request: RunCodeRequest) -> RunCodeResponse:
    """Run one program; a sandbox-side error becomes SandboxFusion's HTTP 500."""
    response = runner.run_code(request)
    if response.status == RunStatus.SandboxError:
        raise DatasetHTTPError(500, f"failed to request sandbox: {response.message}")
    return response


class DatasetKind(Protocol):
    """One dataset class: prompts and evaluation for the rows of its tables."""

    #: The class name clients give as ``config.dataset_type``.
    class_name: ClassVar[str]
    #: The columns SandboxFusion selects for prompts and for evaluation (shown in its errors).
    prompt_columns: ClassVar[tuple[str, ...]]
    submit_columns: ClassVar[tuple[str, ...]]

    def matches(self, row: Row) -> bool:
        """Whether ``row`` has the shape of this class's rows (used to register unknown files)."""

    def prompt(self, row: Row, dataset: str, config: TestConfig) -> Prompt: ...

    def evaluate(self, row: Row, request: SubmitRequest, runner: CodeRunner) -> EvalResult: ...

    def metrics(self, results: Sequence[EvalResult]) -> dict[str, Any]: ...

    def metrics_function(self) -> str | None: ...


class _NoMetrics:
    """SandboxFusion's default: no dataset-level metrics, no metrics function."""

    def metrics(self, results: Sequence[EvalResult]) -> dict[str, Any]:
        return {}

    def metrics_function(self) -> str | None:
        return None


# -- MBPP -----------------------------------------------------------------------------------------


class MBPPKind(_NoMetrics):
    """Assert-based tests (MBPP)."""

    class_name: ClassVar[str] = "MBPPDataset"
    prompt_columns: ClassVar[tuple[str, ...]] = ("id", "content", "labels", "test_list")
    submit_columns: ClassVar[tuple[str, ...]] = ("id", "content", "labels", "test_list")
    _STOP_WORDS: ClassVar[tuple[str, ...]] = ("\nassert", '\n"""')

    def matches(self, row: Row) -> bool:
        return "test_list" in row and "content" in row

    def prompt(self, row: Row, dataset: str, config: TestConfig) -> Prompt:
        tests = "\n".join(json_field(row, "test_list"))
        text = (
            f"You are an expert Python programmer, and here is your task: {row['content']} "
            f"Your code should pass these tests:\n\n{tests}"
        )
        return Prompt(id=row["id"], prompt=text, labels=json_field(row, "labels"))

    def _completion_code(self, completion: str) -> str:
        if "[DONE]" in completion:
            completion = completion[: completion.index("[DONE]")]
        code, _ = extract_first_block(completion, "python")
        for stop in self._STOP_WORDS:
            if stop in code:
                code = code[: code.index(stop)]
        return code

    def evaluate(self, row: Row, request: SubmitRequest, runner: CodeRunner) -> EvalResult:
        labels = json_field(row, "labels")
        tests: list[str] = json_field(row, "test_list")
        code = "\n".join([labels.get("test_setup_code", ""), self._completion_code(request.completion)])
        if "if __name__ ==" in code:
            code = code[: code.index("if __name__ ==")]
        # Few-shot prompts show all but the last test; only that one is then run.
        run_tests = tests[-1:] if request.config.is_fewshot else tests
        full_code = code + "".join(f"\n{test}\n" for test in run_tests)
        result = run_in_sandbox(
            runner,
            RunCodeRequest(code=full_code, language="python", run_timeout=request.config.run_timeout or 20),
        )
        accepted = result.status == RunStatus.Success
        return EvalResult(
            id=request.id,
            accepted=accepted,
            extracted_code=code,
            full_code=full_code,
            tests=[EvalTestCase(passed=accepted, exec_info=result)],
        )


# -- HumanEval ------------------------------------------------------------------------------------


class HumanEvalKind(_NoMetrics):
    """Function tests (HumanEval): ``test`` defines ``check(candidate)``, called with ``entry_point``."""

    class_name: ClassVar[str] = "HumanEvalDataset"
    prompt_columns: ClassVar[tuple[str, ...]] = ("*",)
    submit_columns: ClassVar[tuple[str, ...]] = ("*",)
    # A completion of the prompt ends at its first line that starts in column 0.
    _END_OF_BODY = re.compile(r"\n(?=\S)")
    _FREEFORM_INSTRUCTION = (
        "Complete the code above as its docstring asks. Answer with the whole program in one Markdown "
        "code block, without a main function or example calls."
    )

    def matches(self, row: Row) -> bool:
        return "entry_point" in row and "prompt" in row and "test" in row

    def prompt(self, row: Row, dataset: str, config: TestConfig) -> Prompt:
        text = str(row["prompt"])
        if config.extra.get("is_freeform"):
            text = f"```python\n{text}\n```\n\n{self._FREEFORM_INSTRUCTION}"
        return Prompt(id=row["id"], prompt=text, labels={k: v for k, v in row.items() if k != "prompt"})

    def evaluate(self, row: Row, request: SubmitRequest, runner: CodeRunner) -> EvalResult:
        extracted_type = None
        if request.config.extra.get("is_freeform"):
            completion, extracted_type = extract_best_block(request.completion, "python")
            program = f"{completion}\n{row['test']}"
        else:
            completion = self._END_OF_BODY.split(request.completion, maxsplit=1)[0]
            program = f"{row['prompt']}\n{completion}\n{row['test']}"
        full_code = "\n".join(PYTHON_IMPORT_PRELUDE) + "\n" + program + f"\ncheck({row['entry_point']})"
        config = request.config
        result = run_in_sandbox(
            runner,
            RunCodeRequest(
                code=full_code,
                language="python",
                compile_timeout=config.compile_timeout or 20,
                run_timeout=config.run_timeout or 20,
            ),
        )
        accepted = result.status == RunStatus.Success
        return EvalResult(
            id=request.id,
            accepted=accepted,
            extracted_code=completion,
            full_code=full_code,
            tests=[EvalTestCase(passed=accepted, exec_info=result)],
            extracted_type=extracted_type,
        )


# -- online judge -----------------------------------------------------------------------------------


def outputs_match(expected: str, actual: str) -> bool:
    """An online judge's lenient comparison: line by line, surrounding blanks and one trailing empty
    line ignored, case-insensitive, numbers equal within a relative 1e-5."""
    if expected == actual:
        return True
    want = expected.strip().split("\n")
    got = actual.strip().split("\n")
    if len(want) != len(got):
        return False
    for wanted_line, got_line in zip(want, got, strict=True):
        wanted_line, got_line = wanted_line.strip().lower(), got_line.strip().lower()
        if wanted_line != got_line and not _numbers_close(wanted_line, got_line):
            return False
    return True


def _numbers_close(wanted: str, got: str) -> bool:
    try:
        a, b = float(wanted), float(got)
    except ValueError:
        return False
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-9)


class CommonOJKind(_NoMetrics):
    """stdin/stdout cases (online judges: CodeContests and the like)."""

    class_name: ClassVar[str] = "CommonOJDataset"
    prompt_columns: ClassVar[tuple[str, ...]] = ("id", "labels", "content")
    submit_columns: ClassVar[tuple[str, ...]] = ("test",)
    _INSTRUCTIONS: ClassVar[dict[str, str]] = {
        "python": (
            "Write a complete Python program. It reads the input from standard input and prints the answer "
            "to standard output."
        ),
        "cpp": (
            "Write a complete C++ program with a main function. It reads the input from standard input and "
            "writes the answer to standard output."
        ),
        "java": (
            "Write a complete Java program whose public class is named Main. It reads the input from "
            "System.in and writes the answer to System.out."
        ),
        "default": (
            "Write a complete program in {language} with an entry point. It reads the input from standard "
            "input and writes the answer to standard output."
        ),
    }

    def matches(self, row: Row) -> bool:
        try:
            cases = json_field(row, "test")
        except (KeyError, ValueError):
            return False
        return isinstance(cases, list) and all(
            isinstance(case, dict) and "input" in case and "output" in case for case in cases
        )

    def prompt(self, row: Row, dataset: str, config: TestConfig) -> Prompt:
        template = self._INSTRUCTIONS.get(config.language or "", self._INSTRUCTIONS["default"])
        text = f"{row['content']}\n\n{template.format(language=config.language)}"
        return Prompt(id=row["id"], prompt=text, labels=json_field(row, "labels"))

    def evaluate(self, row: Row, request: SubmitRequest, runner: CodeRunner) -> EvalResult:
        language = request.config.language
        if not language:
            raise DatasetHTTPError(400, "config.language field must exist for CommonOJDataset, got None")
        cases: list[dict[str, Any]] = json_field(row, "test")
        code, extracted_type = extract_best_block(
            request.completion, language, request.config.custom_extract_logic
        )

        def judge(case: dict[str, Any]) -> EvalTestCase:
            return self._judge(code, language, case, request.config, runner)

        if len(cases) > 1:
            with ThreadPoolExecutor(min(MAX_PARALLEL_CASES, len(cases))) as pool:
                outcomes = list(pool.map(judge, cases))
        else:
            outcomes = [judge(case) for case in cases]
        return EvalResult(
            id=request.id,
            accepted=all(outcome.passed for outcome in outcomes),
            extracted_code=code,
            tests=outcomes,
            extracted_type=extracted_type,
        )

    @staticmethod
    def _judge(
        code: str, language: Language, case: dict[str, Any], config: TestConfig, runner: CodeRunner
    ) -> EvalTestCase:
        inputs: dict[str, str] = dict(case["input"])
        outputs: dict[str, str] = dict(case["output"])
        # Keys other than stdin/stdout name files: written before the run, fetched and compared after.
        files = {
            name: base64.b64encode(text.encode()).decode() for name, text in inputs.items() if name != "stdin"
        }
        wanted_files = [name for name in outputs if name != "stdout"]
        result = run_in_sandbox(
            runner,
            RunCodeRequest(
                code=code,
                language=language,
                stdin=inputs.get("stdin"),
                files=dict(files),
                fetch_files=wanted_files,
                compile_timeout=config.compile_timeout or 10,
                run_timeout=config.run_timeout or 10,
            ),
        )
        passed = result.status == RunStatus.Success and result.run_result is not None
        if passed and "stdout" in outputs:
            passed = outputs_match(outputs["stdout"], (result.run_result and result.run_result.stdout) or "")
        for name in wanted_files:
            fetched = result.files.get(name)
            produced = base64.b64decode(fetched).decode("utf-8", errors="replace") if fetched else None
            passed = passed and produced is not None and outputs_match(outputs[name], produced)
        return EvalTestCase(passed=passed, exec_info=result, test_info=case)


#: Every dataset class, by the name clients give as ``config.dataset_type``.
KINDS: dict[str, DatasetKind] = {
    kind.class_name: kind for kind in (MBPPKind(), HumanEvalKind(), CommonOJKind())
}
