"""POST /run_code with Python and bash (contract §2): statuses, timeouts, stdin, files, output."""

from __future__ import annotations

import pytest
from contract_support import Target, b64


def test_success(target: Target) -> None:
    body = target.run_code("print(1)")
    assert body["status"] == "Success"
    assert body["compile_result"] is None
    run = body["run_result"]
    assert (run["status"], run["return_code"], run["stdout"], run["stderr"]) == ("Finished", 0, "1\n", "")
    assert isinstance(run["execution_time"], float) and run["execution_time"] >= 0
    assert body["files"] == {}


def test_nonzero_exit_keeps_output(target: Target) -> None:
    body = target.run_code("print('before exit')\nimport sys\nsys.exit(3)")
    assert body["status"] == "Failed" and body["message"] == ""
    assert (body["run_result"]["return_code"], body["run_result"]["stdout"]) == (3, "before exit\n")


def test_uncaught_exception(target: Target) -> None:
    run = target.run_code('raise ValueError("boom")')["run_result"]
    assert run["return_code"] == 1
    assert run["stderr"].startswith("Traceback (most recent call last):")
    assert run["stderr"].rstrip().endswith("ValueError: boom")


def test_syntax_error_is_a_run_failure(target: Target) -> None:
    body = target.run_code("def f(:\n  pass")
    assert body["status"] == "Failed" and body["compile_result"] is None
    assert body["run_result"]["return_code"] == 1, body["run_result"]
    assert "SyntaxError" in body["run_result"]["stderr"]


def test_stderr_alone_is_still_success(target: Target) -> None:
    body = target.run_code("import sys\nsys.stderr.write('warn\\n')")
    assert body["status"] == "Success"
    assert body["run_result"]["stderr"] == "warn\n"


def test_killed_by_signal_is_negative(target: Target) -> None:
    body = target.run_code("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert body["status"] == "Failed"
    assert body["run_result"]["return_code"] == -9


def test_bash(target: Target) -> None:
    body = target.run_code("echo hi >&2\necho out\nexit 7", language="bash")
    run = body["run_result"]
    assert (body["status"], run["return_code"], run["stdout"], run["stderr"]) == (
        "Failed",
        7,
        "out\n",
        "hi\n",
    )


def test_timeout_keeps_flushed_output(target: Target) -> None:
    # 3 s, not 1: Python must start and print 'started' before the timeout, on a loaded machine too.
    body = target.run_code("import time\nprint('started', flush=True)\ntime.sleep(30)", run_timeout=3)
    run = body["run_result"]
    assert body["status"] == "Failed"
    assert (run["status"], run["return_code"], run["stdout"]) == ("TimeLimitExceeded", None, "started\n")
    assert run["execution_time"] >= 2.9


@pytest.mark.parametrize("timeout", [0, -1])
def test_zero_or_negative_timeout_is_immediate(target: Target, timeout: float) -> None:
    run = target.run_code("print(1)", run_timeout=timeout)["run_result"]
    assert (run["status"], run["return_code"]) == ("TimeLimitExceeded", None)


def test_stdin(target: Target) -> None:
    body = target.run_code("a = input()\nb = input()\nprint(a.upper(), b)", stdin="hello\nworld\n")
    assert body["run_result"]["stdout"] == "HELLO world\n"


def test_no_stdin_reads_eof(target: Target) -> None:
    body = target.run_code("input()")
    assert body["status"] == "Failed"
    assert "EOFError" in body["run_result"]["stderr"]


def test_empty_stdin(target: Target) -> None:
    assert (
        target.run_code("import sys\nprint(repr(sys.stdin.read()))", stdin="")["run_result"]["stdout"]
        == "''\n"
    )


def test_files_and_fetch_files(target: Target) -> None:
    code = "print(open('data/in.txt').read())\nopen('out.txt', 'w').write('written by code')\nimport os\nos.makedirs('d', exist_ok=True)\nopen('d/f', 'w').write('x')"
    body = target.run_code(
        code,
        files={"data/in.txt": b64(b"uploaded content"), "skip.txt": None},
        fetch_files=["out.txt", "missing.txt", "data/in.txt", "d", "d/f", "./d/f"],
    )
    assert body["run_result"]["stdout"] == "uploaded content\n"
    assert body["files"] == {
        "out.txt": b64(b"written by code"),
        "data/in.txt": b64(b"uploaded content"),
        "d/f": b64(b"x"),
        "./d/f": b64(b"x"),
    }


def test_null_files_are_skipped(target: Target) -> None:
    body = target.run_code("import os\nprint(os.path.exists('skip.txt'))", files={"skip.txt": None})
    assert body["run_result"]["stdout"] == "False\n"


def test_bad_base64_is_a_sandbox_error(target: Target) -> None:
    body = target.run_code("print(1)", files={"a.txt": "abcdefghi"})
    assert body["status"] == "SandboxError"
    assert (body["compile_result"], body["run_result"]) == (None, None)
    assert body["message"]


def test_sql_has_no_runner(target: Target) -> None:
    body = target.run_code("select 1;", language="sql")
    assert body["status"] == "SandboxError"
    assert (body["compile_result"], body["run_result"]) == (None, None)


def test_non_utf8_output_is_replaced_by_a_decode_error(target: Target) -> None:
    body = target.run_code("import sys\nsys.stdout.buffer.write(b'\\xff')")
    assert body["run_result"]["stdout"].startswith("[DecodeError]")


def test_unicode_round_trip(target: Target) -> None:
    text = "héllo wörld ✓ 日本 🙂"
    assert target.run_code(f"print({text!r})")["run_result"]["stdout"] == text + "\n"


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("size", [65_536, 200_000])
def test_output_below_200_kb_is_complete(target: Target, size: int, stream: str) -> None:
    # One stream at a time: SandboxFusion measured each up to ~210 KB complete, not both at once.
    body = target.run_code(f"import sys\nsys.{stream}.write('x' * {size})")
    assert body["run_result"][stream] == "x" * size


def test_cwd_is_a_fresh_temp_dir_holding_the_code(target: Target) -> None:
    code = "import os, sys\nprint(os.getcwd())\nprint(os.listdir('.'))\nprint(sys.argv[0])"
    first = target.run_code(code)["run_result"]["stdout"].splitlines()
    second = target.run_code(code)["run_result"]["stdout"].splitlines()
    assert first[0] != second[0]
    assert first[2].startswith(first[0] + "/") and first[2].endswith(".py")
    assert first[1] == repr([first[2].rsplit("/", 1)[1]])
