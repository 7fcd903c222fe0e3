"""``mocksandbox languages``: the table for this host and for a deployment probed over HTTP."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from mocksandbox.cli import main
from mocksandbox.runtime.catalog import LANGUAGE_NEEDS
from mocksandbox.runtime.layout import RuntimeDir
from mocksandbox.runtime.probes import HELLO, LIBRARY_PROBES
from mocksandbox.runtime.report import LanguageStatus, format_table, host_languages, remote_languages


def test_every_language_and_library_has_a_probe() -> None:
    assert set(HELLO) == set(LANGUAGE_NEEDS) - {"cuda", "python_gpu"}  # their programs are whole projects
    assert {name for needs in LANGUAGE_NEEDS.values() for name in needs.libraries} == set(LIBRARY_PROBES)


def test_host_table_with_an_empty_runtime_dir(tmp_path: Path) -> None:
    import sys

    rows = {row.language: row for row in host_languages(RuntimeDir(tmp_path / "none"), sys.executable)}
    assert set(rows) == set(LANGUAGE_NEEDS)
    assert rows["python"].runs and "Python 3" in rows["python"].toolchain
    assert rows["java"].libraries == {"javatuples": False}
    assert rows["java"].to_add in ("mocksandbox runtime install --languages java",)
    assert rows["swift"].to_add.startswith("not installable here") or rows["swift"].runs


def test_table_text() -> None:
    rows = [
        LanguageStatus("go", True, "go version go1.19", {"go_modules": True}),
        LanguageStatus(
            "java",
            False,
            "missing: javac",
            {"javatuples": False},
            "mocksandbox runtime install --languages java",
        ),
    ]
    text = format_table(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["LANGUAGE", "RUNS", "TOOLCHAIN", "RUNTIME", "LIBRARIES"]
    assert lines[1].split()[:2] == ["go", "yes"]
    assert "javatuples (missing)" in lines[2]
    assert "java: mocksandbox runtime install --languages java" in text
    assert lines[-1] == "1 of 2 languages run"


def test_remote_table_from_run_code_answers() -> None:
    """A made-up deployment that runs bash, python and nodejs, with lodash but no jest."""
    sent: list[Mapping[str, Any]] = []

    def post(path: str, body: Mapping[str, Any], timeout: float) -> Mapping[str, Any]:
        assert path == "/run_code"
        sent.append(body)
        language, code = body["language"], body["code"]
        if language == "bash" and "command -v" in code:
            return {
                "status": "Success",
                "run_result": {"stdout": "go\tgo version go1.23\nbash\tGNU bash 5\n"},
            }
        if language in ("bash", "python", "nodejs") and "jest" not in code:
            stdout = "2\n" if "lodash" in code else "hello\n"
            return {"status": "Success", "run_result": {"stdout": stdout}}
        return {"status": "Failed", "run_result": {"stdout": "", "return_code": 127}}

    rows = {row.language: row for row in remote_languages("http://127.0.0.1:1", post=post)}
    assert rows["bash"].runs and rows["bash"].toolchain == "GNU bash 5"
    assert rows["go"].toolchain == "go version go1.23" and not rows["go"].runs
    assert rows["nodejs"].runs and rows["nodejs"].libraries == {"node_modules": False}  # jest probe fails
    assert rows["julia"].to_add.startswith("not installable here")
    assert {body["language"] for body in sent} >= {"bash", "java", "junit", "go_test", "lean"}


def test_cli_host_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["languages", "--runtime-dir", str(tmp_path / "none")]) == 0
    out = capsys.readouterr().out
    assert "not there: nothing installed yet" in out
    assert out.splitlines()[1].split()[:2] == ["LANGUAGE", "RUNS"]
