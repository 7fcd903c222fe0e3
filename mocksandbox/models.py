"""The wire schema of the SandboxFusion API, as pydantic models.

Field order matters: it is the order of keys in every response and the order in which validation
errors are listed, and both must match SandboxFusion (see shared/contract/sandboxfusion.md §2).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

from pydantic import BaseModel, Field

#: Every language SandboxFusion's enum accepts, in the order its 422 message lists them.
Language = Literal[
    "python",
    "cpp",
    "nodejs",
    "go",
    "go_test",
    "java",
    "php",
    "csharp",
    "bash",
    "typescript",
    "sql",
    "rust",
    "cuda",
    "lua",
    "R",
    "perl",
    "D_ut",
    "ruby",
    "scala",
    "julia",
    "pytest",
    "junit",
    "kotlin_script",
    "jest",
    "verilog",
    "python_gpu",
    "lean",
    "swift",
    "racket",
]
ALL_LANGUAGES: tuple[str, ...] = get_args(Language)


class RunStatus(StrEnum):
    """Top-level outcome of a /run_code or /run_jupyter request."""

    Success = "Success"
    Failed = "Failed"
    SandboxError = "SandboxError"


class CommandRunStatus(StrEnum):
    """Outcome of one command (the compile step or the run step)."""

    Finished = "Finished"
    Error = "Error"
    TimeLimitExceeded = "TimeLimitExceeded"


class RunCodeRequest(BaseModel):
    """Body of ``POST /run_code``. Unknown fields are ignored, as in SandboxFusion."""

    compile_timeout: float = 10
    run_timeout: float = 10
    memory_limit_MB: int = -1
    code: str
    stdin: str | None = None
    language: Language
    files: dict[str, str | None] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)


class CommandRunResult(BaseModel):
    """What one command did. ``return_code`` is null on a timeout and on a sandbox error."""

    status: CommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    """Body of every answer to a validated ``POST /run_code`` (always HTTP 200)."""

    status: RunStatus
    message: str
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


def derive_run_status(
    compile_result: CommandRunResult | None, run_result: CommandRunResult | None
) -> tuple[RunStatus, str]:
    """SandboxFusion's ``parse_run_status``: the first matching rule wins.

    1. any ``Error`` result -> ``SandboxError`` with that result's stderr as the message;
    2. any ``TimeLimitExceeded`` -> ``Failed``;
    3. any non-null, non-zero return code -> ``Failed``;
    4. otherwise ``Success``.
    """
    present = [r for r in (compile_result, run_result) if r is not None]
    for result in present:
        if result.status == CommandRunStatus.Error:
            return RunStatus.SandboxError, result.stderr or ""
    if any(r.status == CommandRunStatus.TimeLimitExceeded for r in present):
        return RunStatus.Failed, ""
    if any(r.return_code is not None and r.return_code != 0 for r in present):
        return RunStatus.Failed, ""
    return RunStatus.Success, ""
