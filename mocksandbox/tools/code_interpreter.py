"""The seed's ``code_interpreter`` tool: code in, an observation a model can act on out.

Every call goes through the reference execution pool (:func:`mocksandbox.ratelimit.init_execution_pool`):
``num_workers`` threads (or a threaded Ray actor) under the shared limiter of ``rate_limit`` permits,
acquired before the HTTP call and released after it, with errors handed back with their type.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from mocksandbox.models import ALL_LANGUAGES
from mocksandbox.ratelimit import RetryPolicy, init_execution_pool
from mocksandbox.ratelimit.pool import RayExecutionPool, ThreadExecutionPool
from mocksandbox.tools.base import BaseTool, ToolResult, UnknownInstanceError
from mocksandbox.tools.client import RetryOn, SandboxAPIError, SandboxCall, run_code_call, run_code_url
from mocksandbox.tools.config import CodeInterpreterConfig
from mocksandbox.tools.observation import (
    ObservationKind,
    api_failure_kind,
    classify,
    format_api_failure,
    format_invalid_arguments,
    format_run_outcome,
)
from mocksandbox.tools.schema import OpenAIFunctionToolSchema, code_interpreter_schema

#: Arguments a call may give besides ``code`` (the seed's execute reads them too).
KNOWN_ARGUMENTS = ("code", "timeout", "language")


@dataclass
class _Instance:
    ground_truth: Any = None
    kinds: list[ObservationKind] = field(default_factory=list)
    #: Stripped stdout of each call that ran (the seed keeps these as the instance's "reward").
    outputs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Arguments:
    code: str
    timeout: float
    language: str
    ignored: tuple[str, ...]


class _Invalid(Exception):
    pass


def _type_name(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }.get(type(value), "a " + type(value).__name__)


class CodeInterpreterTool(BaseTool):
    """Runs the model's code on a SandboxFusion ``/run_code`` (the mock, or a real one).

    ``CodeInterpreterTool({"sandbox_fusion_url": url, "rate_limit": 4})``; the schema defaults to
    the seed's. ``pool`` replaces the execution pool (anything with ``execute_async(fn, *args)``).
    """

    config: CodeInterpreterConfig

    def __init__(
        self,
        config: CodeInterpreterConfig | dict[str, Any] | None = None,
        tool_schema: OpenAIFunctionToolSchema | dict[str, Any] | None = None,
        *,
        pool: Any = None,
    ) -> None:
        cfg = CodeInterpreterConfig.model_validate(config or {})
        schema = (
            code_interpreter_schema()
            if tool_schema is None
            else OpenAIFunctionToolSchema.model_validate(tool_schema)
        )
        super().__init__(cfg, schema)
        self.url = run_code_url(cfg.resolved_url())
        self._instances: dict[str, _Instance] = {}
        self._owns_pool = pool is None
        self.pool: ThreadExecutionPool | RayExecutionPool | Any = pool or self._make_pool()

    def _make_pool(self) -> ThreadExecutionPool | RayExecutionPool:
        cfg = self.config
        retry = None
        if cfg.retry_statuses or cfg.retry_connection_errors:
            retry = RetryPolicy(
                RetryOn(tuple(cfg.retry_statuses), cfg.retry_connection_errors), sleeps=cfg.retry_sleeps
            )
        return init_execution_pool(
            cfg.num_workers,
            enable_global_rate_limit=cfg.enable_global_rate_limit,
            rate_limit=cfg.rate_limit,
            mode=cfg.pool_mode,
            name=cfg.rate_limiter_name,
            rate=cfg.rate_per_second,
            retry=retry,
            namespace=cfg.ray_namespace,
        )

    # -- instances -----------------------------------------------------------------------------

    async def create(self, instance_id: str | None = None, ground_truth: Any = None, **kwargs: Any) -> str:
        if instance_id is None:
            instance_id = str(uuid.uuid4())
        self._instances[instance_id] = _Instance(ground_truth=ground_truth)
        return instance_id

    def _instance(self, instance_id: str) -> _Instance:
        try:
            return self._instances[instance_id]
        except KeyError:
            raise UnknownInstanceError(
                f"{self.name}: no instance {instance_id!r} (call create() first; released already?)"
            ) from None

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The share of this instance's calls whose code ran successfully (0.0 without calls)."""
        kinds = self._instance(instance_id).kinds
        if not kinds:
            return 0.0
        return sum(kind is ObservationKind.SUCCESS for kind in kinds) / len(kinds)

    def outputs(self, instance_id: str) -> list[str]:
        """The stripped stdout of each call that ran, in order (the seed's per-instance list)."""
        return list(self._instance(instance_id).outputs)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)

    @property
    def live_instances(self) -> int:
        return len(self._instances)

    # -- calls ---------------------------------------------------------------------------------

    def _arguments(self, parameters: Any) -> _Arguments:
        cfg = self.config
        if not isinstance(parameters, dict):
            raise _Invalid(f"The arguments must be a JSON object, not {_type_name(parameters)}.")
        if "code" not in parameters:
            raise _Invalid('The required argument "code" is missing.')
        code = parameters["code"]
        if not isinstance(code, str):
            raise _Invalid(f'"code" must be a string, not {_type_name(code)}.')
        if not code.strip():
            raise _Invalid('"code" is empty: there is nothing to run.')
        timeout: Any = parameters.get("timeout", cfg.default_timeout)
        if isinstance(timeout, str):
            try:
                timeout = float(timeout)
            except ValueError:
                raise _Invalid(f'"timeout" must be a number of seconds, not {timeout!r}.') from None
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise _Invalid(f'"timeout" must be a number of seconds, not {_type_name(timeout)}.')
        if not math.isfinite(timeout) or timeout <= 0:
            raise _Invalid(f'"timeout" must be a positive number of seconds, not {timeout!r}.')
        if cfg.max_timeout is not None:
            timeout = min(float(timeout), cfg.max_timeout)
        language = parameters.get("language", cfg.default_language)
        if language not in ALL_LANGUAGES:
            raise _Invalid(
                f'"language" {language!r} is not supported; use one of: {", ".join(ALL_LANGUAGES)}.'
            )
        ignored = tuple(sorted(k for k in parameters if k not in KNOWN_ARGUMENTS))
        if ignored and cfg.extra_arguments == "reject":
            names = ", ".join(f'"{k}"' for k in ignored)
            raise _Invalid(f"Unexpected argument(s) {names}: only code, timeout and language are accepted.")
        return _Arguments(code, float(timeout), str(language), ignored)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> ToolResult:
        """Run ``parameters["code"]``; the observation says what happened. Never raises for the
        model's mistakes or the sandbox's failures (only for an unknown ``instance_id``)."""
        instance = self._instance(instance_id)
        if self.pool is None:
            raise RuntimeError(f"{self.name}: the tool is closed")
        cfg = self.config
        metrics: dict[str, Any] = {"tool": self.name}
        try:
            args = self._arguments(parameters)
        except _Invalid as problem:
            kind = ObservationKind.INVALID_ARGUMENTS
            instance.kinds.append(kind)
            metrics.update(kind=kind.value, problem=str(problem))
            reward = -cfg.error_penalty if cfg.error_penalty else 0.0
            return ToolResult(format_invalid_arguments(self.name, str(problem)), reward, metrics)
        metrics.update(language=args.language, run_timeout=args.timeout, ignored_arguments=list(args.ignored))
        call = SandboxCall(
            url=self.url,
            code=args.code,
            language=args.language,
            run_timeout=args.timeout,
            compile_timeout=cfg.compile_timeout,
            memory_limit_mb=cfg.memory_limit_mb,
            request_timeout=cfg.timeout_for_request(args.timeout),
        )
        started = time.monotonic()
        try:
            outcome = await self.pool.execute_async(run_code_call, call)
        except SandboxAPIError as exc:
            kind = api_failure_kind(exc)
            text = format_api_failure(exc)
            metrics.update(kind=kind.value, error=str(exc), http_status=getattr(exc, "status", None))
        else:
            kind = classify(outcome, args.language)
            text = format_run_outcome(
                outcome,
                kind,
                run_timeout=args.timeout,
                compile_timeout=cfg.compile_timeout,
                clean_paths=cfg.clean_paths,
                max_output_chars=cfg.max_output_chars,
            )
            metrics.update(
                kind=kind.value,
                status=outcome.status,
                run_status=outcome.run_status,
                compile_status=outcome.compile_status,
                return_code=outcome.return_code,
                execution_time=outcome.execution_time,
                http_status=200,
            )
            if outcome.run_status is not None:
                instance.outputs.append(outcome.stdout.strip())
        metrics["latency_s"] = time.monotonic() - started
        if args.ignored and cfg.extra_arguments == "note":
            text += f"\n[note] Ignored unexpected argument(s): {', '.join(args.ignored)}."
        instance.kinds.append(kind)
        reward = -cfg.error_penalty if kind.is_model_error and cfg.error_penalty else 0.0
        return ToolResult(text, reward, metrics)

    def close(self) -> None:
        """Stop the pool this tool made (a pool passed in is left alone)."""
        if self._owns_pool and self.pool is not None:
            self.pool.close()
            self.pool = None
