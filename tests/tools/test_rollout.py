"""The scripted rollout driver against the mock, following the seed's test plan:
request creation, the over-size case, the basic case (the seed's sample replayed), the batch case
(32 rollouts, limit 4), and a rollout under injected faults."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from mocksandbox.pytest_plugin import MockSandboxHandle
from mocksandbox.tools import (
    CODE_INTERPRETER_SCHEMA,
    CodeInterpreterTool,
    Message,
    PolicyInput,
    RolloutDriver,
    RolloutScript,
    RolloutState,
    ScriptedPolicy,
    StopReason,
    approx_token_count,
    dump_jsonl,
    format_tool_call,
    gsm8k_numeric_score,
    load_jsonl,
    strip_special_tokens,
)

MakeTool = Callable[..., CodeInterpreterTool]


def call(code: str, **extra: Any) -> str:
    return format_tool_call("code_interpreter", {"code": code, **extra})


# -- request creation ----------------------------------------------------------------------------


def test_rollout_req_creation(make_tool: MakeTool, seed_script: RolloutScript) -> None:
    driver = RolloutDriver([make_tool()], system_prompt="You are a math expert.")
    request = driver.create_request(
        "What is 6 * 7?",
        ["#### 42"],
        ground_truth="42",
        step=3,
        create_kwargs={"code_interpreter": {"ground_truth": "test-solution-str"}},
    )
    assert request.state is RolloutState.PENDING
    assert request.tool_schemas == [CODE_INTERPRETER_SCHEMA]
    assert request.messages == [
        Message("system", "You are a math expert."),
        Message("user", "What is 6 * 7?"),
    ]
    assert (request.ground_truth, request.step) == ("42", 3)
    assert request.create_kwargs == {"code_interpreter": {"ground_truth": "test-solution-str"}}
    assert isinstance(request.policy, ScriptedPolicy) and request.policy.turns == ["#### 42"]
    assert len(request.request_id) == 32

    # From the seed's prompt turns, and from a verl dataset row.
    seeded = seed_script.request(driver, request_id="seed")
    assert [m.role for m in seeded.messages] == ["system", "user"] and seeded.step == 1
    row = {
        "prompt": [{"role": "user", "content": "What is 6 * 7?"}],
        "reward_model": {"ground_truth": 42, "style": "rule"},
        "extra_info": {
            "index": 7,
            "tools_kwargs": {"code_interpreter": {"create_kwargs": {"ground_truth": 42}}},
        },
    }
    from_row = driver.request_from_row(row, ["#### 42"], step=2)
    assert (from_row.request_id, from_row.ground_truth, from_row.step) == ("7", "42", 2)
    assert from_row.create_kwargs == {"code_interpreter": {"ground_truth": 42}}
    with pytest.raises(ValueError, match="unknown tool"):
        driver.create_request("q", ["a"], create_kwargs={"web_search": {}})


# -- the basic case: the seed's sample, replayed ---------------------------------------------------


def test_tool_call_basic_case(
    make_tool: MakeTool, mocksandbox: MockSandboxHandle, seed_script: RolloutScript
) -> None:
    driver = RolloutDriver([make_tool()], chat_format=seed_script.chat_format, max_turns=10)
    [record] = driver.run_sync(seed_script.request(driver))
    expected = seed_script.expected["record"]

    assert record.tool_responses == ["220000.0\n"] == seed_script.expected["tool_responses"]
    assert record.score == expected["score"] == 0  # verl's strict GSM8K: "220000.0" != "220000"
    assert (record.input, record.output, record.step) == (
        expected["input"],
        expected["output"],
        expected["step"],
    )
    assert record.stop_reason == StopReason.FINAL_ANSWER and record.turns == 2
    assert [m.role for m in record.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert record.tool_calls[0].metrics["ignored_arguments"] == ["executes"]
    assert record.tool_rewards == {"code_interpreter": 1.0}
    [entry] = mocksandbox.assert_requests(1, path="/run_code")
    assert entry.body["code"].endswith("print(total_income_this_year)")

    # The JSONL line with the seed's four fields is the seed's record.
    buffer = io.StringIO()
    dump_jsonl([record], buffer, full=False)
    assert json.loads(buffer.getvalue()) == expected

    # Comparing numbers instead of strings, the same answer is right.
    numeric = RolloutDriver([make_tool()], chat_format=seed_script.chat_format, scorer=gsm8k_numeric_score)
    [again] = numeric.run_sync(seed_script.request(numeric))
    assert again.score == 1.0


# -- over size and max_turns ---------------------------------------------------------------------


def test_over_size_case(
    make_tool: MakeTool, mocksandbox: MockSandboxHandle, seed_script: RolloutScript
) -> None:
    fmt = seed_script.chat_format
    prompt_tokens = approx_token_count(fmt.prompt_text(seed_script.prompt, [CODE_INTERPRETER_SCHEMA]))
    limit = prompt_tokens + 60  # room for a part of the first turn only
    driver = RolloutDriver([make_tool()], chat_format=fmt, max_seq_len=limit)
    [record] = driver.run_sync(seed_script.request(driver))

    assert record.stop_reason == StopReason.MAX_SEQ_LEN
    assert f"over max_seq_len={limit}" in record.stop_detail
    assert "turn 1 would bring the conversation to" in record.stop_detail
    assert "its 1 tool call(s) were not run" in record.stop_detail
    # Only the prompt and a response cut to fit, as an engine stopping at the length limit.
    assert [m.role for m in record.messages] == ["system", "user", "assistant"]
    cut = record.messages[-1].content
    assert seed_script.assistant_turns[0].startswith(cut) and 0 < len(cut) < len(
        seed_script.assistant_turns[0]
    )
    assert record.tokens <= limit
    assert record.tool_calls == [] and record.tool_rewards == {"code_interpreter": 0.0}
    assert record.score == 0
    mocksandbox.assert_requests(0, path="/run_code")


def test_over_size_with_another_token_counter_and_after_tool_responses(make_tool: MakeTool) -> None:
    turns = [call("print('x' * 2000)"), "#### 1"]
    # Characters as tokens: the first turn fits, its 2000-character result does not.
    probe = RolloutDriver([make_tool()], token_counter=len)
    request = probe.create_request("q", turns)
    first_turn_chars = len(
        probe.chat_format.render([*request.messages, Message("assistant", turns[0])], probe.tool_schemas)
    )
    driver = RolloutDriver([make_tool()], token_counter=len, max_seq_len=first_turn_chars + 100)
    [record] = driver.run_sync(driver.create_request("q", turns))
    assert record.stop_reason == StopReason.MAX_SEQ_LEN
    assert "after the tool responses of turn 1" in record.stop_detail
    assert record.tool_responses == ["x" * 2000 + "\n"]

    tiny = RolloutDriver([make_tool()], max_seq_len=10)
    [record] = tiny.run_sync(tiny.create_request("q", turns))
    assert record.stop_reason == StopReason.MAX_SEQ_LEN and record.turns == 0
    assert "the prompt alone is" in record.stop_detail


def test_max_turns_does_not_run_the_last_turns_calls(
    make_tool: MakeTool, mocksandbox: MockSandboxHandle, seed_script: RolloutScript
) -> None:
    driver = RolloutDriver([make_tool()], chat_format=seed_script.chat_format, max_turns=1)
    [record] = driver.run_sync(seed_script.request(driver))
    assert record.stop_reason == StopReason.MAX_TURNS
    assert record.stop_detail == "max_turns=1 reached; the 1 tool call(s) of the last turn were not run"
    assert [m.role for m in record.messages] == ["system", "user", "assistant"]
    mocksandbox.assert_requests(0, path="/run_code")


def test_script_runs_out(make_tool: MakeTool) -> None:
    driver = RolloutDriver([make_tool()])
    [record] = driver.run_sync(driver.create_request("q", [call("print(5)")]))
    assert record.stop_reason == StopReason.POLICY_DONE
    assert record.tool_responses == ["5\n"] and record.score is None


# -- the batch case --------------------------------------------------------------------------------


def sum_policy(a: int, b: int) -> Callable[[PolicyInput], str]:
    """Turn 1 asks for two results at once; turn 2 adds up what the tool answered."""

    def policy(view: PolicyInput) -> str:
        if view.turn == 0:
            return f"Two parts.\n{call(f'print({a} * 3)')}\n{call(f'print({b} + 7)')}"
        x, y = (int(text) for text in view.last_tool_responses)
        return f"The parts are {x} and {y}.\n#### {x + y}"

    return policy


def test_tool_call_batch_case(make_tool: MakeTool, mocksandbox: MockSandboxHandle) -> None:
    mocksandbox.delay(0.05)  # hold each request a little, so that 4 at once is a contested cap
    tool = make_tool(rate_limit=4, num_workers=16)
    driver = RolloutDriver([tool])
    batch = [
        driver.create_request(
            f"{i} * 3 + ({i * 5} + 7)?", sum_policy(i, i * 5), ground_truth=str(i * 3 + i * 5 + 7)
        )
        for i in range(32)
    ]
    records = driver.run_sync(batch)

    assert [r.score for r in records] == [1.0] * 32
    assert all(r.stop_reason == StopReason.FINAL_ANSWER for r in records)
    assert all(r.output.endswith(f"#### {i * 8 + 7}") for i, r in enumerate(records))
    stats = requests.get(f"{mocksandbox.url}/_mock/stats", timeout=10).json()
    assert stats["by_path"]["/run_code"] == 64
    assert stats["by_status"] == {"200": 64}
    assert 1 <= stats["max_in_flight"] <= 4
    assert tool.pool.limiter is not None and tool.pool.limiter.in_flight == 0
    assert tool.live_instances == 0  # every instance released


def test_without_the_limiter_the_server_sees_more(
    make_tool: MakeTool, mocksandbox: MockSandboxHandle
) -> None:
    # The control for the batch case: the same load with the global limit off goes past 4.
    mocksandbox.delay(0.2)
    driver = RolloutDriver([make_tool(enable_global_rate_limit=False, num_workers=16)])
    batch = [driver.create_request("q", sum_policy(i, i), ground_truth=str(i * 4 + 7)) for i in range(8)]
    records = driver.run_sync(batch)
    assert [r.score for r in records] == [1.0] * 8
    assert mocksandbox.stats()["max_in_flight"] > 4


# -- faults ----------------------------------------------------------------------------------------


def test_rollout_under_faults(make_tool: MakeTool, mocksandbox: MockSandboxHandle) -> None:
    mocksandbox.add_fault(
        match={"body_contains": "F429"}, action={"type": "status", "status": 429, "retry_after": 2}
    )
    mocksandbox.add_fault(
        match={"body_contains": "FSBX"}, action={"type": "sandbox_error", "message": "no runner free"}
    )
    mocksandbox.add_fault(match={"body_contains": "FDROP"}, action={"type": "reset"})
    mocksandbox.add_fault(match={"body_contains": "FSLOW"}, action={"type": "delay", "seconds": 4})
    first = "\n".join(
        [
            call("print('F429')"),
            call("print('FSBX')"),
            call("print('FDROP')"),
            call("print('FSLOW')"),
            call("import time\ntime.sleep(5)", timeout=0.3),
            call("1 / 0"),
            call("print(6 * 7)"),
        ]
    )

    def policy(view: PolicyInput) -> str:
        if view.turn == 0:
            return first
        good = [text for text in view.last_tool_responses if not text.startswith("[")]
        return f"#### {good[0].strip()}"

    # The request timeout holds for every call: 3 s (not less) lets the real runs (1 / 0, the 0.3 s
    # timeout) answer in time on a loaded machine; FSLOW's delay (4 s) still outlasts it.
    driver = RolloutDriver([make_tool(rate_limit=2, request_timeout=3)])
    [record] = driver.run_sync(driver.create_request("What is 6 * 7?", policy, ground_truth="42"))

    assert [c.kind for c in record.tool_calls] == [
        "rate_limited",
        "sandbox_error",
        "connection_error",
        "api_timeout",
        "timeout",
        "runtime_error",
        "success",
    ]
    said = record.tool_responses
    assert said[0].startswith(
        "[sandbox unavailable] The sandbox is rate-limiting requests: it answered HTTP 429"
    )
    assert "retry after 2 s" in said[0] and said[0].endswith("the code was not run.")
    assert said[1] == "[sandbox error] The sandbox failed to run the code: no runner free"
    assert (
        said[2] == "[sandbox unavailable] Could not reach the sandbox (connection reset); there is no result."
    )
    assert said[3] == "[sandbox unavailable] The sandbox did not answer within 3 s; there is no result."
    assert said[4] == "[timeout] The code did not finish within the 0.3 s time limit and was stopped."
    assert (
        said[5].startswith("[runtime error] The code exited with code 1.") and "ZeroDivisionError" in said[5]
    )
    assert said[6] == "42\n"
    # The model read them in <tool_response> blocks, in call order.
    output = record.output
    assert output.index("rate-limiting") < output.index("no runner free") < output.index("ZeroDivisionError")
    assert "user\n<tool_response>\n[sandbox unavailable]" in output
    assert record.stop_reason == StopReason.FINAL_ANSWER and record.score == 1.0
    assert record.tool_rewards == {"code_interpreter": pytest.approx(1 / 7)}


def test_malformed_and_unknown_calls_in_a_rollout(
    make_tool: MakeTool, mocksandbox: MockSandboxHandle
) -> None:
    turns = [
        '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(1)"</tool_call>\n'
        '<tool_call>{"name": "web_search", "arguments": {"query": "x"}}</tool_call>\n'
        '<tool_call>{"name": "code_interpreter", "arguments": {"code": 7}}</tool_call>',
        "#### 1",
    ]
    driver = RolloutDriver([make_tool()])
    [record] = driver.run_sync(driver.create_request("q", turns, ground_truth="1"))
    kinds = [c.kind for c in record.tool_calls]
    assert kinds == ["invalid_tool_call", "unknown_tool", "invalid_arguments"]
    assert record.tool_responses[0].startswith(
        "[invalid tool call] The text inside <tool_call></tool_call> is not valid JSON"
    )
    assert (
        record.tool_responses[1]
        == "[unknown tool] There is no tool named 'web_search'. Available tools: code_interpreter."
    )
    assert record.tool_responses[2].startswith('[invalid arguments] "code" must be a string, not a number.')
    assert record.score == 1.0
    mocksandbox.assert_requests(0, path="/run_code")


# -- policies and records --------------------------------------------------------------------------


def test_async_policy_sees_the_conversation(make_tool: MakeTool) -> None:
    seen: list[PolicyInput] = []

    async def policy(view: PolicyInput) -> str | None:
        seen.append(view)
        return call("print(2 ** 10)") if view.turn == 0 else f"#### {view.last_tool_responses[0].strip()}"

    driver = RolloutDriver([make_tool()])
    [record] = driver.run_sync(driver.create_request("2 ** 10?", policy, ground_truth="1024"))
    assert record.score == 1.0
    assert [v.turn for v in seen] == [0, 1]
    assert seen[1].messages[-1] == Message("tool", "1024\n", "code_interpreter")
    assert seen[1].text.endswith(
        "<tool_response>\n1024\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert strip_special_tokens(seen[0].text) == record.input


def test_records_dump_as_jsonl(make_tool: MakeTool, tmp_path: Path) -> None:
    driver = RolloutDriver([make_tool()])
    batch = [
        driver.create_request(f"{i}?", [call(f"print({i})"), f"#### {i}"], ground_truth=str(i), step=5)
        for i in range(3)
    ]
    records = driver.run_sync(batch)
    path = tmp_path / "rollouts.jsonl"
    assert dump_jsonl(records, path) == 3
    rows = load_jsonl(path)
    assert list(rows[0])[:4] == ["input", "output", "score", "step"]
    assert [(r["score"], r["step"], r["stop_reason"]) for r in rows] == [(1.0, 5, "final_answer")] * 3
    assert rows[2]["tool_calls"][0]["observation"] == "2\n"
    assert rows[2]["tool_calls"][0]["metrics"]["kind"] == "success"
    with pytest.raises(ValueError, match="not pending"):
        driver.run_sync(batch[0])


def test_max_concurrent_rollouts(make_tool: MakeTool) -> None:
    driver = RolloutDriver([make_tool()], max_concurrent_rollouts=2)
    records = driver.run_sync(
        [driver.create_request("q", [call("print(1)"), "#### 1"], ground_truth="1") for _ in range(5)]
    )
    assert [r.score for r in records] == [1.0] * 5


def test_for_sandbox_owns_its_tool(mocksandbox: MockSandboxHandle, limiter_name: str) -> None:
    with RolloutDriver.for_sandbox(
        mocksandbox.url, {"rate_limiter_name": limiter_name, "rate_limit": 2}
    ) as driver:
        tool = driver.tools["code_interpreter"]
        [record] = driver.run_sync(driver.create_request("q", [call("print(3)"), "#### 3"], ground_truth="3"))
        assert record.score == 1.0
    assert isinstance(tool, CodeInterpreterTool) and tool.pool is None
