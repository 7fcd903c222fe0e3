"""Hermes/Qwen tool-call parsing and ChatML rendering (no sandbox)."""

from __future__ import annotations

import json

import pytest

from mocksandbox.tools import (
    CODE_INTERPRETER_SCHEMA,
    ChatFormat,
    Message,
    RolloutScript,
    ToolCall,
    ToolCallError,
    ToolTurnStyle,
    format_tool_call,
    format_tool_response,
    parse_tool_calls,
    strip_special_tokens,
    tools_block,
)


def test_several_calls_in_one_turn_in_order() -> None:
    text = (
        "Let me compute both.\n"
        '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"}}\n</tool_call>\n'
        "and\n"
        '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(2)"}}</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert [c.arguments["code"] for c in parsed.valid_calls] == ["print(1)", "print(2)"]
    assert parsed.content == "Let me compute both.\n\nand"
    assert not parsed.errors


def test_whitespace_and_fences_are_tolerated() -> None:
    text = (
        "<tool_call>  \n\n\t"
        '{ "name" : "code_interpreter" ,\n  "arguments" : { "code" : "x = 1" } }'
        "  \n</tool_call>"
        '<tool_call>\n```json\n{"name": "code_interpreter", "arguments": {"code": "y"}}\n```\n</tool_call>'
    )
    calls = parse_tool_calls(text).valid_calls
    assert [(c.name, c.arguments) for c in calls] == [
        ("code_interpreter", {"code": "x = 1"}),
        ("code_interpreter", {"code": "y"}),
    ]


def test_arguments_as_a_json_string_and_parameters_alias() -> None:
    text = (
        '<tool_call>{"name": "code_interpreter", "arguments": "{\\"code\\": \\"print(3)\\"}"}</tool_call>'
        '<tool_call>{"name": "code_interpreter", "parameters": {"code": "print(4)"}}</tool_call>'
        '<tool_call>{"name": "code_interpreter"}</tool_call>'
    )
    calls = parse_tool_calls(text).valid_calls
    assert [c.arguments for c in calls] == [{"code": "print(3)"}, {"code": "print(4)"}, {}]


@pytest.mark.parametrize(
    ("block", "says"),
    [
        ('{"name": "code_interpreter", "arguments": {"code": "print(1)"}', "not valid JSON"),
        ("{'name': 'code_interpreter'}", "not valid JSON"),
        ("", "empty"),
        ('["code_interpreter"]', "must be a JSON object"),
        ('{"arguments": {"code": "1"}}', 'no "name"'),
        ('{"name": "code_interpreter", "arguments": [1]}', '"arguments" must be a JSON object'),
        ('{"name": "code_interpreter", "arguments": "{oops"}', "string that is not valid JSON"),
    ],
)
def test_malformed_calls_become_error_observations(block: str, says: str) -> None:
    parsed = parse_tool_calls(f"thinking <tool_call>{block}</tool_call> done")
    [error] = parsed.calls
    assert isinstance(error, ToolCallError)
    assert error.observation.startswith("[invalid tool call]")
    assert says in error.observation
    assert '{"name": <function-name>, "arguments": <args-json-object>}' in error.observation


def test_unclosed_block_is_an_error_after_the_good_ones() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        ' then <tool_call>{"name": "code_interpreter", "arguments": {"code": "pri'
    )
    parsed = parse_tool_calls(text)
    assert isinstance(parsed.calls[0], ToolCall)
    assert isinstance(parsed.calls[1], ToolCallError)
    assert "no closing </tool_call>" in parsed.calls[1].observation
    assert parsed.content == "then"


def test_no_calls() -> None:
    parsed = parse_tool_calls("#### 42")
    assert not parsed.has_tool_calls and parsed.content == "#### 42"


def test_format_call_round_trips() -> None:
    block = format_tool_call("code_interpreter", {"code": "print('é')\nprint(2)"})
    assert block == (
        '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(\'é\')\\nprint(2)"}}\n</tool_call>'
    )
    [call] = parse_tool_calls(block).valid_calls
    assert call.arguments == {"code": "print('é')\nprint(2)"}


def test_tools_block_lists_one_schema_per_line() -> None:
    block = tools_block([CODE_INTERPRETER_SCHEMA, CODE_INTERPRETER_SCHEMA])
    inner = block.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].split("\n")
    assert [json.loads(line)["function"]["name"] for line in inner] == ["code_interpreter"] * 2
    assert block.endswith(
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def test_hermes_tool_responses_share_one_user_turn() -> None:
    messages = [
        Message("user", "q"),
        Message("assistant", "calls"),
        Message("tool", "1\n"),
        Message("tool", "2\n"),
        Message("assistant", "#### 3"),
    ]
    text = ChatFormat().render(messages, [CODE_INTERPRETER_SCHEMA])
    assert (
        "<|im_start|>user\n<tool_response>\n1\n\n</tool_response>\n<tool_response>\n2\n\n</tool_response><|im_end|>\n"
        in text
    )
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    assert format_tool_response("x") == "<tool_response>\nx\n</tool_response>"


def test_role_style_and_default_system() -> None:
    fmt = ChatFormat(tool_turn=ToolTurnStyle.ROLE, default_system=None)
    text = fmt.render([Message("user", "q"), Message("assistant", "a"), Message("tool", "r")])
    assert (
        text
        == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n<|im_start|>tool\nr<|im_end|>\n"
    )
    assert (
        ChatFormat()
        .render([Message("user", "q")], add_generation_prompt=True)
        .endswith("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")
    )


def test_the_seed_record_renders_from_its_turns(seed_script: RolloutScript) -> None:
    # Without any sandbox: prompt + turns + the recorded tool response give the seed's record.
    fmt, record = seed_script.chat_format, seed_script.expected["record"]
    messages = [
        *seed_script.prompt,
        Message("assistant", seed_script.assistant_turns[0]),
        Message("tool", seed_script.expected["tool_responses"][0]),
        Message("assistant", seed_script.assistant_turns[1]),
    ]
    tools = [CODE_INTERPRETER_SCHEMA]
    assert strip_special_tokens(fmt.prompt_text(seed_script.prompt, tools)) == record["input"]
    assert strip_special_tokens(fmt.response_text(seed_script.prompt, messages, tools)) == record["output"]
    [call] = parse_tool_calls(seed_script.assistant_turns[0]).calls
    assert isinstance(call, ToolCall)
    assert call.arguments["executes"] == "True"  # the seed model's unexpected extra argument
