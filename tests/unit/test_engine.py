"""The engine without HTTP: step sequencing through a fake runner, and the real file layout."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mocksandbox.execution.engine import ExecutionEngine, create_engine
from mocksandbox.execution.languages import TOOLCHAIN_BINARIES
from mocksandbox.execution.process import CommandSpec
from mocksandbox.models import CommandRunResult, CommandRunStatus, RunCodeRequest, RunStatus
from mocksandbox.settings import Settings

Finished, Error, TLE = CommandRunStatus.Finished, CommandRunStatus.Error, CommandRunStatus.TimeLimitExceeded


def finished(return_code: int = 0, stdout: str = "", stderr: str = "") -> CommandRunResult:
    return CommandRunResult(
        status=Finished, execution_time=0.01, return_code=return_code, stdout=stdout, stderr=stderr
    )


@dataclass
class Call:
    """One command the fake runner was asked to run, with what it saw on disk at that moment."""

    spec: CommandSpec
    cwd_listing: list[str]
    code_text: str | None


@dataclass
class FakeRunner:
    """Answers each command with ``respond(spec)``; records every call. Satisfies CommandRunner."""

    respond: Callable[[CommandSpec], CommandRunResult] = lambda spec: finished()
    calls: list[Call] = field(default_factory=list)

    def run(self, spec: CommandSpec) -> CommandRunResult:
        listing = sorted(os.listdir(spec.cwd)) if os.path.isdir(spec.cwd) else []
        code_files = [n for n in listing if n.startswith("tmp") or n in ("Main.java", "Program.cs")]
        code_text = Path(spec.cwd, code_files[0]).read_text() if len(code_files) == 1 else None
        self.calls.append(Call(spec, listing, code_text))
        return self.respond(spec)

    @property
    def commands(self) -> list[str]:
        return [call.spec.command for call in self.calls]


@pytest.fixture
def tmp_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    return root


@pytest.fixture
def settings(tmp_root: Path) -> Settings:
    return Settings(tmp_root=str(tmp_root), pod_name=None, python="/opt/py/bin/python3")


def engine_with(settings: Settings, runner: FakeRunner) -> ExecutionEngine:
    return ExecutionEngine(settings, runner)


def assert_nothing_left(engine: ExecutionEngine, tmp_root: Path) -> None:
    """The runs' files are gone: what is left under ``tmp_root`` is empty temp dirs kept for the
    next runs, and they go when the engine closes."""
    left = list(tmp_root.iterdir())
    assert all(d.is_dir() and not any(d.iterdir()) for d in left), left
    engine.close()
    assert list(tmp_root.iterdir()) == []


def request(**fields: object) -> RunCodeRequest:
    return RunCodeRequest.model_validate(fields)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- interpreted languages -----------------------------------------------------------------------


def test_python_runs_once_in_a_fresh_temp_dir(settings: Settings, tmp_root: Path) -> None:
    runner = FakeRunner(lambda spec: finished(0, "1\n"))
    engine = engine_with(settings, runner)
    response = engine.run_code(
        request(code="print(1)", language="python", stdin="in", run_timeout=3, memory_limit_MB=64)
    )
    assert response.status == RunStatus.Success and response.message == ""
    assert response.compile_result is None
    assert response.run_result == finished(0, "1\n")
    [call] = runner.calls
    spec = call.spec
    assert Path(spec.cwd).parent == tmp_root
    assert re.fullmatch(r"tmp[a-z0-9_]{8}", Path(spec.cwd).name)
    [code_file] = call.cwd_listing
    assert re.fullmatch(r"tmp[a-z0-9_]{8}\.py", code_file)
    assert spec.command == f"/opt/py/bin/python3 {Path(spec.cwd, code_file)}"
    assert call.code_text == "print(1)"
    assert (spec.stdin, spec.timeout, spec.memory_limit_mb) == (b"in", 3, 64)
    assert spec.env["PATH"].startswith("/opt/py/bin:")
    assert_nothing_left(engine, tmp_root)


def test_null_stdin_is_passed_as_none(settings: Settings) -> None:
    runner = FakeRunner()
    engine_with(settings, runner).run_code(request(code="", language="bash"))
    engine_with(settings, runner).run_code(request(code="", language="bash", stdin=""))
    assert [c.spec.stdin for c in runner.calls] == [None, b""]


def test_non_python_languages_get_the_plain_environment(settings: Settings) -> None:
    runner = FakeRunner()
    engine_with(settings, runner).run_code(request(code="echo", language="bash"))
    assert not runner.calls[0].spec.env.get("PATH", "").startswith("/opt/py/bin:")
    assert runner.commands[0].startswith("/bin/bash ") and runner.commands[0].endswith(".sh")


def test_server_test_variables_are_hidden_from_programs(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_ADDOPTS", "-x")
    monkeypatch.setenv("MOCKSANDBOX_PORT", "1")
    monkeypatch.setenv("KEEP_ME", "yes")
    runner = FakeRunner()
    engine_with(settings, runner).run_code(request(code="", language="python"))
    env = runner.calls[0].spec.env
    assert env["KEEP_ME"] == "yes"
    assert "PYTEST_ADDOPTS" not in env and "MOCKSANDBOX_PORT" not in env


def test_timeouts_are_capped_by_settings_but_passed_through_below(settings: Settings) -> None:
    runner = FakeRunner()
    engine = engine_with(settings.replace(max_timeout_s=5), runner)
    for timeout in (100, 2.5, 0, -1):
        engine.run_code(request(code="", language="python", run_timeout=timeout))
    assert [c.spec.timeout for c in runner.calls] == [5, 2.5, 0, -1]


def test_php_code_gets_its_open_tag(settings: Settings) -> None:
    runner = FakeRunner()
    engine_with(settings, runner).run_code(request(code="echo 1;", language="php"))
    assert runner.calls[0].code_text == "<?php\necho 1;"
    assert runner.commands[0].startswith("php -f ")


# -- compile, then run ---------------------------------------------------------------------------


def test_compile_then_run_in_the_same_dir(settings: Settings) -> None:
    runner = FakeRunner(lambda spec: finished(0, "compiled" if spec.command.startswith("javac") else "ran"))
    response = engine_with(settings, runner).run_code(
        request(code="class Main {}", language="java", stdin="x", compile_timeout=7, run_timeout=3)
    )
    assert runner.commands == [
        "javac -cp .:javatuples-1.2.jar Main.java",
        "java -cp .:javatuples-1.2.jar -ea Main",
    ]
    compile_call, run_call = runner.calls
    assert compile_call.spec.cwd == run_call.spec.cwd
    # (Beside it, SandboxFusion's Java libraries where this host has them: mocksandbox.runtime.)
    assert [n for n in compile_call.cwd_listing if not n.endswith(".jar")] == ["Main.java"]
    assert compile_call.code_text == "class Main {}"
    assert (compile_call.spec.stdin, compile_call.spec.timeout) == (None, 7), "stdin goes to the run only"
    assert (run_call.spec.stdin, run_call.spec.timeout) == (b"x", 3)
    # The compiler's temp files go into the run's dir (a killed compile leaves none in /tmp); the
    # program's TMPDIR stays what SandboxFusion's is.
    assert compile_call.spec.env["TMPDIR"] == compile_call.spec.cwd
    assert run_call.spec.env.get("TMPDIR") != run_call.spec.cwd
    assert response.compile_result is not None and response.compile_result.stdout == "compiled"
    assert response.run_result is not None and response.run_result.stdout == "ran"
    assert response.status == RunStatus.Success


def test_memory_limit_applies_to_compile_and_run(settings: Settings) -> None:
    runner = FakeRunner()
    engine_with(settings, runner).run_code(request(code="", language="rust", memory_limit_MB=256))
    assert [c.spec.memory_limit_mb for c in runner.calls] == [256, 256]


@pytest.mark.parametrize(
    ("compile_result", "status", "message"),
    [
        (finished(1, stderr="error: x"), RunStatus.Failed, ""),
        (CommandRunResult(status=TLE, execution_time=0.05), RunStatus.Failed, ""),
        (CommandRunResult(status=Error, stderr="exception on running command rustc"), RunStatus.SandboxError,
         "exception on running command rustc"),
        (finished(-9), RunStatus.Failed, ""),
    ],
    ids=["compile-error", "compile-timeout", "compile-sandbox-error", "compiler-killed"],
)  # fmt: skip
def test_run_is_skipped_after_a_failed_compile(
    settings: Settings, compile_result: CommandRunResult, status: RunStatus, message: str
) -> None:
    runner = FakeRunner(lambda spec: compile_result)
    response = engine_with(settings, runner).run_code(request(code="fn main(){}", language="rust"))
    assert len(runner.calls) == 1 and runner.commands[0].startswith("rustc ")
    assert response.compile_result == compile_result
    assert response.run_result is None
    assert (response.status, response.message) == (status, message)


def test_run_error_is_a_sandbox_error(settings: Settings) -> None:
    error = CommandRunResult(status=Error, stderr="exception on running command ./test: boom | None")
    runner = FakeRunner(lambda spec: error if spec.command == "./test" else finished())
    response = engine_with(settings, runner).run_code(request(code="fn main(){}", language="rust"))
    assert (response.status, response.message) == (RunStatus.SandboxError, error.stderr)
    assert response.compile_result == finished() and response.run_result == error


def test_cpp_link_flags_are_probed_once(settings: Settings) -> None:
    runner = FakeRunner(lambda spec: finished(1 if spec.command.endswith(("-lcrypto", "-lssl")) else 0))
    engine = engine_with(settings, runner)
    engine.run_code(request(code="int main(){}", language="cpp"))
    engine.run_code(request(code="int main(){}", language="cpp"))
    probes = [c for c in runner.commands if "/probe.cpp " in c]
    assert [p.rsplit(" ", 1)[1] for p in probes] == ["-lcrypto", "-lssl", "-lpthread"]
    compiles = [c for c in runner.commands if c.startswith("g++ -std=c++17")]
    assert len(compiles) == 2
    assert all(
        re.fullmatch(r"g\+\+ -std=c\+\+17 \S+/tmp[a-z0-9_]{8}\.cpp -o test -lpthread", c) for c in compiles
    )
    assert runner.commands.count("./test") == 2


def test_scala_object_name_is_the_run_target(settings: Settings) -> None:
    runner = FakeRunner()
    engine_with(settings, runner).run_code(request(code="object Hello extends App {}", language="scala"))
    assert runner.commands[0].startswith("scalac ") and runner.commands[0].endswith(".scala")
    assert runner.commands[1] == "scala Hello"


def test_scala_without_object_runs_nothing(settings: Settings, tmp_root: Path) -> None:
    runner = FakeRunner()
    response = engine_with(settings, runner).run_code(request(code="println(1)", language="scala"))
    assert runner.calls == []
    assert response.status == RunStatus.SandboxError
    assert response.message == "Object name not found."
    assert response.compile_result == CommandRunResult(
        status=Error, return_code=1, stderr="Object name not found."
    )
    assert response.run_result is None
    assert list(tmp_root.iterdir()) == []


def test_csharp_setup_step_is_not_reported(settings: Settings) -> None:
    def respond(spec: CommandSpec) -> CommandRunResult:
        if spec.command.startswith("dotnet new"):
            return finished(1, stderr="setup failed")
        return finished(0, "hi\n")

    runner = FakeRunner(respond)
    response = engine_with(settings, runner).run_code(request(code="class P {}", language="csharp"))
    workdir = runner.calls[0].spec.cwd
    assert runner.commands == [f"dotnet new console -o {workdir}", f"dotnet run --project {workdir}"]
    assert response.compile_result is None
    assert response.run_result == finished(0, "hi\n")
    assert response.status == RunStatus.Success


def test_csharp_project_is_created_before_the_code_is_written(settings: Settings) -> None:
    runner = FakeRunner()
    engine_with(settings, runner).run_code(request(code="class P {}", language="csharp"))
    assert "Program.cs" not in runner.calls[0].cwd_listing


# -- files in and out, errors ----------------------------------------------------------------------


def test_files_are_restored_before_compiling_and_fetched_after_running(settings: Settings) -> None:
    def respond(spec: CommandSpec) -> CommandRunResult:
        if spec.command == "./test":
            Path(spec.cwd, "out.txt").write_bytes(b"result")
        return finished()

    runner = FakeRunner(respond)
    response = engine_with(settings, runner).run_code(
        request(
            code="fn main(){}",
            language="rust",
            files={"data/in.txt": b64(b"in"), "skip.txt": None},
            fetch_files=["out.txt", "data/in.txt", "data", "missing"],
        )
    )
    assert runner.calls[0].cwd_listing[0] == "data"
    assert "skip.txt" not in runner.calls[0].cwd_listing
    assert response.files == {"out.txt": b64(b"result"), "data/in.txt": b64(b"in")}


def test_verilog_does_not_restore_files(settings: Settings) -> None:
    runner = FakeRunner()
    engine_with(settings, runner).run_code(
        request(code="module tb; endmodule", language="verilog", files={"x.v": b64(b"x")})
    )
    assert "x.v" not in runner.calls[0].cwd_listing


def test_bad_base64_is_a_sandbox_error_before_any_command(settings: Settings, tmp_root: Path) -> None:
    runner = FakeRunner()
    response = engine_with(settings, runner).run_code(
        request(code="print(1)", language="python", files={"a": "aGVsbG8gd"})
    )
    assert runner.calls == []
    assert response.status == RunStatus.SandboxError
    assert response.message == (
        "exception on running code print(1): Invalid base64-encoded string: number of data characters (9) "
        "cannot be 1 more than a multiple of 4 None"
    )
    assert (response.compile_result, response.run_result, response.files) == (None, None, {})
    # Nothing written: at most the empty dir, kept for the next run.
    assert all(d.is_dir() and not any(d.iterdir()) for d in tmp_root.iterdir())


def test_sql_has_no_runner(settings: Settings) -> None:
    runner = FakeRunner()
    response = engine_with(settings, runner).run_code(request(code="select 1;", language="sql"))
    assert runner.calls == []
    assert (response.status, response.message) == (
        RunStatus.SandboxError,
        "exception on running code select 1;: 'sql' None",
    )


def test_runner_exception_becomes_a_sandbox_error(settings: Settings, tmp_root: Path) -> None:
    def explode(spec: CommandSpec) -> CommandRunResult:
        raise RuntimeError("runner broke")

    engine = engine_with(settings, FakeRunner(explode))
    response = engine.run_code(request(code="x", language="python"))
    assert response.status == RunStatus.SandboxError
    assert response.message == "exception on running code x: runner broke None"
    assert (response.compile_result, response.run_result) == (None, None)
    assert_nothing_left(engine, tmp_root)  # on errors too


def test_lone_surrogates_are_dropped_from_stdin(settings: Settings) -> None:
    """Contract §0.1: SandboxFusion runs the program; the surrogate never reaches its stdin."""
    runner = FakeRunner()
    response = engine_with(settings, runner).run_code(request(code="x", language="bash", stdin="a\ud800b"))
    assert response.status == RunStatus.Success
    assert [call.spec.stdin for call in runner.calls] == [b"ab"]


@pytest.mark.parametrize(
    ("language", "field", "result_key"),
    [("python", "run_timeout", "run_result"), ("cpp", "compile_timeout", "compile_result")],
)
def test_nan_timeout_is_an_error_result_without_running(
    settings: Settings, language: str, field: str, result_key: str
) -> None:
    """Contract §0.1: SandboxFusion fails converting a NaN timeout before it starts the command."""
    runner = FakeRunner()
    response = engine_with(settings, runner).run_code(
        request(code="x", language=language, **{field: float("nan")})
    )
    result = getattr(response, result_key)
    assert result is not None and result.status == Error
    assert (result.execution_time, result.return_code, result.stdout) == (None, None, None)
    assert result.stderr is not None
    assert result.stderr.startswith("exception on running command ")
    assert result.stderr.endswith(": cannot convert float NaN to integer | None")
    assert response.status == RunStatus.SandboxError and response.message == result.stderr
    assert runner.calls == [] or language == "cpp"  # C++ probes its link flags once; nothing else runs
    assert not any(call.spec.command.startswith("g++ -std") for call in runner.calls)
    if language == "cpp":
        assert response.run_result is None
    else:
        assert re.fullmatch(r"exception on running command \S+ \S+/tmp\w+\.py: .*", result.stderr)


def test_nan_compile_timeout_of_an_interpreted_language_is_ignored(settings: Settings) -> None:
    runner = FakeRunner()
    response = engine_with(settings, runner).run_code(
        request(code="x", language="python", compile_timeout=float("nan"))
    )
    assert response.status == RunStatus.Success and len(runner.calls) == 1


def test_pod_name_comes_from_settings(settings: Settings) -> None:
    response = engine_with(settings.replace(pod_name="pod-7"), FakeRunner()).run_code(
        request(code="", language="bash")
    )
    assert response.executor_pod_name == "pod-7"


# -- the real runner: SandboxFusion's on-disk layout ---------------------------------------------


@pytest.fixture(params=["fork", "spawn"])
def real_engine(tmp_root: Path, request: pytest.FixtureRequest) -> Iterator[ExecutionEngine]:
    engine, confinement, launcher = create_engine(
        Settings(tmp_root=str(tmp_root), pod_name=None, exec_mode=request.param)
    )
    yield engine
    launcher.close()
    confinement.close()


def test_real_layout_cwd_listing_argv(real_engine: ExecutionEngine, tmp_root: Path) -> None:
    code = "import json, os, sys\nprint(json.dumps([os.getcwd(), sorted(os.listdir('.')), sys.argv]))"
    response = real_engine.run_code(request(code=code, language="python", files={"in.txt": b64(b"x")}))
    assert response.status == RunStatus.Success, response
    assert response.run_result is not None and response.run_result.stdout is not None
    cwd, listing, argv = json.loads(response.run_result.stdout)
    assert Path(cwd).parent == tmp_root and re.fullmatch(r"tmp[a-z0-9_]{8}", Path(cwd).name)
    assert len(argv) == 1 and Path(argv[0]).parent == Path(cwd)
    code_file = Path(argv[0]).name
    assert re.fullmatch(r"tmp[a-z0-9_]{8}\.py", code_file)
    assert listing == sorted(["in.txt", code_file])
    assert not Path(cwd).exists(), "the temp dir is removed after the run"


def test_real_bash_layout(real_engine: ExecutionEngine) -> None:
    """`/bin/bash <file>.sh` in the temp dir: $0 is the code file's absolute path, no arguments."""
    response = real_engine.run_code(request(code='echo "$0" "$#"; pwd; ls', language="bash"))
    assert response.run_result is not None and response.run_result.stdout is not None
    script_and_argc, cwd, listing = response.run_result.stdout.splitlines()
    script, argc = script_and_argc.rsplit(" ", 1)
    assert argc == "0"
    assert Path(script).parent == Path(cwd)
    assert Path(script).name == listing
    assert re.fullmatch(r"tmp[a-z0-9_]{8}\.sh", listing)


RECURSION_PROGRAM = """import sys, threading
depth = 0
def down():
    global depth
    depth += 1
    down()
def deepest():
    global depth
    depth = 0
    try:
        down()
    except RecursionError:
        return depth
print(deepest(), sys.getrecursionlimit())
found = []
thread = threading.Thread(target=lambda: found.append(deepest()))
thread.start(); thread.join()
sys.setrecursionlimit(60)
print(found[0], deepest())
def f(n):
    return f(n + 1)
f(0)
"""


def test_a_program_recurses_as_deep_as_in_a_fresh_python(real_engine: ExecutionEngine, tmp_path: Path) -> None:
    """The warm path's program runs below the launcher's frames; it still reaches the depth, and
    prints the RecursionError traceback, of ``python <file>`` on the same interpreter (SandboxFusion
    469de08 with CPython 3.10: ``[Previous line repeated 996 more times]``; the fork path said 988)."""
    response = real_engine.run_code(request(code=RECURSION_PROGRAM, language="python"))
    assert response.run_result is not None
    script = tmp_path / "recursion.py"
    script.write_text(RECURSION_PROGRAM)
    fresh = subprocess.run(
        [real_engine.settings.python, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert fresh.stdout.splitlines()[0].split()[1] == "1000"  # the default limit: the numbers below are its
    assert response.run_result.stdout == fresh.stdout
    repeated = re.compile(r"\[Previous line repeated \d+ more times\]")
    assert repeated.findall(response.run_result.stderr or "") == repeated.findall(fresh.stderr)
    assert response.run_result.return_code == fresh.returncode == 1


class _UnusableConfinement:
    name = "unusable"

    def new_jail(self, leader_hint: str) -> object:
        raise AssertionError("a run with no time left must not start a process")


@pytest.mark.parametrize("timeout", [0, -1, float("nan")])
def test_runner_with_no_time_left_never_starts_the_program(tmp_path: Path, timeout: float) -> None:
    from mocksandbox.execution.process import ProcessRunner

    runner = ProcessRunner(_UnusableConfinement(), None, 1024)  # type: ignore[arg-type]
    result = runner.run(CommandSpec(f"touch {tmp_path}/ran", str(tmp_path), {}, None, timeout))
    assert (result.status, result.return_code, result.stdout, result.stderr) == (TLE, None, "", "")
    assert isinstance(result.execution_time, float)
    assert not (tmp_path / "ran").exists()


def test_a_language_without_its_toolchain_here_is_a_divergence(settings: Settings) -> None:
    """The program could not run for want of a toolchain SandboxFusion's image has: said beside
    the answer, which stays the mock's (the shell's "command not found"); a program that itself
    exits 127 is no divergence."""
    from mocksandbox import divergence

    not_found = finished(127, stderr="/bin/bash: line 1: nosuchcompiler: command not found\n")
    engine = engine_with(
        settings.model_copy(update={"runtime_dir": "/nonexistent"}), FakeRunner(lambda spec: not_found)
    )
    paths = {name: env.get("PATH") for name, env in engine._language_env.items()}
    lacked = next(
        (
            name
            for name, binary in TOOLCHAIN_BINARIES.items()
            if shutil.which(binary, path=paths.get(name)) is None
        ),
        None,
    )
    if lacked is None:
        pytest.skip("every language's toolchain is here")
    with divergence.collecting() as notes:
        answer = engine.run_code(RunCodeRequest(code="x", language=lacked))
    assert answer.status == RunStatus.Failed
    assert len(notes) == 1 and notes[0].startswith(f"toolchain: {lacked} has no ")
    own = engine_with(settings, FakeRunner(lambda spec: finished(127, stderr="exit 127\n")))
    with divergence.collecting() as notes:
        own.run_code(RunCodeRequest(code="import sys; sys.exit(127)", language="python"))
    assert notes == []
