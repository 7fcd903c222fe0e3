"""The runtime dir as runs see it: what a temp dir gets, the class path, environments, settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mocksandbox.execution.languages import (
    JAVATUPLES_JAR,
    JUNIT_CONSOLE_JAR,
    LANGUAGES,
    java_classpath,
    java_code_file_name,
)
from mocksandbox.runtime.catalog import LANGUAGE_NEEDS, LIBRARIES
from mocksandbox.runtime.layout import GO_GOPATH_SYSTEM, RuntimeDir, default_runtime_dir
from mocksandbox.settings import Settings, load_settings


@pytest.fixture
def runtime(tmp_path: Path) -> RuntimeDir:
    """A runtime dir with a few made-up files where the real ones go."""
    root = tmp_path / "runtime"
    (root / "java").mkdir(parents=True)
    (root / "java" / JAVATUPLES_JAR).write_bytes(b"runtime jar")
    (root / "node" / "node_modules" / "lodash").mkdir(parents=True)
    (root / "node" / "package.json").write_text("{}")
    (root / "node" / "babel.config.js").write_text("")
    (root / "go" / "gopath").mkdir(parents=True)
    (root / "go" / "go.mod").write_text("module SeedSandbox\n")
    (root / "bin").mkdir()
    return RuntimeDir(root)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    return path


def test_every_language_of_the_table_has_needs_and_back() -> None:
    assert set(LANGUAGE_NEEDS) == set(LANGUAGES)
    for needs in LANGUAGE_NEEDS.values():
        assert set(needs.libraries) <= set(LIBRARIES)


def test_default_runtime_dir_follows_xdg() -> None:
    assert default_runtime_dir({"XDG_DATA_HOME": "/data"}) == "/data/mocksandbox/runtime"
    assert default_runtime_dir({}).endswith("/.local/share/mocksandbox/runtime")


def test_java_gets_a_copy_of_the_jar_and_the_class_path(runtime: RuntimeDir, workdir: Path) -> None:
    placeholders = runtime.prepare_workdir(LANGUAGES["java"], str(workdir), ["Main.java", "lib/dep.jar"])
    copied = workdir / JAVATUPLES_JAR
    assert copied.read_bytes() == b"runtime jar" and not copied.is_symlink()  # programs may write it
    assert placeholders == {"classpath": f".:{JAVATUPLES_JAR}:lib/dep.jar"}


def test_a_request_file_of_the_same_name_wins(runtime: RuntimeDir, workdir: Path) -> None:
    (workdir / JAVATUPLES_JAR).write_bytes(b"the request's")
    runtime.prepare_workdir(LANGUAGES["java"], str(workdir), [JAVATUPLES_JAR])
    assert (workdir / JAVATUPLES_JAR).read_bytes() == b"the request's"


def test_jar_names_from_the_request_are_one_quoted_shell_word(runtime: RuntimeDir, workdir: Path) -> None:
    placeholders = runtime.prepare_workdir(LANGUAGES["java"], str(workdir), ["a b;rm -rf x.jar"])
    assert placeholders["classpath"] == f"'.:{JAVATUPLES_JAR}:a b;rm -rf x.jar'"


def test_absent_runtime_files_are_left_out(runtime: RuntimeDir, workdir: Path) -> None:
    """No JUnit jars in this runtime: the run fails as on a SandboxFusion without them."""
    placeholders = runtime.prepare_workdir(LANGUAGES["junit"], str(workdir), [])
    assert os.listdir(workdir) == []
    assert placeholders["classpath"].startswith(f".:{JUNIT_CONSOLE_JAR}:")


def test_node_runs_link_node_modules_and_jest_its_configuration(runtime: RuntimeDir, workdir: Path) -> None:
    runtime.prepare_workdir(LANGUAGES["jest"], str(workdir), [])
    for name in ("node_modules", "package.json", "babel.config.js"):
        assert (workdir / name).is_symlink()
        assert os.readlink(workdir / name) == str(runtime.node_dir / name)


def test_a_request_file_where_a_link_goes_fails_as_upstream(runtime: RuntimeDir, workdir: Path) -> None:
    (workdir / "node_modules").mkdir()
    with pytest.raises(FileExistsError):
        runtime.prepare_workdir(LANGUAGES["nodejs"], str(workdir), ["node_modules/x.js"])


def test_go_runs_get_the_module_files_and_gopath_mode(runtime: RuntimeDir, workdir: Path) -> None:
    runtime.prepare_workdir(LANGUAGES["go"], str(workdir), [])
    assert (workdir / "go.mod").read_text() == "module SeedSandbox\n"
    env = runtime.environment(LANGUAGES["go_test"], {"PATH": "/usr/bin"})
    assert env["GO111MODULE"] == "off"
    assert env["GOPATH"] == f"{runtime.gopath}:{GO_GOPATH_SYSTEM}"
    assert env["PATH"] == f"{runtime.bin_dir}:/usr/bin"


def test_python_runs_keep_their_environment(runtime: RuntimeDir) -> None:
    """Their environment must stay the launcher's (the fast path sends none)."""
    base = {"PATH": "/venv/bin:/usr/bin"}
    assert runtime.environment(LANGUAGES["python"], base) == base
    assert runtime.environment(LANGUAGES["ruby"], base)["PATH"] == f"{runtime.bin_dir}:/venv/bin:/usr/bin"


def test_no_runtime_dir_changes_nothing(tmp_path: Path, workdir: Path) -> None:
    runtime = RuntimeDir(tmp_path / "absent")
    assert runtime.environment(LANGUAGES["go"], {"PATH": "/usr/bin"}) == {"PATH": "/usr/bin"}
    assert runtime.prepare_workdir(LANGUAGES["go"], str(workdir), []) == {}
    assert os.listdir(workdir) == []
    assert runtime.python() is None


@pytest.mark.parametrize(
    ("code", "name"),
    [
        ("public class PhoneNumberCreator {}\nclass PhoneNumberCreatorTest {}", "PhoneNumberCreator.java"),
        ("public final class Solver {}", "Solver.java"),
        ("class OnlyPackagePrivate {}", "Main.java"),
        ("", "Main.java"),
    ],
)
def test_junit_code_file_is_named_after_the_public_class(code: str, name: str) -> None:
    assert java_code_file_name(code) == name
    assert LANGUAGES["junit"].code_file_name is java_code_file_name


def test_classpath_lists_every_jar_name_of_the_request() -> None:
    assert (
        java_classpath(("a.jar",), ["x.txt", "b.jar", "IGNORE_THIS_FILE.jar"])
        == ".:a.jar:b.jar:IGNORE_THIS_FILE.jar"
    )


def test_settings_use_the_runtime_interpreter_unless_told_otherwise(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    python = root / "python" / "venv" / "bin" / "python"
    assert Settings(runtime_dir=str(root)).python != str(python)  # none installed: the server's own
    python.parent.mkdir(parents=True)
    python.symlink_to(os.path.realpath("/proc/self/exe"))
    assert Settings(runtime_dir=str(root)).python == str(python)
    assert Settings(runtime_dir=str(root), python="/usr/bin/python3").python == "/usr/bin/python3"
    settings = load_settings(environ={"MOCKSANDBOX_RUNTIME_DIR": str(root)})
    assert settings.runtime_dir == str(root) and settings.python == str(python)
    assert settings.replace(port=1).python == str(python)
