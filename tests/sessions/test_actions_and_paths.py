"""The action parser (OpenHands' function-call format) and the /workspace path translation."""

from __future__ import annotations

from pathlib import Path

import pytest

from mocksandbox.sessions.actions import (
    ActionError,
    DiffBlock,
    FunctionCall,
    observation,
    parse_action,
    truncate_observation,
)
from mocksandbox.sessions.paths import PathMap
from mocksandbox.sessions.scripted import function_call as call

# -- parsing ------------------------------------------------------------------------------------


def test_call_after_reasoning_with_multiline_values() -> None:
    text = call(
        "str_replace_editor",
        "Let me fix the off-by-one.\nIt is in num_pages.",
        command="str_replace",
        path="/workspace/x/a.py",
        old_str="    return a\n    + 1",
        new_str="    return a",
    )
    action = parse_action(text)
    assert action == FunctionCall(
        "str_replace_editor",
        # values are stripped, as OpenHands strips them
        {
            "command": "str_replace",
            "path": "/workspace/x/a.py",
            "old_str": "return a\n    + 1",
            "new_str": "return a",
        },
    )


def test_types_are_converted() -> None:
    action = parse_action(
        call("str_replace_editor", command="view", path="/workspace/x", view_range="[3, 9]")
        + "\n"
        + call("execute_bash", command="ls")
    )
    assert isinstance(action, FunctionCall)
    assert action.params["view_range"] == [3, 9]
    assert action.ignored_calls == 1
    insert = parse_action(
        call("str_replace_editor", command="insert", path="/a", insert_line="4", new_str="x")
    )
    assert isinstance(insert, FunctionCall) and insert.params["insert_line"] == 4


def test_missing_closing_tags_are_forgiven() -> None:
    action = parse_action("<function=execute_bash>\n<parameter=command>pytest -x tests</parameter>\n")
    assert action == FunctionCall("execute_bash", {"command": "pytest -x tests"})
    action = parse_action("<function=execute_bash>\n<parameter=command>ls -la")
    assert action == FunctionCall("execute_bash", {"command": "ls -la"})
    assert parse_action("<function=finish>\n</function>") == FunctionCall("finish", {})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (call("run_python", code="1"), ["Function 'run_python' not found", "execute_bash"]),
        (call("execute_bash", cmd="ls"), ["Parameter 'cmd' is not allowed", "<function=execute_bash>"]),
        (call("execute_bash"), ["Missing required parameters for function 'execute_bash'", "command"]),
        (call("str_replace_editor", command="delete", path="/a"), ["expected to be one of", "undo_edit"]),
        (
            call("str_replace_editor", command="insert", path="/a", insert_line="x"),
            ["expected to be an integer"],
        ),
        (
            call("str_replace_editor", command="view", path="/a", view_range="1-3"),
            ["expected to be an array"],
        ),
        ("I think the bug is in paginator.py.", ["no function call found", "<function=execute_bash>"]),
        ("<function execute_bash>ls</function>", ["malformed", "<function=execute_bash>"]),
    ],
)
def test_malformed_calls_say_what_is_wrong(text: str, words: list[str]) -> None:
    action = parse_action(text)
    assert isinstance(action, ActionError)
    for word in words:
        assert word in action.message


def test_diff_block_when_there_is_no_call() -> None:
    patch = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert parse_action(f"Fix:\n```diff\n{patch}```") == DiffBlock(patch)
    assert parse_action(f"```patch\n{patch}") == DiffBlock(patch)  # unterminated block
    # a function call wins over a diff in the reasoning
    assert isinstance(parse_action(f"```diff\n{patch}```\n" + call("finish")), FunctionCall)


def test_observation_format_and_truncation() -> None:
    assert observation("execute_bash", "hi\n[Command finished with exit code 0]") == (
        "EXECUTION RESULT of [execute_bash]:\nhi\n[Command finished with exit code 0]"
    )
    long = "a" * 20_000 + "b" * 20_000
    cut = truncate_observation(long)
    assert cut.startswith("a" * 15_000) and cut.endswith("b" * 15_000)
    assert "[... Observation truncated due to length ...]" in cut


# -- path translation ---------------------------------------------------------------------------


def test_paths_in_commands_and_outputs(tmp_path: Path) -> None:
    root = tmp_path / "sessions" / "123"
    paths = PathMap(root)
    command = "cd /workspace/acme__pagekit__1.2 && python /tmp/repro.py > /tmp/out.txt; ls /workspace"
    real = paths.to_real(command)
    assert real == (
        f"cd {root}/workspace/acme__pagekit__1.2 && python {root}/tmp/repro.py > {root}/tmp/out.txt; "
        f"ls {root}/workspace"
    )
    assert paths.to_agent(real) == command
    # a traceback from inside the session reads as the agent's paths
    assert paths.to_agent(f'File "{root}/workspace/x/a.py", line 3') == 'File "/workspace/x/a.py", line 3'


@pytest.mark.parametrize(
    "text", ["/var/tmp/x", "/workspaces/x", "x/workspace/y", "http://host/tmp/a", "/tmpfile", "~/tmp/a"]
)
def test_only_roots_at_the_start_of_a_path_are_translated(tmp_path: Path, text: str) -> None:
    assert PathMap(tmp_path).to_real(text) == text


def test_real_paths_of_agent_paths(tmp_path: Path) -> None:
    paths = PathMap(tmp_path)
    assert paths.real_path("/workspace/r/a.py") == tmp_path / "workspace" / "r" / "a.py"
    assert paths.real_path("/tmp") == tmp_path / "tmp"
    assert paths.real_path("/tmp/../etc/passwd") is None  # normalised first: outside the session
    assert paths.real_path("/etc/hosts") is None


def test_unsafe_session_roots_are_refused() -> None:
    with pytest.raises(ValueError, match="unsafe"):
        PathMap(Path("/tmp/my state; rm -rf"))
