"""Runs that use the runtime, through the real engine, as SandboxFusion's runners run them.

Per runtime library one program that uses it; per language whose toolchain the runtime completes
(tsx, dmd on LDC, Kotlin scripts) a hello world and, where there is a compile step, a compile
error; jest's JSON report; JUnit's file naming. Hello worlds and compile errors of the other
languages are in ``tests/unit/test_languages_toolchains.py``. Each case is skipped, with what is
missing and the ``runtime install`` line that adds it, where this host lacks the toolchain or the
library (``make runtime`` installs them).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mocksandbox.core import MockSandbox
from mocksandbox.models import CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus
from mocksandbox.runtime.layout import RuntimeDir
from mocksandbox.runtime.probes import HELLO, LIBRARY_PROBES, Probe
from mocksandbox.runtime.report import missing_for
from mocksandbox.settings import load_settings

#: Slow compilers (scalac, kotlinc, javac) on a loaded CI machine must not time out.
LIMITS: dict[str, Any] = {"compile_timeout": 120, "run_timeout": 120}

#: The runtime dir of this host's settings (MOCKSANDBOX_RUNTIME_DIR, else the default).
RUNTIME = RuntimeDir(load_settings().runtime_dir)


def needs(language: str, *libraries: str) -> list[pytest.MarkDecorator]:
    reason = missing_for(RUNTIME, language, libraries)
    return [pytest.mark.skipif(reason is not None, reason=reason or "")]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockSandbox]:
    box = MockSandbox.create(
        load_settings(
            overrides={"tmp_root": str(tmp_path_factory.mktemp("runs")), "runtime_dir": str(RUNTIME.root)}
        )
    )
    yield box
    box.close()


def run(sandbox: MockSandbox, language: str, code: str, **fields: Any) -> RunCodeResponse:
    return sandbox.engine.run_code(RunCodeRequest(code=code, language=language, **{**LIMITS, **fields}))


def explain(response: RunCodeResponse) -> str:
    return response.model_dump_json(indent=1)


def assert_passes(sandbox: MockSandbox, probe: Probe) -> RunCodeResponse:
    response = run(sandbox, probe.language, probe.code)
    assert response.status == RunStatus.Success, explain(response)
    assert response.run_result is not None
    if probe.stdout is not None:
        assert probe.stdout in (response.run_result.stdout or ""), explain(response)
    return response


LIBRARY_CASES = [
    pytest.param(probe, id=f"{library}-{probe.language}", marks=needs(probe.language, library))
    for library, probes in LIBRARY_PROBES.items()
    for probe in probes
]


@pytest.mark.parametrize("probe", LIBRARY_CASES)
def test_a_program_using_the_library_runs(sandbox: MockSandbox, probe: Probe) -> None:
    assert_passes(sandbox, probe)


#: Languages whose toolchain the runtime completes (links and shims in its bin/).
RUNTIME_TOOLCHAINS = ("typescript", "D_ut", "kotlin_script")


@pytest.mark.parametrize("language", [pytest.param(name, marks=needs(name)) for name in RUNTIME_TOOLCHAINS])
def test_hello_world_with_a_runtime_toolchain(sandbox: MockSandbox, language: str) -> None:
    assert_passes(sandbox, HELLO[language])


@pytest.mark.parametrize(
    ("language", "code"),
    [
        pytest.param("D_ut", "void main() { int x = ; }\n", marks=needs("D_ut"), id="D_ut"),
        pytest.param(
            "go", "package main\n\nfunc main() { undefined() }\n", marks=needs("go", "go_modules"), id="go"
        ),
        pytest.param(
            "junit",
            "import org.junit.jupiter.api.Test;\n\nclass BrokenTest {\n  @Test\n  void t() { int x = ; }\n}\n",
            marks=needs("junit", "junit5"),
            id="junit",
        ),
    ],
)
def test_compile_error(sandbox: MockSandbox, language: str, code: str) -> None:
    response = run(sandbox, language, code)
    assert response.status == RunStatus.Failed, explain(response)
    assert response.compile_result is not None and response.compile_result.return_code != 0, explain(response)
    assert response.run_result is None


@pytest.mark.parametrize("language", [pytest.param("typescript", marks=needs("typescript", "node_modules"))])
def test_typescript_imports_from_node_modules(sandbox: MockSandbox, language: str) -> None:
    code = "import _ from 'lodash';\nconst n: number = _.sum([1, 2]);\nconsole.log(n);\n"
    assert_passes(sandbox, Probe(language, code, "3"))


JEST_FAILING = "test('adds', () => {\n  expect(1 + 1).toBe(3);\n});\n"


@pytest.mark.parametrize("language", [pytest.param("jest", marks=needs("jest", "node_modules"))])
def test_jest_writes_sandboxfusions_json_report(sandbox: MockSandbox, language: str) -> None:
    """SandboxFusion's jest configuration: a JSON report in jest-report.json, fetched as a file."""
    response = run(sandbox, language, JEST_FAILING, fetch_files=["jest-report.json"])
    assert response.status == RunStatus.Failed, explain(response)
    assert response.run_result is not None and response.run_result.return_code != 0
    report = json.loads(base64.b64decode(response.files["jest-report.json"]))
    assert report["numFailedTests"] == 1 and report["numPassedTests"] == 0


@pytest.mark.parametrize("language", [pytest.param("junit", marks=needs("junit", "junit5"))])
def test_junit_failing_test_fails_the_run(sandbox: MockSandbox, language: str) -> None:
    code = (
        "import org.junit.jupiter.api.Test;\nimport static org.junit.jupiter.api.Assertions.*;\n\n"
        "public class Adder {\n  static int add(int a, int b) { return a - b; }\n}\n\n"
        "class AdderTest {\n  @Test\n  void adds() { assertEquals(3, Adder.add(1, 2)); }\n}\n"
    )
    response = run(sandbox, language, code)
    assert response.status == RunStatus.Failed, explain(response)
    assert response.compile_result is not None and response.compile_result.status == CommandRunStatus.Finished
    assert response.run_result is not None and "1 tests failed" in (response.run_result.stdout or "")


@pytest.mark.parametrize("language", [pytest.param("java", marks=needs("java", "javatuples"))])
def test_java_gets_jars_of_the_request_on_its_class_path(
    sandbox: MockSandbox, language: str, tmp_path: Path
) -> None:
    """SandboxFusion adds every ``*.jar`` of ``files`` to ``-cp``: here a jar the test builds."""
    import shutil
    import subprocess

    if shutil.which("jar") is None:
        pytest.skip("the JDK's jar tool is not on PATH")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "Greeter.java").write_text('package lib;\npublic class Greeter { public static String hi() { return "hi from a jar"; } }\n')  # fmt: skip
    subprocess.run(["javac", "lib/Greeter.java"], cwd=tmp_path, check=True)
    subprocess.run(["jar", "cf", "greeter.jar", "lib/Greeter.class"], cwd=tmp_path, check=True)
    jar = base64.b64encode((tmp_path / "greeter.jar").read_bytes()).decode()
    code = "public class Main {\n  public static void main(String[] a) {\n    System.out.println(lib.Greeter.hi());\n  }\n}\n"
    response = run(sandbox, language, code, files={"deps/greeter.jar": jar})
    assert response.status == RunStatus.Success, explain(response)
    assert response.run_result is not None and response.run_result.stdout == "hi from a jar\n"
