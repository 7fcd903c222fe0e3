"""Fault rules: what to match, what to do, and when.

A rule is data (the same JSON from Python, over ``/_mock/faults`` and in a fault file)::

    {"match":    {"path": "/run_code", "method": "POST", "language": "python"},
     "action":   {"type": "status", "status": 429, "headers": {"Retry-After": "1"}},
     "schedule": {"first": 2}}

Every request that the matcher accepts counts as one *match* of the rule (1, 2, 3, ...); the
schedule decides from that count (and a seeded random stream, and the rule's age) whether the
rule fires. The same seed and the same order of requests give the same faults.

Several rules can fire on one request: delays add up and the request goes on, as it does after an
``output_mode`` rule (the first one sets the request's output mode); the first rule with any other
action decides the answer.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator


class _Strict(BaseModel):
    # No NaN or infinity: a delay of Infinity would fail (time.sleep overflows) on every request.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class FaultMatch(_Strict):
    """Which requests a rule looks at. Every given condition must hold."""

    #: Exact path, or a glob (``/run_*``).
    path: str | None = None
    method: str | None = None
    #: The ``language`` field of a JSON body.
    language: str | None = None
    #: A substring of the raw body.
    body_contains: str | None = None
    #: Top-level JSON body fields that must equal these values.
    body: dict[str, Any] | None = None

    def accepts(self, request: RequestInfo) -> bool:
        if self.path is not None and not fnmatch.fnmatchcase(request.path, self.path):
            return False
        if self.method is not None and request.method.upper() != self.method.upper():
            return False
        if self.body_contains is not None and self.body_contains not in request.body_text:
            return False
        json_body = request.json_body if isinstance(request.json_body, dict) else {}
        if self.language is not None and json_body.get("language") != self.language:
            return False
        return self.body is None or all(json_body.get(k, _MISSING) == v for k, v in self.body.items())


_MISSING = object()


class DelayAction(_Strict):
    """Wait, then let the request go on (to the next rule or the real handler)."""

    type: Literal["delay"] = "delay"
    seconds: float | None = Field(None, ge=0)
    min_seconds: float | None = Field(None, ge=0)
    max_seconds: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _fixed_or_range(self) -> DelayAction:
        fixed = self.seconds is not None
        ranged = self.min_seconds is not None and self.max_seconds is not None
        if fixed == ranged:
            raise ValueError("give either seconds, or min_seconds and max_seconds")
        if ranged and self.min_seconds > self.max_seconds:  # type: ignore[operator]
            raise ValueError("min_seconds must not exceed max_seconds")
        return self


class OutputModeAction(_Strict):
    """Run the request with this output mode (``sandboxfusion``: SandboxFusion's stalling reader;
    see :mod:`mocksandbox.divergence`), then go on like a delay: later rules still decide."""

    type: Literal["output_mode"] = "output_mode"
    mode: Literal["complete", "sandboxfusion"] = "sandboxfusion"


class StatusAction(_Strict):
    """Answer with this HTTP status instead of running the request (429, 500, 502, 503, 504, ...)."""

    type: Literal["status"] = "status"
    status: int = Field(ge=100, le=599)
    #: JSON body; a string is sent as text. Default: ``{"detail": "<reason phrase>"}``.
    body: Any = None
    headers: dict[str, str] = Field(default_factory=dict)
    #: Shorthand for a ``Retry-After`` header, in seconds.
    retry_after: float | None = Field(None, ge=0)


class SandboxErrorAction(_Strict):
    """Answer HTTP 200 with ``status: SandboxError`` (the service's own failure, not the program's)."""

    type: Literal["sandbox_error"] = "sandbox_error"
    message: str = "mocksandbox: injected sandbox error"


class ResetAction(_Strict):
    """Drop the connection with a TCP reset, sending no response."""

    type: Literal["reset"] = "reset"


class CloseAction(_Strict):
    """Close the connection cleanly without sending a response."""

    type: Literal["close"] = "close"


class TruncateAction(_Strict):
    """Run the request, then send only the first part of its JSON body (a valid HTTP message)."""

    type: Literal["truncate"] = "truncate"
    fraction: float = Field(0.5, ge=0, lt=1)


class MalformedJsonAction(_Strict):
    """Answer 200 with a body that claims to be JSON and is not."""

    type: Literal["malformed_json"] = "malformed_json"
    body: str = '{"status": "Success", "message": '


class SlowBodyAction(_Strict):
    """Run the request, then send its body in small chunks with pauses between them."""

    type: Literal["slow_body"] = "slow_body"
    chunk_bytes: int = Field(16, ge=1)
    interval_seconds: float = Field(0.05, ge=0)


FaultAction = Annotated[
    DelayAction
    | OutputModeAction
    | StatusAction
    | SandboxErrorAction
    | ResetAction
    | CloseAction
    | TruncateAction
    | MalformedJsonAction
    | SlowBodyAction,
    Field(discriminator="type"),
]


class FaultSchedule(_Strict):
    """When a rule fires, from the count ``n`` of requests it matched (1-based). All given hold."""

    #: Only the first N matches.
    first: int | None = Field(None, ge=0)
    #: Every k-th match (k, 2k, ...).
    every: int | None = Field(None, ge=1)
    #: Only after the first N matches.
    after: int | None = Field(None, ge=0)
    #: With probability p, drawn from a random stream seeded with ``seed``.
    probability: float | None = Field(None, ge=0, le=1)
    seed: int = 0
    #: Seconds since the rule was added (or the last reset): fire only in ``[start, end)``.
    window: tuple[float, float] | None = None
    #: Fire at most this many times in all.
    times: int | None = Field(None, ge=0)


class FaultSpec(_Strict):
    """A whole rule as data."""

    match: FaultMatch = Field(default_factory=FaultMatch)
    action: FaultAction
    schedule: FaultSchedule = Field(default_factory=FaultSchedule)
    #: A name for the journal and the listing; an id is given when absent.
    name: str | None = None


_SPEC_LIST = TypeAdapter(list[FaultSpec])


class RequestInfo:
    """What a matcher may look at; the body is decoded and parsed only if a matcher asks."""

    def __init__(self, method: str, path: str, raw_body: bytes) -> None:
        self.method = method
        self.path = path
        self.raw_body = raw_body

    @functools.cached_property
    def body_text(self) -> str:
        return self.raw_body.decode("utf-8", errors="replace")

    @functools.cached_property
    def json_body(self) -> Any:
        try:
            return json.loads(self.raw_body) if self.raw_body else None
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return None


class FaultError(ValueError):
    """A fault rule or fault file that cannot be used; the message says what is wrong."""


@dataclass
class FaultRule:
    """A :class:`FaultSpec` with its counters."""

    id: str
    spec: FaultSpec
    added_at: float
    matched: int = 0
    fired: int = 0
    _random: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self._random = random.Random(self.spec.schedule.seed)

    def consider(self, request: RequestInfo, now: float) -> bool:
        """Count ``request`` if it matches, and say whether the rule fires on it."""
        if not self.spec.match.accepts(request):
            return False
        self.matched += 1
        n = self.matched
        schedule = self.spec.schedule
        # The random draw happens for every match, fired or not, so the stream stays in step
        # with the order of requests.
        draw = self._random.random() if schedule.probability is not None else 0.0
        fires = (
            (schedule.first is None or n <= schedule.first)
            and (schedule.every is None or n % schedule.every == 0)
            and (schedule.after is None or n > schedule.after)
            and (schedule.probability is None or draw < schedule.probability)
            and (schedule.times is None or self.fired < schedule.times)
            and (schedule.window is None or schedule.window[0] <= now - self.added_at < schedule.window[1])
        )
        if fires:
            self.fired += 1
        return fires

    def delay_seconds(self) -> float:
        action = self.spec.action
        assert isinstance(action, DelayAction)
        if action.seconds is not None:
            return action.seconds
        return self._random.uniform(action.min_seconds or 0.0, action.max_seconds or 0.0)

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            **self.spec.model_dump(mode="json", exclude_none=True),
            "matched": self.matched,
            "fired": self.fired,
        }


@dataclass(frozen=True)
class FaultDecision:
    """What the fault layer does with one request."""

    delay_seconds: float = 0.0
    #: The rule whose action replaces or alters the answer, if any.
    action: Any = None
    rule_ids: tuple[str, ...] = ()
    #: The output mode a rule asked for (the first that did), else ``None``: the server's.
    output_mode: str | None = None

    @property
    def applied(self) -> bool:
        return bool(self.rule_ids)


class FaultInjector:
    """The live set of rules. Thread-safe; :meth:`reset` drops every rule."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []
        self._ids = itertools.count(1)

    def add(self, spec: FaultSpec | Mapping[str, Any]) -> FaultRule:
        """Add a rule (a :class:`FaultSpec` or its JSON form); raises :class:`FaultError` if invalid."""
        spec = validate_fault_spec(spec)
        with self._lock:
            rule = FaultRule(id=spec.name or f"fault-{next(self._ids)}", spec=spec, added_at=self._clock())
            if any(r.id == rule.id for r in self._rules):
                raise FaultError(f"a fault named {rule.id!r} exists already")
            self._rules.append(rule)
        return rule

    def add_all(self, specs: Iterable[FaultSpec | Mapping[str, Any]]) -> list[FaultRule]:
        return [self.add(spec) for spec in specs]

    def remove(self, rule_id: str) -> bool:
        with self._lock:
            before = len(self._rules)
            self._rules = [r for r in self._rules if r.id != rule_id]
            return len(self._rules) != before

    def rules(self) -> list[FaultRule]:
        with self._lock:
            return list(self._rules)

    def reset(self) -> None:
        with self._lock:
            self._rules = []
            self._ids = itertools.count(1)

    def decide(self, request: RequestInfo) -> FaultDecision:
        """Which rules fire on ``request``: the summed delay and the deciding action."""
        delay = 0.0
        fired: list[str] = []
        mode: str | None = None
        with self._lock:
            now = self._clock()
            for rule in self._rules:
                if not rule.consider(request, now):
                    continue
                fired.append(rule.id)
                action = rule.spec.action
                if isinstance(action, DelayAction):
                    delay += rule.delay_seconds()
                    continue
                if isinstance(action, OutputModeAction):
                    mode = mode or action.mode
                    continue
                return FaultDecision(delay, action, tuple(fired), mode)
        return FaultDecision(delay, None, tuple(fired), mode)


def validate_fault_spec(spec: FaultSpec | Mapping[str, Any]) -> FaultSpec:
    """A rule from its JSON form (or as it is); raises :class:`FaultError` when it is not valid."""
    if isinstance(spec, FaultSpec):
        return spec
    try:
        return FaultSpec.model_validate(spec)
    except ValidationError as exc:
        raise FaultError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'rule'}: {e['msg']}" for e in exc.errors())


def parse_fault_specs(data: Any, source: str = "faults") -> list[FaultSpec]:
    """Rules from JSON data: a list of rules, or ``{"faults": [...]}``."""
    if isinstance(data, dict) and "faults" in data:
        data = data["faults"]
    if data is None:
        return []
    try:
        return _SPEC_LIST.validate_python(data)
    except ValidationError as exc:
        raise FaultError(f"{source}: {_describe(exc)}") from None


def load_fault_file(path: str | Path) -> list[FaultSpec]:
    """Rules from a ``.json``, ``.yaml``/``.yml`` or ``.toml`` file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise FaultError(f"cannot read fault file {path}: {exc.strerror}") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        elif path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            raise FaultError(f"fault file {path}: use .json, .yaml, .yml or .toml")
    except (json.JSONDecodeError, yaml.YAMLError, ValueError) as exc:
        if isinstance(exc, FaultError):
            raise
        raise FaultError(f"fault file {path} is not valid: {exc}") from None
    return parse_fault_specs(data, source=str(path))
