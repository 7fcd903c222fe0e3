"""Session behaviour: sids, the shell, isolation, errors, persistence across restarts, expiry, the cap."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mocksandbox.execution.confinement import CgroupConfinement
from mocksandbox.execution.world import lite_unavailable_reason
from mocksandbox.sessions import (
    InstanceRegistry,
    SessionEndedError,
    SessionLimitError,
    SessionManager,
    StateDirError,
    UnknownSessionError,
)
from mocksandbox.sessions.isolation import namespace_unavailable
from mocksandbox.sessions.scripted import diff_block, function_call

MakeManager = Callable[..., SessionManager]
PAGEKIT = next(i for i in InstanceRegistry.from_paths([]).all() if i.instance_id == "acme__pagekit-17")
WS = PAGEKIT.workspace_path


class FakeClock:
    """Wall-clock time that moves only when told to."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def bash(command: str, **params: Any) -> str:
    return function_call("execute_bash", command=command, **params)


def view(path: str) -> str:
    return function_call("str_replace_editor", command="view", path=path)


def test_sids_as_int_or_string_address_one_session(make_manager: MakeManager) -> None:
    manager = make_manager()
    sid = manager.start(PAGEKIT.instance_hash)
    assert "EXECUTION RESULT of [execute_bash]:\nhello" in manager.process_action(
        int(sid), bash("echo hello")
    )
    assert "hello" in manager.process_action(sid, bash("echo hello"))
    assert "hello" in manager.process_action(f" {sid} ", bash("echo hello"))
    with pytest.raises(UnknownSessionError, match="unknown sid '42'"):
        manager.process_action(42, bash("ls"))
    with pytest.raises(UnknownSessionError, match="a sid is a decimal integer"):
        manager.compute_reward("abc")


NO_NAMESPACE = namespace_unavailable()  # None where this host gives each command a mount namespace
NO_WORLD = lite_unavailable_reason("cgroup" if CgroupConfinement.available() else "process-group")
ISOLATIONS = [
    pytest.param("world", marks=pytest.mark.skipif(NO_WORLD is not None, reason=f"no worlds: {NO_WORLD}")),
    pytest.param(
        "namespace",
        marks=pytest.mark.skipif(NO_NAMESPACE is not None, reason=f"no mount namespaces: {NO_NAMESPACE}"),
    ),
    "paths",
]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_shell_state_paths_and_environment(make_manager: MakeManager, isolation: str) -> None:
    manager = make_manager(isolation=isolation)
    assert manager.isolation()[0] == isolation
    sid = manager.start(PAGEKIT.instance_hash)
    out = manager.process_action(sid, bash("pwd && git status --short && echo $TMPDIR $SWE_INSTANCE_ID"))
    assert out == (
        f"EXECUTION RESULT of [execute_bash]:\n{WS}\n/tmp acme__pagekit-17\n[Command finished with exit code 0]"
    )
    manager.process_action(sid, bash("cd pagekit && export NOT_KEPT=1"))
    assert f"{WS}/pagekit\n" in manager.process_action(sid, bash("pwd"))  # cd persists, as in a shell
    traceback = manager.process_action(sid, bash("python -c 'import page; page.Page(1, 2, 3).has_next()'"))
    assert f'File "{WS}/pagekit/page.py", line' in traceback  # real paths read as the agent's
    assert "[Command finished with exit code 1]" in traceback
    manager.process_action(sid, bash("cd /workspace"))
    assert "acme__pagekit__1.2\n" in manager.process_action(sid, bash("ls"))


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_sessions_do_not_share_tmp_or_repository(make_manager: MakeManager, isolation: str) -> None:
    manager = make_manager(isolation=isolation)
    first, second = manager.start(PAGEKIT.instance_hash), manager.start(PAGEKIT.instance_hash)
    for sid, word in ((first, "one"), (second, "two")):
        manager.process_action(sid, bash(f"echo {word} > /tmp/marker && echo {word} >> {WS}/README.md"))
    for sid, word in ((first, "one"), (second, "two")):
        out = manager.process_action(sid, bash(f"cat /tmp/marker; tail -1 {WS}/README.md"))
        assert out.split("\n")[1:3] == [word, word]


@pytest.mark.skipif(NO_NAMESPACE is not None, reason=f"no mount namespaces: {NO_NAMESPACE}")
def test_in_a_mount_namespace_files_may_name_workspace_paths(make_manager: MakeManager) -> None:
    """What path translation cannot do: a script that names /workspace in its own text."""
    manager = make_manager(isolation="namespace")
    sid = manager.start(PAGEKIT.instance_hash)
    script = f"import sys\nsys.path.insert(0, '{WS}')\nimport pagekit\nprint(pagekit.__file__)\n"
    create = function_call("str_replace_editor", command="create", path="/tmp/repro.py", file_text=script)
    assert "File created successfully at: /tmp/repro.py" in manager.process_action(sid, create)
    out = manager.process_action(
        sid, bash("cd / && python /tmp/repro.py && ls /workspace && df /workspace >/dev/null")
    )
    assert out == (
        f"EXECUTION RESULT of [execute_bash]:\n{WS}/pagekit/__init__.py\nacme__pagekit__1.2\n"
        "[Command finished with exit code 0]"
    )


def test_timeouts_control_keys_and_malformed_calls(make_manager: MakeManager) -> None:
    manager = make_manager()
    sid = manager.start(PAGEKIT.instance_hash)
    # 3 s, not 0.5: the command's shell (and its namespace or world) must start and echo in time.
    slow = manager.process_action(sid, bash("echo started; sleep 30", timeout="3"))
    assert slow == (
        "EXECUTION RESULT of [execute_bash]:\nstarted\n[Command timed out after 3 seconds and was killed. "
        "Run long jobs with a smaller input or a timeout of their own.]"
    )
    assert "exit code 0" in manager.process_action(sid, bash("true"))  # the session goes on
    assert "No previous running command to interact with" in manager.process_action(sid, bash("C-c"))
    assert "No previous running command to retrieve logs" in manager.process_action(
        sid, "<function=execute_bash>\n<parameter=command></parameter>\n</function>"
    )
    wrong = manager.process_action(sid, "I should look at paginator.py first.")
    assert wrong.startswith("EXECUTION RESULT of [error]:\nERROR: no function call found")
    assert "<function=execute_bash>" in wrong  # the expected format is shown
    typo = manager.process_action(sid, function_call("str_replace_editor", command="open", path=WS))
    assert typo.startswith("EXECUTION RESULT of [str_replace_editor]:\nERROR: Parameter 'command'")


def test_diff_blocks_with_agent_paths_and_ones_that_do_not_apply(make_manager: MakeManager) -> None:
    manager = make_manager()
    sid = manager.start(PAGEKIT.instance_hash)
    bad = "--- a/pagekit/paginator.py\n+++ b/pagekit/paginator.py\n@@ -1,1 +1,1 @@\n-no such line\n+x\n"
    out = manager.process_action(sid, diff_block(bad))
    assert out.startswith("EXECUTION RESULT of [apply_patch]:\nERROR: the patch does not apply")
    assert manager.compute_reward(sid)["patch_exists"] is False  # nothing changed
    absolute = PAGEKIT.patch.replace("a/pagekit/", f"a{WS}/pagekit/").replace("b/pagekit/", f"{WS}/pagekit/")
    assert "Applied patch pagekit/paginator.py cleanly" in manager.process_action(sid, diff_block(absolute))
    assert manager.compute_reward(sid)["resolved"] is True


@pytest.mark.parametrize("git_command", ["git commit -qam fix", "rm -rf .git"])
def test_the_patch_does_not_depend_on_the_sessions_git(make_manager: MakeManager, git_command: str) -> None:
    manager = make_manager()
    sid = manager.start(PAGEKIT.instance_hash)
    manager.process_action(sid, diff_block(PAGEKIT.patch))
    assert "exit code 0" in manager.process_action(sid, bash(f"cd {WS} && {git_command}"))
    assert manager.compute_reward(sid)["reward"] == 1.0


def test_postprocess_frees_the_session_and_keeps_its_result(make_manager: MakeManager) -> None:
    manager = make_manager()
    sid = manager.start(PAGEKIT.instance_hash)
    manager.process_action(sid, diff_block(PAGEKIT.patch))
    first = manager.postprocess(sid)
    assert first == manager.postprocess(int(sid))  # idempotent
    assert not list((manager.state_dir or Path("/")).joinpath("sessions").iterdir())  # work dir freed
    with pytest.raises(SessionEndedError, match="post-processed"):
        manager.process_action(sid, bash("ls"))
    assert manager.compute_reward(sid) == manager.compute_reward(int(sid))
    assert manager.describe(sid)["patch"] == PAGEKIT.patch  # git diff against the base: the gold patch


def test_a_restart_loses_no_session_and_no_result(make_manager: MakeManager, tmp_path: Path) -> None:
    state = tmp_path / "state"
    before = make_manager(state_dir=str(state))
    live = before.start(PAGEKIT.instance_hash)
    before.process_action(live, diff_block(PAGEKIT.patch))
    before.process_action(live, bash(f"cd {WS}/tests"))
    done = before.start(PAGEKIT.instance_hash)
    before.process_action(done, diff_block(PAGEKIT.patch))
    before.postprocess(done)
    expected = before.compute_reward(done)
    before.close()

    after = make_manager(state_dir=str(state))
    runs: list[str] = []
    real_run = after.executor.run
    after.executor.run = lambda *args, **kwargs: runs.append("run") or real_run(*args, **kwargs)  # type: ignore[method-assign]
    assert after.compute_reward(done) == expected and runs == []  # the stored result, not a re-run
    assert f"{WS}/tests\n" in after.process_action(live, bash("pwd"))  # the shell's directory too
    assert "(self.count + self.per_page - 1)" in after.process_action(
        live, view(f"{WS}/pagekit/paginator.py")
    )
    assert after.postprocess(live)["reward"] == 1.0
    listing = after.list_sessions()
    assert listing["counts"] == {"live": 0, "finished": 2, "leaked": 0}
    assert listing["persistent"] is True


def test_state_dir_is_held_by_one_server(make_manager: MakeManager, tmp_path: Path) -> None:
    first = make_manager(state_dir=str(tmp_path / "state"))
    first.start(PAGEKIT.instance_hash)
    second = make_manager(state_dir=str(tmp_path / "state"))
    with pytest.raises(StateDirError, match="in use by another mocksandbox server"):
        second.start(PAGEKIT.instance_hash)


def test_a_lost_work_dir_is_a_leaked_session(make_manager: MakeManager, tmp_path: Path) -> None:
    state = tmp_path / "state"
    before = make_manager(state_dir=str(state))
    sid = before.start(PAGEKIT.instance_hash)
    before.close()
    for child in (state / "sessions").iterdir():
        shutil.rmtree(child)
    after = make_manager(state_dir=str(state))
    leaked = after.list_sessions()["leaked"]
    assert [(s["sid"], s["reason"]) for s in leaked] == [(sid, "lost")]
    assert after.compute_reward(sid)["patch_is_None"] is True


def test_idle_sessions_expire_and_keep_their_patch(make_manager: MakeManager) -> None:
    clock = FakeClock()
    manager = make_manager(clock=clock, session_ttl_s=60.0)
    idle = manager.start(PAGEKIT.instance_hash)
    manager.process_action(idle, diff_block(PAGEKIT.patch))
    busy = manager.start(PAGEKIT.instance_hash)
    clock.advance(45)
    manager.process_action(busy, bash("true"))
    clock.advance(30)  # idle: 75 s since its last action; busy: 30 s
    assert manager.expire_idle() == [idle]
    listing = manager.list_sessions()
    assert [s["sid"] for s in listing["live"]] == [busy]
    assert [(s["sid"], s["reason"]) for s in listing["leaked"]] == [(idle, "expired")]
    with pytest.raises(SessionEndedError, match="idle for more than 60 s"):
        manager.process_action(idle, bash("ls"))
    assert manager.compute_reward(idle)["reward"] == 1.0  # scored from the patch taken at expiry


def test_the_cap_on_live_sessions(make_manager: MakeManager) -> None:
    manager = make_manager(max_sessions=2)
    first = manager.start(PAGEKIT.instance_hash)
    manager.start(PAGEKIT.instance_hash)
    with pytest.raises(SessionLimitError, match="too many live sessions: 2 of max_sessions=2"):
        manager.start(PAGEKIT.instance_hash)
    manager.postprocess(first)
    manager.start(PAGEKIT.instance_hash)


def test_reset_forgets_every_session(make_manager: MakeManager) -> None:
    manager = make_manager()
    sid = manager.start(PAGEKIT.instance_hash)
    manager.reset()
    assert manager.list_sessions()["counts"] == {"live": 0, "finished": 0, "leaked": 0}
    assert not list((manager.state_dir or Path("/")).joinpath("sessions").iterdir())
    with pytest.raises(UnknownSessionError):
        manager.compute_reward(sid)
    assert manager.start(PAGEKIT.instance_hash)  # and goes on working
