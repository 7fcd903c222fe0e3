"""What a model reads after a tool call: one text per outcome, each saying what happened.

The seed's sketch answers ``"no stdout here"`` whether the program timed out, did not compile,
raised, or never reached the sandbox. Here every outcome has its own :class:`ObservationKind` and a
text that starts with a bracketed tag (``[timeout]``, ``[compile error]``, ``[runtime error]``,
``[sandbox unavailable]``, ``[sandbox error]``, ``[invalid arguments]``, ...), followed by the
program's own stdout and stderr under ``[stdout]`` / ``[stderr]``. The one exception is the common
case: a program that succeeded and wrote only to stdout is answered with its stdout, verbatim
(``220000.0\\n`` in the seed's sample), as verl answers it.
"""

from __future__ import annotations

import re
import signal
from enum import StrEnum

from mocksandbox.tools.client import (
    RunOutcome,
    SandboxAPIError,
    SandboxBadResponse,
    SandboxConnectionError,
    SandboxHTTPError,
    SandboxNoAnswer,
    seconds,
)


class ObservationKind(StrEnum):
    """How a tool call ended."""

    SUCCESS = "success"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    COMPILE_ERROR = "compile_error"
    COMPILE_TIMEOUT = "compile_timeout"
    #: The service's own failure, reported in a 200 answer (``status: SandboxError``).
    SANDBOX_ERROR = "sandbox_error"
    #: HTTP 429.
    RATE_LIMITED = "rate_limited"
    #: Any other HTTP error status.
    HTTP_ERROR = "http_error"
    CONNECTION_ERROR = "connection_error"
    #: The client's request timeout ran out (not the program's time limit).
    API_TIMEOUT = "api_timeout"
    BAD_RESPONSE = "bad_response"
    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_TOOL_CALL = "invalid_tool_call"

    @property
    def is_api_failure(self) -> bool:
        """The sandbox service failed: the model's code is not to blame."""
        return self in API_FAILURES

    @property
    def is_model_error(self) -> bool:
        """The model's code or call was at fault."""
        return self in MODEL_ERRORS


API_FAILURES = frozenset(
    {
        ObservationKind.SANDBOX_ERROR,
        ObservationKind.RATE_LIMITED,
        ObservationKind.HTTP_ERROR,
        ObservationKind.CONNECTION_ERROR,
        ObservationKind.API_TIMEOUT,
        ObservationKind.BAD_RESPONSE,
    }
)
MODEL_ERRORS = frozenset(
    {
        ObservationKind.RUNTIME_ERROR,
        ObservationKind.TIMEOUT,
        ObservationKind.COMPILE_ERROR,
        ObservationKind.COMPILE_TIMEOUT,
        ObservationKind.INVALID_ARGUMENTS,
        ObservationKind.UNKNOWN_TOOL,
        ObservationKind.INVALID_TOOL_CALL,
    }
)

#: SandboxFusion writes each program to ``/tmp/tmpXXXXXXXX/tmpYYYYYYYY.<ext>`` (Java: ``Main.java``).
_TEMP_PATH = re.compile(r"(?:/[\w.-]+)*/tmp[\w]{6,}/(?:tmp[\w]{6,}|Main)\.(\w+)")
_PY_SYNTAX = re.compile(r"^(SyntaxError|IndentationError|TabError)\b", re.MULTILINE)


def hide_temp_paths(text: str) -> str:
    """Replace the sandbox's random temp file path with ``main.<ext>``: same code, same text."""
    return _TEMP_PATH.sub(lambda m: f"main.{m.group(1)}", text)


def classify(outcome: RunOutcome, language: str = "python") -> ObservationKind:
    """The kind of a 200 answer, from its statuses (contract §2.3)."""
    if outcome.status == "SandboxError":
        return ObservationKind.SANDBOX_ERROR
    if outcome.compile_status == "TimeLimitExceeded":
        return ObservationKind.COMPILE_TIMEOUT
    if outcome.compile_status == "Finished" and outcome.compile_return_code not in (0, None):
        return ObservationKind.COMPILE_ERROR
    if outcome.run_status == "TimeLimitExceeded":
        return ObservationKind.TIMEOUT
    if outcome.status == "Success":
        return ObservationKind.SUCCESS
    if outcome.run_status is None:  # Failed with no run: compile failed in a way not seen above
        return ObservationKind.COMPILE_ERROR
    if _is_python_syntax_error(outcome, language):
        return ObservationKind.COMPILE_ERROR
    return ObservationKind.RUNTIME_ERROR


def _is_python_syntax_error(outcome: RunOutcome, language: str) -> bool:
    # Python has no compile step in SandboxFusion: a syntax error is exit code 1 with no traceback
    # header (a SyntaxError raised while running has "Traceback (most recent call last):").
    return (
        language in ("python", "python_gpu")
        and outcome.return_code == 1
        and "Traceback (most recent call last)" not in outcome.stderr
        and bool(_PY_SYNTAX.search(outcome.stderr))
    )


def _clip(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} more characters not shown]"


def _sections(*parts: tuple[str, str]) -> str:
    return "\n".join(f"[{label}]\n{text.rstrip(chr(10))}" for label, text in parts if text)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def format_run_outcome(
    outcome: RunOutcome,
    kind: ObservationKind,
    *,
    run_timeout: float,
    compile_timeout: float,
    clean_paths: bool = True,
    max_output_chars: int | None = None,
) -> str:
    """The observation for a 200 answer of kind ``kind``."""

    def out(text: str) -> str:
        return _clip(hide_temp_paths(text) if clean_paths else text, max_output_chars)

    stdout, stderr = out(outcome.stdout), out(outcome.stderr)
    if kind is ObservationKind.SUCCESS:
        if not stderr:
            return stdout if stdout else "[no output] The code ran successfully and printed nothing."
        return _sections(("stdout", stdout), ("stderr", stderr))
    if kind is ObservationKind.RUNTIME_ERROR:
        rc = outcome.return_code
        if rc is not None and rc < 0:
            head = f"[runtime error] The code was killed by {_signal_name(-rc)}."
        else:
            head = f"[runtime error] The code exited with code {rc}."
        return "\n".join(filter(None, [head, _sections(("stdout", stdout), ("stderr", stderr))]))
    if kind is ObservationKind.TIMEOUT:
        head = (
            f"[timeout] The code did not finish within the {seconds(run_timeout)} time limit and was stopped."
        )
        body = _sections(("stdout", stdout), ("stderr", stderr))
        return "\n".join(filter(None, [head, "Output before it was stopped:" if body else "", body]))
    if kind is ObservationKind.COMPILE_TIMEOUT:
        return (
            f"[compile timeout] Compiling the code took longer than {seconds(compile_timeout)}; nothing ran."
        )
    if kind is ObservationKind.COMPILE_ERROR:
        if outcome.compile_status is None:  # Python: a syntax error
            return "\n".join(
                ["[compile error] The code has a syntax error; nothing ran.", _sections(("stderr", stderr))]
            )
        details = _sections(("stdout", out(outcome.compile_stdout)), ("stderr", out(outcome.compile_stderr)))
        rc = outcome.compile_return_code
        head = f"[compile error] The code did not compile (exit code {rc}); nothing ran."
        return "\n".join(filter(None, [head, details]))
    if kind is ObservationKind.SANDBOX_ERROR:
        message = _clip(outcome.message.strip(), 300) or "no message"
        return f"[sandbox error] The sandbox failed to run the code: {message}"
    raise ValueError(f"{kind} is not the kind of a /run_code answer")


def api_failure_kind(exc: SandboxAPIError) -> ObservationKind:
    if isinstance(exc, SandboxHTTPError):
        return ObservationKind.RATE_LIMITED if exc.status == 429 else ObservationKind.HTTP_ERROR
    if isinstance(exc, SandboxConnectionError):
        return ObservationKind.CONNECTION_ERROR
    if isinstance(exc, SandboxNoAnswer):
        return ObservationKind.API_TIMEOUT
    if isinstance(exc, SandboxBadResponse):
        return ObservationKind.BAD_RESPONSE
    return ObservationKind.HTTP_ERROR


def format_api_failure(exc: SandboxAPIError) -> str:
    """The observation when the service failed: what happened, and that there is no result."""
    if isinstance(exc, SandboxHTTPError) and exc.status == 429:
        return (
            f"[sandbox unavailable] The sandbox is rate-limiting requests: it answered {exc.describe()}; "
            "the code was not run."
        )
    if isinstance(exc, SandboxHTTPError):
        return f"[sandbox unavailable] The sandbox answered {exc.describe()}; there is no result."
    text = exc.describe()
    return f"[sandbox unavailable] {text[0].upper()}{text[1:]}; there is no result."


def format_invalid_arguments(tool: str, problem: str) -> str:
    return (
        f"[invalid arguments] {problem} The code was not run. Call {tool} with "
        '{"code": "<the code to run>"}.'
    )


def format_unknown_tool(name: str, available: list[str]) -> str:
    names = ", ".join(available) or "none"
    return f"[unknown tool] There is no tool named {name!r}. Available tools: {names}."
