"""Every language with a real toolchain: hello world, failing programs, compile errors, answer shape.

Each case needs the language's binaries on PATH and is skipped (naming the missing binary) where
they are absent, so the suite passes on a bare CI machine. Expectations follow the contract
(§2.2-§2.4, §2.7): compiled languages answer with a ``compile_result``, interpreted ones with
``null``; a compile error leaves ``run_result`` null; a missing toolchain is the shell's rc 127.
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from mocksandbox.core import MockSandbox
from mocksandbox.models import CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus
from mocksandbox.runtime.layout import RuntimeDir
from mocksandbox.settings import load_settings

#: Languages whose runner has a compile step (contract §2.7 column C; swift's runner compiles
#: with ``swiftc`` before running ``./test.out``). Written out here, not read from the table.
COMPILED = {"cpp", "java", "junit", "rust", "scala", "verilog", "go", "D_ut", "swift", "cuda", "python_gpu"}

#: Generous limits: slow toolchains (scalac, rustc) on a loaded CI machine must not time out.
LIMITS: dict[str, Any] = {"compile_timeout": 120, "run_timeout": 60}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


#: The PATH runs get: the runtime dir's ``bin/`` (``mocksandbox runtime install``: tsx, a dmd
#: shim, ...) before this process's own.
RUN_PATH = (
    f"{RuntimeDir(load_settings().runtime_dir).bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
)


def installed(binary: str) -> bool:
    """``binary`` is found where runs look for it."""
    return shutil.which(binary, path=RUN_PATH) is not None


def toolchain(*binaries: str) -> list[pytest.MarkDecorator]:
    """Mark a case as needing ``binaries``; skip it, naming what is missing, when they are absent."""
    missing = [name for name in binaries if not installed(name)]
    return [
        pytest.mark.toolchain(binaries[0]),
        pytest.mark.skipif(
            bool(missing), reason=f"toolchain binary not on PATH nor in the runtime dir: {', '.join(missing)}"
        ),
    ]


@dataclass(frozen=True)
class Case:
    language: str
    code: str
    #: Exact stdout (``exact``) or a substring of it; ``None`` leaves stdout unchecked.
    stdout: str | None
    binaries: tuple[str, ...]
    exact: bool = True
    files: dict[str, str] = field(default_factory=dict)
    id: str = ""

    def param(self) -> Any:
        marks = toolchain(*self.binaries) if self.binaries else []
        return pytest.param(self, id=self.id or self.language, marks=marks)


# The interpreter for user Python code is the server's own by default: always present.
HELLO = [
    Case("python", 'print("hello")', "hello\n", ()),
    Case("pytest", "def test_hello():\n    assert 1 + 1 == 2\n", "1 passed", (), exact=False),
    Case("bash", "echo hello", "hello\n", ("bash",)),
    Case(
        "cpp",
        '#include <iostream>\nint main() { std::cout << "hello" << std::endl; return 0; }\n',
        "hello\n",
        ("g++",),
    ),
    Case("nodejs", 'console.log("hello")', "hello\n", ("node",)),
    Case("typescript", 'const greeting: string = "hello";\nconsole.log(greeting);\n', "hello\n", ("tsx",)),
    Case(
        "java",
        'public class Main {\n  public static void main(String[] args) {\n    System.out.println("hello");\n  }\n}\n',
        "hello\n",
        ("javac", "java"),
    ),
    Case("rust", 'fn main() {\n    println!("hello");\n}\n', "hello\n", ("rustc",)),
    Case("perl", 'print "hello\\n";', "hello\n", ("perl",)),
    Case("php", 'echo "hello\\n";', "hello\n", ("php",), id="php-without-open-tag"),
    Case("php", '<?php\necho "hello\\n";', "hello\n", ("php",), id="php-with-open-tag"),
    # SandboxFusion strips leading whitespace before looking for the tag, so none is printed.
    Case("php", '\n\n  <?php echo "hello\\n";', "hello\n", ("php",), id="php-leading-whitespace"),
    Case("ruby", 'puts "hello"', "hello\n", ("ruby",)),
    Case("lua", 'print("hello")', "hello\n", ("lua",)),
    Case("R", 'cat("hello\\n")', "hello\n", ("Rscript",)),
    Case(
        "scala",
        'object Hello {\n  def main(args: Array[String]): Unit = println("hello")\n}\n',
        "hello\n",
        ("scalac", "scala"),
        id="scala-main",
    ),
    Case(
        "scala",
        'object Greeter extends App {\n  println("hello")\n}\n',
        "hello\n",
        ("scalac", "scala"),
        id="scala-app",
    ),
    Case(
        "verilog",
        'module tb;\n  initial begin\n    $display("hello");\n    $finish;\n  end\nendmodule\n',
        "hello\n",
        ("iverilog", "vvp"),
    ),
    Case(
        "go", 'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hello")\n}\n', "hello\n", ("go",)
    ),
    Case(
        "go_test",
        'package main\n\nimport "testing"\n\nfunc TestHello(t *testing.T) {}\n',
        "ok",
        ("go",),
        exact=False,
    ),
    Case("D_ut", "unittest { assert(1 + 1 == 2); }\n\nvoid main() {}\n", None, ("dmd",)),
    Case("swift", 'print("hello")', "hello\n", ("swiftc",)),
    Case("julia", 'println("hello")', "hello\n", ("julia",)),
    Case("kotlin_script", 'println("hello")', "hello\n", ("kotlin",)),
    Case("racket", '#lang racket\n(displayln "hello")\n', "hello\n", ("racket",)),
    Case("csharp", 'System.Console.WriteLine("hello");\n', "hello\n", ("dotnet",), exact=False),
    # The project of these two comes entirely from `files`; `code` is written but unused.
    Case(
        "python_gpu",
        "",
        "hello\n",
        (),
        files={"compile.py": b64("print('compiled')\n"), "run.py": b64("print('hello')\n")},
    ),
    Case(
        "cuda",
        "",
        "hello\n",
        ("cmake", "make", "g++"),
        files={
            "CMakeLists.txt": b64(
                "cmake_minimum_required(VERSION 3.10)\nproject(main CXX)\nadd_executable(main main.cpp)\n"
            ),
            "main.cpp": b64('#include <cstdio>\nint main() { std::puts("hello"); return 0; }\n'),
        },
    ),
]


def hello(language: str) -> Case:
    return next(case for case in HELLO if case.language == language)


#: Programs that run and exit non-zero: status Failed, the program's own return code.
FAILING = [
    Case("python", "import sys\nprint('before exit')\nsys.exit(3)\n", "before exit\n", (), id="python-3"),
    Case("pytest", "def test_fails():\n    assert 1 == 2\n", "1 failed", (), exact=False, id="pytest-1"),
    Case("bash", "echo hi; exit 7", "hi\n", ("bash",), id="bash-7"),
    Case("cpp", "int main() { return 4; }", "", ("g++",), id="cpp-4"),
    Case("nodejs", "process.exit(5)", "", ("node",), id="nodejs-5"),
    Case("typescript", "process.exit(2)", "", ("tsx",), id="typescript-2"),
    Case(
        "java",
        "public class Main {\n  public static void main(String[] args) {\n    System.exit(3);\n  }\n}\n",
        "",
        ("javac", "java"),
        id="java-3",
    ),
    Case("rust", "fn main() {\n    std::process::exit(6);\n}\n", "", ("rustc",), id="rust-6"),
    Case("perl", "exit 2;", "", ("perl",), id="perl-2"),
    Case("php", "exit(4);", "", ("php",), id="php-4"),
    Case("ruby", "exit 3", "", ("ruby",), id="ruby-3"),
    Case("lua", "os.exit(3)", "", ("lua",), id="lua-3"),
    Case("R", "quit(status = 3)", "", ("Rscript",), id="R-3"),
    Case(
        "scala",
        "object Hello {\n  def main(args: Array[String]): Unit = sys.exit(3)\n}\n",
        "",
        ("scalac", "scala"),
        id="scala-3",
    ),
    Case("go", 'package main\n\nimport "os"\n\nfunc main() {\n\tos.Exit(3)\n}\n', "", ("go",), id="go-3"),
    Case("julia", "exit(3)", "", ("julia",), id="julia-3"),
    Case("racket", "#lang racket\n(exit 3)\n", "", ("racket",), id="racket-3"),
]
FAILING_RC = {
    "python-3": 3,
    "pytest-1": 1,
    "bash-7": 7,
    "cpp-4": 4,
    "nodejs-5": 5,
    "typescript-2": 2,
    "java-3": 3,
    "rust-6": 6,
    "perl-2": 2,
    "php-4": 4,
    "ruby-3": 3,
    "lua-3": 3,
    "R-3": 3,
    "scala-3": 3,
    "go-3": 3,
    "julia-3": 3,
    "racket-3": 3,
}

#: Programs the compiler rejects: compile_result rc != 0 with the diagnostic, run_result null.
COMPILE_ERRORS = [
    Case("cpp", "int main() { return x; }", "was not declared", ("g++",)),
    Case(
        "java",
        'public class Main {\n  public static void main(String[] args) {\n    int x = "s";\n  }\n}\n',
        "incompatible types",
        ("javac",),
    ),
    Case("rust", 'fn main() {\n    let x: i32 = "s";\n}\n', "mismatched types", ("rustc",)),
    Case(
        "scala",
        'object Hello {\n  def main(args: Array[String]): Unit = { val x: Int = "s" }\n}\n',
        "type mismatch",
        ("scalac",),
    ),
    Case("verilog", 'module tb;\n  initial $display("hello")\nendmodule\n', "syntax error", ("iverilog",)),
    # The runner compiles with `-s tb`: a design without a `tb` module does not elaborate.
    Case(
        "verilog",
        'module top;\n  initial $display("hello");\nendmodule\n',
        'root module "tb"',
        ("iverilog",),
        id="verilog-no-tb",
    ),
    Case("go", "package main\n\nfunc main() { x := 1 }\n", "declared", ("go",)),
    Case("swift", 'let x: Int = "s"\n', "error", ("swiftc",)),
]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockSandbox]:
    runs = tmp_path_factory.mktemp("language-runs")
    box = MockSandbox.create(load_settings(overrides={"tmp_root": str(runs)}))
    yield box
    box.close()


def run(sandbox: MockSandbox, language: str, code: str, **fields: Any) -> RunCodeResponse:
    return sandbox.engine.run_code(RunCodeRequest(code=code, language=language, **{**LIMITS, **fields}))


def explain(response: RunCodeResponse) -> str:
    return response.model_dump_json(indent=1)


def assert_compile_shape(language: str, response: RunCodeResponse) -> None:
    if language in COMPILED:
        assert response.compile_result is not None, explain(response)
        assert response.compile_result.status == CommandRunStatus.Finished, explain(response)
        assert response.compile_result.return_code == 0, explain(response)
    else:
        assert response.compile_result is None, explain(response)


@pytest.mark.parametrize("case", [case.param() for case in HELLO])
def test_hello_world(sandbox: MockSandbox, case: Case) -> None:
    response = run(sandbox, case.language, case.code, files=case.files)
    assert response.status == RunStatus.Success, explain(response)
    assert response.message == ""
    assert_compile_shape(case.language, response)
    result = response.run_result
    assert result is not None, explain(response)
    assert result.status == CommandRunStatus.Finished
    assert result.return_code == 0
    if case.stdout is not None:
        assert result.stdout is not None
        if case.exact:
            assert result.stdout == case.stdout, explain(response)
        else:
            assert case.stdout in result.stdout, explain(response)


@pytest.mark.parametrize("case", [case.param() for case in FAILING])
def test_failing_program_reports_its_return_code(sandbox: MockSandbox, case: Case) -> None:
    response = run(sandbox, case.language, case.code)
    assert response.status == RunStatus.Failed, explain(response)
    assert response.message == ""
    assert_compile_shape(case.language, response)
    result = response.run_result
    assert result is not None, explain(response)
    assert result.status == CommandRunStatus.Finished
    assert result.return_code == FAILING_RC[case.id], explain(response)
    assert case.stdout is not None and result.stdout is not None
    if case.exact:
        assert result.stdout == case.stdout
    else:
        assert case.stdout in result.stdout


@pytest.mark.parametrize("case", [case.param() for case in COMPILE_ERRORS])
def test_compile_error_leaves_run_result_null(sandbox: MockSandbox, case: Case) -> None:
    response = run(sandbox, case.language, case.code)
    assert response.status == RunStatus.Failed, explain(response)
    assert response.message == ""
    compiled = response.compile_result
    assert compiled is not None, explain(response)
    assert compiled.status == CommandRunStatus.Finished
    assert compiled.return_code not in (0, None), explain(response)
    assert case.stdout is not None and case.stdout in (compiled.stderr or ""), explain(response)
    assert response.run_result is None


@pytest.mark.parametrize(
    "case", [case.param() for case in COMPILE_ERRORS if case.language in ("cpp", "java")]
)
def test_cpp_and_java_compile_errors_are_rc_1(sandbox: MockSandbox, case: Case) -> None:
    """Contract §2.4 quotes rc 1 for both."""
    response = run(sandbox, case.language, case.code)
    assert response.compile_result is not None
    assert response.compile_result.return_code == 1, explain(response)


# -- scala's object detection (decided before any command runs: no toolchain needed) -----------


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("class Foo { def x = 1 }\n", id="no-object"),
        # SandboxFusion's regex also matches ` extends B {` first, with an empty name: "not found".
        pytest.param(
            'class A extends B {}\nobject Hello { def main(args: Array[String]): Unit = println("hi") }\n',
            id="extends-before-object",
        ),
    ],
)
def test_scala_without_object_name_is_sandbox_error(sandbox: MockSandbox, code: str) -> None:
    response = run(sandbox, "scala", code)
    assert response.status == RunStatus.SandboxError
    assert response.message == "Object name not found."
    assert response.compile_result is not None
    assert response.compile_result.status == CommandRunStatus.Error
    assert response.compile_result.return_code == 1
    assert response.compile_result.stderr == "Object name not found."
    assert response.compile_result.stdout is None
    assert response.run_result is None


# -- verilog never restores `files` -----------------------------------------------------------


@pytest.mark.parametrize("case", [Case("verilog", "", None, ("iverilog", "vvp")).param()])
def test_verilog_does_not_restore_files(sandbox: MockSandbox, case: Case) -> None:
    code = (
        "module tb;\n  integer f;\n  initial begin\n"
        '    f = $fopen("in.txt", "r");\n    $display("%0d", f);\n    $finish;\n  end\nendmodule\n'
    )
    response = run(sandbox, "verilog", code, files={"in.txt": b64("data")})
    assert response.status == RunStatus.Success, explain(response)
    assert response.run_result is not None
    assert response.run_result.stdout == "0\n"  # $fopen of a missing file gives 0


# -- a toolchain that is absent: the shell's answer, not a SandboxError -----------------------

ABSENT = [("julia", "julia"), ("kotlin_script", "kotlin"), ("lean", "lake"), ("swift", "swiftc")]


@pytest.mark.parametrize(
    ("language", "binary"),
    [
        pytest.param(
            language,
            binary,
            marks=pytest.mark.skipif(
                installed(binary), reason=f"{binary} is installed here, so it is not missing"
            ),
            id=language,
        )
        for language, binary in ABSENT
    ],
)
def test_missing_toolchain_is_command_not_found(sandbox: MockSandbox, language: str, binary: str) -> None:
    response = run(sandbox, language, 'println("hello")')
    assert response.status == RunStatus.Failed, explain(response)
    assert response.message == ""
    if language in COMPILED:  # swift fails at its compile step, so nothing runs
        result = response.compile_result
        assert response.run_result is None
    else:
        result = response.run_result
        assert response.compile_result is None
    assert result is not None, explain(response)
    assert result.status == CommandRunStatus.Finished
    assert result.return_code == 127
    assert result.stderr is not None
    assert "command not found" in result.stderr
    assert binary in result.stderr


# -- memory_limit_MB (contract §2.4): an address-space limit, not a memory meter ---------------


def test_python_runs_at_256_mb(sandbox: MockSandbox) -> None:
    response = run(sandbox, "python", "print('hello')", memory_limit_MB=256)
    assert response.status == RunStatus.Success, explain(response)
    assert response.run_result is not None
    assert response.run_result.stdout == "hello\n"


def test_python_allocation_over_the_limit_is_memory_error(sandbox: MockSandbox) -> None:
    response = run(sandbox, "python", "x = bytearray(300 * 1024 * 1024)\nprint(len(x))", memory_limit_MB=200)
    assert response.status == RunStatus.Failed, explain(response)
    assert response.run_result is not None
    assert response.run_result.return_code == 1
    assert "MemoryError" in (response.run_result.stderr or "")


@pytest.mark.parametrize("case", [hello("cpp").param()])
def test_cpp_compiles_and_runs_at_256_mb(sandbox: MockSandbox, case: Case) -> None:
    response = run(sandbox, case.language, case.code, memory_limit_MB=256)
    assert response.status == RunStatus.Success, explain(response)
    assert_compile_shape("cpp", response)
    assert response.run_result is not None
    assert response.run_result.stdout == "hello\n"


@pytest.mark.parametrize("limit", [256, 1024])
@pytest.mark.parametrize("case", [hello("nodejs").param()])
def test_nodejs_fails_under_any_memory_limit(sandbox: MockSandbox, case: Case, limit: int) -> None:
    """Node's threads take RLIMIT_STACK-sized stacks, which the same-sized RLIMIT_AS cannot hold:
    SandboxFusion's node aborts (rc -6) at every limit tried."""
    response = run(sandbox, case.language, case.code, memory_limit_MB=limit)
    assert response.status == RunStatus.Failed, explain(response)
    assert response.run_result is not None
    assert response.run_result.status == CommandRunStatus.Finished
    assert response.run_result.return_code not in (0, None)
    assert response.run_result.stdout != "hello\n"


def test_cases_name_real_languages() -> None:
    """Guard against typos: every language used here is one the request model accepts."""
    from mocksandbox.execution.languages import LANGUAGES

    for case in HELLO + FAILING + COMPILE_ERRORS:
        assert case.language in LANGUAGES
    assert set(FAILING_RC) == {case.id for case in FAILING}
