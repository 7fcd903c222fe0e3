"""Run temp dirs kept for the next run: only when a run left its own dir empty and as it was made."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from mocksandbox.core import MockSandbox
from mocksandbox.execution import workdirs
from mocksandbox.execution.workdirs import IDLE_WORKDIRS, WorkdirPool
from mocksandbox.models import RunCodeRequest, RunStatus
from mocksandbox.settings import load_settings


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[WorkdirPool]:
    made = WorkdirPool(str(tmp_path))
    yield made
    made.close()


def test_an_empty_dir_is_reused_and_the_code_file_removed(pool: WorkdirPool) -> None:
    first = pool.take()
    assert Path(first).parent == Path(pool.root or "") and Path(first).name.startswith("tmp")
    assert oct(os.stat(first).st_mode & 0o777) == oct(0o700)
    code = Path(first, "tmpcode.py")
    code.write_text("print(1)")
    inode = os.stat(first).st_ino
    pool.give_back(first, str(code))
    assert not code.exists()
    second = pool.take()
    # The same dir under a fresh name: every run sees a new tmpXXXXXXXX, as on SandboxFusion.
    assert os.stat(second).st_ino == inode and second != first and not os.path.lexists(first)
    assert Path(second).parent == Path(first).parent and Path(second).name.startswith("tmp")
    assert len(Path(second).name) == len(Path(first).name)
    assert list(Path(second).iterdir()) == []


def test_a_pool_that_reuses_nothing_makes_each_dir_fresh_and_removes_it(tmp_path: Path) -> None:
    """A relay's kept root keeps a run's dir bound after the run: such dirs are never handed out
    again, under any name."""
    pool = WorkdirPool(str(tmp_path), reuse=False)
    try:
        first = pool.take()
        Path(first, "tmpcode.py").write_text("print(1)")
        pool.give_back(first, str(Path(first, "tmpcode.py")))  # empty but for its code file
        assert not os.path.lexists(first)
        second = pool.take()
        assert second != first and list(Path(second).iterdir()) == []
        # A dir removed before it is given back (its relay removed it) is no error.
        os.rmdir(second)
        pool.give_back(second, None)
        assert list(tmp_path.iterdir()) == []
    finally:
        pool.close()


def test_a_reused_dir_never_replaces_one_that_has_its_new_name(
    pool: WorkdirPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rename is RENAME_NOREPLACE: an empty dir someone else made under the drawn name stays."""
    first = pool.take()
    pool.give_back(first, None)
    parent = Path(first).parent
    names = iter(["tmpaaaaaaaa", "tmpbbbbbbbb"])
    (parent / "tmpaaaaaaaa").mkdir()  # empty: a plain rename(2) would silently replace it
    monkeypatch.setattr(workdirs, "temp_name", lambda suffix="": next(names) + suffix)
    assert pool.take() == str(parent / "tmpbbbbbbbb")
    assert (parent / "tmpaaaaaaaa").is_dir()


def test_a_dir_with_files_left_is_removed(pool: WorkdirPool) -> None:
    first = pool.take()
    Path(first, "out.txt").write_text("left behind")
    pool.give_back(first, None)
    assert not Path(first).exists()
    assert pool.take() != first


def test_a_dir_whose_mode_changed_is_not_reused(pool: WorkdirPool) -> None:
    first = pool.take()
    os.chmod(first, 0o777)
    pool.give_back(first, None)
    assert not Path(first).exists()


def test_a_dir_replaced_by_a_symlink_is_unlinked_never_followed(pool: WorkdirPool, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "precious").write_text("keep me")
    first = pool.take()
    os.rmdir(first)
    os.symlink(elsewhere, first)
    pool.give_back(first, os.path.join(first, "tmpcode.py"))
    assert not os.path.lexists(first)
    assert (elsewhere / "precious").read_text() == "keep me"
    assert pool.take() != first


def test_at_most_the_idle_limit_is_kept_and_close_removes_them(tmp_path: Path) -> None:
    pool = WorkdirPool(str(tmp_path))
    taken = [pool.take() for _ in range(IDLE_WORKDIRS + 3)]
    for path in taken:
        pool.give_back(path, None)
    assert len(list(tmp_path.iterdir())) == IDLE_WORKDIRS
    pool.close()
    assert list(tmp_path.iterdir()) == []


def test_runs_through_the_engine_reuse_dirs_and_a_program_cannot_redirect_the_next(tmp_path: Path) -> None:
    """A program that swaps its dir for a symlink to another dir: the next run gets a fresh dir, and
    nothing is written to or removed from the symlink's target."""
    runs = tmp_path / "runs"
    runs.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "precious").write_text("keep me")
    # Isolation none: the temp dirs on the host are what is tested here (lite has layers instead).
    box = MockSandbox.create(load_settings(overrides={"tmp_root": str(runs), "isolation": "none"}))
    try:

        def cwd_of(code: str) -> str:
            answer = box.engine.run_code(RunCodeRequest(code=code, language="python"))
            assert answer.status == RunStatus.Success, answer
            assert answer.run_result is not None and answer.run_result.stdout is not None
            return answer.run_result.stdout.strip()

        first = cwd_of("import os; print(os.getcwd())")
        second = cwd_of("import os; print(os.getcwd())")
        assert second != first and [p.name for p in runs.iterdir()] == [os.path.basename(second)]
        swapped = cwd_of(
            "import os\nd = os.getcwd()\nos.chdir('/')\nfor f in os.listdir(d): os.unlink(os.path.join(d, f))\n"
            f"os.rmdir(d)\nos.symlink({str(target)!r}, d)\nprint(d)"
        )
        after = cwd_of("import os; print(os.getcwd())")
        assert after not in (first, second, swapped) and os.path.realpath(after) == after
        assert sorted(p.name for p in target.iterdir()) == ["precious"]
        assert not os.path.lexists(swapped)
    finally:
        box.close()
    assert list(runs.iterdir()) == []


@pytest.mark.skipif(shutil.which("g++") is None, reason="toolchain binary not on PATH: g++")
def test_a_compile_killed_at_its_timeout_leaves_no_compiler_temp_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gcc writes cc*.s and friends to $TMPDIR and removes them only if it finishes: they go into
    the run's dir, which goes with the run, not into the server's temp dir."""
    server_tmp = tmp_path / "server-tmp"
    server_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(server_tmp))
    runs = tmp_path / "runs"
    runs.mkdir()
    # Deep template recursion: seconds of compiling, killed after a quarter of one.
    slow = "template<int N> struct F { enum { v = F<N-1>::v + F<N-2>::v }; };\n"
    slow += "template<> struct F<0> { enum { v = 0 }; };\ntemplate<> struct F<1> { enum { v = 1 }; };\n"
    slow += "int main() { return F<30>::v > 0 ? 0 : 1; }\n" + "#include <bits/stdc++.h>\n" * 3
    box = MockSandbox.create(load_settings(overrides={"tmp_root": str(runs)}))
    try:
        answer = box.engine.run_code(RunCodeRequest(code=slow, language="cpp", compile_timeout=0.25))
        assert answer.compile_result is not None
        assert answer.compile_result.status == "TimeLimitExceeded", answer
    finally:
        box.close()
    assert list(server_tmp.iterdir()) == []
    assert list(runs.iterdir()) == []
