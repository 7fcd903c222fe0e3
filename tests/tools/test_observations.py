"""Each outcome gets its own observation (unit: answers as data, no sockets)."""

from __future__ import annotations

import pytest

from mocksandbox.tools import (
    ObservationKind,
    RunOutcome,
    SandboxBadResponse,
    SandboxConnectionError,
    SandboxHTTPError,
    SandboxNoAnswer,
)
from mocksandbox.tools.observation import (
    api_failure_kind,
    classify,
    format_api_failure,
    format_run_outcome,
    hide_temp_paths,
)

K = ObservationKind


def answer(**run: object) -> dict[str, object]:
    return {"status": "Success", "message": "", "compile_result": None, "run_result": run}


def observe(body: dict[str, object], language: str = "python") -> tuple[ObservationKind, str]:
    outcome = RunOutcome.from_response(body)
    kind = classify(outcome, language)
    return kind, format_run_outcome(outcome, kind, run_timeout=30, compile_timeout=10)


def test_success_stdout_is_verbatim() -> None:
    body = answer(status="Finished", return_code=0, stdout="220000.0\n", stderr="")
    assert observe(body) == (K.SUCCESS, "220000.0\n")


def test_success_with_stderr_and_with_nothing() -> None:
    kind, text = observe(answer(status="Finished", return_code=0, stdout="5\n", stderr="warn\n"))
    assert (kind, text) == (K.SUCCESS, "[stdout]\n5\n[stderr]\nwarn")
    kind, text = observe(answer(status="Finished", return_code=0, stdout="", stderr=""))
    assert text.startswith("[no output]")


def test_runtime_error_shows_the_traceback_with_a_stable_path() -> None:
    stderr = (
        'Traceback (most recent call last):\n  File "/tmp/tmpdw3m0zaa/tmpu138rp_a.py", line 1, in <module>\n'
        '    raise ValueError("boom")\nValueError: boom\n'
    )
    body = {
        "status": "Failed",
        "run_result": {"status": "Finished", "return_code": 1, "stdout": "", "stderr": stderr},
    }
    kind, text = observe(body)
    assert kind is K.RUNTIME_ERROR
    assert text.startswith("[runtime error] The code exited with code 1.\n[stderr]\nTraceback")
    assert 'File "main.py", line 1' in text and "ValueError: boom" in text


def test_killed_by_a_signal() -> None:
    body = {
        "status": "Failed",
        "run_result": {"status": "Finished", "return_code": -9, "stdout": "", "stderr": ""},
    }
    assert observe(body) == (K.RUNTIME_ERROR, "[runtime error] The code was killed by SIGKILL.")


def test_timeout_keeps_what_was_printed() -> None:
    body = {
        "status": "Failed",
        "run_result": {"status": "TimeLimitExceeded", "return_code": None, "stdout": "started\n"},
    }
    kind, text = observe(body)
    assert kind is K.TIMEOUT
    assert text == (
        "[timeout] The code did not finish within the 30 s time limit and was stopped.\n"
        "Output before it was stopped:\n[stdout]\nstarted"
    )


def test_python_syntax_error_is_a_compile_error_but_a_raised_one_is_not() -> None:
    syntax = "  File \"/tmp/tmpyt31jz52/tmp0cqk4gt0.py\", line 1\n    print(1\n         ^\nSyntaxError: '(' was never closed\n"
    body = {"status": "Failed", "run_result": {"status": "Finished", "return_code": 1, "stderr": syntax}}
    kind, text = observe(body)
    assert kind is K.COMPILE_ERROR
    assert text.startswith(
        '[compile error] The code has a syntax error; nothing ran.\n[stderr]\n  File "main.py"'
    )
    raised = 'Traceback (most recent call last):\n  File "x.py", line 1\nSyntaxError: x\n'
    body = {"status": "Failed", "run_result": {"status": "Finished", "return_code": 1, "stderr": raised}}
    assert observe(body)[0] is K.RUNTIME_ERROR


def test_compile_error_and_compile_timeout() -> None:
    body = {
        "status": "Failed",
        "compile_result": {
            "status": "Finished",
            "return_code": 1,
            "stdout": "",
            "stderr": "error: 'x' was not declared",
        },
        "run_result": None,
    }
    kind, text = observe(body, "cpp")
    assert kind is K.COMPILE_ERROR
    assert (
        text
        == "[compile error] The code did not compile (exit code 1); nothing ran.\n[stderr]\nerror: 'x' was not declared"
    )
    body = {
        "status": "Failed",
        "compile_result": {"status": "TimeLimitExceeded", "return_code": None},
        "run_result": None,
    }
    assert observe(body, "cpp") == (
        K.COMPILE_TIMEOUT,
        "[compile timeout] Compiling the code took longer than 10 s; nothing ran.",
    )


def test_sandbox_error_names_the_service() -> None:
    body = {"status": "SandboxError", "message": "exception on running code print(1): boom None"}
    kind, text = observe(body)
    assert kind is K.SANDBOX_ERROR and kind.is_api_failure
    assert (
        text
        == "[sandbox error] The sandbox failed to run the code: exception on running code print(1): boom None"
    )


@pytest.mark.parametrize(
    ("exc", "kind", "text"),
    [
        (
            SandboxHTTPError("u", 429, "Too Many Requests", "1"),
            K.RATE_LIMITED,
            "[sandbox unavailable] The sandbox is rate-limiting requests: it answered HTTP 429 Too Many "
            "Requests (retry after 1 s); the code was not run.",
        ),
        (
            SandboxHTTPError("u", 500, "boom"),
            K.HTTP_ERROR,
            "[sandbox unavailable] The sandbox answered HTTP 500 Internal Server Error (boom); there is no result.",
        ),
        (
            SandboxConnectionError("u", "connection refused"),
            K.CONNECTION_ERROR,
            "[sandbox unavailable] Could not reach the sandbox (connection refused); there is no result.",
        ),
        (
            SandboxNoAnswer("u", 40.0),
            K.API_TIMEOUT,
            "[sandbox unavailable] The sandbox did not answer within 40 s; there is no result.",
        ),
        (
            SandboxBadResponse("u", "not JSON"),
            K.BAD_RESPONSE,
            "[sandbox unavailable] The sandbox's answer could not be read (not JSON); there is no result.",
        ),
    ],
)
def test_api_failures(exc: SandboxHTTPError, kind: ObservationKind, text: str) -> None:
    assert api_failure_kind(exc) is kind and kind.is_api_failure and not kind.is_model_error
    assert format_api_failure(exc) == text


def test_not_a_run_code_answer() -> None:
    with pytest.raises(ValueError):
        RunOutcome.from_response({"detail": "Not Found"})


def test_temp_paths() -> None:
    assert hide_temp_paths('File "/tmp/tmpdw3m0zaa/tmpu138rp_a.py", line 1') == 'File "main.py", line 1'
    assert hide_temp_paths("/tmp/tmpmoswohhc/tmp2vm319b7.cpp:1:21: error") == "main.cpp:1:21: error"
    assert hide_temp_paths("/tmp/tmpab12cd34/Main.java:3: error") == "main.java:3: error"
    assert hide_temp_paths("/tmp/data.txt") == "/tmp/data.txt"


def test_output_clipping() -> None:
    outcome = RunOutcome.from_response(answer(status="Finished", return_code=0, stdout="x" * 50, stderr=""))
    text = format_run_outcome(outcome, K.SUCCESS, run_timeout=1, compile_timeout=1, max_output_chars=10)
    assert text == "xxxxxxxxxx\n[... 40 more characters not shown]"
