"""User Python as production runs it: CPython 3.10 (setting ``production_python``) with SandboxFusion's
packages, and a divergence note wherever this host's runtime cannot match it.

No network: the interpreter finder is given made-up places (files, and a probe that says what each
is); the notes are made by real runs on the interpreters this machine has (a 3.10 venv made
``--without-pip`` is a second's work, offline). Building a runtime from PyPI is in
``tests/server/test_user_code_apart.py`` (slow).
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mocksandbox import divergence
from mocksandbox.cli import main
from mocksandbox.core import MockSandbox
from mocksandbox.models import CommandRunStatus, RunCodeRequest, RunCodeResponse
from mocksandbox.runtime import production
from mocksandbox.runtime.catalog import PYTHON_REQUIREMENTS, python_profile_requirements
from mocksandbox.runtime.install import Host, plan_install, run_plan
from mocksandbox.runtime.interpreters import Interpreter, find_python, parse_minor
from mocksandbox.runtime.layout import RuntimeDir
from mocksandbox.runtime.production import (
    PURE_PYTHON_SPEED,
    SPEED_KERNELS,
    PythonRuntime,
    Slowdown,
    missing_production_modules,
    normalise,
    production_slowdown,
    sandboxfusion_modules,
    sandboxfusion_requirements,
    time_limit_note,
)
from mocksandbox.settings import Settings, load_settings

#: The suite's ``require_or_skip`` fixture (tests/conftest.py).
RequireOrSkip = Callable[[str | None], None]
HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"
#: A CPython 3.10 of this machine (pyenv here), or None: the tests that need one skip without it.
PYTHON_310 = find_python("3.10").found


def touch(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return str(path)


def fake_probe(versions: dict[str, str]):  # type: ignore[no-untyped-def]
    """A probe that says each path is the CPython of ``versions`` (a string: it does not run)."""

    def probe(path: str, source: str) -> Interpreter | str:
        version = versions.get(path, f"{path}: does not run")
        if not version[0].isdigit():
            return version
        major, minor, micro = map(int, version.split("."))
        return Interpreter(path, (major, minor, micro), source)

    return probe


# -- finding the interpreter ----------------------------------------------------------------------


def test_finder_prefers_python310_on_path_then_pyenv_newest_first(tmp_path: Path) -> None:
    on_path = touch(tmp_path / "bin" / "python3.10")
    old = touch(tmp_path / "pyenv" / "versions" / "3.10.2" / "bin" / "python3.10")
    new = touch(tmp_path / "pyenv" / "versions" / "3.10.13" / "bin" / "python3.10")
    touch(tmp_path / "pyenv" / "versions" / "3.11.7" / "bin" / "python3.11")
    environ = {"HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path / "pyenv")}
    versions = {on_path: "3.10.12", old: "3.10.2", new: "3.10.13"}

    def which(name: str) -> str | None:
        return on_path if name == "python3.10" else None

    found = find_python("3.10", environ, which, fake_probe(versions)).found
    assert found == Interpreter(on_path, (3, 10, 12), "PATH")
    # A pyenv shim on PATH that names a version pyenv has not selected does not run: pyenv's own.
    search = find_python("3.10", environ, which, fake_probe({old: "3.10.2", new: "3.10.13"}))
    assert search.found == Interpreter(new, (3, 10, 13), "pyenv")
    assert search.rejected == [f"{on_path}: does not run"]


def test_finder_looks_in_uv_and_conda_and_checks_the_version(tmp_path: Path) -> None:
    uv = touch(
        tmp_path / "share" / "uv" / "python" / "cpython-3.10.14-linux-x86_64-gnu" / "bin" / "python3.10"
    )
    conda_env = touch(tmp_path / "miniconda3" / "envs" / "sandbox-runtime" / "bin" / "python3.10")
    other_env = touch(tmp_path / "miniconda3" / "envs" / "aaa" / "bin" / "python3.10")
    environ = {"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "share")}
    # A file named python3.10 that is something else is passed over, with the reason.
    probe = fake_probe({uv: "3.9.1", conda_env: "3.10.9", other_env: "3.10.10"})
    search = find_python("3.10", environ, lambda name: None, probe)
    assert search.found == Interpreter(conda_env, (3, 10, 9), "conda")  # SandboxFusion's env first
    assert search.rejected == [f"{uv}: is 3.9"]


def test_finder_says_where_it_looked_when_there_is_none(tmp_path: Path) -> None:
    search = find_python("3.10", {"HOME": str(tmp_path)}, lambda name: None, fake_probe({}))
    assert search.found is None and search.rejected == []
    with pytest.raises(ValueError, match=r"write it as 3\.10"):
        parse_minor("py3")


@pytest.mark.skipif(PYTHON_310 is None, reason="no CPython 3.10 on this machine")
def test_install_builds_on_a_found_310_and_honours_python_interpreter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert PYTHON_310 is not None
    monkeypatch.setenv("MOCKSANDBOX_PRODUCTION_PYTHON", "3.10")  # the suite's is its own (conftest.py)
    # (pip's commands: with uv found here, the dry run would show uv's.)
    args = ["runtime", "install", "--languages", "python", "--runtime-dir", str(tmp_path), "--dry-run"]
    args += ["--installer", "pip"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"python runtime on CPython 3.10.{PYTHON_310.version[2]}" in out
    assert f"would run: {PYTHON_310.path} -m venv {tmp_path}/python/venv" in out
    # Named: that one, whatever its version, with a word when it is not production's.
    assert main([*args, "--python-interpreter", sys.executable]) == 0
    out = capsys.readouterr().out
    assert f"python runtime on CPython {HERE}." in out and "(--python-interpreter:" in out
    assert f"answers produced on {HERE} carry a divergence note" in out
    assert main([*args, "--python-interpreter", str(tmp_path / "nothing")]) == 2
    assert "--python-interpreter" in capsys.readouterr().err


def test_the_venv_is_made_again_on_another_minor_version_and_says_its_profile(tmp_path: Path) -> None:
    runtime = RuntimeDir(tmp_path)
    runtime.venv_dir.mkdir(parents=True)
    (runtime.venv_dir / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    host = Host(
        is_root=True,
        which=lambda name: None,
        installed_packages=lambda wanted: set(),
        has_apt=True,
        python=Interpreter("/opt/python3.10", (3, 10, 13), "pyenv"),
    )
    (step,) = plan_install(["python"], runtime, host).steps
    assert step.commands[0] == ("/opt/python3.10", "-m", "venv", "--clear", str(runtime.venv_dir))
    assert step.prepare is not None
    step.prepare()
    header = Path(f"{runtime.python_stamp}.new").read_text().splitlines()[0]
    assert header == "# mocksandbox python runtime: profile default, CPython 3.10"
    Path(f"{runtime.python_stamp}.new").rename(runtime.python_stamp)
    assert runtime.python_profile() == "default" and runtime.python_version() == (3, 11, 7)
    assert step.done()
    # The full profile: torch's CPU build first (its failure does not stop the step), then the list.
    (full,) = plan_install(["python"], runtime, host, python_profile_requirements("full"), "full").steps
    assert not full.done()
    torch = full.commands[2]
    assert torch[-3:] == ("--index-url", "https://download.pytorch.org/whl/cpu", "torch==2.1.2")
    assert full.optional == frozenset({2})
    out = io.StringIO()
    assert run_plan(plan_install(["python"], runtime, host), out) == 0 and "already there" in out.getvalue()


# -- production's packages, as data ----------------------------------------------------------------


def test_sandboxfusion_requirements_and_their_import_names() -> None:
    requirements = sandboxfusion_requirements()
    assert len(requirements) == 102 and all("==" in line for line in requirements)
    assert "torch==2.1.2" in requirements and "numpy==1.26.3" in requirements
    modules = sandboxfusion_modules()
    # Every package of the list gives a module, under its import name where that differs.
    provided = {normalise(distribution) for distribution in modules.values()}
    metapackages = {"jupyter", "bs4"}  # no module of their own (bs4's comes from beautifulsoup4)
    assert {normalise(line.split("==")[0]) for line in requirements} - metapackages <= provided
    for module, distribution in [("sklearn", "scikit-learn"), ("cv2", "opencv-python"), ("PIL", "pillow"),
                                 ("jwt", "PyJWT"), ("docx", "python-docx"), ("skimage", "scikit-image"),
                                 ("dateutil", "python-dateutil"), ("sympy", "sympy")]:  # fmt: skip
        assert modules[module] == distribution
    assert "tomllib" not in modules  # standard library from 3.11: production has none


def test_profiles_pin_as_sandboxfusion() -> None:
    pins = dict(line.split("==") for line in sandboxfusion_requirements())
    for line in PYTHON_REQUIREMENTS:
        name, _, version = line.partition("==")
        if version and ";" not in version:
            assert pins[name] == version, name
    full = python_profile_requirements("full")
    assert full[:-1] == sandboxfusion_requirements() and full[-1] == "ipykernel==6.29.5"
    with pytest.raises(ValueError, match="unknown Python profile"):
        python_profile_requirements("gpu")


def test_which_failed_imports_production_would_have_had() -> None:
    text = (
        "ModuleNotFoundError: No module named 'torch'\n"
        "E   ModuleNotFoundError: No module named 'sklearn'\n"  # pytest's way
        "ModuleNotFoundError: No module named 'not_a_real_module'\n"
        "ModuleNotFoundError: No module named 'numpy.gone'\n"  # a package both have: not this note
        "ImportError: No module named 'cv2'\n"
    )
    assert missing_production_modules(text) == ["torch", "sklearn", "cv2"]


# -- notes beside the answers --------------------------------------------------------------------


@pytest.fixture(scope="module")
def python_310_venv(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A bare CPython 3.10 venv (no packages): production's interpreter, offline."""
    if PYTHON_310 is None:
        pytest.skip("no CPython 3.10 on this machine")
    venv = tmp_path_factory.mktemp("py310") / "venv"
    subprocess.run([PYTHON_310.path, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return str(venv / "bin" / "python")


def sandbox_on(tmp_path: Path, python: str, production: str) -> MockSandbox:
    settings = load_settings(
        overrides={
            "tmp_root": str(tmp_path),
            "python": python,
            "production_python": production,
            "pod_name": "p",
        }
    )
    return MockSandbox.create(settings)


@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockSandbox]:
    """User Python on this interpreter (3.11 or later), production's being 3.10."""
    box = sandbox_on(tmp_path_factory.mktemp("runs"), sys.executable, "3.10")
    yield box
    box.close()


def run(box: MockSandbox, code: str, language: str = "python") -> tuple[RunCodeResponse, list[str]]:
    """The answer, and its notes of kind ``runtime`` (this host may add others: ``isolation``)."""
    with divergence.collecting() as notes:
        response = box.engine.run_code(RunCodeRequest(code=code, language=language, run_timeout=30))
    return response, [note for note in notes if divergence.kind_of(note) == divergence.RUNTIME]


ELEVEN_ONLY = "import tomllib\nprint(tomllib.loads('a = 1'))\n"


def test_a_311_only_program_on_311_succeeds_with_a_note(here: MockSandbox) -> None:
    response, notes = run(here, ELEVEN_ONLY)
    assert response.status == "Success" and response.run_result is not None
    assert response.run_result.stdout == "{'a': 1}\n"  # the body stays the run's
    (note,) = notes
    assert note.startswith(f"runtime: user Python here is CPython {HERE}.")
    assert "production runs CPython 3.10" in note and "--languages python" in note
    assert divergence.kind_of(note) == divergence.RUNTIME


def test_a_missing_production_module_gets_a_note(here: MockSandbox) -> None:
    response, notes = run(here, "import torch\n")
    assert response.status == "Failed"
    assert any("production's Python runtime has torch" in note and "torch==2.1.2" in note for note in notes)
    assert any("--python-profile full" in note for note in notes)
    # A module production lacks too: nothing to say about packages.
    _, notes = run(here, "import not_a_real_module\n")
    assert not any("production's Python runtime has" in note for note in notes)
    # pytest runs too (their output is on stdout).
    _, notes = run(here, "import torch\n\ndef test_x():\n    pass\n", "pytest")
    assert any("production's Python runtime has torch" in note for note in notes)


def test_no_version_note_when_production_runs_this_version(tmp_path: Path) -> None:
    box = sandbox_on(tmp_path, sys.executable, HERE)
    try:
        response, notes = run(box, "print(1)")
    finally:
        box.close()
    assert response.status == "Success" and notes == []


def test_on_a_310_runtime_311_programs_fail_as_on_sandboxfusion(tmp_path: Path, python_310_venv: str) -> None:
    box = sandbox_on(tmp_path, python_310_venv, "3.10")
    try:
        facts = box.engine.python_runtime.facts()
        assert facts.same_minor and facts.version is not None and facts.version[:2] == (3, 10)
        response, notes = run(box, ELEVEN_ONLY)
        traceback, _ = run(box, "x = [1]\nprint(x[0] + x[1])\n")
        version, _ = run(box, "import sys; print(sys.version_info[:2])")
    finally:
        box.close()
    assert response.status == "Failed" and response.run_result is not None
    assert response.run_result.stderr.endswith("ModuleNotFoundError: No module named 'tomllib'\n")
    assert notes == []  # production's version; tomllib is the standard library's, not a package
    # 3.10's traceback: no ~~^~~ markers under the failing expression.
    assert traceback.run_result is not None
    assert traceback.run_result.stderr.splitlines()[-3:] == [
        '  File "' + traceback.run_result.stderr.split('"')[1] + '", line 2, in <module>',
        "    print(x[0] + x[1])",
        "IndexError: list index out of range",
    ]
    assert version.run_result is not None and version.run_result.stdout == "(3, 10)\n"


def test_banner_and_languages_say_the_runtime_against_production(
    here: MockSandbox, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = here.engine.python_runtime.facts()
    line = facts.describe()
    assert line.startswith(f"CPython {HERE}.") and "production: CPython 3.10" in line
    assert "not a runtime made by `runtime install`" in line
    assert ("NOT production's version" in line) == (HERE != "3.10")
    assert main(["languages", "--runtime-dir", str(tmp_path / "none")]) == 0
    assert "python runtime: CPython" in capsys.readouterr().out
    # A runtime venv says its profile (from the stamp runtime install writes).
    runtime = RuntimeDir(tmp_path)
    runtime.venv_dir.mkdir(parents=True)
    runtime.python_stamp.write_text("# mocksandbox python runtime: profile full, CPython 3.10\nx\n")
    (runtime.venv_dir / "pyvenv.cfg").write_text("version = 3.10.13\n")
    facts = PythonRuntime(str(runtime.venv_dir / "bin" / "python"), "3.10").facts()
    assert facts.profile == "full" and facts.version == (3, 10, 13) and facts.same_minor
    assert facts.describe().startswith("CPython 3.10.13, profile full; production: CPython 3.10")


def test_production_python_is_a_setting() -> None:
    assert Settings().production_python == "3.10"
    assert load_settings(environ={"MOCKSANDBOX_PRODUCTION_PYTHON": "3.11.4"}).production_python == "3.11"


# -- a run near its time limit on an interpreter faster (or slower) than production's -------------

#: A made-up speed table (two kernels), so the arithmetic below is exact.
SPEEDS = {(3, 9): (0.8, 0.8), (3, 10): (1.0, 1.0), (3, 11): (1.2, 1.8), (3, 12): (1.05, 1.05)}


def test_time_note_says_when_production_would_likely_or_could_time_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(production, "PURE_PYTHON_SPEED", SPEEDS)
    finished, timed_out = CommandRunStatus.Finished, CommandRunStatus.TimeLimitExceeded
    # 3.10 takes 1.2x to 1.8x the time of 3.11 (typical: their geometric mean, 1.47x).
    slowdown = production_slowdown((3, 11), (3, 10))
    assert slowdown is not None and (slowdown.low, slowdown.high) == (1.2, 1.8)
    assert slowdown.typical == pytest.approx(1.4697, abs=1e-4)
    assert time_limit_note((3, 11), (3, 10), finished, 0.5, 1.0) is None  # 0.9 s at worst: in time
    could = time_limit_note((3, 11), (3, 10), finished, 0.6, 1.0)  # 0.88 s typically, 1.08 s at worst
    assert could == (
        "the run finished in 0.60 s of its run_timeout of 1 s on CPython 3.11; production's CPython 3.10 "
        "takes 1.47x the time of 3.11 on typical pure-Python code (1.20-1.80x on the workloads measured), "
        "so it would take about 0.88 s there (up to 1.08 s) if its time went to Python code (sleeping, I/O "
        "and compiled libraries such as numpy do not scale so): production could answer TimeLimitExceeded"
    )
    likely = time_limit_note((3, 11), (3, 10), finished, 0.7, 1.0)
    assert likely is not None and "about 1.03 s there" in likely
    assert likely.endswith("production would likely answer TimeLimitExceeded")
    # Timed out here on the faster one: production would have timed out too.
    assert time_limit_note((3, 11), (3, 10), timed_out, 1.0, 1.0) is None
    # Production's own minor version: this machine's speed against production's is not known.
    assert time_limit_note((3, 10), (3, 10), finished, 0.99, 1.0) is None
    # A version not measured, a result without a time, a status neither Finished nor timed out.
    assert time_limit_note((3, 14), (3, 10), finished, 0.99, 1.0) is None
    assert time_limit_note((3, 11), (3, 10), finished, None, 1.0) is None
    assert time_limit_note((3, 11), (3, 10), CommandRunStatus.Error, 0.99, 1.0) is None


def test_time_note_of_a_timeout_on_an_interpreter_slower_than_production(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(production, "PURE_PYTHON_SPEED", SPEEDS)
    finished, timed_out = CommandRunStatus.Finished, CommandRunStatus.TimeLimitExceeded
    # 3.10 here, production on 3.11: production takes 1/1.8 to 1/1.2 of the time.
    note = time_limit_note((3, 10), (3, 11), timed_out, 2.0, 2.0)
    assert note is not None and note.startswith("the run reached its run_timeout of 2 s on CPython 3.10; ")
    assert "takes 0.68x the time of 3.10" in note and "(0.56-0.83x on the workloads measured)" in note
    assert (
        "needs less than about 2.94 s here (up to 3.60 s, depending on the code) finishes in time there"
        in note
    )
    assert note.endswith("production could answer Finished")
    assert time_limit_note((3, 10), (3, 11), finished, 1.9, 2.0) is None  # faster there: in time too
    # 3.9 here: production 1.25x as fast; 3.12 against 3.10: within the measurements' noise, nothing.
    assert time_limit_note((3, 9), (3, 10), timed_out, 2.0, 2.0) is not None
    assert time_limit_note((3, 9), (3, 10), finished, 1.99, 2.0) is None
    assert time_limit_note((3, 10), (3, 12), timed_out, 2.0, 2.0) is None
    assert time_limit_note((3, 12), (3, 10), finished, 1.99, 2.0) is None


def test_the_measured_speeds() -> None:
    assert set(PURE_PYTHON_SPEED) >= {(3, 10), (3, 11), (3, 12), (3, 13)}
    assert all(len(row) == len(SPEED_KERNELS) for row in PURE_PYTHON_SPEED.values())
    assert set(PURE_PYTHON_SPEED[(3, 10)]) == {1.0}
    for faster in [(3, 11), (3, 12), (3, 13)]:
        slowdown = production_slowdown(faster, (3, 10))
        assert slowdown is not None and slowdown.typical > 1.1 and slowdown.high > 1.5
        back = production_slowdown((3, 10), faster)
        assert back is not None and back.typical == pytest.approx(1 / slowdown.typical)
        assert back.high == pytest.approx(1 / slowdown.low)


def faster_than_310() -> tuple[str, Slowdown] | None:
    """An interpreter of this machine faster than 3.10 on Python code (3.11, 3.12, 3.13), with how
    much longer 3.10 takes."""
    for version in ("3.11", "3.12", "3.13"):
        found = find_python(version).found
        slowdown = production_slowdown(parse_minor(version), (3, 10))
        if found is not None and slowdown is not None:
            return found.path, slowdown
    return None


def run_timed(box: MockSandbox, code: str, run_timeout: float) -> tuple[RunCodeResponse, list[str]]:
    with divergence.collecting() as notes:
        response = box.engine.run_code(RunCodeRequest(code=code, language="python", run_timeout=run_timeout))
    return response, [note for note in notes if "run_timeout" in note]


def test_a_run_close_to_its_limit_on_a_faster_interpreter_gets_a_note(
    tmp_path: Path, require_or_skip: RequireOrSkip
) -> None:
    found = faster_than_310()
    require_or_skip(None if found else "no CPython 3.11, 3.12 or 3.13 here (pyenv install 3.11)")
    assert found is not None
    python, slowdown = found
    # Sleeping is no Python work, but the note cannot tell: execution_time >= the sleep, and the
    # sleep times production's worst slowdown passes run_timeout, while at least 0.6 s are left to
    # finish. 5 s, not 2: what is left after the sleep (about 2 s on 3.11) starts Python on a loaded
    # machine, and the bare run below must stay under run_timeout / slowdown.high to get no note.
    run_timeout = 5.0
    sleep = min(1.1 * run_timeout / slowdown.high, run_timeout - 0.6)
    assert sleep * slowdown.high >= run_timeout
    box = sandbox_on(tmp_path, python, "3.10")
    try:
        near, near_notes = run_timed(
            box, f"import time\ntime.sleep({sleep:.3f})\nprint('done')\n", run_timeout
        )
        far, far_notes = run_timed(box, "print('done')\n", run_timeout)
    finally:
        box.close()
    assert near.status == "Success" and near.run_result is not None and near.run_result.stdout == "done\n"
    (note,) = near_notes
    assert note.startswith(f"runtime: the run finished in {near.run_result.execution_time:.2f} s of its ")
    assert "production's CPython 3.10 takes" in note and note.endswith("answer TimeLimitExceeded")
    assert far.status == "Success" and far_notes == []


def test_a_timeout_on_an_interpreter_slower_than_production_gets_a_note(
    tmp_path: Path, python_310_venv: str
) -> None:
    # Production on 3.11, user Python here on 3.10: production runs Python code faster.
    box = sandbox_on(tmp_path, python_310_venv, "3.11")
    try:
        response, notes = run_timed(box, "while True:\n    pass\n", 1.0)
    finally:
        box.close()
    assert response.status == "Failed" and response.run_result is not None  # SandboxFusion's status
    assert response.run_result.status == "TimeLimitExceeded"
    (note,) = notes
    assert note.startswith("runtime: the run reached its run_timeout of 1 s on CPython 3.10; ")
    assert note.endswith("production could answer Finished")
