"""What every dataset class shares: the base class, the context it runs in, and its helpers.

A dataset class (SandboxFusion calls them evaluation classes: ``MBPPDataset``, ``CommonOJDataset``,
...) turns rows of its tables into prompts and evaluates a completion for one row by running
programs through the same engine as ``/run_code``. The classes themselves live in
:mod:`mocksandbox.datasets.classes`, one module per family; each follows the SandboxFusion class
of the same name (Apache-2.0, Copyright 2024 Bytedance Ltd.), reimplemented: same columns, prompt
texts, code assembly, verdicts and errors.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from mocksandbox import divergence
from mocksandbox.datasets.errors import DatasetHTTPError
from mocksandbox.datasets.models import (
    EvalResult,
    EvalTestCase,
    GetPromptByIdRequest,
    GetPromptsRequest,
    Prompt,
    SubmitRequest,
    TestConfig,
)
from mocksandbox.datasets.tables import Row, TableStore
from mocksandbox.models import RunCodeRequest, RunCodeResponse, RunStatus

if TYPE_CHECKING:
    from mocksandbox.datasets.tokenizer import Tokenizer

#: Languages SandboxFusion compiles; their stdin cases get a compile timeout.
COMPILED_LANGUAGES = frozenset({"cpp", "go", "java"})

#: How many times an online-judge case is sent again after a sandbox error (SandboxFusion's retry).
STDIO_ATTEMPTS = 5


class CodeRunner(Protocol):
    """What evaluation needs from the engine."""

    def run_code(self, request: RunCodeRequest) -> RunCodeResponse: ...


@dataclass(frozen=True)
class EvalContext:
    """Where a class finds its rows and runs its programs, for one request."""

    tables: TableStore
    runner: CodeRunner
    #: The table that holds ``dataset``'s rows for this class (registered, else ``code_eval_<id>``).
    table_name: Callable[[str], str]
    #: Online-judge cases run at once per submission (SandboxFusion's ``max_runner_concurrency``;
    #: 0 means all at once).
    max_runner_concurrency: int = 3
    #: The GPT-2 tokenizer RepoBench-P counts with, when one was found.
    tokenizer: Tokenizer | None = None
    #: SandboxFusion's ``assets/`` directory (CRUXEval-X's examples); ``None``: ``./assets``.
    assets_dir: str | None = None

    def rows(self, request: GetPromptsRequest, columns: Sequence[str] | None = None) -> list[Row]:
        return self.tables.rows(
            request.config, self.table_name(request.dataset), columns, request.offset, request.limit
        )

    def row(self, request: GetPromptByIdRequest | SubmitRequest, columns: Sequence[str] | None = None) -> Row:
        return self.tables.row_by_id(request.config, self.table_name(request.dataset), request.id, columns)

    def run(self, request: RunCodeRequest) -> RunCodeResponse:
        """Run one program; a sandbox-side error is SandboxFusion's HTTP 500."""
        response = self.runner.run_code(request)
        if response.status == RunStatus.SandboxError:
            raise DatasetHTTPError(
                500, f"failed to request sandbox: Sanbox responded with error: {response.message}"
            )
        return response


class DatasetClass:
    """One evaluation class. Subclasses set the class attributes and override what differs."""

    #: The name clients give as ``config.dataset_type`` (SandboxFusion's class name).
    class_name: ClassVar[str]
    #: Dataset ids SandboxFusion registers for this class, with their tables.
    dataset_tables: ClassVar[Mapping[str, str]] = {}
    #: What the host needs for :meth:`evaluate` beyond Python (shown at start-up when missing).
    needs: ClassVar[str] = ""

    def matches(self, row: Row) -> bool:
        """Whether an unregistered table whose first row is ``row`` belongs to this class."""
        return False

    #: The columns :meth:`build_prompt` reads (``None``: every column).
    prompt_columns: ClassVar[Sequence[str] | None] = None

    def build_prompt(self, row: Row, config: TestConfig) -> Prompt:
        """One row's prompt. A class whose prompts each come from their own row alone overrides
        this (and :attr:`prompt_columns`) and gets both prompt endpoints from it."""
        raise NotImplementedError

    def get_prompts(self, request: GetPromptsRequest, ctx: EvalContext) -> list[Prompt]:
        return [self.build_prompt(row, request.config) for row in ctx.rows(request, self.prompt_columns)]

    def get_prompt_by_id(self, request: GetPromptByIdRequest, ctx: EvalContext) -> Prompt:
        return self.build_prompt(ctx.row(request, self.prompt_columns), request.config)

    def get_ids(self, request: GetPromptsRequest, ctx: EvalContext) -> list[int | str]:
        """``/list_ids``: the ids of the prompts (SandboxFusion builds every prompt for this)."""
        return [prompt.id for prompt in self.get_prompts(request, ctx)]

    def evaluate(self, request: SubmitRequest, ctx: EvalContext) -> EvalResult:
        raise NotImplementedError

    def metrics(self, results: Sequence[EvalResult]) -> dict[str, Any]:
        """``/get_metrics``: no SandboxFusion class computes dataset-level metrics."""
        return {}

    def metrics_function(self) -> str | None:
        """``/get_metrics_function``: Python source defining ``get_metrics(results)``, or ``None``."""
        return None


def ensure_json(row: dict[str, Any], key: str) -> Any:
    """Parse ``row[key]`` in place when it is JSON text (nested values are stored as text)."""
    if isinstance(row[key], str):
        row[key] = json.loads(row[key], strict=False)
    return row[key]


def single_test_result(
    request: SubmitRequest,
    result: RunCodeResponse,
    extracted_code: str,
    full_code: str | None,
    *,
    accepted: bool | None = None,
    test_code: str | None = None,
    test_info: dict[str, Any] | None = None,
    extracted_type: Any = None,
    extra: dict[str, Any] | None = None,
) -> EvalResult:
    """The usual answer: one program, one test, accepted when it succeeded (unless told)."""
    passed = result.status == RunStatus.Success if accepted is None else accepted
    return EvalResult(
        id=request.id,
        accepted=passed,
        extracted_code=extracted_code,
        full_code=full_code,
        test_code=test_code,
        tests=[EvalTestCase(passed=passed, exec_info=result, test_info=test_info)],
        extracted_type=extracted_type,
        extra=extra,
    )


# -- online-judge cases -----------------------------------------------------------------------------


def _truncated(text: str, max_length: int = 1000, placeholder: str = "...") -> str:
    # Both ends kept, as SandboxFusion's truncate_str.
    if not text or len(text) <= max_length:
        return text
    keep = (max(max_length, len(placeholder) + 2) - len(placeholder)) // 2
    return text[:keep] + placeholder + text[-keep:]


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def outputs_match(expected: str, actual: str, lower: bool = True) -> bool:
    """SandboxFusion's judge: stripped, line by line (one trailing empty line forgiven on either
    side), case-insensitive unless ``lower`` is off, numbers equal within a relative 1e-5."""
    got = actual.strip().split("\n")
    want = expected.strip().split("\n")
    if len(got) - len(want) == 1 and got[-1] == "":
        got = got[:-1]
    if len(want) - len(got) == 1 and want[-1] == "":
        want = want[:-1]
    if len(got) != len(want):
        return False
    for got_line, want_line in zip(got, want, strict=True):
        if lower:
            got_line, want_line = got_line.lower(), want_line.lower()
        if got_line.strip() != want_line.strip():
            if _is_float(want_line) and _is_float(got_line):
                a, b = float(got_line), float(want_line)
                if abs(a - b) / max(abs(b), 1e-10) < 1e-5:
                    continue
            return False
    return True


def _stdio_case(case: Any) -> dict[str, dict[str, str]]:
    # SandboxFusion validates each case as GeneralStdioTest (input/output: str -> str); other keys go.
    if not isinstance(case, dict):
        raise TypeError(f"a test case must be an object, got {type(case).__name__}")
    checked: dict[str, dict[str, str]] = {}
    for side in ("input", "output"):
        values = case.get(side)
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            raise ValueError(f"test case field {side!r} must be an object of strings")
        checked[side] = dict(values)
    return checked


def check_stdio_case(
    code: str, case: dict[str, dict[str, str]], config: TestConfig, ctx: EvalContext, lower: bool = True
) -> EvalTestCase:
    """Run ``code`` on one case's stdin and judge its stdout."""
    language = config.language
    assert language is not None
    if language in COMPILED_LANGUAGES:
        request = RunCodeRequest(
            code=code,
            language=language,
            stdin=case["input"]["stdin"],
            compile_timeout=config.compile_timeout or 10,
            run_timeout=config.run_timeout or 10,
        )
    else:
        request = RunCodeRequest(
            code=code, language=language, stdin=case["input"]["stdin"], run_timeout=config.run_timeout or 20
        )
    result = ctx.runner.run_code(request)
    for _ in range(STDIO_ATTEMPTS - 1):
        if result.status != RunStatus.SandboxError:
            break
        result = ctx.runner.run_code(request)
    if result.status == RunStatus.SandboxError:
        raise DatasetHTTPError(
            500, f"failed to request sandbox: Sanbox responded with error: {result.message}"
        )
    failed = EvalTestCase(passed=False, exec_info=result, test_info=case)
    if result.status != RunStatus.Success or result.run_result is None:
        return failed
    if not outputs_match(case["output"]["stdout"], result.run_result.stdout or "", lower):
        return failed
    if not config.extra.get("return_full_case", False):
        case = {
            side: {key: _truncated(value) for key, value in values.items()} for side, values in case.items()
        }
    return EvalTestCase(passed=True, exec_info=result, test_info=case)


def check_stdio_cases(
    code: str, raw_cases: Sequence[Any], config: TestConfig, ctx: EvalContext, lower: bool = True
) -> list[EvalTestCase]:
    """Every case, ``ctx.max_runner_concurrency`` at a time, answers in case order. Unless
    ``config.extra.run_all_cases``, the list ends at the first failing case and the cases not yet
    started are dropped, as SandboxFusion cancels them."""
    cases = [_stdio_case(case) for case in raw_cases]
    if not cases:
        return []
    workers = ctx.max_runner_concurrency if ctx.max_runner_concurrency > 0 else len(cases)
    run_all = bool(config.extra.get("run_all_cases", False))
    outcomes: list[EvalTestCase] = []
    pool = ThreadPoolExecutor(max_workers=min(workers, len(cases)), thread_name_prefix="stdio-case")
    try:
        futures: list[Future[EvalTestCase]] = [
            # (In the request's context: its output mode, and the notes of where SandboxFusion differs.)
            pool.submit(divergence.carry(check_stdio_case), code, case, config, ctx, lower)
            for case in cases
        ]
        for future in futures:
            try:
                outcome = future.result()
            except Exception as exc:
                raise DatasetHTTPError(500, f"Failed to check stdio test case: {_http_text(exc)}") from None
            outcomes.append(outcome)
            if not run_all and not outcome.passed:
                break
    finally:
        # Cases still queued are cancelled; those running finish in the background, unread.
        pool.shutdown(wait=False, cancel_futures=True)
    return outcomes


def _http_text(exc: BaseException) -> str:
    # str() of a FastAPI HTTPException is "<status>: <detail>"; of anything else, its message.
    if isinstance(exc, DatasetHTTPError):
        return f"{exc.status}: {exc.detail}"
    return str(exc)


# -- metrics functions ------------------------------------------------------------------------------

#: Pass@k per category, as the Python source SandboxFusion's ``/get_metrics_function`` answers for
#: EvoEval and MHPP. The client defines ``repeats`` and ``k_targets`` before calling
#: ``get_metrics(results)``; ``{categories}`` is replaced by a ``get_categories(results)`` function.
PASS_AT_K_BY_CATEGORY = '''
{categories}

def pass_at_k_v2(samples, n: int, k: int) -> float:
    """Average over tasks of 1 - comb(n - c, k) / comb(n, k); samples are (task id, passed) pairs."""
    import numpy
    from collections import defaultdict

    def codex_estimator(n: int, c: int, k: int) -> float:
        if n - c < k:
            return 1.0
        return 1.0 - numpy.prod(1.0 - k / numpy.arange(n - c + 1, n + 1))

    correct = defaultdict(int)
    for name, passed in samples:
        correct[name] += 1 if passed else 0
    scores = [codex_estimator(n, c, k) for c in correct.values()]
    return sum(scores) / len(scores) if scores else 0.0


def get_metrics(results):
    performance = {{}}
    for category, samples in get_categories(results).items():
        for k in k_targets:
            if repeats < k:
                continue
            pairs = [(s.id, s.accepted) for s in samples]
            performance[f"{{category}}/Pass@k={{k}}"] = pass_at_k_v2(pairs, repeats, k)
    return performance
'''
