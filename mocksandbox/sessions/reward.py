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
"""

from __future__ import annotations

import re
import shlex
import shutil
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from mocksandbox.sessions.executor import SessionExecutor
from mocksandbox.sessions.gitops import (
    apply_patch,
    changed_paths,
    copy_repo,
    restore_paths,
    without_paths,
)
from mocksandbox.sessions.instances import Instance

RewardMode = Literal["f2p", "resolved"]
_PASSING = ("PASSED", "XFAIL")
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
) -> RewardResult:
    """Score ``patch`` (the model's ``git diff`` against the base; ``None`` if none was taken)."""
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
    root = scratch_root / f"score-{uuid.uuid4().hex[:12]}"
    repo = root / "repo"
    root.mkdir(parents=True)
    try:
        copy_repo(base_repo, repo)
        test_files = set(changed_paths(instance.test_patch))
        if patch_exists:
            assert patch is not None
            kept, ignored = without_paths(patch, test_files)
            result.ignored_paths = ignored
            if kept.strip():
                applied = apply_patch(repo, kept, ceiling=root)
                result.log += f"$ git apply <model patch>\n{applied.output}\n"
                if not applied.ok:
                    return result
        result.patch_successfully_applied = patch_exists
        # As SWE-bench's eval script does: test files back to the base, then the test patch.
        restore_paths(repo, base_sha, test_files, ceiling=root)
        applied = apply_patch(repo, instance.test_patch, ceiling=root)
        if not applied.ok:
            raise RuntimeError(
                f"instance {instance.instance_id}: its test_patch does not apply: {applied.output}"
            )
        ran = executor.run(root, pytest_script(python, f2p + p2p), repo, timeout, env)
        result.log += ran.output
        if ran.error:
            result.log += f"\n[sandbox error: {ran.error}]"
        if ran.timed_out:
            result.log += f"\n[the tests timed out after {timeout:g} s]"
        statuses = parse_pytest_summary(ran.output)
        result.tests = {test: statuses.get(test, "MISSING") for test in f2p + p2p}
        result.f2p_count = sum(statuses.get(t) in _PASSING for t in f2p)
        result.p2p_count = sum(statuses.get(t) in _PASSING for t in p2p)
        result.resolved = result.f2p_count == len(f2p) and result.p2p_count == len(p2p)
        if mode == "resolved":
            result.reward = 1.0 if result.resolved else 0.0
        else:
            result.reward = result.f2p_count / len(f2p) if f2p else float(result.resolved)
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)
