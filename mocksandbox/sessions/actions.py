"""What the model sends to ``/process_action``: one OpenHands function call, or a ```diff block.

The function-call format is OpenHands' own (its ``fn_call_converter`` for models without native
tool calls)::

    <function=str_replace_editor>
    <parameter=command>str_replace</parameter>
    <parameter=path>/workspace/acme__pagekit__1.2/pagekit/paginator.py</parameter>
    <parameter=old_str>...</parameter>
    <parameter=new_str>...</parameter>
    </function>

Text before the call is the model's reasoning and is ignored. As in OpenHands, parameter values
are stripped of surrounding whitespace, integers and arrays are parsed, and unknown functions,
unknown parameters and missing required ones are errors whose message the model gets back. A
missing ``</function>`` is forgiven (generation often stops at it). Only the first call counts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

#: The tools the agent has: name -> (parameters with their types, required parameters).
FUNCTIONS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "execute_bash": ({"command": "string", "is_input": "string", "timeout": "number"}, ("command",)),
    "str_replace_editor": (
        {
            "command": "string",
            "path": "string",
            "file_text": "string",
            "old_str": "string",
            "new_str": "string",
            "insert_line": "integer",
            "view_range": "array",
        },
        ("command", "path"),
    ),
    "finish": ({"message": "string", "task_completed": "string"}, ()),
}
ENUMS = {("str_replace_editor", "command"): ("view", "create", "str_replace", "insert", "undo_edit")}

_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
_DIFF_BLOCK = re.compile(r"```(?:diff|patch)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)

EXPECTED_FORMAT = """Call exactly one function per message, in this format:

<function=execute_bash>
<parameter=command>cd /workspace && ls</parameter>
</function>

<function=str_replace_editor>
<parameter=command>str_replace</parameter>
<parameter=path>/absolute/path/to/file.py</parameter>
<parameter=old_str>text that appears exactly once</parameter>
<parameter=new_str>its replacement</parameter>
</function>

Functions: execute_bash(command), str_replace_editor(command = view | create | str_replace | insert \
| undo_edit, path, file_text, old_str, new_str, insert_line, view_range), finish(). A ```diff block \
(a unified diff with paths relative to the repository root) is applied as a patch."""


@dataclass(frozen=True)
class FunctionCall:
    """A parsed, validated call."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    #: Calls after the first, which are ignored (OpenHands runs one call per message).
    ignored_calls: int = 0


@dataclass(frozen=True)
class DiffBlock:
    """A fenced ```diff block, to be applied as a patch."""

    patch: str


@dataclass(frozen=True)
class ActionError:
    """A message that is not a usable action; ``message`` says why, for the model."""

    message: str
    #: The function the model meant, when known (the observation is labelled with it).
    name: str = "error"


Action = FunctionCall | DiffBlock | ActionError


def parse_action(text: str) -> Action:
    """The action in the model's message."""
    calls = list(_FUNCTION.finditer(text))
    if calls:
        first = calls[0]
        return _validate(first.group(1).strip(), first.group(2), len(calls) - 1)
    diff = _DIFF_BLOCK.search(text)
    if diff:
        return DiffBlock(diff.group(1))
    if "<function" in text:
        return ActionError(f"ERROR: the function call is malformed.\n\n{EXPECTED_FORMAT}")
    return ActionError(f"ERROR: no function call found in your message.\n\n{EXPECTED_FORMAT}")


def _validate(name: str, body: str, ignored: int) -> Action:
    if name not in FUNCTIONS:
        return ActionError(
            f"ERROR: Function '{name}' not found in available tools: {list(FUNCTIONS)}\n\n{EXPECTED_FORMAT}",
            name=name or "error",
        )
    types, required = FUNCTIONS[name]
    params: dict[str, Any] = {}
    for match in _PARAMETER.finditer(body):
        key, value = match.group(1).strip(), match.group(2).strip()
        if key not in types:
            return ActionError(
                f"ERROR: Parameter '{key}' is not allowed for function '{name}'. "
                f"Allowed parameters: {set(types)}\n\n{EXPECTED_FORMAT}",
                name=name,
            )
        kind = types[key]
        converted: Any = value
        if kind == "integer":
            try:
                converted = int(value)
            except ValueError:
                return ActionError(f"ERROR: Parameter '{key}' is expected to be an integer.", name=name)
        elif kind == "number":
            try:
                converted = float(value)
            except ValueError:
                return ActionError(f"ERROR: Parameter '{key}' is expected to be a number.", name=name)
        elif kind == "array":
            try:
                converted = json.loads(value)
            except json.JSONDecodeError:
                return ActionError(f"ERROR: Parameter '{key}' is expected to be an array.", name=name)
        allowed = ENUMS.get((name, key))
        if allowed is not None and converted not in allowed:
            return ActionError(
                f"ERROR: Parameter '{key}' is expected to be one of {list(allowed)}.", name=name
            )
        params[key] = converted
    missing = [key for key in required if key not in params]
    if missing:
        return ActionError(
            f"ERROR: Missing required parameters for function '{name}': {set(missing)}\n\n{EXPECTED_FORMAT}",
            name=name,
        )
    return FunctionCall(name, params, ignored)


def observation(function: str, output: str) -> str:
    """The text the model gets back: OpenHands' ``EXECUTION RESULT of [<function>]:`` turn."""
    return f"EXECUTION RESULT of [{function}]:\n{output}"


def truncate_observation(content: str, max_chars: int = 30_000) -> str:
    """OpenHands' ``truncate_content``: the head and the tail of an over-long observation."""
    if len(content) <= max_chars:
        return content
    half = max_chars // 2
    return content[:half] + "\n[... Observation truncated due to length ...]\n" + content[-half:]
