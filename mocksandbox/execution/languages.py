"""The language table: one entry per language, as data.

Commands are SandboxFusion's (isolation ``none``), run with ``/bin/bash -c`` in the request's temp
dir, so a missing toolchain answers exactly as there: the shell's ``command not found``, rc 127.
Placeholders in commands are filled with shell-quoted values that the server made itself (temp
paths, the configured interpreter), never with text from the request:

``{file}``  absolute path of the code file       ``{dir}``          the temp dir
``{python}`` the interpreter for user Python code ``{cpp_flags}``    optional g++ link flags that work here
``{pytest}`` pytest for that interpreter
``{object_name}`` the Scala ``object`` to run
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LanguageSpec:
    """How SandboxFusion runs one language."""

    name: str
    #: Suffix of the random code file name (``tmpXXXXXXXX<suffix>``), unless ``file_name`` is set.
    suffix: str = ""
    #: A fixed code file name (Java's ``Main.java``); ``None`` means a random ``tmp*`` name.
    file_name: str | None = None
    compile_command: str | None = None
    run_command: str = ""
    #: A preparation command whose outcome is not reported (C#'s ``dotnet new console``).
    setup_command: str | None = None
    #: SandboxFusion's verilog runner never restores ``files``; every other runner does.
    restores_files: bool = True
    #: Prepend the interpreter's directory to PATH, as SandboxFusion does for its Python runtime.
    python_env: bool = False
    #: Rewrites the code before it is written (PHP's open tag).
    prepare_code: Callable[[str], str] | None = None
    #: Names of extra placeholders this entry needs (resolved by the engine).
    needs: frozenset[str] = field(default_factory=frozenset)

    @property
    def has_compile_step(self) -> bool:
        return self.compile_command is not None


def ensure_php_open_tag(code: str) -> str:
    """SandboxFusion strips leading whitespace, then prepends ``<?php`` if the code lacks it.

    The strip happens in both cases, so ``"\\n\\n<?php echo 1;"`` prints ``1``, not ``"\\n\\n1"``.
    """
    code = code.lstrip()
    return code if code.startswith("<?php") else "<?php\n" + code


_SCALA_OBJECT = re.compile(r"object\s+(\w+)(\s*)|(\s+extends\s+\w+\s*){", re.DOTALL | re.MULTILINE)


def find_scala_object_name(code: str) -> str | None:
    """The first ``object`` name, found the way SandboxFusion finds it (an empty match counts)."""
    matches = _SCALA_OBJECT.findall(code)
    return matches[0][0] if matches else None


_NODE = "node {file}"
LANGUAGES: Mapping[str, LanguageSpec] = {
    spec.name: spec
    for spec in (
        LanguageSpec("python", ".py", run_command="{python} {file}", python_env=True),
        LanguageSpec("pytest", ".py", run_command="{pytest} {file}", python_env=True),
        LanguageSpec(
            "cpp",
            ".cpp",
            compile_command="g++ -std=c++17 {file} -o test {cpp_flags}",
            run_command="./test",
            needs=frozenset({"cpp_flags"}),
        ),
        LanguageSpec("nodejs", ".js", run_command=_NODE),
        LanguageSpec("typescript", ".ts", run_command="tsx {file}"),
        LanguageSpec("jest", ".test.ts", run_command="npm run test"),
        LanguageSpec("go", ".go", compile_command="go build -o out {file}", run_command="./out"),
        LanguageSpec("go_test", "_test.go", run_command="go test {file}"),
        LanguageSpec(
            "java",
            file_name="Main.java",
            compile_command="javac -cp .:javatuples-1.2.jar Main.java",
            run_command="java -cp .:javatuples-1.2.jar -ea Main",
        ),
        LanguageSpec(
            "junit",
            file_name="Main.java",
            compile_command="javac -cp .:junit-platform-console-standalone-1.8.2.jar *.java",
            run_command=(
                "java -jar ./junit-platform-console-standalone-1.8.2.jar "
                "--class-path .:junit-platform-console-standalone-1.8.2.jar --scan-class-path"
            ),
        ),
        LanguageSpec(
            "csharp",
            file_name="Program.cs",
            setup_command="dotnet new console -o {dir}",
            run_command="dotnet run --project {dir}",
        ),
        LanguageSpec("rust", ".rs", compile_command="rustc {file} -o test", run_command="./test"),
        LanguageSpec("bash", ".sh", run_command="/bin/bash {file}"),
        LanguageSpec("php", ".php", run_command="php -f {file}", prepare_code=ensure_php_open_tag),
        LanguageSpec("lua", ".lua", run_command="lua {file}"),
        LanguageSpec("R", ".R", run_command="Rscript {file}"),
        LanguageSpec("perl", ".pl", run_command="perl {file}"),
        LanguageSpec("ruby", ".rb", run_command="ruby {file}"),
        LanguageSpec("D_ut", ".d", compile_command="dmd {file} -unittest -of=test", run_command="./test"),
        LanguageSpec(
            "scala",
            ".scala",
            compile_command="scalac {file}",
            run_command="scala {object_name}",
            needs=frozenset({"object_name"}),
        ),
        LanguageSpec("julia", ".jl", run_command="julia {file}"),
        LanguageSpec("kotlin_script", ".kts", run_command="kotlin {file}"),
        LanguageSpec(
            "verilog",
            ".sv",
            compile_command="iverilog -Wall -Winfloop -Wno-timescale -g2012 -s tb -o test.vvp {file};",
            run_command="vvp -n test.vvp",
            restores_files=False,
        ),
        LanguageSpec("lean", file_name="Main.lean", run_command="lake build"),
        LanguageSpec(
            "swift", ".swift", compile_command="swiftc {file} -o test.out", run_command="./test.out"
        ),
        LanguageSpec("racket", ".rkt", run_command="racket {file}"),
        # The project for these two comes entirely from `files`.
        LanguageSpec(
            "cuda",
            ".cu",
            compile_command="mkdir -p build && cd build && cmake .. && make",
            run_command="./build/main",
        ),
        LanguageSpec(
            "python_gpu",
            ".py",
            compile_command="{python} compile.py",
            run_command="{python} run.py",
            python_env=True,
        ),
        # `sql` is in the request enum but has no entry: SandboxFusion answers SandboxError.
    )
}

#: Toolchain binary whose presence on PATH means a language can really run here.
TOOLCHAIN_BINARIES: Mapping[str, str] = {
    "python": "python3",
    "pytest": "python3",
    "cpp": "g++",
    "nodejs": "node",
    "typescript": "tsx",
    "jest": "npm",
    "go": "go",
    "go_test": "go",
    "java": "javac",
    "junit": "javac",
    "csharp": "dotnet",
    "rust": "rustc",
    "bash": "bash",
    "php": "php",
    "lua": "lua",
    "R": "Rscript",
    "perl": "perl",
    "ruby": "ruby",
    "D_ut": "dmd",
    "scala": "scalac",
    "julia": "julia",
    "kotlin_script": "kotlin",
    "verilog": "iverilog",
    "lean": "lake",
    "swift": "swiftc",
    "racket": "racket",
    "cuda": "nvcc",
    "python_gpu": "nvidia-smi",
}
