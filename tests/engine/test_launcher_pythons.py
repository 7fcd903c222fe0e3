"""The launcher on every CPython a user may name (``--python``), from 3.8 to 3.13: its modules are
written for 3.8 (ruff checks them against 3.8's syntax), and here each version runs programs,
warm Python ones and exec'ed ones, through it (and imports the kernels' zygote); and a mock on the
oldest gives its runs a world of their own (``lite``)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from test_launcher import _request, _whole_run

import mocksandbox.jupyter as jupyter_package
from mocksandbox.core import MockSandbox
from mocksandbox.execution.engine import program_environment
from mocksandbox.execution.launcher import Launcher
from mocksandbox.execution.world import lite_unavailable_reason
from mocksandbox.models import RunCodeRequest
from mocksandbox.runtime.interpreters import find_python
from mocksandbox.settings import Settings

_PROGRAM = """\
import sys
def fold(numbers):
    return sum(n * n for n in numbers)
print(sys.version_info[:2], fold(int(x) for x in sys.argv[1:] or [1, 2, 3]))
raise SystemExit(3)
"""


def find_cpython(minor: str, require_or_skip: Callable[[str | None], None]) -> str:
    """The path of a CPython ``minor`` of this host, or the test skipped (failed in CI) without."""
    found = find_python(minor).found
    require_or_skip(None if found is not None else f"needs a CPython {minor} (pyenv install {minor})")
    assert found is not None
    return found.path


@pytest.mark.parametrize("minor", ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"])
def test_the_launcher_runs_programs_on_each_cpython(
    minor: str, require_or_skip: Callable[[str | None], None], tmp_path: Path
) -> None:
    python = find_cpython(minor, require_or_skip)
    launcher = Launcher(python, program_environment(os.environ))
    launcher.start()
    try:
        script = tmp_path / "program.py"
        script.write_text(_PROGRAM)
        for source in (_PROGRAM, None):  # (compiled by its relay, or by the program)
            status, stdout, stderr = _whole_run(
                launcher, _request(tmp_path, "", mode="python", argv=None, file=str(script), source=source)
            )
            assert stdout.decode() == f"({minor.replace('.', ', ')}) 14\n", stderr
            assert int.from_bytes(status[10:18], "little", signed=True) == 3 << 8, status
        status, stdout, stderr = _whole_run(launcher, _request(tmp_path, "echo exec; exit 4"))
        # (The kernels' zygote, which /run_jupyter starts on the same interpreter, too.)
        zygote_dir = str(Path(jupyter_package.__file__).parent)
        code = f"import sys; sys.path.insert(0, {zygote_dir!r}); import _zygote"
        imported = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        assert imported.returncode == 0, imported.stderr
        assert (stdout, int.from_bytes(status[10:18], "little", signed=True)) == (b"exec\n", 4 << 8), stderr
    finally:
        launcher.close()


def test_a_mock_on_the_oldest_cpython_gives_its_runs_a_world(
    require_or_skip: Callable[[str | None], None], tmp_path: Path
) -> None:
    """On CPython 3.8, ``isolation: lite`` passes its start-up run and every protection it asks
    for holds; a run is in a PID namespace of its own (its parent, the relay, is PID 1 there), and its traceback is the program's."""
    if (reason := lite_unavailable_reason()) is not None:
        pytest.skip(reason)
    python = find_cpython("3.8", require_or_skip)
    settings = Settings(python=python, isolation="lite", pod_name=None, tmp_root=str(tmp_path))
    sandbox = MockSandbox.create(settings)
    try:
        assert (sandbox.engine.isolation.mode, sandbox.engine.isolation.missing()) == ("lite", [])
        code = "import os, sys\nprint(sys.version_info[:2], os.getppid() == 1)\n1/0"
        answer = sandbox.engine.run_code(RunCodeRequest(code=code, language="python"))
    finally:
        sandbox.close()
    result = answer.run_result
    assert result is not None and (result.status, result.return_code) == ("Finished", 1), answer
    assert result.stdout == "(3, 8) True\n", answer
    assert result.stderr.rstrip().endswith("ZeroDivisionError: division by zero"), answer
