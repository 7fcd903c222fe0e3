"""uv where it helps, pip otherwise (``mocksandbox/runtime/installer.py``), and the line of progress
shown while either installs (``progress.py``). No network: uv and pip are stood in for by scripts
that print what they print."""

from __future__ import annotations

import io
import stat
import sys
from pathlib import Path

import pytest

from mocksandbox.runtime.install import Host, plan_install, run_plan
from mocksandbox.runtime.installer import (
    Installer,
    choose_installer,
    find_uv,
    parse_pip_config,
    uv_environment,
)
from mocksandbox.runtime.interpreters import Interpreter
from mocksandbox.runtime.layout import RuntimeDir
from mocksandbox.runtime.progress import InstallProgress, run_installer

#: What ``pip config list`` prints on this project's machines.
PIP_CONFIG = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/somewhere/else'
"""

UV_OUTPUT = """\
Using Python 3.10.13 environment at: venv
Resolved 7 packages in 592ms
Downloading numpy (17.4MiB)
Downloading pandas (12.4MiB)
 Downloaded numpy
 Downloaded pandas
Prepared 7 packages in 633ms
Installed 7 packages in 50ms
 + numpy==1.26.3
 + pandas==2.2.0
"""

PIP_OUTPUT = """\
Collecting tabulate==0.9.0
  Using cached tabulate-0.9.0-py3-none-any.whl.metadata (34 kB)
Collecting pandas
  Downloading pandas-2.2.0-cp310-cp310-manylinux_2_17_x86_64.whl (12.4 MB)
Collecting numpy>=1.22.4
  Downloading numpy-1.26.3-cp310-cp310-manylinux_2_17_x86_64.whl.metadata (61 kB)
  Downloading numpy-1.26.3-cp310-cp310-manylinux_2_17_x86_64.whl (18.2 MB)
Installing collected packages: tabulate, numpy, pandas
Successfully installed numpy-1.26.3 pandas-2.2.0 tabulate-0.9.0
"""


def script(path: Path, body: str) -> str:
    """An executable that runs ``body`` (Python) with this interpreter."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def fake_uv(path: Path) -> str:
    return script(path, "import sys\nprint('uv 0.13.9 (x86_64-unknown-linux-gnu)')\n")


# -- pip's settings, for uv ---------------------------------------------------------------------------


def test_pip_settings_become_uvs_and_the_users_own_win() -> None:
    settings = parse_pip_config(PIP_CONFIG)
    assert settings["find-links"] == "/opt/wheels"  # the variable wins over the file
    env = uv_environment(settings, environ={})
    assert env == {
        "UV_EXTRA_INDEX_URL": "file:///opt/pypi/simple file:///opt/pypi-more/simple",
        "UV_FIND_LINKS": "/opt/wheels",
        "UV_CONSTRAINT": "/etc/xdg/pip/constraints.txt",
        "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
        # pip takes the best match of all its indexes; uv must be told to.
        "UV_INDEX_STRATEGY": "unsafe-best-match",
    }
    mine = {"UV_FIND_LINKS": "/mine", "SSL_CERT_FILE": "/my.pem", "UV_INDEX_STRATEGY": "first-index"}
    env = uv_environment(settings, environ=mine)
    assert "UV_FIND_LINKS" not in env and "SSL_CERT_FILE" not in env
    assert env["UV_INDEX_STRATEGY"] == "first-index"
    assert uv_environment({}, environ={}) == {}


def test_uv_and_pip_commands_for_the_same_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    uv = Installer("/opt/uv", "uv 0.13.9", "on PATH")
    assert uv.venv_commands("/py310", venv) == [
        ("/opt/uv", "venv", "--quiet", "--seed", "--allow-existing", "--python", "/py310", str(venv))
    ]
    assert "--clear" in uv.venv_commands("/py310", venv, clear=True)[0]
    assert uv.install_command(venv, "-r", "req.txt") == (
        "/opt/uv", "pip", "install", "--python", f"{venv}/bin/python", "-r", "req.txt",
    )  # fmt: skip
    pip = Installer()
    assert pip.venv_commands("/py310", venv)[0] == ("/py310", "-m", "venv", str(venv))
    assert pip.install_command(venv, "-r", "req.txt")[:4] == (f"{venv}/bin/python", "-m", "pip", "install")
    assert (uv.name, pip.name) == ("uv", "pip")


# -- finding uv --------------------------------------------------------------------------------------


def test_uv_on_path_then_the_places_named(tmp_path: Path) -> None:
    on_path = fake_uv(tmp_path / "bin" / "uv")
    placed = fake_uv(tmp_path / "venv" / "bin" / "uv")
    assert find_uv([(placed, "in the venv")], which=lambda name: on_path) == (on_path, "uv 0.13.9", "on PATH")
    assert find_uv([(placed, "in the venv")], which=lambda name: None) == (placed, "uv 0.13.9", "in the venv")
    # One that does not run is passed over (one beside this interpreter may be found instead).
    broken = script(tmp_path / "broken" / "uv", "raise SystemExit(3)\n")
    found = find_uv([(broken, "broken")], which=lambda name: None)
    assert found is None or found[0] != broken


def test_choose_pip_when_asked_or_when_no_uv_can_be_had(tmp_path: Path) -> None:
    out = io.StringIO()
    assert choose_installer("pip", sys.executable, out).name == "pip"
    # A "python" whose pip cannot get uv (as where the index has none): pip, saying why.
    no_pip = script(tmp_path / "python", "raise SystemExit(1)\n")
    chosen = choose_installer(
        "auto", no_pip, out, obtain=True, obtain_into=tmp_path / "tools" / "uv", which=lambda name: None
    )
    if chosen.uv is None:  # (a uv beside this interpreter would be found instead)
        assert chosen.why_pip == "no uv here, and pip could not get one"
        assert "pip installs instead" in out.getvalue()
        with pytest.raises(ValueError, match="no uv here"):
            choose_installer("uv", no_pip, out, obtain=True, obtain_into=tmp_path / "x", which=lambda n: None)
    uv = fake_uv(tmp_path / "tools" / "uv" / "bin" / "uv")
    chosen = choose_installer(
        "auto", no_pip, out, obtain_into=tmp_path / "tools" / "uv", which=lambda n: None
    )
    assert chosen.uv in (uv, str(Path(sys.executable).parent / "uv"))


# -- the runtime's venv by uv -----------------------------------------------------------------------


def test_the_python_runtime_by_uv_is_the_same_list(tmp_path: Path) -> None:
    runtime = RuntimeDir(tmp_path)
    uv = Installer("/opt/uv", "uv 0.13.9", "on PATH", {"UV_FIND_LINKS": "/opt/wheels"})
    host = Host(
        is_root=True,
        which=lambda name: None,
        installed_packages=lambda wanted: set(),
        has_apt=True,
        python=Interpreter("/opt/python3.10", (3, 10, 13), "pyenv"),
        installer=uv,
    )
    (step,) = plan_install(["python"], runtime, host).steps
    assert step.commands[0][:2] == ("/opt/uv", "venv")
    assert step.commands[-1][:3] == ("/opt/uv", "pip", "install") and step.commands[-1][-2] == "-r"
    assert step.condensed == frozenset({1}) and step.env == {"UV_FIND_LINKS": "/opt/wheels"}
    assert step.log == tmp_path / "python" / "install.log"
    (pip_step,) = plan_install(["python"], runtime, dataclass_replace(host, installer=Installer())).steps
    assert pip_step.condensed == frozenset({2})  # after the venv and pip's own upgrade
    # The same requirement file either way: the same pins.
    assert step.commands[-1][-1] == pip_step.commands[-1][-1]


def dataclass_replace(host: Host, **changes: object) -> Host:
    import dataclasses

    return dataclasses.replace(host, **changes)  # type: ignore[arg-type]


# -- progress ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "summary"),
    [(UV_OUTPUT, "7 packages installed"), (PIP_OUTPUT, "3 packages installed")],
)
def test_progress_follows_uv_and_pip(output: str, summary: str) -> None:
    progress = InstallProgress()
    stages = []
    for line in output.splitlines(keepends=True):
        if progress.feed(line):
            stages.append(progress.status())
    assert progress.summary() == summary
    assert stages[-1] == summary
    if output is UV_OUTPUT:
        assert stages[0] == "fetching 7 packages"
        progress = InstallProgress()
        for line in output.splitlines()[:4]:
            progress.feed(line)
        assert progress.status() == "fetching 7 packages (large files: 0/2; pandas, 12.4MiB)"
    else:
        assert stages[0] == "resolving (1 so far: tabulate==0.9.0)"
        assert "installing 3 packages" in stages


def test_run_installer_shows_stages_and_keeps_the_output(tmp_path: Path) -> None:
    tool = script(tmp_path / "uv", f"import sys\nsys.stdout.write({UV_OUTPUT!r})\n")
    out = io.StringIO()
    log = tmp_path / "logs" / "install.log"
    assert run_installer([tool, "pip", "install"], out, log=log) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].strip().startswith("$ ")
    assert lines[1].strip().startswith("fetching 7 packages")
    assert lines[-1].strip().startswith("7 packages installed (")
    assert " + numpy==1.26.3" in log.read_text()  # every line, in the log only
    assert "numpy==1.26.3" not in out.getvalue()


def test_a_failed_install_shows_its_last_lines(tmp_path: Path) -> None:
    tool = script(
        tmp_path / "pip",
        "import sys\nprint('Collecting nothing==9')\nprint('ERROR: No matching distribution found')\nsys.exit(1)\n",
    )
    out = io.StringIO()
    assert run_installer([tool], out, log=tmp_path / "install.log") == 1
    text = out.getvalue()
    assert "failed (exit status 1)" in text and "ERROR: No matching distribution found" in text
    assert str(tmp_path / "install.log") in text


def test_a_runtime_install_by_a_failing_installer_says_why(tmp_path: Path) -> None:
    """The step fails with the tool's own last lines, and the venv is not recorded as done."""
    failing = script(
        tmp_path / "uv",
        "import sys\nif sys.argv[1] != 'venv':\n    print('error: no index')\n    sys.exit(2)\n",
    )
    runtime = RuntimeDir(tmp_path / "runtime")
    host = Host(
        is_root=True,
        which=lambda name: None,
        installed_packages=lambda wanted: set(),
        has_apt=True,
        python=Interpreter(sys.executable, (3, 11, 0), "test"),
        installer=Installer(failing, "uv 0.13.9", "test"),
    )
    out = io.StringIO()
    assert run_plan(plan_install(["python"], runtime, host, ("tabulate==0.9.0",)), out) == 1
    text = out.getvalue()
    assert "error: no index" in text and "1 step(s) not done" in text
    assert not runtime.python_stamp.exists()


def test_where_no_310_is_found_the_uv_here_is_named() -> None:
    from mocksandbox.runtime.interpreters import how_to_get

    assert how_to_get("3.10", "/x/uv").startswith("/x/uv python install 3.10 (uv is here;")
    assert how_to_get("3.10").startswith("uv python install 3.10 (needs the internet); pyenv install 3.10")
