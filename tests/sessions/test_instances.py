"""Instances as data: the shipped ones follow SWE-bench's row schema; user dirs and JSONL load."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from mocksandbox.sessions import InstanceError, InstanceRegistry, UnknownInstanceError
from mocksandbox.sessions.gitops import build_base_repo, split_patch, without_paths
from mocksandbox.sessions.instances import SHIPPED_INSTANCES_DIR, load_instances
from mocksandbox.sessions.reward import parse_pytest_summary

SWE_BENCH_FIELDS = {
    "repo",
    "instance_id",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "hints_text",
    "created_at",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "environment_setup_commit",
}
SHIPPED_DIRS = sorted(p for p in SHIPPED_INSTANCES_DIR.iterdir() if (p / "instance.json").is_file())


def verl_hash(instance_id: str) -> int:
    """md5(instance_id) mod 2**63, computed independently of the code under test."""
    return int.from_bytes(hashlib.md5(instance_id.encode()).digest(), "big") & (2**63 - 1)


def test_at_least_four_instances_ship() -> None:
    assert len(SHIPPED_DIRS) >= 4


@pytest.mark.parametrize("directory", SHIPPED_DIRS, ids=lambda p: p.name)
def test_shipped_instance_is_a_swe_bench_row(directory: Path, tmp_path: Path) -> None:
    row = json.loads((directory / "instance.json").read_text())
    assert set(row) >= SWE_BENCH_FIELDS
    assert row["instance_hash"] == verl_hash(row["instance_id"])
    assert (directory / "gold.patch").read_text() == row["patch"]
    assert (directory / "test.patch").read_text() == row["test_patch"]
    # As on the Hub: the test lists are JSON strings.
    f2p, p2p = json.loads(row["FAIL_TO_PASS"]), json.loads(row["PASS_TO_PASS"])
    assert f2p and p2p and not set(f2p) & set(p2p)
    # The gold patch changes source only; the test patch tests only.
    assert all(not path.startswith("tests/") for path, _ in split_patch(row["patch"]))
    assert all(path.startswith("tests/") for path, _ in split_patch(row["test_patch"]))
    # base_commit is the commit the server builds from repo/: the same on every machine.
    assert build_base_repo(directory / "repo", tmp_path / "base") == row["base_commit"]
    assert row["environment_setup_commit"] == row["base_commit"]


def test_registry_finds_instances_by_hash_in_any_form() -> None:
    registry = InstanceRegistry.from_paths([])
    instance = registry.all()[0]
    assert registry.find(instance.instance_hash) is instance
    assert registry.find(str(instance.instance_hash)) is instance
    assert registry.find(instance.instance_id) is instance  # a convenience for hand-written clients
    assert instance.workspace_path == f"/workspace/{instance.repo.replace('/', '__')}__{instance.version}"
    with pytest.raises(UnknownInstanceError, match="unknown instance_hash 42"):
        registry.find(42)
    with pytest.raises(UnknownInstanceError, match="GET /_mock/instances"):
        registry.find("3864552457764042195")


def _row(instance_id: str, **extra: object) -> dict[str, object]:
    row: dict[str, object] = {
        "instance_id": instance_id,
        "repo": "me/calc",
        "version": "0.1",
        "base_commit": "",
        "problem_statement": "add() subtracts",
        "patch": "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
        " def add(a, b):\n-    return a - b\n+    return a + b\n",
        "test_patch": "diff --git a/test_calc.py b/test_calc.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/test_calc.py\n@@ -0,0 +1,5 @@\n+from calc import add\n+\n+\n+def test_add():\n"
        "+    assert add(2, 2) == 4\n",
        "FAIL_TO_PASS": ["test_calc.py::test_add"],
        "PASS_TO_PASS": [],
    }
    row.update(extra)
    return row


def test_jsonl_rows_with_plain_and_git_snapshots(tmp_path: Path) -> None:
    (tmp_path / "repos" / "me__calc-1").mkdir(parents=True)
    (tmp_path / "repos" / "me__calc-1" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git_repo = tmp_path / "repos" / "me__calc-2"
    shutil.copytree(tmp_path / "repos" / "me__calc-1", git_repo)
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "x"],
    ):
        subprocess.run(["git", *args], cwd=git_repo, env=env, check=True)
    base = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=git_repo, env=env, check=True, capture_output=True
    )
    # A later commit holds the fix: the session must not see it.
    (git_repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    subprocess.run(
        ["git", "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qam", "fix"], cwd=git_repo, env=env
    )
    rows = [_row("me__calc-1"), _row("me__calc-2", base_commit=base.stdout.decode().strip())]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    registry = InstanceRegistry.from_paths([tmp_path / "rows.jsonl"], include_shipped=False)
    assert [i.instance_id for i in registry.all()] == ["me__calc-1", "me__calc-2"]
    for instance in registry.all():
        base_dir, _ = registry.base_repo(instance, tmp_path / "bases")
        assert (base_dir / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"
        log = subprocess.run(["git", "log", "--oneline"], cwd=base_dir, capture_output=True, env=env)
        assert len(log.stdout.splitlines()) == 1  # no history to find the fix in


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (_row("x", instance_hash=1), "is not md5"),
        ({"instance_id": "x"}, "missing field"),
        (_row("x", FAIL_TO_PASS="not json"), "FAIL_TO_PASS"),
        (_row("x", env={"A": 1}), "env must map"),
        (_row("x", test_patch=""), "test_patch is empty"),
        (_row("no-snapshot"), "is not a directory"),
    ],
)
def test_bad_rows_are_clear_errors(tmp_path: Path, row: dict[str, object], message: str) -> None:
    (tmp_path / "repos" / "x").mkdir(parents=True)
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(InstanceError, match=message):
        load_instances([tmp_path / "rows.jsonl"])


def test_instance_dir_gold_patch_must_match(tmp_path: Path) -> None:
    shutil.copytree(SHIPPED_DIRS[0], tmp_path / "inst")
    (tmp_path / "inst" / "gold.patch").write_text("something else\n")
    with pytest.raises(InstanceError, match=r"gold.patch differs"):
        load_instances([tmp_path / "inst"])
    with pytest.raises(InstanceError, match="not an instance directory"):
        load_instances([tmp_path / "missing"])


def test_test_files_are_left_out_of_the_model_patch() -> None:
    patch = (
        "diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-x\n+y\n"
        "diff --git a/tests/conftest.py b/tests/conftest.py\n--- a/tests/conftest.py\n+++ b/tests/conftest.py\n"
        "@@ -1 +1 @@\n-x\n+y\n"
        "diff --git a/test_repro.py b/test_repro.py\nnew file mode 100644\n--- /dev/null\n+++ b/test_repro.py\n"
        "@@ -0,0 +1 @@\n+y\n"
        "diff --git a/docs/notes.md b/docs/notes.md\n--- a/docs/notes.md\n+++ b/docs/notes.md\n@@ -1 +1 @@\n-x\n+y\n"
    )
    kept, dropped = without_paths(patch, {"docs/notes.md"})
    assert [path for path, _ in split_patch(kept)] == ["pkg/a.py"]
    assert dropped == ["tests/conftest.py", "test_repro.py", "docs/notes.md"]


def test_pytest_summary_is_read_like_swe_bench() -> None:
    output = (
        "============ short test summary info ============\n"
        "PASSED tests/test_a.py::test_one\n"
        "FAILED tests/test_a.py::test_two - AssertionError: assert 1 == 2\n"
        "PASSED tests/test_a.py::test_param[a - b]\n"
        "ERROR tests/test_b.py::test_three - fixture 'x' not found\n"
        "XFAIL tests/test_b.py::test_four - reason\n"
        "SKIPPED [1] tests/test_b.py:9: no network\n"
    )
    assert parse_pytest_summary(output) == {
        "tests/test_a.py::test_one": "PASSED",
        "tests/test_a.py::test_two": "FAILED",
        "tests/test_a.py::test_param[a - b]": "PASSED",
        "tests/test_b.py::test_three": "ERROR",
        "tests/test_b.py::test_four": "XFAIL",
    }
