"""User Python answers as SandboxFusion's, whose ``sandbox-runtime`` is CPython 3.10: replayed
against its recording.

``fixtures/cassettes/sandboxfusion-runtime310-469de08.jsonl`` holds SandboxFusion 469de08's answers
(through ``mocksandbox record``; its server on CPython 3.11 under uvicorn on uvloop, its local
config, user code on a CPython 3.10.13 ``sandbox-runtime`` with its ``requirements.txt`` less torch
and tensorflow) to programs that tell 3.10 from 3.11 and later: tracebacks (3.11 marks the failing
expression with ``~~^~~``), ``tomllib``, ``except*``, ``typing.Self``, ``math.cbrt``,
``enum.StrEnum``, ``datetime.UTC``, ``asyncio.TaskGroup``, ``sys.version_info``, SyntaxError
messages, and programs both answer alike (``fixtures/cassettes/send_runtime_cases.py``). The mock,
its user Python on a CPython 3.10 (the runtime ``make serve``'s step installs, else a venv of one
this machine has, with SandboxFusion's pins of the three packages the cases import), must
answer each with the same status, return code, stdout and stderr; the temp paths (the run's
directory and file names) are the only difference.

The one ``pytest`` run's report also names what its runtime has (pytest's ``plugins:`` line, the
PyQt5 line pytest-qt adds, the plugins' warnings on stderr) and how long it took. Its plugins are
production's only with ``--python-profile full``; on another profile those lines are left out of
the comparison, and the rest of the report must still be SandboxFusion's.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mocksandbox import divergence
from mocksandbox.core import MockSandbox
from mocksandbox.models import RunCodeRequest
from mocksandbox.recording.cassette import read_cassette
from mocksandbox.runtime.catalog import PYTHON_REQUIREMENTS
from mocksandbox.runtime.interpreters import find_python
from mocksandbox.runtime.production import interpreter_version
from mocksandbox.settings import load_settings

RequireOrSkip = Callable[[str | None], None]

CASSETTES = Path(__file__).parents[2] / "fixtures" / "cassettes"
CASSETTE = CASSETTES / "sandboxfusion-runtime310-469de08.jsonl"


def _sent_cases() -> list[tuple[str, dict[str, Any]]]:
    spec = importlib.util.spec_from_file_location("send_runtime_cases", CASSETTES / "send_runtime_cases.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cases: list[tuple[str, dict[str, Any]]] = module.runtime_cases()
    return cases


def _recorded() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, request body, SandboxFusion's answer) for each exchange, named as it was sent."""
    names = {json.dumps(body, sort_keys=True): name for name, body in _sent_cases()}
    cases = []
    for exchange in read_cassette(CASSETTE):
        body = json.loads(exchange.request.body)
        cases.append((names[json.dumps(body, sort_keys=True)], body, json.loads(exchange.body)))
    return cases


CASES = _recorded()
#: What a bare CPython 3.10 lacks: these cases need the runtime's packages.
NEEDS_PACKAGES = ("success_numpy", "success_pandas", "pytest_failing_subscript")
#: The packages they import, pinned as production pins them.
PACKAGES = tuple(line for line in PYTHON_REQUIREMENTS if line.split("==")[0] in ("numpy", "pandas", "pytest"))
#: One worker builds the venv and replays every case (``make test`` distributes by group).
pytestmark = pytest.mark.xdist_group("production-reference")

#: A run's directory (``/tmp/tmpab12cd34``, under any temp root) and its files (``tmpab12cd34.py``).
_RUN_DIR = re.compile(r"(?:/[^\s\"':]+)?/tmp[a-z0-9_]{8}\b")
_RUN_FILE = re.compile(r"\btmp[a-z0-9_]{8}\.py\b")
#: pytest's summary line ends with how long the run took.
_DURATION = re.compile(r" in \d+\.\d+s ")
#: The lines of a pytest report that name the runtime's packages (see the module).
_PACKAGE_LINES = re.compile(r"^(plugins: .*|PyQt5 .* -- Qt runtime .*)\n", re.MULTILINE)


def normalise(text: str) -> str:
    text = _RUN_FILE.sub("<file>.py", _RUN_DIR.sub("<run dir>", text))
    return _DURATION.sub(" in <duration> ", text)


def test_the_recording_holds_every_case_once_and_what_3_10_answers() -> None:
    assert [name for name, _, _ in CASES] == [name for name, _ in _sent_cases()]
    answers = {name: answer["run_result"] for name, _, answer in CASES}
    assert answers["version_info_311"]["stdout"] == "(3, 10)\nFalse\n"
    assert answers["tomllib_311"]["stderr"].endswith("ModuleNotFoundError: No module named 'tomllib'\n")
    assert answers["except_star_311"]["stderr"].endswith("SyntaxError: invalid syntax\n")
    # No 3.11 markers under a failing expression anywhere.
    assert not any("^^" in a["stderr"] or "~^" in a["stderr"] for n, a in answers.items() if "traceback" in n)
    # Every case that says _311 answers otherwise on 3.11: Failed on 3.10, bar sys.version_info.
    assert all(a["return_code"] == 1 for n, a in answers.items() if n.endswith("_311") and "version" not in n)


@pytest.fixture(scope="module")
def python_310(tmp_path_factory: pytest.TempPathFactory, require_or_skip: RequireOrSkip) -> tuple[str, str]:
    """User Python on a CPython 3.10: the runtime's (``make serve``'s step), else a venv of one
    found here with :data:`PACKAGES` from the package index (about 20 s); and why the packages
    are missing, or ``""``."""
    runtime_python = load_settings().python
    version = interpreter_version(runtime_python)
    if version is not None and version[:2] == (3, 10):
        return runtime_python, ""
    found = find_python("3.10").found
    require_or_skip(
        None
        if found is not None
        else "no CPython 3.10 here for user code: `mocksandbox runtime install --languages python` "
        "(make serve's step) finds one on PATH, in pyenv, uv or conda"
    )
    assert found is not None
    venv = tmp_path_factory.mktemp("py310") / "venv"
    subprocess.run([found.path, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    installed = subprocess.run(
        [python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--timeout", "30", *PACKAGES],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if installed.returncode != 0:
        last = (installed.stderr.strip().splitlines() or ["no output"])[-1]
        return python, f"pip install {' '.join(PACKAGES)} failed here ({last})"
    return python, ""


@pytest.fixture(scope="module", params=["fork", "spawn"])
def sandbox(
    request: pytest.FixtureRequest, python_310: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MockSandbox]:
    settings = load_settings(
        overrides={
            "port": 0,
            "python": python_310[0],
            "production_python": "3.10",
            "exec_mode": request.param,
            "tmp_root": str(tmp_path_factory.mktemp("runs")),
        }
    )
    box = MockSandbox.create(settings)
    yield box
    box.close()


@pytest.mark.parametrize("case", CASES, ids=[name for name, _, _ in CASES])
def test_answers_as_sandboxfusion_on_3_10(
    case: tuple[str, dict[str, Any], dict[str, Any]],
    sandbox: MockSandbox,
    python_310: tuple[str, str],
    require_or_skip: RequireOrSkip,
) -> None:
    name, body, recorded = case
    if name in NEEDS_PACKAGES:
        require_or_skip(f"{name} imports numpy, pandas or pytest: {python_310[1]}" if python_310[1] else None)
    with divergence.collecting() as notes:
        answer = sandbox.engine.run_code(RunCodeRequest.model_validate(body))
    result, expected = answer.run_result, recorded["run_result"]
    assert result is not None
    got = {
        "status": answer.status.value,
        "run_status": result.status.value,
        "return_code": result.return_code,
    }
    assert got == {
        "status": recorded["status"],
        "run_status": expected["status"],
        "return_code": expected["return_code"],
    }
    stdout, stderr = normalise(result.stdout or ""), normalise(result.stderr or "")
    want_stdout, want_stderr = normalise(expected["stdout"]), normalise(expected["stderr"])
    if body["language"] == "pytest" and sandbox.engine.python_runtime.facts().profile != "full":
        stdout, want_stdout = _PACKAGE_LINES.sub("", stdout), _PACKAGE_LINES.sub("", want_stdout)
        stderr = want_stderr = ""  # the plugins' warnings (nameko's): production's packages
    assert stdout == want_stdout
    assert stderr == want_stderr
    # Production's version: nothing to say about the runtime.
    assert [note for note in notes if divergence.kind_of(note) == divergence.RUNTIME] == []
