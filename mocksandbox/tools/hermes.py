"""Hermes/Qwen-style tool calling in plain text: parse the model's calls, render the conversation.

A model asks for tools by writing, anywhere in its turn, one or more blocks::

    <tool_call>
    {"name": "code_interpreter", "arguments": {"code": "print(1 + 1)"}}
    </tool_call>

and reads the results back in ``<tool_response>`` blocks. The tools it may call are listed in the
system prompt inside ``<tools></tools>``, one JSON schema per line. :class:`ChatFormat` renders a
conversation the way Qwen2.5's chat template does (ChatML: ``<|im_start|>role\\n...<|im_end|>``),
with tool results either as Qwen's ``<tool_response>`` blocks in a ``user`` turn (``hermes``, the
default) or as a ``tool`` turn holding the bare result (``role``: what the seed's sample shows).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from mocksandbox.tools.schema import OpenAIFunctionToolSchema

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS = (IM_START, IM_END, END_OF_TEXT)
#: Qwen2.5's system prompt when the conversation has none.
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
#: What a call should look like (quoted in error observations and in the tools block).
CALL_FORMAT = '{"name": <function-name>, "arguments": <args-json-object>}'

_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


# -- parsing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: a tool name and its arguments."""

    name: str
    arguments: dict[str, Any]
    #: The text between the tags, as written.
    raw: str = ""


@dataclass(frozen=True)
class ToolCallError:
    """A block that is not a usable call; ``observation`` tells the model what is wrong."""

    observation: str
    raw: str = ""

    @property
    def name(self) -> str | None:
        return None


@dataclass(frozen=True)
class ParsedTurn:
    """A model turn split into its text and its calls (in order, broken ones included)."""

    content: str
    calls: list[ToolCall | ToolCallError] = field(default_factory=list)

    @property
    def has_tool_calls(self) -> bool:
        return bool(self.calls)

    @property
    def valid_calls(self) -> list[ToolCall]:
        return [c for c in self.calls if isinstance(c, ToolCall)]

    @property
    def errors(self) -> list[ToolCallError]:
        return [c for c in self.calls if isinstance(c, ToolCallError)]


def invalid_tool_call(problem: str, raw: str = "") -> ToolCallError:
    return ToolCallError(
        f"[invalid tool call] {problem} Write each call as {TOOL_CALL_OPEN}{CALL_FORMAT}{TOOL_CALL_CLOSE}.",
        raw,
    )


def parse_call(raw: str) -> ToolCall | ToolCallError:
    """One block's text: JSON with a ``name`` and an ``arguments`` object (tolerantly)."""
    text = raw.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    if not text:
        return invalid_tool_call("The <tool_call> block is empty.", raw)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return invalid_tool_call(
            f"The text inside <tool_call></tool_call> is not valid JSON ({exc.msg} at line {exc.lineno} "
            f"column {exc.colno}).",
            raw,
        )
    if not isinstance(data, dict):
        return invalid_tool_call("The call must be a JSON object.", raw)
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        return invalid_tool_call('The call has no "name" (a string naming the tool).', raw)
    arguments: Any = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI's wire format: arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return invalid_tool_call(f'"arguments" is a string that is not valid JSON ({exc.msg}).', raw)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return invalid_tool_call('"arguments" must be a JSON object.', raw)
    return ToolCall(name.strip(), arguments, raw)


def parse_tool_calls(text: str) -> ParsedTurn:
    """Every ``<tool_call>`` block of a turn, in order; an unclosed last block is an error too."""
    calls: list[ToolCall | ToolCallError] = []
    pieces: list[str] = []
    position = 0
    for match in _BLOCK.finditer(text):
        pieces.append(text[position : match.start()])
        calls.append(parse_call(match.group(1)))
        position = match.end()
    rest = text[position:]
    unclosed = rest.find(TOOL_CALL_OPEN)
    if unclosed >= 0:
        pieces.append(rest[:unclosed])
        raw = rest[unclosed + len(TOOL_CALL_OPEN) :]
        calls.append(invalid_tool_call(f"A {TOOL_CALL_OPEN} block has no closing {TOOL_CALL_CLOSE}.", raw))
    else:
        pieces.append(rest)
    return ParsedTurn("".join(pieces).strip(), calls)


def has_tool_call(text: str) -> bool:
    return TOOL_CALL_OPEN in text


# -- formatting ----------------------------------------------------------------------------------


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A call block as Qwen2.5's template writes one."""
    return (
        f'{TOOL_CALL_OPEN}\n{{"name": "{name}", "arguments": '
        f"{json.dumps(arguments, ensure_ascii=False)}}}\n{TOOL_CALL_CLOSE}"
    )


def format_tool_response(text: str) -> str:
    return f"<tool_response>\n{text}\n</tool_response>"


def tools_block(tools: Iterable[OpenAIFunctionToolSchema]) -> str:
    """The text Qwen2.5's template appends to the system prompt when tools are offered."""
    lines = "".join("\n" + tool.to_json() for tool in tools)
    return (
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        f"{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        f"{TOOL_CALL_OPEN}{TOOL_CALL_CLOSE} XML tags:\n{TOOL_CALL_OPEN}\n{CALL_FORMAT}\n{TOOL_CALL_CLOSE}"
    )


def strip_special_tokens(text: str) -> str:
    """The text as a tokenizer decodes it with ``skip_special_tokens=True``."""
    for token in SPECIAL_TOKENS:
        text = text.replace(token, "")
    return text


# -- conversations -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """One turn. Assistant content is the model's raw text, ``<tool_call>`` blocks included."""

    role: str
    content: str
    #: For ``tool`` turns: which tool answered.
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            data["name"] = self.name
        return data

    @classmethod
    def from_value(cls, value: Message | dict[str, Any]) -> Message:
        if isinstance(value, Message):
            return value
        if not isinstance(value, dict) or not isinstance(value.get("role"), str):
            raise ValueError(f"a message needs a role and a content: {value!r}")
        content = value.get("content")
        if not isinstance(content, str):
            raise ValueError(f"message content must be a string: {value!r}")
        return cls(value["role"], content, value.get("name"))


class ToolTurnStyle(StrEnum):
    """How tool results are written back into the conversation."""

    #: Qwen2.5/Hermes: consecutive results in one ``user`` turn, each in ``<tool_response>`` tags.
    HERMES = "hermes"
    #: A ``tool`` turn per result holding the bare text (the seed's sample: ``tool\\n220000.0\\n``).
    ROLE = "role"


@dataclass(frozen=True)
class ChatFormat:
    """ChatML rendering as Qwen2.5's chat template does it (the template verl's rollouts apply)."""

    tool_turn: ToolTurnStyle = ToolTurnStyle.HERMES
    #: System prompt used when the conversation has none (None: no system turn then, unless tools).
    default_system: str | None = QWEN_DEFAULT_SYSTEM

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[OpenAIFunctionToolSchema] = (),
        add_generation_prompt: bool = False,
    ) -> str:
        parts: list[str] = []
        rest = list(messages)
        system = rest[0].content if rest and rest[0].role == "system" else None
        if system is not None:
            rest = rest[1:]
        if tools:
            parts.append(
                f"{IM_START}system\n{system if system is not None else QWEN_DEFAULT_SYSTEM}"
                f"{tools_block(tools)}{IM_END}\n"
            )
        elif system is not None or self.default_system is not None:
            parts.append(
                f"{IM_START}system\n{system if system is not None else self.default_system}{IM_END}\n"
            )
        index = 0
        while index < len(rest):
            message = rest[index]
            if message.role == "tool" and self.tool_turn is ToolTurnStyle.HERMES:
                group = []
                while index < len(rest) and rest[index].role == "tool":
                    group.append("\n" + format_tool_response(rest[index].content))
                    index += 1
                parts.append(f"{IM_START}user{''.join(group)}{IM_END}\n")
                continue
            parts.append(f"{IM_START}{message.role}\n{message.content}{IM_END}\n")
            index += 1
        if add_generation_prompt:
            parts.append(f"{IM_START}assistant\n")
        return "".join(parts)

    def prompt_text(self, prompt: Sequence[Message], tools: Sequence[OpenAIFunctionToolSchema] = ()) -> str:
        """The prompt as the model sees it, ending with the generation prompt."""
        return self.render(prompt, tools, add_generation_prompt=True)

    def response_text(
        self,
        prompt: Sequence[Message],
        messages: Sequence[Message],
        tools: Sequence[OpenAIFunctionToolSchema] = (),
    ) -> str:
        """Everything after the prompt's turns; a last assistant turn ends at its end-of-turn
        token (the model stopped there: no newline after it)."""
        before = self.render(prompt, tools)
        full = self.render(messages, tools)
        if not full.startswith(before):
            raise ValueError("messages do not start with the prompt")
        response = full[len(before) :]
        if messages and messages[-1].role == "assistant" and response.endswith("\n"):
            response = response[:-1]
        return response
