"""derive_run_status: SandboxFusion's parse_run_status, rule by rule and against a transcription."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mocksandbox.models import CommandRunResult, CommandRunStatus, RunStatus, derive_run_status

Finished, Error, TLE = CommandRunStatus.Finished, CommandRunStatus.Error, CommandRunStatus.TimeLimitExceeded


def result(
    status: CommandRunStatus, return_code: int | None = None, stderr: str | None = ""
) -> CommandRunResult:
    return CommandRunResult(status=status, return_code=return_code, stderr=stderr)


def sandboxfusion_parse_run_status(
    compile_result: CommandRunResult | None, run_result: CommandRunResult | None
) -> tuple[str, str]:
    """sandbox/server/sandbox_api.py::parse_run_status, transcribed as the oracle."""
    outcomes, retcodes, err_msgs = [], [], []
    for res in (compile_result, run_result):
        if res is not None:
            outcomes.append(res.status)
            err_msgs.append(res.stderr or "")
            if res.return_code is not None:
                retcodes.append(res.return_code)
    for outcome, message in zip(outcomes, err_msgs, strict=True):
        if outcome == CommandRunStatus.Error:
            return "SandboxError", message
    if any(o == CommandRunStatus.TimeLimitExceeded for o in outcomes):
        return "Failed", ""
    if any(r != 0 for r in retcodes):
        return "Failed", ""
    return "Success", ""


@pytest.mark.parametrize(
    ("compile_result", "run_result", "expected"),
    [
        # rule 1: any Error -> SandboxError with that result's stderr; compile is looked at first
        (result(Error, 1, "Object name not found."), None, ("SandboxError", "Object name not found.")),
        (
            None,
            result(Error, None, "exception on running command x"),
            ("SandboxError", "exception on running command x"),
        ),
        (result(Error, None, "compile"), result(Error, None, "run"), ("SandboxError", "compile")),
        (result(Finished, 0), result(Error, None, "run"), ("SandboxError", "run")),
        (result(Error, None, None), None, ("SandboxError", "")),
        # rule 1 beats rule 2 and rule 3
        (result(TLE), result(Error, None, "e"), ("SandboxError", "e")),
        (result(Finished, 1), result(Error, None, "e"), ("SandboxError", "e")),
        # rule 2: any TimeLimitExceeded -> Failed, message ""
        (result(TLE, None, "partial"), None, ("Failed", "")),
        (None, result(TLE), ("Failed", "")),
        (result(Finished, 0), result(TLE), ("Failed", "")),
        # rule 3: any non-null, non-zero return code -> Failed
        (None, result(Finished, 3, "stderr is not the message"), ("Failed", "")),
        (None, result(Finished, -9), ("Failed", "")),
        (result(Finished, 1), None, ("Failed", "")),
        (result(Finished, 0), result(Finished, 127), ("Failed", "")),
        # rule 4: otherwise Success (a null return code does not count as non-zero)
        (None, result(Finished, 0, "warnings on stderr"), ("Success", "")),
        (result(Finished, 0), result(Finished, 0), ("Success", "")),
        (None, result(Finished, None), ("Success", "")),
        (None, None, ("Success", "")),
    ],
)
def test_rules_in_order(
    compile_result: CommandRunResult | None, run_result: CommandRunResult | None, expected: tuple[str, str]
) -> None:
    status, message = derive_run_status(compile_result, run_result)
    assert (status.value, message) == expected


def test_returns_run_status_enum() -> None:
    status, _ = derive_run_status(None, result(Finished, 0))
    assert status is RunStatus.Success


results = st.none() | st.builds(
    CommandRunResult,
    status=st.sampled_from(list(CommandRunStatus)),
    return_code=st.none() | st.integers(-64, 255),
    stdout=st.none() | st.text(max_size=5),
    stderr=st.none() | st.text(max_size=5),
)


@settings(max_examples=50, derandomize=True)
@given(results, results)
def test_matches_sandboxfusion(
    compile_result: CommandRunResult | None, run_result: CommandRunResult | None
) -> None:
    status, message = derive_run_status(compile_result, run_result)
    assert (status.value, message) == sandboxfusion_parse_run_status(compile_result, run_result)


@settings(max_examples=50, derandomize=True)
@given(results, results)
def test_properties(compile_result: CommandRunResult | None, run_result: CommandRunResult | None) -> None:
    status, message = derive_run_status(compile_result, run_result)
    present = [r for r in (compile_result, run_result) if r is not None]
    assert (status == RunStatus.SandboxError) == any(r.status == Error for r in present)
    if status != RunStatus.SandboxError:
        assert message == ""
    clean = all(r.status == Finished and r.return_code in (0, None) for r in present)
    assert (status == RunStatus.Success) == clean
    # stdout never influences the outcome
    if compile_result is not None:
        silent = compile_result.model_copy(update={"stdout": None})
        assert derive_run_status(silent, run_result) == (status, message)
