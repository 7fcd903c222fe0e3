"""A scripted multi-turn rollout driver: verl's tool-calling loop, with a script instead of a GPU.

A *policy* plays the model: a list of assistant turns (a script), or a callable that sees the
conversation so far and returns the next turn (or ``None`` to stop). The driver runs the loop a
verl rollout runs: ask the policy for a turn, find its ``<tool_call>`` blocks, run them
concurrently through the tools (so through the execution pool and its limiter), append the
responses, and go on until

* a turn has no tool call (``final_answer``),
* ``max_turns`` assistant turns were taken (``max_turns``; the last turn's calls are not run, as
  verl does not run them),
* the conversation would exceed ``max_seq_len`` tokens by a pluggable counter (``max_seq_len``:
  the turn is cut to fit, as an engine stopping at the length limit would cut it, and its calls are
  not run), or
* the policy has nothing more to say (``policy_done``).

Each rollout becomes a :class:`RolloutRecord`: ``input``, ``output``, ``score`` and ``step`` as in
the seed's sample (verl's ``rollout_data_dir`` dump), plus why it stopped, every tool call with its
observation, and the tools' rewards. Records dump to JSON Lines.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from mocksandbox.tools.base import BaseTool, ToolResult
from mocksandbox.tools.config import ToolRegistry
from mocksandbox.tools.hermes import (
    SPECIAL_TOKENS,
    ChatFormat,
    Message,
    ToolCall,
    ToolCallError,
    ToolTurnStyle,
    parse_tool_calls,
    strip_special_tokens,
)
from mocksandbox.tools.observation import ObservationKind, format_unknown_tool
from mocksandbox.tools.schema import OpenAIFunctionToolSchema
from mocksandbox.tools.scoring import gsm8k_score

TokenCounter = Callable[[str], int]
Scorer = Callable[[str, str], float]

_APPROX_TOKEN = re.compile(r"[A-Za-z]+|\d{1,3}|[^\sA-Za-z\d]")


def approx_token_count(text: str) -> int:
    """A tokenizer-free estimate: each special token, word, group of up to 3 digits and other
    non-space character counts one. Pass ``lambda s: len(tokenizer.encode(s))`` for exact counts."""
    count = 0
    for token in SPECIAL_TOKENS:
        count += text.count(token)
        text = text.replace(token, " ")
    return count + len(_APPROX_TOKEN.findall(text))


# -- policies ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyInput:
    """What a policy sees before it writes turn ``turn`` (0-based)."""

    messages: tuple[Message, ...]
    turn: int
    request_id: str
    #: The conversation as the model would read it, ending with the generation prompt.
    text: str

    @property
    def last_tool_responses(self) -> list[str]:
        """The tool results since the last assistant turn, in call order."""
        found: list[str] = []
        for message in reversed(self.messages):
            if message.role != "tool":
                break
            found.append(message.content)
        return found[::-1]


PolicyFn = Callable[[PolicyInput], str | Awaitable[str | None] | None]


class ScriptedPolicy:
    """The turns of a script, one per call; ``None`` once it runs out."""

    def __init__(self, turns: Iterable[str]) -> None:
        self.turns = list(turns)
        if not all(isinstance(t, str) for t in self.turns):
            raise TypeError("a script is a list of strings (the assistant turns)")

    def __call__(self, view: PolicyInput) -> str | None:
        return self.turns[view.turn] if view.turn < len(self.turns) else None

    def __repr__(self) -> str:
        return f"ScriptedPolicy({len(self.turns)} turns)"


def as_policy(policy: Sequence[str] | PolicyFn) -> PolicyFn:
    """A list of turns becomes a :class:`ScriptedPolicy`; a callable is used as it is."""
    if isinstance(policy, str):
        return ScriptedPolicy([policy])
    if callable(policy):
        return policy
    return ScriptedPolicy(policy)


# -- requests and records ------------------------------------------------------------------------


class RolloutState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    TOOL_CALLING = "tool_calling"
    COMPLETED = "completed"


class StopReason(StrEnum):
    FINAL_ANSWER = "final_answer"
    MAX_TURNS = "max_turns"
    MAX_SEQ_LEN = "max_seq_len"
    POLICY_DONE = "policy_done"


@dataclass
class RolloutRequest:
    """One rollout to run (verl's ``AsyncRolloutRequest``, for a scripted policy)."""

    request_id: str
    #: The prompt turns (system, user).
    messages: list[Message]
    policy: PolicyFn
    tool_schemas: list[OpenAIFunctionToolSchema]
    ground_truth: str | None = None
    #: The training step the record is filed under.
    step: int = 0
    #: Per tool name: keyword arguments for its ``create`` (verl's ``tools_kwargs[name].create_kwargs``).
    create_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    state: RolloutState = RolloutState.PENDING


@dataclass
class ToolCallRecord:
    """One call of a rollout and what came of it."""

    turn: int
    name: str | None
    arguments: dict[str, Any] | None
    kind: str
    observation: str
    reward: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "name": self.name,
            "arguments": self.arguments,
            "kind": self.kind,
            "observation": self.observation,
            "reward": self.reward,
            "metrics": self.metrics,
        }


@dataclass
class RolloutRecord:
    """A finished rollout. ``input``/``output``/``score``/``step`` are the seed's sample fields:
    the prompt and the response as a tokenizer decodes them without special tokens (each turn
    starts with its role, as verl's dump of that time shows it)."""

    input: str
    output: str
    score: float | None
    step: int
    request_id: str = ""
    ground_truth: str | None = None
    stop_reason: str = ""
    #: Why it stopped, in words (over-size: how many tokens, which limit, what was cut).
    stop_detail: str = ""
    turns: int = 0
    tokens: int = 0
    messages: list[Message] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    tool_rewards: dict[str, float] = field(default_factory=dict)

    @property
    def tool_responses(self) -> list[str]:
        """The observations the model read, in order."""
        return [call.observation for call in self.tool_calls]

    def to_dict(self, full: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "input": self.input,
            "output": self.output,
            "score": self.score,
            "step": self.step,
        }
        if full:
            data.update(
                request_id=self.request_id,
                ground_truth=self.ground_truth,
                stop_reason=self.stop_reason,
                stop_detail=self.stop_detail,
                turns=self.turns,
                tokens=self.tokens,
                messages=[m.to_dict() for m in self.messages],
                tool_calls=[c.to_dict() for c in self.tool_calls],
                tool_rewards=self.tool_rewards,
            )
        return data


def dump_jsonl(records: Iterable[RolloutRecord], target: str | Path | IO[str], *, full: bool = True) -> int:
    """Write one JSON object per record (``full=False``: only input/output/score/step)."""
    lines = [json.dumps(r.to_dict(full), ensure_ascii=False, default=str) + "\n" for r in records]
    if isinstance(target, str | Path):
        with open(target, "w", encoding="utf-8") as handle:
            handle.writelines(lines)
    else:
        target.writelines(lines)
    return len(lines)


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


# -- the driver ----------------------------------------------------------------------------------


class RolloutDriver:
    """Runs scripted rollouts against tools (a sandbox URL, through the execution pool).

    ``max_turns`` caps assistant turns; ``max_seq_len`` caps the conversation's length by
    ``token_counter`` (default :func:`approx_token_count`); ``scorer(output, ground_truth)``
    scores a finished rollout that has a ground truth (default: verl's GSM8K scorer).
    ``max_concurrent_rollouts`` bounds how many rollouts of a batch run at once (default: all;
    the tools' limiter still bounds the sandbox calls).
    """

    def __init__(
        self,
        tools: ToolRegistry | Sequence[BaseTool] | Mapping[str, BaseTool],
        *,
        max_turns: int = 10,
        max_seq_len: int = 8192,
        token_counter: TokenCounter = approx_token_count,
        scorer: Scorer | None = gsm8k_score,
        chat_format: ChatFormat | None = None,
        max_concurrent_rollouts: int | None = None,
        system_prompt: str | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        if max_seq_len < 1:
            raise ValueError("max_seq_len must be at least 1")
        if isinstance(tools, ToolRegistry):
            self.tools = tools
        elif isinstance(tools, Mapping):
            self.tools = ToolRegistry(list(tools.values()))
        else:
            self.tools = ToolRegistry(list(tools))
        self.max_turns = max_turns
        self.max_seq_len = max_seq_len
        self.token_counter = token_counter
        self.scorer = scorer
        self.chat_format = chat_format or ChatFormat()
        self.max_concurrent_rollouts = max_concurrent_rollouts
        self.system_prompt = system_prompt
        self._owned: list[ToolRegistry] = []

    @classmethod
    def for_sandbox(
        cls, url: str, tool_config: Mapping[str, Any] | None = None, **options: Any
    ) -> RolloutDriver:
        """A driver offering the seed's ``code_interpreter`` on ``url``; :meth:`close` stops it."""
        from mocksandbox.tools.code_interpreter import CodeInterpreterTool

        registry = ToolRegistry([CodeInterpreterTool({**(tool_config or {}), "sandbox_fusion_url": url})])
        driver = cls(registry, **options)
        driver._owned.append(registry)
        return driver

    def close(self) -> None:
        """Close the tools this driver made (tools passed in stay open)."""
        while self._owned:
            self._owned.pop().close()

    def __enter__(self) -> RolloutDriver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def tool_schemas(self) -> list[OpenAIFunctionToolSchema]:
        return self.tools.schemas

    # -- requests --------------------------------------------------------------------------------

    def create_request(
        self,
        prompt: str | Sequence[Message | dict[str, Any]],
        policy: Sequence[str] | PolicyFn,
        *,
        ground_truth: str | None = None,
        step: int = 0,
        request_id: str | None = None,
        create_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        system_prompt: str | None = None,
    ) -> RolloutRequest:
        """A pending request: a question (or prompt turns), the policy playing the model, and
        what to score against. A question string gets the system prompt in front, if any."""
        if isinstance(prompt, str):
            messages = []
            system = system_prompt if system_prompt is not None else self.system_prompt
            if system is not None:
                messages.append(Message("system", system))
            messages.append(Message("user", prompt))
        else:
            messages = [Message.from_value(m) for m in prompt]
        if not messages:
            raise ValueError("a rollout needs at least one prompt turn")
        kwargs = {name: dict(value) for name, value in (create_kwargs or {}).items()}
        unknown = set(kwargs) - set(self.tools)
        if unknown:
            raise ValueError(f"create_kwargs for unknown tool(s): {sorted(unknown)}")
        return RolloutRequest(
            request_id=request_id or uuid.uuid4().hex,
            messages=messages,
            policy=as_policy(policy),
            tool_schemas=self.tool_schemas,
            ground_truth=ground_truth,
            step=step,
            create_kwargs=kwargs,
        )

    def request_from_row(
        self, row: Mapping[str, Any], policy: Sequence[str] | PolicyFn, *, step: int = 0
    ) -> RolloutRequest:
        """A request from a verl dataset row: ``prompt`` (turns), ``reward_model.ground_truth``,
        ``extra_info.tools_kwargs.<tool>.create_kwargs``, ``extra_info.index``."""
        extra = row.get("extra_info") or {}
        tools_kwargs = extra.get("tools_kwargs") or {}
        ground_truth = (row.get("reward_model") or {}).get("ground_truth")
        return self.create_request(
            row["prompt"],
            policy,
            ground_truth=None if ground_truth is None else str(ground_truth),
            step=step,
            request_id=None if extra.get("index") is None else str(extra["index"]),
            create_kwargs={
                name: value.get("create_kwargs", {})
                for name, value in tools_kwargs.items()
                if name in self.tools
            },
        )

    # -- running ---------------------------------------------------------------------------------

    def _count(self, messages: Sequence[Message], generation_prompt: bool = False) -> int:
        return self.token_counter(self.chat_format.render(messages, self.tool_schemas, generation_prompt))

    async def run(self, request: RolloutRequest) -> RolloutRecord:
        """Run one rollout to its end and record it."""
        if request.state is not RolloutState.PENDING:
            raise ValueError(f"request {request.request_id} is {request.state}, not pending")
        request.state = RolloutState.RUNNING
        instances: dict[str, str] = {}
        messages = list(request.messages)
        calls: list[ToolCallRecord] = []
        turns = 0
        try:
            for name, tool in self.tools.items():
                kwargs = {"ground_truth": request.ground_truth, **request.create_kwargs.get(name, {})}
                instances[name] = await tool.create(f"{request.request_id}:{name}", **kwargs)
            reason, detail = await self._loop(request, messages, calls, instances)
            turns = sum(m.role == "assistant" for m in messages[len(request.messages) :])
            rewards = {name: await self.tools[name].calc_reward(iid) for name, iid in instances.items()}
        finally:
            for name, iid in instances.items():
                await self.tools[name].release(iid)
            request.state = RolloutState.COMPLETED
        fmt = self.chat_format
        output = strip_special_tokens(fmt.response_text(request.messages, messages, self.tool_schemas))
        score = None
        if self.scorer is not None and request.ground_truth is not None:
            score = self.scorer(output, request.ground_truth)
        return RolloutRecord(
            input=strip_special_tokens(fmt.prompt_text(request.messages, self.tool_schemas)),
            output=output,
            score=score,
            step=request.step,
            request_id=request.request_id,
            ground_truth=request.ground_truth,
            stop_reason=reason.value,
            stop_detail=detail,
            turns=turns,
            tokens=self._count(messages),
            messages=messages,
            tool_calls=calls,
            tool_rewards=rewards,
        )

    async def _loop(
        self,
        request: RolloutRequest,
        messages: list[Message],
        calls: list[ToolCallRecord],
        instances: dict[str, str],
    ) -> tuple[StopReason, str]:
        limit = self.max_seq_len
        prompt_tokens = self._count(messages, generation_prompt=True)
        if prompt_tokens > limit:
            return StopReason.MAX_SEQ_LEN, (
                f"the prompt alone is {prompt_tokens} tokens, over max_seq_len={limit}; no turn was asked for"
            )
        turn = 0
        while True:
            view = PolicyInput(
                tuple(messages),
                turn,
                request.request_id,
                self.chat_format.render(messages, self.tool_schemas, add_generation_prompt=True),
            )
            produced = request.policy(view)
            text = await produced if inspect.isawaitable(produced) else produced
            if text is None:
                return StopReason.POLICY_DONE, f"the policy had no turn {turn + 1} to give"
            if not isinstance(text, str):
                raise TypeError(
                    f"a policy returns the turn's text (a str) or None, not {type(text).__name__}"
                )
            candidate = [*messages, Message("assistant", text)]
            tokens = self._count(candidate)
            if tokens > limit:
                kept = self._fit(messages, text)
                if kept is not None:
                    messages.append(Message("assistant", kept))
                pending = len(parse_tool_calls(text).calls)
                return StopReason.MAX_SEQ_LEN, (
                    f"turn {turn + 1} would bring the conversation to {tokens} tokens, over "
                    f"max_seq_len={limit}; "
                    + (
                        f"it was cut to its first {len(kept)} of {len(text)} characters"
                        if kept is not None
                        else "it was dropped (not even its header fits)"
                    )
                    + (f" and its {pending} tool call(s) were not run" if pending else "")
                )
            messages.append(Message("assistant", text))
            turn += 1
            parsed = parse_tool_calls(text)
            if not parsed.has_tool_calls:
                return StopReason.FINAL_ANSWER, f"turn {turn} has no tool call"
            if turn >= self.max_turns:
                return StopReason.MAX_TURNS, (
                    f"max_turns={self.max_turns} reached; the {len(parsed.calls)} tool call(s) of the last "
                    "turn were not run"
                )
            request.state = RolloutState.TOOL_CALLING
            results = await asyncio.gather(*(self._call(c, instances) for c in parsed.calls))
            request.state = RolloutState.RUNNING
            for call, result in zip(parsed.calls, results, strict=True):
                name = call.name if isinstance(call, ToolCall) else None
                arguments = call.arguments if isinstance(call, ToolCall) else None
                calls.append(
                    ToolCallRecord(
                        turn,
                        name,
                        arguments,
                        str(result.metrics.get("kind", "")),
                        result.text,
                        result.reward,
                        result.metrics,
                    )
                )
                messages.append(Message("tool", result.text, name))
            tokens = self._count(messages, generation_prompt=True)
            if tokens > limit:
                return StopReason.MAX_SEQ_LEN, (
                    f"after the tool responses of turn {turn} the conversation is {tokens} tokens, over "
                    f"max_seq_len={limit}; no room for another turn"
                )

    def _fit(self, messages: list[Message], text: str) -> str | None:
        """The longest prefix of ``text`` that keeps the conversation within ``max_seq_len``."""
        if self._count([*messages, Message("assistant", "")]) > self.max_seq_len:
            return None
        low, high = 0, len(text)  # invariant: text[:low] fits, text[:high + 1] does not
        while low < high:
            middle = (low + high + 1) // 2
            if self._count([*messages, Message("assistant", text[:middle])]) <= self.max_seq_len:
                low = middle
            else:
                high = middle - 1
        return text[:low]

    async def _call(self, call: ToolCall | ToolCallError, instances: Mapping[str, str]) -> ToolResult:
        if isinstance(call, ToolCallError):
            return ToolResult(call.observation, 0.0, {"kind": ObservationKind.INVALID_TOOL_CALL.value})
        tool = self.tools.get(call.name)
        if tool is None:
            text = format_unknown_tool(call.name, list(self.tools))
            return ToolResult(text, 0.0, {"kind": ObservationKind.UNKNOWN_TOOL.value})
        return await tool.execute(instances[call.name], call.arguments)

    async def run_batch(self, requests: Iterable[RolloutRequest]) -> list[RolloutRecord]:
        """Run rollouts concurrently (all at once, or ``max_concurrent_rollouts``); records in order."""
        requests = list(requests)
        if self.max_concurrent_rollouts is None:
            return list(await asyncio.gather(*(self.run(r) for r in requests)))
        gate = asyncio.Semaphore(self.max_concurrent_rollouts)

        async def bounded(request: RolloutRequest) -> RolloutRecord:
            async with gate:
                return await self.run(request)

        return list(await asyncio.gather(*(bounded(r) for r in requests)))

    def run_sync(self, requests: RolloutRequest | Iterable[RolloutRequest]) -> list[RolloutRecord]:
        """:meth:`run_batch` from synchronous code (starts and ends its own event loop)."""
        batch = [requests] if isinstance(requests, RolloutRequest) else list(requests)
        return asyncio.run(self.run_batch(batch))


# -- rollout scripts (the fixtures' format) ------------------------------------------------------


@dataclass
class RolloutScript:
    """A recorded conversation to replay: prompt turns, the assistant turns, what to expect.

    The JSON form (``fixtures/rollouts/*.json``): ``prompt`` (turns), ``assistant_turns``,
    ``ground_truth``, ``step``, ``chat_format`` (``{"tool_turn": "hermes" | "role"}``), and
    ``expected`` (``tool_responses``, and the ``record`` as it was dumped).
    """

    prompt: list[Message]
    assistant_turns: list[str]
    ground_truth: str | None = None
    step: int = 0
    chat_format: ChatFormat = field(default_factory=ChatFormat)
    expected: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutScript:
        fmt = data.get("chat_format") or {}
        return cls(
            prompt=[Message.from_value(m) for m in data["prompt"]],
            assistant_turns=list(data["assistant_turns"]),
            ground_truth=data.get("ground_truth"),
            step=int(data.get("step", 0)),
            chat_format=ChatFormat(
                tool_turn=ToolTurnStyle(fmt.get("tool_turn", "hermes")),
                default_system=fmt.get("default_system", ChatFormat.default_system),
            ),
            expected=dict(data.get("expected") or {}),
            description=str(data.get("description", "")),
        )

    @classmethod
    def load(cls, path: str | Path) -> RolloutScript:
        with open(path, encoding="utf-8") as handle:
            return cls.from_dict(json.load(handle))

    def request(self, driver: RolloutDriver, request_id: str | None = None) -> RolloutRequest:
        return driver.create_request(
            self.prompt,
            self.assistant_turns,
            ground_truth=self.ground_truth,
            step=self.step,
            request_id=request_id,
        )
