"""Whole episodes on every shipped instance, through the session layer (no sockets).

Each instance is solved by its gold patch sent as OpenHands editor calls (reward 1.0, resolved),
earns less when left alone, is not resolved by a patch that fixes FAIL_TO_PASS but breaks
PASS_TO_PASS, and gains nothing from edits to its tests.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mocksandbox.sessions import Instance, InstanceRegistry, SessionManager
from mocksandbox.sessions.scripted import diff_block, function_call, gold_editor_calls

SHIPPED = InstanceRegistry.from_paths([]).all()
MakeManager = Callable[..., SessionManager]
PAGEKIT = next(i for i in SHIPPED if i.instance_id == "acme__pagekit-17")

#: After the gold patch, one edit per instance that keeps FAIL_TO_PASS passing and breaks a
#: PASS_TO_PASS test: (path, old_str, new_str).
P2P_BREAKERS = {
    "acme__pagekit-17": (
        "pagekit/paginator.py",
        "        if self.count == 0:\n            return 1\n        return (self.count",
        "        return (self.count",
    ),
    "textutils__slugger-42": ("slugger/slug.py", "    if lowercase:\n", "    if True:\n"),
    "pyver__semverlite-88": (
        "semverlite/version.py",
        "return (self.major, self.minor, self.patch, pre)",
        "return (self.major, self.minor, self.patch, pre, self.build)",
    ),
    "sciutils__unitconv-311": (
        "unitconv/registry.py",
        "    if len(matches) == 1:\n        return matches[0]\n",
        "\n",
    ),
}

#: A conftest that would make every test pass, if edits to tests counted.
CHEATING_CONFTEST = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


def by_id(instance: Instance) -> str:
    return instance.instance_id


def act(manager: SessionManager, sid: str, text: str) -> str:
    content = manager.process_action(sid, text)
    assert content.startswith("EXECUTION RESULT of [")
    return content


@pytest.mark.parametrize("instance", SHIPPED, ids=by_id)
def test_gold_patch_as_editor_calls_solves_the_instance(
    make_manager: MakeManager, instance: Instance
) -> None:
    manager = make_manager()
    sid = manager.start(instance.instance_hash)
    assert sid.isdigit() and 0 < int(sid) < 2**63

    listing = act(
        manager, sid, function_call("str_replace_editor", command="view", path=instance.workspace_path)
    )
    assert f"{instance.workspace_path}/tests/" in listing
    for edit in gold_editor_calls(instance):
        assert "has been edited" in act(manager, sid, edit)
    tests = act(
        manager,
        sid,
        function_call("execute_bash", command=f"cd {instance.workspace_path} && python -m pytest -q tests"),
    )
    assert tests.startswith("EXECUTION RESULT of [execute_bash]:\n")
    assert " passed" in tests and tests.endswith("[Command finished with exit code 0]")
    assert "finished" in act(manager, sid, function_call("finish"))

    done = manager.postprocess(int(sid))
    assert done["state"] == "finished" and done["reward"] == 1.0
    reward = manager.compute_reward(int(sid))
    assert reward == {
        "reward": 1.0,
        "f2p_count": len(instance.fail_to_pass),
        "f2p_total": len(instance.fail_to_pass),
        "p2p_count": len(instance.pass_to_pass),
        "p2p_total": len(instance.pass_to_pass),
        "resolved": True,
        "patch_is_None": False,
        "patch_exists": True,
        "patch_successfully_applied": True,
    }


@pytest.mark.parametrize("instance", SHIPPED, ids=by_id)
def test_no_action_earns_less(make_manager: MakeManager, instance: Instance) -> None:
    manager = make_manager()
    sid = manager.start(str(instance.instance_hash))
    reward = manager.compute_reward(sid)  # on a live session, as verl may ask
    assert reward["reward"] < 1.0
    assert reward["f2p_count"] == 0 and not reward["resolved"]
    assert reward["p2p_count"] == reward["p2p_total"]  # the base state passes what passed before
    assert reward["patch_exists"] is False and reward["patch_is_None"] is False


@pytest.mark.parametrize("instance", SHIPPED, ids=by_id)
def test_fixing_f2p_but_breaking_p2p_is_not_resolved(make_manager: MakeManager, instance: Instance) -> None:
    manager = make_manager()
    sid = manager.start(instance.instance_hash)
    assert "Applied patch" in act(manager, sid, diff_block(instance.patch))
    path, old, new = P2P_BREAKERS[instance.instance_id]
    edit = function_call(
        "str_replace_editor",
        command="str_replace",
        path=f"{instance.workspace_path}/{path}",
        old_str=old,
        new_str=new,
    )
    assert "has been edited" in act(manager, sid, edit)
    reward = manager.compute_reward(sid)
    assert reward["f2p_count"] == reward["f2p_total"]
    assert reward["reward"] == 1.0  # the default reward is the F2P fraction...
    assert reward["p2p_count"] < reward["p2p_total"]
    assert reward["resolved"] is False  # ...but the instance is not resolved


@pytest.mark.parametrize("instance", SHIPPED, ids=by_id)
def test_editing_the_tests_gains_nothing(make_manager: MakeManager, instance: Instance) -> None:
    manager = make_manager()
    sid = manager.start(instance.instance_hash)
    for test_id in instance.fail_to_pass:  # the F2P tests defined as no-ops...
        path, name = test_id.split("::")
        lines = (instance.source / path).read_text().splitlines()
        insert = function_call(
            "str_replace_editor",
            command="insert",
            path=f"{instance.workspace_path}/{path}",
            insert_line=len(lines),
            new_str=f"\n\ndef {name}():\n    pass",
        )
        assert "has been edited" in act(manager, sid, insert)
    create = function_call(  # ...and a conftest that passes everything
        "str_replace_editor",
        command="create",
        path=f"{instance.workspace_path}/tests/conftest.py",
        file_text=CHEATING_CONFTEST,
    )
    assert "File created successfully" in act(manager, sid, create)
    manager.postprocess(sid)
    reward = manager.compute_reward(sid)
    assert reward["reward"] == 0.0 and not reward["resolved"]
    assert reward["patch_exists"] and reward["patch_successfully_applied"]
    details = manager.describe(sid)["result"]
    assert "tests/conftest.py" in details["ignored_paths"]


def test_resolved_mode_gives_zero_to_a_p2p_breaking_patch(make_manager: MakeManager) -> None:
    manager = make_manager(reward_mode="resolved")
    sid = manager.start(PAGEKIT.instance_hash)
    path, old, new = P2P_BREAKERS[PAGEKIT.instance_id]
    act(manager, sid, diff_block(PAGEKIT.patch))
    act(manager, sid, function_call("str_replace_editor", command="str_replace",
                                    path=f"{PAGEKIT.workspace_path}/{path}", old_str=old, new_str=new))  # fmt: skip
    assert manager.compute_reward(sid)["reward"] == 0.0
    act(
        manager,
        sid,
        function_call("str_replace_editor", command="undo_edit", path=f"{PAGEKIT.workspace_path}/{path}"),
    )
    assert manager.compute_reward(sid)["reward"] == 1.0  # the result follows the live patch
