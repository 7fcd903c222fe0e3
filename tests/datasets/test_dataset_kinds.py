"""The shared evaluation helpers: the online judge's comparison and its case scheduling."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from mocksandbox.datasets.errors import DatasetHTTPError
from mocksandbox.datasets.kinds import EvalContext, check_stdio_cases, outputs_match
from mocksandbox.datasets.models import TestConfig
from mocksandbox.datasets.tables import TableStore
from mocksandbox.models import CommandRunResult, CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus


def ran(stdout: str) -> RunCodeResponse:
    result = CommandRunResult(status=CommandRunStatus.Finished, return_code=0, stdout=stdout, stderr="")
    return RunCodeResponse(status=RunStatus.Success, message="", run_result=result)


class EchoRunner:
    """Answers each case with its stdin (so a case passes when stdin == stdout), counting overlap."""

    def __init__(self, delay: float = 0.05, answer: Callable[[str], str] = lambda s: s) -> None:
        self.delay, self.answer = delay, answer
        self.lock = threading.Lock()
        self.running = self.peak = self.calls = 0

    def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        with self.lock:
            self.calls += 1
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(self.delay)
        with self.lock:
            self.running -= 1
        return ran(self.answer(request.stdin or ""))


def context(runner: object, concurrency: int = 3) -> EvalContext:
    return EvalContext(TableStore(), runner, lambda d: d, max_runner_concurrency=concurrency)  # type: ignore[arg-type]


def cases(*pairs: tuple[str, str]) -> list[dict[str, dict[str, str]]]:
    return [{"input": {"stdin": i}, "output": {"stdout": o}} for i, o in pairs]


@pytest.mark.parametrize(
    ("expected", "actual", "same"),
    [("1\n2\n", "1\n2", True), ("YES", "yes", True), ("0.333333", "0.3333331", True), ("1 2", "1  2", False)],
)
def test_outputs_match(expected: str, actual: str, same: bool) -> None:
    assert outputs_match(expected, actual) is same


def test_cases_run_three_at_a_time_in_order() -> None:
    runner = EchoRunner()
    outcomes = check_stdio_cases(
        "x", cases(*[(str(n), str(n)) for n in range(9)]), TestConfig(language="python"), context(runner)
    )
    assert [o.test_info["input"]["stdin"] for o in outcomes if o.test_info] == [str(n) for n in range(9)]
    assert all(o.passed for o in outcomes) and runner.peak == 3


def test_first_failing_case_ends_the_list_unless_run_all_cases() -> None:
    runner = EchoRunner(delay=0.2)
    judged = cases(("a", "a"), ("b", "wrong"), *[(str(n), str(n)) for n in range(20)])
    started = time.monotonic()
    outcomes = check_stdio_cases("x", judged, TestConfig(language="python"), context(runner))
    assert [o.passed for o in outcomes] == [True, False]
    assert time.monotonic() - started < 2 and runner.calls < 10  # the queued cases never ran
    everything = check_stdio_cases(
        "x", judged, TestConfig(language="python", extra={"run_all_cases": True}), context(EchoRunner(0))
    )
    assert len(everything) == 22


def test_a_sandbox_error_is_retried_then_500() -> None:
    class Broken:
        calls = 0

        def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
            Broken.calls += 1
            return RunCodeResponse(status=RunStatus.SandboxError, message="boom")

    with pytest.raises(
        DatasetHTTPError, match="Failed to check stdio test case: 500: failed to request sandbox"
    ):
        check_stdio_cases("x", cases(("a", "a")), TestConfig(language="python"), context(Broken()))
    assert Broken.calls == 5
