"""One frozen settings object, read from arguments, a config file and ``MOCKSANDBOX_*`` variables.

Precedence, lowest first: defaults, the config file, the environment, explicit overrides (the CLI).
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

ENV_PREFIX = "MOCKSANDBOX_"


class SettingsError(ValueError):
    """A config file, variable or option that cannot be used; the message says which and why."""


class Settings(BaseModel):
    """Everything the server can be told. Frozen: build a new one with :meth:`replace`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    #: Interpreter for user Python code (``python`` and ``pytest``); the server's own by default.
    python: str = Field(default_factory=lambda: sys.executable)
    #: Where per-request temp dirs are made; the system temp dir (``/tmp``) by default, as in SandboxFusion.
    tmp_root: str | None = None
    #: Cap per output stream. SandboxFusion returns ~210 KB complete; we drain and keep this much.
    max_output_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    #: Upper bound on any run or compile timeout, in seconds (SandboxFusion has none; NaN or
    #: infinity there means "no limit", which a shared server cannot afford).
    max_timeout_s: float = Field(3600.0, gt=0)
    #: How runs are confined: a cgroup per run where the host allows it, else process groups and rlimits.
    confinement: Literal["auto", "cgroup", "process-group"] = "auto"
    #: Upper bound on processes (threads included) one run may have at once (cgroup ``pids.max``).
    max_processes: int = Field(512, ge=8)
    #: Upper bound on one run's memory in MiB, whatever ``memory_limit_MB`` says (cgroup mode only).
    max_memory_mb: int = Field(4096, ge=16)
    #: ``executor_pod_name`` in answers; SandboxFusion reads ``MY_POD_NAME``.
    pod_name: str | None = Field(default_factory=lambda: os.environ.get("MY_POD_NAME"))
    #: Version named in the ``url`` of 422 items (SandboxFusion runs pydantic 2.6).
    pydantic_docs_version: str = "2.6"
    #: Log every request line to stderr.
    access_log: bool = False

    # -- the fixture framework's extras --------------------------------------------------------
    #: Serve the control endpoints under ``/_mock/`` (faults, journal, stats, reset).
    control_api: bool = True
    #: Requests served at once beyond which the server answers 429 (or queues): a FaaS gateway's cap.
    max_in_flight: int | None = Field(None, ge=1)
    #: What happens to a request over ``max_in_flight``: ``reject`` (429) or ``queue`` (wait for a slot).
    overload: Literal["reject", "queue"] = "reject"
    #: With ``overload = "queue"``: give up after this many seconds and answer 429 (``None``: wait).
    queue_timeout_s: float | None = Field(None, ge=0)
    #: ``Retry-After`` seconds sent with a 429 from the cap.
    retry_after_s: float = Field(1.0, ge=0)
    #: Fault rules applied from start-up and after every reset (see ``mocksandbox.faults``).
    faults: list[dict[str, Any]] = Field(default_factory=list)
    #: A file of fault rules (``.json``, ``.yaml`` or ``.toml``), added to ``faults``.
    faults_file: str | None = None
    #: How many requests the journal keeps (counts and stats cover all of them).
    journal_limit: int = Field(10_000, ge=1)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied and validated."""
        try:
            return Settings(**{**self.model_dump(), **changes})
        except ValidationError as exc:
            raise SettingsError(_describe(exc)) from None


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        if path.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise SettingsError(f"config file {path}: use .toml, .yaml, .yml or .json")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as exc:
        raise SettingsError(f"config file {path} is not valid: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must hold a table/mapping of settings")
    # A [server] table (or the top level) holds the settings; other tables belong to other parts.
    section = data.get("server", data)
    values = {str(k).replace("-", "_"): v for k, v in section.items() if not isinstance(v, dict)}
    if "faults" in data and "faults" not in values:
        values["faults"] = data["faults"]
    return values


def _read_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    known = set(Settings.model_fields)
    values: dict[str, Any] = {}
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX):
            key = name[len(ENV_PREFIX) :].lower()
            if key in known:
                values[key] = value
    return values


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build :class:`Settings` from a config file, the environment and explicit overrides."""
    merged: dict[str, Any] = {}
    if config_file is not None:
        merged.update(_read_config_file(Path(config_file)))
    merged.update(_read_environment(os.environ if environ is None else environ))
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return Settings(**merged)
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return f"invalid settings: {problems}"
