"""The code_interpreter tool against the mock: every outcome has its own observation; nothing raises."""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import Callable
from typing import Any

import pytest

from mocksandbox.pytest_plugin import MockSandboxHandle
from mocksandbox.tools import CodeInterpreterTool, ObservationKind, ToolResult, UnknownInstanceError

MakeTool = Callable[..., CodeInterpreterTool]


def run(tool: CodeInterpreterTool, *calls: dict[str, Any]) -> list[ToolResult]:
    """Create an instance, make the calls concurrently, release it."""

    async def go() -> list[ToolResult]:
        iid = await tool.create()
        try:
            return list(await asyncio.gather(*(tool.execute(iid, c) for c in calls)))
        finally:
            await tool.release(iid)

    return asyncio.run(go())


def test_success_is_stdout_verbatim(make_tool: MakeTool, mocksandbox: MockSandboxHandle) -> None:
    [result] = run(make_tool(), {"code": "print(200000 * 1.1)"})
    text, reward, metrics = result
    assert text == "220000.00000000003\n"
    assert reward == 0.0
    assert metrics["kind"] == "success" and metrics["return_code"] == 0
    [entry] = mocksandbox.assert_requests(1, path="/run_code")
    assert entry.body["run_timeout"] == 30 and entry.body["language"] == "python"
    assert entry.body["memory_limit_MB"] == 1024


def test_program_failures_are_told_apart(make_tool: MakeTool) -> None:
    results = run(
        make_tool(),
        {"code": "raise ValueError('boom')"},
        {"code": "print(1"},
        # 3 s, not less: the program must start and print under isolation before it is stopped.
        {"code": "import time\nprint('started', flush=True)\ntime.sleep(30)", "timeout": 3},
        {"code": "import sys\nprint('out')\nprint('careful', file=sys.stderr)"},
        {"code": "x = 1"},
    )
    kinds = [r.metrics["kind"] for r in results]
    assert kinds == ["runtime_error", "compile_error", "timeout", "success", "success"]
    runtime, syntax, timeout, with_stderr, silent = (r.text for r in results)
    assert runtime.startswith("[runtime error] The code exited with code 1.\n[stderr]\nTraceback")
    assert 'File "main.py", line 1' in runtime and runtime.endswith("ValueError: boom")
    assert syntax.startswith("[compile error] The code has a syntax error; nothing ran.")
    assert "SyntaxError" in syntax
    assert timeout == (
        "[timeout] The code did not finish within the 3 s time limit and was stopped.\n"
        "Output before it was stopped:\n[stdout]\nstarted"
    )
    assert with_stderr == "[stdout]\nout\n[stderr]\ncareful"
    assert silent.startswith("[no output]")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_compile_error(make_tool: MakeTool) -> None:
    [result] = run(make_tool(), {"code": "int main() { return x; }", "language": "cpp"})
    assert result.metrics["kind"] == "compile_error"
    assert result.text.startswith("[compile error] The code did not compile (exit code 1); nothing ran.")
    assert "main.cpp" in result.text and "not declared" in result.text


def test_api_failures_are_told_apart(make_tool: MakeTool, mocksandbox: MockSandboxHandle) -> None:
    for marker, action in [
        ("A429", {"type": "status", "status": 429, "retry_after": 1}),
        ("A500", {"type": "status", "status": 500}),
        ("ASBX", {"type": "sandbox_error", "message": "worker pool exhausted"}),
        ("ADROP", {"type": "reset"}),
        ("ABAD", {"type": "malformed_json"}),
    ]:
        mocksandbox.add_fault(match={"body_contains": marker}, action=action)
    results = run(
        make_tool(),
        *({"code": f"print('{marker}')"} for marker in ("A429", "A500", "ASBX", "ADROP", "ABAD")),
    )
    texts = [r.text for r in results]
    assert [r.metrics["kind"] for r in results] == [
        "rate_limited",
        "http_error",
        "sandbox_error",
        "connection_error",
        "bad_response",
    ]
    assert texts[0] == (
        "[sandbox unavailable] The sandbox is rate-limiting requests: it answered HTTP 429 Too Many "
        "Requests (retry after 1 s); the code was not run."
    )
    assert texts[1].startswith("[sandbox unavailable] The sandbox answered HTTP 500 Internal Server Error")
    assert texts[2] == "[sandbox error] The sandbox failed to run the code: worker pool exhausted"
    assert (
        texts[3]
        == "[sandbox unavailable] Could not reach the sandbox (connection reset); there is no result."
    )
    assert texts[4] == (
        "[sandbox unavailable] The sandbox's answer could not be read (not JSON); there is no result."
    )
    assert all(ObservationKind(r.metrics["kind"]).is_api_failure for r in results)
    assert all(r.reward == 0.0 for r in results)  # never the model's fault


def test_no_answer_in_time(make_tool: MakeTool, mocksandbox: MockSandboxHandle) -> None:
    mocksandbox.delay(1.0)
    [result] = run(make_tool(request_timeout=0.2), {"code": "print(1)"})
    assert result.metrics["kind"] == "api_timeout"
    assert result.text == "[sandbox unavailable] The sandbox did not answer within 0.2 s; there is no result."


def test_connection_refused(limiter_name: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tool = CodeInterpreterTool(
        {"sandbox_fusion_url": f"http://127.0.0.1:{port}", "rate_limiter_name": limiter_name}
    )
    try:
        [result] = run(tool, {"code": "print(1)"})
    finally:
        tool.close()
    assert result.metrics["kind"] == "connection_error"
    assert (
        result.text
        == "[sandbox unavailable] Could not reach the sandbox (connection refused); there is no result."
    )


@pytest.mark.parametrize(
    ("parameters", "problem"),
    [
        ({}, 'The required argument "code" is missing.'),
        ({"code": 42}, '"code" must be a string, not a number.'),
        ({"code": ["print(1)"]}, '"code" must be a string, not a list.'),
        ({"code": "   \n"}, '"code" is empty: there is nothing to run.'),
        ({"code": "print(1)", "timeout": "soon"}, "\"timeout\" must be a number of seconds, not 'soon'."),
        ({"code": "print(1)", "timeout": -1}, '"timeout" must be a positive number of seconds, not -1.'),
        ({"code": "print(1)", "timeout": True}, '"timeout" must be a number of seconds, not a boolean.'),
        ({"code": "print(1)", "language": "cobol"}, "\"language\" 'cobol' is not supported"),
        ("print(1)", "The arguments must be a JSON object, not a str."),
    ],
)
def test_malformed_arguments_get_an_observation(
    make_tool: MakeTool, mocksandbox: MockSandboxHandle, parameters: Any, problem: str
) -> None:
    [result] = run(make_tool(), parameters)
    assert result.metrics["kind"] == "invalid_arguments"
    assert result.text.startswith(f"[invalid arguments] {problem}")
    assert result.text.endswith(
        'The code was not run. Call code_interpreter with {"code": "<the code to run>"}.'
    )
    mocksandbox.assert_requests(0, path="/run_code")


def test_numeric_string_timeout_and_language_are_accepted(
    make_tool: MakeTool, mocksandbox: MockSandboxHandle
) -> None:
    [result] = run(make_tool(max_timeout=5), {"code": "echo hi", "language": "bash", "timeout": "60"})
    assert result.text == "hi\n"
    [entry] = mocksandbox.requests(path="/run_code")
    assert entry.body["language"] == "bash" and entry.body["run_timeout"] == 5  # capped by max_timeout


@pytest.mark.parametrize(
    ("policy", "kind", "suffix"),
    [
        ("ignore", "success", "220000.0\n"),
        ("note", "success", "220000.0\n\n[note] Ignored unexpected argument(s): executes."),
        ("reject", "invalid_arguments", 'Unexpected argument(s) "executes": only code, timeout and language'),
    ],
)
def test_the_seeds_extra_argument(make_tool: MakeTool, policy: str, kind: str, suffix: str) -> None:
    code = "print(200000 + 200000 * 10 / 100)"
    [result] = run(make_tool(extra_arguments=policy), {"code": code, "executes": "True"})
    assert result.metrics["kind"] == kind
    assert suffix in result.text
    if kind == "success":
        assert result.metrics["ignored_arguments"] == ["executes"]


def test_instances_and_rewards(make_tool: MakeTool) -> None:
    tool = make_tool(error_penalty=0.5)

    async def go() -> None:
        a = await tool.create("a", ground_truth="3")
        b = await tool.create()
        assert a == "a" and b != a and tool.live_instances == 2
        assert await tool.calc_reward(a) == 0.0
        ok = await tool.execute(a, {"code": "print(3)"})
        bad = await tool.execute(a, {"code": "1/0"})
        assert (ok.reward, bad.reward) == (0.0, -0.5)
        assert await tool.calc_reward(a) == 0.5  # one of two calls ran cleanly
        assert tool.outputs(a) == ["3", ""]
        assert await tool.calc_reward(b) == 0.0
        await tool.release(a)
        await tool.release(a)  # twice is harmless
        with pytest.raises(UnknownInstanceError, match="no instance 'a'"):
            await tool.execute(a, {"code": "print(1)"})
        await tool.release(b)
        assert tool.live_instances == 0

    asyncio.run(go())


def test_retry_504_outside_the_permit(make_tool: MakeTool, mocksandbox: MockSandboxHandle) -> None:
    mocksandbox.fail(504, first=1)
    [result] = run(make_tool(retry_statuses=[504], retry_sleeps=[0.01]), {"code": "print(7)"})
    assert result.text == "7\n"
    assert [e.status for e in mocksandbox.requests(path="/run_code")] == [504, 200]


def test_without_a_global_limit(make_tool: MakeTool) -> None:
    # The seed's sketch crashes every call with enable_global_rate_limit=False; here it is uncapped.
    tool = make_tool(enable_global_rate_limit=False)
    assert tool.pool.limit is None
    assert [r.text for r in run(tool, {"code": "print(1)"}, {"code": "print(2)"})] == ["1\n", "2\n"]
