"""The language table as data: coverage of the enum, placeholders, SandboxFusion's file layout."""

from __future__ import annotations

import string

import pytest

from mocksandbox.execution.languages import (
    LANGUAGES,
    TOOLCHAIN_BINARIES,
    LanguageSpec,
    ensure_php_open_tag,
    find_scala_object_name,
)
from mocksandbox.models import ALL_LANGUAGES

PLACEHOLDERS = {"file", "dir", "python", "pytest", "cpp_flags", "object_name", "classpath"}


def fields_of(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def templates(spec: LanguageSpec) -> list[str]:
    return [t for t in (spec.setup_command, spec.compile_command, spec.run_command) if t is not None]


def test_every_enum_language_but_sql_has_an_entry() -> None:
    assert set(LANGUAGES) == set(ALL_LANGUAGES) - {"sql"}
    assert "sql" in ALL_LANGUAGES


def test_enum_order_and_size_match_the_contract() -> None:
    assert len(ALL_LANGUAGES) == 29
    assert ALL_LANGUAGES[:4] == ("python", "cpp", "nodejs", "go")
    assert ALL_LANGUAGES[-3:] == ("lean", "swift", "racket")
    for alias in ("js", "ts"):  # runner aliases SandboxFusion keeps out of the enum
        assert alias not in ALL_LANGUAGES and alias not in LANGUAGES


@pytest.mark.parametrize("name", sorted(LANGUAGES))
def test_entry_is_consistent(name: str) -> None:
    spec = LANGUAGES[name]
    assert spec.name == name
    assert spec.run_command
    assert (spec.suffix != "") != (spec.file_name is not None), "a random suffix or a fixed name, not both"
    used = set().union(*(fields_of(t) for t in templates(spec)))
    assert used <= PLACEHOLDERS
    assert used & {"cpp_flags", "object_name", "classpath"} <= spec.needs
    assert spec.has_compile_step == (spec.compile_command is not None)
    assert name in TOOLCHAIN_BINARIES


def test_compile_step_languages() -> None:
    compiled = {name for name, spec in LANGUAGES.items() if spec.has_compile_step}
    # contract §2.7 column C, plus swift (`swiftc` then `./test.out`)
    assert compiled == {"cpp", "java", "junit", "rust", "scala", "verilog", "go", "D_ut", "swift", "cuda", "python_gpu"}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "suffix", "file_name"),
    [
        ("python", ".py", None),
        ("pytest", ".py", None),
        ("cpp", ".cpp", None),
        ("nodejs", ".js", None),
        ("typescript", ".ts", None),
        ("jest", ".test.ts", None),
        ("go_test", "_test.go", None),
        ("bash", ".sh", None),
        ("php", ".php", None),
        ("rust", ".rs", None),
        ("java", "", "Main.java"),
        ("csharp", "", "Program.cs"),
    ],
)
def test_code_file_names_as_sandboxfusion(name: str, suffix: str, file_name: str | None) -> None:
    spec = LANGUAGES[name]
    assert (spec.suffix, spec.file_name) == (suffix, file_name)


@pytest.mark.parametrize(
    ("name", "compile_command", "run_command"),
    [
        ("python", None, "{python} {file}"),
        ("cpp", "g++ -std=c++17 {file} -o test {cpp_flags}", "./test"),
        ("bash", None, "/bin/bash {file}"),
        ("java", "javac -cp {classpath} Main.java", "java -cp {classpath} -ea Main"),
        ("rust", "rustc {file} -o test", "./test"),
        ("go", "go build -o out {file}", "./out"),
        ("nodejs", None, "node {file}"),
        ("php", None, "php -f {file}"),
    ],
)
def test_commands_as_sandboxfusion(name: str, compile_command: str | None, run_command: str) -> None:
    spec = LANGUAGES[name]
    assert (spec.compile_command, spec.run_command) == (compile_command, run_command)


def test_only_csharp_has_a_setup_step_and_only_verilog_skips_files() -> None:
    assert {n for n, s in LANGUAGES.items() if s.setup_command} == {"csharp"}
    assert {n for n, s in LANGUAGES.items() if not s.restores_files} == {"verilog"}
    assert {n for n, s in LANGUAGES.items() if s.python_env} == {"python", "pytest", "python_gpu"}
    assert {n for n, s in LANGUAGES.items() if s.prepare_code} == {"php"}


# -- ensure_php_open_tag (SandboxFusion's ensure_php_tag_in_string) -------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("echo 1;", "<?php\necho 1;"),
        ("<?php echo 1;", "<?php echo 1;"),
        ("<?php\necho 1;", "<?php\necho 1;"),
        ("", "<?php\n"),
        ("   ", "<?php\n"),
        ("<?PHP echo 1;", "<?php\n<?PHP echo 1;"),  # case-sensitive, as upstream
        ("<? echo 1;", "<?php\n<? echo 1;"),
    ],
)
def test_ensure_php_open_tag(code: str, expected: str) -> None:
    assert ensure_php_open_tag(code) == expected


def test_ensure_php_open_tag_strips_leading_whitespace_like_upstream() -> None:
    """Upstream returns ``php_code.lstrip()`` whether or not it adds the tag."""
    assert ensure_php_open_tag("\n  <?php echo 1;") == "<?php echo 1;"
    assert ensure_php_open_tag("  echo 1;") == "<?php\necho 1;"


# -- find_scala_object_name ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("object Main {\n  def main(args: Array[String]): Unit = println(1)\n}", "Main"),
        ("object Main extends App {\n  println(1)\n}", "Main"),
        ("import scala.io._\n\nobject   Solution{ }", "Solution"),
        ("class A\nobject First\nobject Second", "First"),
        ("// the object here\nobject Real", "here"),  # upstream's regex does not skip comments
        ("println(1)", None),
        ("", None),
        ("objectMain {}", None),
        ("class Foo extends Bar {}", ""),  # the second alternative matches with an empty name
    ],
)
def test_find_scala_object_name(code: str, expected: str | None) -> None:
    assert find_scala_object_name(code) == expected
