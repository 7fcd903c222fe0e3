"""Tool configuration: the seed's parameters, and verl-style YAML tool config files.

A tool config file lists tools as verl's does (``actor_rollout_ref.rollout.multi_turn.tool_config_path``)::

    tools:
      - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
        config:
          sandbox_fusion_url: "http://127.0.0.1:8080/run_code"
          num_workers: 10
          enable_global_rate_limit: true
          rate_limit: 10
          default_timeout: 30
          default_language: "python"
        tool_schema:
          type: "function"
          function:
            name: "code_interpreter"
            description: "A tool for executing code."
            parameters:
              type: "object"
              properties:
                code:
                  type: "string"
                  description: "The code to execute."
              required: ["code"]

verl's class name (and ``SandboxFusionTool``, ``CodeInterpreterTool``) build a
:class:`~mocksandbox.tools.code_interpreter.CodeInterpreterTool`; another dotted path is imported
and must name a :class:`~mocksandbox.tools.base.BaseTool` subclass.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mocksandbox.models import ALL_LANGUAGES
from mocksandbox.tools.base import BaseTool
from mocksandbox.tools.schema import OpenAIFunctionToolSchema


class ToolConfigError(ValueError):
    """A tool config that cannot be used; the message says which tool and what is wrong."""


class CodeInterpreterConfig(BaseModel):
    """The ``config`` of a code interpreter tool: the seed's six parameters, then this kit's own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # -- the seed design's parameters ----------------------------------------------------------
    #: Worker threads (or the Ray actor's concurrency) per data-parallel rank that call the sandbox.
    num_workers: int = Field(10, ge=1)
    #: Global limit of concurrent code executions.
    rate_limit: int = Field(10, ge=1)
    #: Seconds each execution may run (``run_timeout``), unless the call asks for another.
    default_timeout: float = Field(30, gt=0)
    #: Language when the call names none.
    default_language: str = "python"
    #: Cap every pool sharing the limiter's name at ``rate_limit`` (False: no cap at all).
    enable_global_rate_limit: bool = True
    #: The sandbox: a base URL or its ``/run_code`` URL (empty: ``$SANDBOX_FUSION_URL``).
    sandbox_fusion_url: str = ""

    # -- verl's later additions ------------------------------------------------------------------
    memory_limit_mb: int = 1024
    #: verl's tool configs may say ``type: native``; accepted and ignored.
    type: str | None = None

    # -- this kit's own ------------------------------------------------------------------------
    compile_timeout: float = Field(10, gt=0)
    #: The client's timeout per request (default: compile + run timeout + 10 s, as verl's client).
    request_timeout: float | None = Field(None, gt=0)
    #: Upper bound on the ``timeout`` a call may ask for (None: no bound).
    max_timeout: float | None = Field(None, gt=0)
    #: ``thread``: a thread pool in this process; ``ray``: a threaded Ray actor (cluster-wide limiter).
    pool_mode: Literal["thread", "ray"] = "thread"
    #: Name of the shared limiter (pools with the same name share one cap; another limit is refused).
    rate_limiter_name: str | None = None
    #: Per-second request rate paced on top of the concurrency cap (None: no pacing).
    rate_per_second: float | None = Field(None, gt=0)
    ray_namespace: str | None = None
    #: Arguments other than code/timeout/language: ``ignore`` them (run; listed in the metrics, as
    #: verl does), ``note`` them (run; a note ends the observation), or ``reject`` the call.
    extra_arguments: Literal["ignore", "note", "reject"] = "ignore"
    #: Step reward of a call whose code failed (runtime/compile error, timeout, bad arguments).
    error_penalty: float = 0.0
    #: Show the sandbox's random temp file path as ``main.<ext>`` (the same code, the same text).
    clean_paths: bool = True
    #: Cut stdout/stderr beyond this many characters (None: never).
    max_output_chars: int | None = Field(None, ge=1)
    #: Retry these HTTP statuses (e.g. [504], as verl's client does), with these back-off sleeps;
    #: the permit goes back to the limiter during a sleep.
    retry_statuses: list[int] = Field(default_factory=list)
    retry_connection_errors: bool = False
    retry_sleeps: list[float] = Field(default_factory=lambda: [1.0, 2.0])

    @field_validator("default_language")
    @classmethod
    def _known_language(cls, value: str) -> str:
        if value not in ALL_LANGUAGES:
            raise ValueError(f"{value!r} is not a SandboxFusion language ({', '.join(ALL_LANGUAGES)})")
        return value

    def resolved_url(self) -> str:
        """``sandbox_fusion_url`` (``$VARS`` expanded), else ``$SANDBOX_FUSION_URL``."""
        url = os.path.expandvars(self.sandbox_fusion_url).strip() or os.environ.get("SANDBOX_FUSION_URL", "")
        if not url:
            raise ToolConfigError(
                "sandbox_fusion_url is not set: give it in the tool config or set SANDBOX_FUSION_URL"
            )
        return url

    def timeout_for_request(self, run_timeout: float) -> float:
        return self.request_timeout or (self.compile_timeout + run_timeout + 10.0)


#: Class names that build the code interpreter.
CODE_INTERPRETER_CLASS_NAMES = frozenset(
    {
        "verl.tools.sandbox_fusion_tools.SandboxFusionTool",
        "SandboxFusionTool",
        "CodeInterpreterTool",
        "mocksandbox.tools.CodeInterpreterTool",
        "mocksandbox.tools.code_interpreter.CodeInterpreterTool",
    }
)


@dataclass
class ToolSpec:
    """One entry of a tool config file."""

    class_name: str
    config: dict[str, Any] = field(default_factory=dict)
    tool_schema: OpenAIFunctionToolSchema | None = None

    def tool_class(self) -> type[BaseTool]:
        if self.class_name in CODE_INTERPRETER_CLASS_NAMES:
            from mocksandbox.tools.code_interpreter import CodeInterpreterTool

            return CodeInterpreterTool
        module_name, _, attr = self.class_name.rpartition(".")
        if not module_name:
            raise ToolConfigError(f"class_name {self.class_name!r}: not a known tool or a dotted path")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ToolConfigError(f"class_name {self.class_name!r} cannot be imported: {exc}") from None
        if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
            raise ToolConfigError(f"class_name {self.class_name!r} is not a mocksandbox.tools.BaseTool")
        return cls

    def build(self, overrides: Mapping[str, Any] | None = None) -> BaseTool:
        cls = self.tool_class()
        config = {**self.config, **(overrides or {})}
        try:
            return cls(config, self.tool_schema)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise ToolConfigError(f"{self.class_name}: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())


def parse_tool_config(data: Any, source: str = "tool config") -> list[ToolSpec]:
    """Tool specs from parsed YAML/JSON: ``{"tools": [{class_name, config, tool_schema}, ...]}``."""
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
        raise ToolConfigError(f"{source}: expected a mapping with a 'tools' list")
    specs = []
    for index, entry in enumerate(data["tools"]):
        where = f"{source}: tools[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            raise ToolConfigError(f"{where}: each tool needs a class_name")
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ToolConfigError(f"{where}: config must be a mapping")
        schema = None
        if entry.get("tool_schema") is not None:
            try:
                schema = OpenAIFunctionToolSchema.model_validate(entry["tool_schema"])
            except ValidationError as exc:
                raise ToolConfigError(f"{where}: tool_schema: {_describe(exc)}") from None
        specs.append(ToolSpec(entry["class_name"], dict(config), schema))
    return specs


def load_tool_config(path: str | Path) -> list[ToolSpec]:
    """Tool specs from a YAML (or JSON) file, as verl reads ``tool_config_path``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ToolConfigError(f"cannot read tool config {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ToolConfigError(f"tool config {path} is not valid: {exc}") from None
    return parse_tool_config(data, str(path))


class ToolRegistry(Mapping[str, BaseTool]):
    """Tools by name (what a rollout offers the model), closed together."""

    def __init__(self, tools: Sequence[BaseTool] = ()) -> None:
        self._tools: dict[str, BaseTool] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: BaseTool) -> None:
        if tool.name in self._tools:
            raise ToolConfigError(f"two tools are named {tool.name!r}")
        self._tools[tool.name] = tool

    def __getitem__(self, name: str) -> BaseTool:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def schemas(self) -> list[OpenAIFunctionToolSchema]:
        return [tool.get_openai_tool_schema() for tool in self._tools.values()]

    def close(self) -> None:
        for tool in self._tools.values():
            tool.close()

    def __enter__(self) -> ToolRegistry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ToolRegistry({list(self._tools)})"


def build_tools(
    source: str | Path | Sequence[ToolSpec], overrides: Mapping[str, Any] | None = None
) -> ToolRegistry:
    """Build every tool of a config file (or of specs); ``overrides`` go into each tool's config."""
    specs = load_tool_config(source) if isinstance(source, str | Path) else list(source)
    registry = ToolRegistry()
    try:
        for spec in specs:
            registry.add(spec.build(overrides))
    except BaseException:
        registry.close()
        raise
    return registry
