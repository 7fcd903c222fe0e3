"""The wire schema of ``POST /run_jupyter`` (shared/contract/sandboxfusion.md §3).

Field order is the order of keys in responses and of 422 items, as for :mod:`mocksandbox.models`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from mocksandbox.models import CommandRunResult, RunStatus


class RunJupyterRequest(BaseModel):
    """Body of ``POST /run_jupyter``. Unknown fields are ignored, as in SandboxFusion."""

    cells: list[str]
    #: Echoed in the driver's log; not enforced (SandboxFusion does not either).
    cell_timeout: float = 0.0
    #: The driver gets ``total_timeout + 10`` seconds, as in SandboxFusion.
    total_timeout: float = 45.0
    #: Accepted and ignored, as in SandboxFusion.
    memory_limit_MB: int = -1
    kernel: Literal["python3"] = "python3"
    #: Path -> base64 content; unlike ``/run_code``, null values are not allowed.
    files: dict[str, str] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)


class CellRunResult(BaseModel):
    """What one cell did: its streams, its displayed values (mime bundles) and its errors."""

    stdout: str
    stderr: str
    display: list[dict[str, Any]]
    error: list[dict[str, Any]]


class RunJupyterResponse(BaseModel):
    """Body of every answer to a validated ``POST /run_jupyter`` (always HTTP 200)."""

    status: RunStatus
    message: str
    driver: CommandRunResult | None = None
    cells: list[CellRunResult] = Field(default_factory=list)
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
