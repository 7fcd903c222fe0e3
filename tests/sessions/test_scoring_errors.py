"""Scoring runs in which no test reports a result (issue 17): an error that says why when the
environment is to blame (pytest missing, tests that cannot be collected even at the base state),
a plain 0.0 when the model's patch is (it broke the imports: the tests do run at the base state).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import visible_dirs

from mocksandbox.core import MockSandbox
from mocksandbox.execution.engine import program_environment
from mocksandbox.sessions import InstanceRegistry, ScoringError, SessionManager
from mocksandbox.sessions.executor import LocalExecutor
from mocksandbox.sessions.reward import score
from mocksandbox.sessions.scripted import function_call

SHIPPED = InstanceRegistry.from_paths([]).all()
PAGEKIT = next(i for i in SHIPPED if i.instance_id == "acme__pagekit-17")
MakeManager = Callable[..., SessionManager]


@pytest.fixture(scope="module")
def python_without_pytest() -> Iterator[str]:
    """A fresh venv's interpreter: this project's Python, without pytest. Where a session's world
    sees it (not in /tmp, which worlds find empty but for the server's own Python)."""
    with visible_dirs.python_without_pytest() as python:
        done = subprocess.run(
            [python, "-m", "pytest", "--version"], capture_output=True, text=True, timeout=60
        )
        assert done.returncode != 0 and "No module named pytest" in done.stderr
        yield python


def test_no_pytest_for_the_interpreter_is_an_error_not_a_zero(
    make_manager: MakeManager, python_without_pytest: str
) -> None:
    manager = make_manager(python=python_without_pytest)
    sid = manager.start(PAGEKIT.instance_hash)
    for call in ("postprocess", "compute_reward", "compute_reward"):  # never cached as a result
        with pytest.raises(ScoringError) as raised:
            getattr(manager, call)(sid)
        message = str(raised.value)
        assert message.startswith(f"session {sid}: instance acme__pagekit-17: cannot score: none of its ")
        assert f"{python_without_pytest} has no pytest (No module named pytest)" in message
        assert "The test output ends: " in message and message.rstrip().endswith("No module named pytest'")
    assert manager.describe(sid)["result"] is None


def test_a_patch_that_breaks_collection_scores_zero(make_manager: MakeManager) -> None:
    """Every test MISSING because of the patch (a syntax error in the module the tests import): the
    tests run at the base state, so this is the model's 0.0, as SWE-bench gives it."""
    manager = make_manager()
    sid = manager.start(PAGEKIT.instance_hash)
    manager.process_action(
        sid,
        function_call(
            "execute_bash", command=f"echo 'def (' >> {PAGEKIT.workspace_path}/pagekit/paginator.py"
        ),
    )
    answer = manager.compute_reward(sid)
    assert answer["reward"] == 0.0 and answer["patch_successfully_applied"] is True
    assert answer["f2p_count"] == answer["p2p_count"] == 0
    tests = manager.describe(sid)["result"]["tests"]
    assert list(tests) == [*PAGEKIT.fail_to_pass, *PAGEKIT.pass_to_pass]
    assert set(tests.values()) == {"MISSING"}
    assert manager.postprocess(sid)["reward"] == 0.0


def test_tests_that_cannot_run_even_at_the_base_are_an_error(
    engine_box: MockSandbox, registry: InstanceRegistry, tmp_path: Path
) -> None:
    """The gold patch, but pytest refuses to start (an option it does not know): the run at the base
    state fails the same way, so the environment is to blame."""
    python = engine_box.settings.python
    env = program_environment(os.environ)
    env["PATH"] = f"{Path(python).parent}:{env.get('PATH', os.defpath)}"
    base, sha = registry.base_repo(PAGEKIT, tmp_path / "bases")
    with pytest.raises(ScoringError) as raised:
        score(
            PAGEKIT,
            base,
            sha,
            PAGEKIT.patch,
            LocalExecutor(engine_box.engine.runner, env),
            tmp_path / "scratch",
            python,
            {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_ADDOPTS": "--no-such-option"},
            120.0,
        )
    message = str(raised.value)
    assert "pytest exited 4 without a result for them, even without the model's patch" in message
    assert "unrecognized arguments: --no-such-option" in message
    assert not any((tmp_path / "scratch").iterdir())  # both checkouts removed
