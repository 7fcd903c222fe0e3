"""Scoring a model's patch the way SWE-bench does.

1. A clean checkout of the instance's base state.
2. The model's patch, without its changes to test files (files the ``test_patch`` touches, and any
   file that looks like a test: ``tests/``, ``test_*.py``, ``conftest.py``, ...), so that editing
   the tests gains nothing. If it does not apply, nothing is run and the reward is 0.
3. The ``test_patch`` on top.
4. ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` with pytest (``-rA``), each test's status read from the
   short summary as SWE-bench's log parser reads it (``PASSED``/``XFAIL`` count as passing).

``reward`` is the fraction of ``FAIL_TO_PASS`` tests that pass (``reward_mode = "f2p"``, the default,
which is what verl's client computes when only the counts are sent), or ``resolved`` as 0/1
(``reward_mode = "resolved"``): every F2P and every P2P test passes.

A run in which no test reports a result at all is not scored 0 silently. If the model's patch is
to blame (the same tests do report results at the base state: a syntax error, an import it broke,
a hang), it is a 0 as SWE-bench gives; otherwise (pytest missing, the sandbox failing, tests that
cannot be collected even without the patch) scoring raises :class:`ScoringError`, quoting the end
of the test output.
"""

from __future__ import annotations

import re
import shlex
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from mocksandbox.execution.world import remove_own_tree
from mocksandbox.sessions.errors import ScoringError
from mocksandbox.sessions.executor import ExecResult, SessionExecutor
from mocksandbox.sessions.gitops import (
    apply_patch,
    changed_paths,
    copy_repo,
    restore_paths,
    without_paths,
)
from mocksandbox.sessions.instances import Instance
from mocksandbox.sessions.isolation import RunWorld

RewardMode = Literal["f2p", "resolved"]
_PASSING = ("PASSED", "XFAIL")
#: How much of the test output a :class:`ScoringError` quotes (its last lines).
_TAIL_LINES, _TAIL_CHARS = 15, 1500
#: ``STATUS test-id[ - message]``; a parametrized id may hold spaces inside its brackets.
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) ((?:\[[^\]]*\]|[^\s\[])+)(?: - .*)?$")


@dataclass
class RewardResult:
    """The answer of ``/compute_reward`` (the key order is the order on the wire), plus details."""

    reward: float
    f2p_count: int
    f2p_total: int
    p2p_count: int
    p2p_total: int
    resolved: bool
    patch_is_None: bool
    patch_exists: bool
    patch_successfully_applied: bool
    #: Not sent to the client: each test's status, and the paths of the model's patch left out.
    tests: dict[str, str] = field(default_factory=dict)
    ignored_paths: list[str] = field(default_factory=list)
    log: str = ""

    def answer(self) -> dict[str, Any]:
        """What ``/compute_reward`` sends."""
        data = asdict(self)
        for key in ("tests", "ignored_paths", "log"):
            data.pop(key)
        return data

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RewardResult:
        return cls(**dict(data))


def parse_pytest_summary(output: str) -> dict[str, str]:
    """Test id -> status from pytest's ``-rA`` short test summary (the last status of an id wins)."""
    statuses: dict[str, str] = {}
    for line in output.splitlines():
        match = _SUMMARY_LINE.match(line.rstrip())
        if match and "::" in match.group(2):
            statuses[match.group(2)] = match.group(1)
    return statuses


def pytest_script(python: str, test_ids: Iterable[str]) -> str:
    """The test command: one pytest run over the given ids, with a summary line per test."""
    ids = " ".join(shlex.quote(t) for t in test_ids)
    return f"exec 2>&1\n{shlex.quote(python)} -m pytest -rA --tb=short -p no:cacheprovider {ids}\n"


def score(
    instance: Instance,
    base_repo: Path,
    base_sha: str,
    patch: str | None,
    executor: SessionExecutor,
    scratch_root: Path,
    python: str,
    env: Mapping[str, str],
    timeout: float,
    mode: RewardMode = "f2p",
    tests_known_to_run: bool = False,
    in_world: bool = False,
    give: Callable[[Path], None] | None = None,
) -> RewardResult:
    """Score ``patch`` (the model's ``git diff`` against the base; ``None`` if none was taken).

    ``tests_known_to_run``: this instance's tests were seen to report results here before, so a
    run in which none does is the patch's doing (no check at the base state is made).
    ``in_world``: the tests run in a world of their own (see ``isolation.RunWorld``); ``give``: what
    gives a checkout to the tests' uid there before they run (``SessionManager._give_to_commands``)."""
    f2p, p2p = list(instance.fail_to_pass), list(instance.pass_to_pass)
    patch_exists = bool(patch and patch.strip())
    result = RewardResult(
        reward=0.0,
        f2p_count=0,
        f2p_total=len(f2p),
        p2p_count=0,
        p2p_total=len(p2p),
        resolved=False,
        patch_is_None=patch is None,
        patch_exists=patch_exists,
        patch_successfully_applied=False,
    )
    kept = ""
    if patch_exists:
        assert patch is not None
        kept, result.ignored_paths = without_paths(patch, set(changed_paths(instance.test_patch)))
    root = scratch_root / f"score-{uuid.uuid4().hex[:12]}"
    root.mkdir(parents=True)
    try:
        if kept.strip():
            applied = apply_patch(_checkout(instance, base_repo, root), kept, ceiling=root)
            result.log += f"$ git apply <model patch>\n{applied.output}\n"
            if not applied.ok:
                return result
        result.patch_successfully_applied = patch_exists
        ran = _run_tests(instance, base_repo, base_sha, executor, root, python, env, timeout, in_world, give)
    finally:
        remove_own_tree(root)
    result.log += ran.output
    if ran.error:
        result.log += f"\n[sandbox error: {ran.error}]"
    if ran.timed_out:
        result.log += f"\n[the tests timed out after {timeout:g} s]"
    statuses = parse_pytest_summary(ran.output)
    tests = f2p + p2p
    if tests and not any(test in statuses for test in tests):
        # Nothing ran. The environment's fault (an error), or the patch's (a legitimate 0)?
        cause = _environment_cause(ran, python)
        if cause is None and not kept.strip():
            cause = _base_cause(ran, timeout)  # this run was the base state already
        if cause is None and not tests_known_to_run:
            base_root = scratch_root / f"score-{uuid.uuid4().hex[:12]}-base"
            base_root.mkdir(parents=True)
            try:
                base_ran = _run_tests(
                    instance, base_repo, base_sha, executor, base_root, python, env, timeout, in_world, give
                )
            finally:
                remove_own_tree(base_root)
            base_statuses = parse_pytest_summary(base_ran.output)
            if not any(test in base_statuses for test in tests):
                ran = base_ran
                cause = _environment_cause(base_ran, python) or _base_cause(base_ran, timeout)
            else:
                result.log += "\n[no test reported a result with the patch; they do at the base state]"
        if cause is not None:
            raise ScoringError(
                f"instance {instance.instance_id}: cannot score: none of its {len(f2p)} FAIL_TO_PASS and "
                f"{len(p2p)} PASS_TO_PASS tests reported a result: {cause}. The test output ends: "
                f"{_tail(ran.output)}"
            )
    result.tests = {test: statuses.get(test, "MISSING") for test in tests}
    result.f2p_count = sum(statuses.get(t) in _PASSING for t in f2p)
    result.p2p_count = sum(statuses.get(t) in _PASSING for t in p2p)
    result.resolved = result.f2p_count == len(f2p) and result.p2p_count == len(p2p)
    if mode == "resolved":
        result.reward = 1.0 if result.resolved else 0.0
    else:
        result.reward = result.f2p_count / len(f2p) if f2p else float(result.resolved)
    return result


def _checkout(instance: Instance, base_repo: Path, root: Path) -> Path:
    """A clean checkout of the base state at ``root/repo`` (made once)."""
    repo = root / "repo"
    if not repo.exists():
        copy_repo(base_repo, repo)
    return repo


def _run_tests(
    instance: Instance,
    base_repo: Path,
    base_sha: str,
    executor: SessionExecutor,
    root: Path,
    python: str,
    env: Mapping[str, str],
    timeout: float,
    in_world: bool = False,
    give: Callable[[Path], None] | None = None,
) -> ExecResult:
    """In ``root/repo`` (a base checkout is made if there is none): the test files back to the base
    and the test patch on top (as SWE-bench's eval script does), then F2P + P2P under pytest; in a
    world of its own (the checkout bound in place, its layer beside it) if ``in_world``."""
    repo = _checkout(instance, base_repo, root)
    restore_paths(repo, base_sha, set(changed_paths(instance.test_patch)), ceiling=root)
    applied = apply_patch(repo, instance.test_patch, ceiling=root)
    if not applied.ok:
        raise RuntimeError(
            f"instance {instance.instance_id}: its test_patch does not apply: {applied.output}"
        )
    tests = list(instance.fail_to_pass) + list(instance.pass_to_pass)
    if give is not None:
        give(repo)  # (pytest writes its caches beside the tests)
    world = RunWorld(root / "world", ((str(repo), str(repo)),)) if in_world else None
    return executor.run(root, pytest_script(python, tests), repo, timeout, env, world=world)


def _environment_cause(ran: ExecResult, python: str) -> str | None:
    """Why no test could run whatever the patch, when the output shows it (else ``None``)."""
    if ran.error:
        return f"the sandbox failed ({ran.error.strip()})"
    if "No module named pytest" in ran.output:
        return (
            f"{python} has no pytest (No module named pytest); install pytest for it, or point --python "
            "(--swedev-backend-python with a backend) at an interpreter that has it"
        )
    return None


def _base_cause(ran: ExecResult, timeout: float) -> str:
    """Why no test reported a result at the base state (without the model's patch)."""
    if ran.timed_out:
        return f"the tests timed out after {timeout:g} s without the model's patch (reward_timeout_s)"
    if re.search(r"^(_+ )?ERROR collecting |errors? during collection", ran.output, re.MULTILINE):
        return "the tests could not be collected, even without the model's patch"
    return f"pytest exited {ran.exit_code} without a result for them, even without the model's patch"


def _tail(output: str) -> str:
    """The last lines of the test output, as one quoted string."""
    lines = [line for line in output.rstrip().splitlines() if line.strip()][-_TAIL_LINES:]
    text = "\n".join(lines)[-_TAIL_CHARS:]
    return repr(text) if text else "(no output)"
