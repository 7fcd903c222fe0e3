"""The language table: one entry per language, as data.

Commands are SandboxFusion's (isolation ``none``), run with ``/bin/bash -c`` in the request's temp
dir, so a missing toolchain answers exactly as there: the shell's ``command not found``, rc 127.
Placeholders in commands are filled with shell-quoted values that the server made itself (temp
paths, the configured interpreter); the one exception, ``{classpath}``, holds names of the
request's ``files``, quoted as one shell word (SandboxFusion pastes them in bare):

``{file}``  absolute path of the code file       ``{dir}``          the temp dir
``{python}`` the interpreter for user Python code ``{cpp_flags}``    optional g++ link flags that work here
``{pytest}`` pytest for that interpreter          ``{object_name}``  the Scala ``object`` to run
``{classpath}`` Java's ``-cp``: ``.``, the runtime's jars, then the request's ``*.jar`` names

Runtime libraries (SandboxFusion's ``runtime/``: Java jars, ``node_modules``, a Go module, Lean's
packages) live in the runtime dir (see :mod:`mocksandbox.runtime`); ``workdir_entries`` says what of
it each run's temp dir gets, the way SandboxFusion's runner puts it there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class WorkdirEntry:
    """One thing of the runtime dir that a run's temp dir gets, as SandboxFusion's runner puts it.

    ``copy``: copied unless the request's ``files`` wrote that name (SandboxFusion copies first and
    then restores ``files`` over it, so the request's file wins either way). ``symlink``: linked
    after ``files`` are restored; a clash fails the run as there. ``dir``: an empty directory.
    Entries whose source the runtime dir lacks are left out: the run then fails as it would on a
    SandboxFusion without that library.
    """

    #: Path under the runtime dir (unused for ``dir``).
    source: str
    #: Path under the temp dir.
    name: str
    how: Literal["copy", "symlink", "dir"] = "copy"


def _entries(how: Literal["copy", "symlink", "dir"], *pairs: str) -> tuple[WorkdirEntry, ...]:
    """Entries whose name in the temp dir is the last part of their source."""
    return tuple(WorkdirEntry(source, source.rpartition("/")[2], how) for source in pairs)


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
    #: The code file's name from the code (JUnit's public class); wins over ``file_name``.
    code_file_name: Callable[[str], str] | None = None
    #: What of the runtime dir each run's temp dir gets (see :class:`WorkdirEntry`).
    workdir_entries: tuple[WorkdirEntry, ...] = ()
    #: Jars of the runtime at the head of ``{classpath}``, after ``.`` (named as SandboxFusion names them).
    classpath: tuple[str, ...] = ()

    @property
    def has_compile_step(self) -> bool:
        return self.compile_command is not None


def ensure_php_open_tag(code: str) -> str:
    """SandboxFusion strips leading whitespace, then prepends ``<?php`` if the code lacks it.

    The strip happens in both cases, so ``"\\n\\n<?php echo 1;"`` prints ``1``, not ``"\\n\\n1"``.
    """
    code = code.lstrip()
    return code if code.startswith("<?php") else "<?php\n" + code


_JAVA_PUBLIC_CLASS = re.compile(r"\bpublic\s+(abstract\s+|final\s+)?class\s+(\w+)")


def java_code_file_name(code: str) -> str:
    """``<public class>.java``, else ``Main.java``: where SandboxFusion's JUnit runner writes the code
    (javac wants a public class in a file of its name)."""
    match = _JAVA_PUBLIC_CLASS.search(code)
    return f"{match.group(2) if match else 'Main'}.java"


def java_classpath(runtime_jars: tuple[str, ...], file_names: Iterable[str]) -> str:
    """SandboxFusion's ``-cp`` value: ``.``, the runtime's jars, then every ``*.jar`` named in the
    request's ``files`` (even one whose content is null: it lists the names, not what it wrote)."""
    return ":".join([".", *runtime_jars, *(name for name in file_names if name.endswith(".jar"))])


_SCALA_OBJECT = re.compile(r"object\s+(\w+)(\s*)|(\s+extends\s+\w+\s*){", re.DOTALL | re.MULTILINE)


def find_scala_object_name(code: str) -> str | None:
    """The first ``object`` name, found the way SandboxFusion finds it (an empty match counts)."""
    matches = _SCALA_OBJECT.findall(code)
    return matches[0][0] if matches else None


_NODE = "node {file}"
#: The jars SandboxFusion's Java runners copy in (its runtime/java), by the names it gives them.
JAVATUPLES_JAR = "javatuples-1.2.jar"
JUNIT_CONSOLE_JAR = "junit-platform-console-standalone-1.8.2.jar"
JUNIT_API_JAR = "junit-jupiter-api-5.11.0-javadoc.jar"
#: Node runs get the runtime's node_modules linked in; jest runs also its package.json (jest's
#: configuration and JSON report) and babel.config.js (TypeScript through babel).
_NODE_MODULES = _entries("symlink", "node/node_modules")
_JEST_FILES = _entries("symlink", "node/node_modules", "node/package.json", "node/babel.config.js")
#: SandboxFusion copies its whole runtime/go module (go.mod, go.sum, main.go) into each Go run.
_GO_FILES = _entries("copy", "go/go.mod", "go/go.sum", "go/main.go")
_LEAN_FILES = (
    WorkdirEntry("lean", ".lake", "dir"),
    WorkdirEntry("lean/.lake/packages", ".lake/packages", "symlink"),
    *_entries("symlink", "lean/lake-manifest.json", "lean/lakefile.lean", "lean/lean-toolchain"),
)
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
        LanguageSpec("nodejs", ".js", run_command=_NODE, workdir_entries=_NODE_MODULES),
        LanguageSpec("typescript", ".ts", run_command="tsx {file}", workdir_entries=_NODE_MODULES),
        LanguageSpec("jest", ".test.ts", run_command="npm run test", workdir_entries=_JEST_FILES),
        LanguageSpec(
            "go",
            ".go",
            compile_command="go build -o out {file}",
            run_command="./out",
            workdir_entries=_GO_FILES,
        ),
        LanguageSpec("go_test", "_test.go", run_command="go test {file}", workdir_entries=_GO_FILES),
        LanguageSpec(
            "java",
            file_name="Main.java",
            compile_command="javac -cp {classpath} Main.java",
            run_command="java -cp {classpath} -ea Main",
            needs=frozenset({"classpath"}),
            workdir_entries=(WorkdirEntry(f"java/{JAVATUPLES_JAR}", JAVATUPLES_JAR),),
            classpath=(JAVATUPLES_JAR,),
        ),
        LanguageSpec(
            "junit",
            file_name="Main.java",
            code_file_name=java_code_file_name,
            compile_command="javac -cp {classpath} *.java",
            run_command=f"java -jar ./{JUNIT_CONSOLE_JAR} --class-path {{classpath}} --scan-class-path",
            needs=frozenset({"classpath"}),
            workdir_entries=_entries("copy", f"java/{JUNIT_API_JAR}", f"java/{JUNIT_CONSOLE_JAR}"),
            classpath=(JUNIT_CONSOLE_JAR, JUNIT_API_JAR),
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
        LanguageSpec("lean", file_name="Main.lean", run_command="lake build", workdir_entries=_LEAN_FILES),
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
