"""The installed path, as a user meets it (issue 17): build the wheel and the sdist, install each
into a fresh venv outside the checkout, and use it there.

* the sdist, plain (no extras): ``mocksandbox serve`` answers ``/run_code``, runs a swedev episode
  started by ``instance_id`` over the shipped samples, and answers ``/run_jupyter`` with a
  SandboxError naming the ``jupyter`` extra; commands whose extra is missing say which in one line
  (exit 2, no traceback); then with ``[contract]``, ``mocksandbox contract`` runs the areas a plain
  install answers differently and passes or skips each with a reason (``/run_jupyter`` skipped:
  no kernel side);
* the wheel with ``[contract,jupyter]``: ``/run_jupyter`` runs cells, ``mocksandbox contract``
  passes or skips with a reason, ``python -m mocksandbox --version``, and a small user project
  whose tests use the ``mocksandbox`` fixtures runs under ``pytest -n 2``.

Packages come from this machine's package index (pip's own configuration). The build is made from
a copy of the sources, so the checkout is not written to.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

import mocksandbox
from mocksandbox.sessions.scripted import diff_block

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
#: What the build needs of the checkout (mocksandbox/ links into contract_tests/ and fixtures/).
SOURCES = (
    "pyproject.toml",
    "README.md",
    "CHANGELOG.md",
    "MANIFEST.in",
    "mocksandbox",
    "contract_tests",
    "fixtures",
)
SAMPLE_IDS = ["acme__pagekit-17", "pyver__semverlite-88", "sciutils__unitconv-311", "textutils__slugger-42"]


def _clean_env() -> dict[str, str]:
    """The environment of a user's shell: none of this test run's Python, pytest or mock settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "MOCKSANDBOX_", "PYTHON", "COV_", "HYPOTHESIS"))
        and k not in ("VIRTUAL_ENV", "SANDBOX_FUSION_URL", "SANDBOX_FUSION_ENDPOINT")
    }
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@dataclass
class Venv:
    """A fresh venv outside the checkout; commands run with ``cwd`` in a user's directory."""

    root: Path
    cwd: Path
    env: dict[str, str]

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def run(
        self, *argv: str | Path, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(a) for a in argv],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            pytest.fail(f"{argv} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        return done

    def pip_install(self, *requirements: str | Path) -> float:
        started = time.monotonic()
        self.run(self.bin / "python", "-m", "pip", "install", "--quiet", *requirements)
        return time.monotonic() - started


def _make_venv(base: Path, name: str) -> Venv:
    root, cwd = base / name, base / f"{name}-user"
    cwd.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, capture_output=True, timeout=300)
    return Venv(root, cwd, _clean_env())


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wheel and the sdist, built with ``python -m build`` (the wheel from the sdist)."""
    base = tmp_path_factory.mktemp("build")
    src = base / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache", ".hypothesis")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, symlinks=True, ignore=ignore)
        elif path.is_file():
            shutil.copy2(path, src / name)
    out = base / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"python -m build failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    [wheel] = out.glob("mocksandbox-*.whl")
    [sdist] = out.glob("mocksandbox-*.tar.gz")
    assert wheel.name == f"mocksandbox-{mocksandbox.__version__}-py3-none-any.whl"
    return wheel, sdist


# -- a served mock ---------------------------------------------------------------------------------


@dataclass
class Served:
    url: str
    banner: str


@contextmanager
def _serve(venv: Venv, *options: str) -> Iterator[Served]:
    proc = subprocess.Popen(
        [str(venv.bin / "mocksandbox"), "serve", "--port", "0", *options],
        cwd=venv.cwd,
        env=venv.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "press Ctrl-C" in line:
                break
        banner = "".join(lines)
        match = re.search(r"serving on (http://\S+)", banner)
        if not match:
            proc.kill()
            pytest.fail(f"mocksandbox serve did not start:\n{banner}\n{proc.communicate(timeout=30)[1]}")
        yield Served(match.group(1), banner)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        assert "Traceback" not in err, err


def _post(url: str, body: Any, timeout: float = 300) -> Any:
    session = requests.Session()
    session.trust_env = False
    reply = session.post(url, json=body, timeout=timeout)
    assert reply.status_code == 200, f"{url}: HTTP {reply.status_code}: {reply.text[:500]}"
    return reply.json()


def _check_run_code(url: str) -> None:
    answer = _post(f"{url}/run_code", {"code": "print(6 * 7)", "language": "python"})
    assert answer["status"] == "Success" and answer["run_result"]["stdout"] == "42\n", answer


def _check_console(url: str) -> None:
    """The web console's page and assets are package data: served by an installed copy too."""
    for path in ("/_mock/ui", "/_mock/ui/console.js", "/_mock/ui/console.css"):
        reply = requests.get(f"{url}{path}", timeout=30)
        assert reply.status_code == 200 and reply.content, path


def _check_swedev_episode(url: str) -> None:
    listed = requests.get(f"{url}/_mock/instances", timeout=30).json()["instances"]
    assert sorted(i["instance_id"] for i in listed) == SAMPLE_IDS
    sid = _post(f"{url}/start_instance", {"instance_id": "acme__pagekit-17"})["sid"]
    gold = (REPO / "fixtures" / "swedev" / "pagekit" / "gold.patch").read_text()
    content = _post(f"{url}/process_action", {"sid": sid, "content": diff_block(gold)})["content"]
    assert content.startswith("EXECUTION RESULT of"), content
    _post(f"{url}/postprocess", {"sid": sid})
    reward = _post(f"{url}/compute_reward", {"sid": int(sid)})
    assert reward["reward"] == 1.0 and reward["resolved"] is True, reward


def _check_contract(venv: Venv, jupyter: bool, *pytest_args: str) -> str:
    """``mocksandbox contract`` against a mock it starts: no failure, every skip with its reason."""
    done = venv.run(venv.bin / "mocksandbox", "contract", *pytest_args, timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    summary = output[output.index("contract summary") :]
    rows = {
        m.group(1).strip(): (int(m.group(2)), int(m.group(3)), int(m.group(4)))
        for m in re.finditer(r"^(\S[\w &]+?)\s+(\d+)\s+(\d+)\s+(\d+)$", summary, re.M)
    }
    assert "swedev" in rows and rows["swedev"][0] >= 4 and rows["swedev"][2] == 0, summary
    assert all(failed == 0 for _, failed, _ in rows.values()), summary
    for area, (_, _, skipped) in rows.items():
        if skipped:
            assert f"skipped in {area}: " in summary, f"{area}: skips without a reason\n{summary}"
    if jupyter:
        assert rows["run_jupyter"] == (7, 0, 0), summary
    else:
        assert rows["run_jupyter"][2] == 5, summary
        assert "skipped in run_jupyter: /run_jupyter: its kernel side is not installed: " in summary
        assert "pip install 'mocksandbox[jupyter]'" in summary
    return summary


# -- the sdist, plain, then with [contract] --------------------------------------------------------


def test_sdist_plain_install_then_contract_extra(dists: tuple[Path, Path], tmp_path: Path) -> None:
    _, sdist = dists
    venv = _make_venv(tmp_path, "venv-sdist")
    took = venv.pip_install(sdist)
    print(f"plain install from the sdist: {took:.1f} s")

    # Commands whose extra is missing: one line that names it, exit 2, no traceback.
    for argv, line in [
        (
            ["contract"],
            "mocksandbox: 'mocksandbox contract' needs hypothesis: pip install 'mocksandbox[contract]'",
        ),
        (
            ["stress", "--url", "http://127.0.0.1:9", "--limit", "2", "--json", "r.json"],
            "mocksandbox: 'mocksandbox stress' (without --quiet) needs rich: pip install 'mocksandbox[stress]'",
        ),
        (
            [
                "stress",
                "--url",
                "http://127.0.0.1:9",
                "--limit",
                "2",
                "--json",
                "r.json",
                "--quiet",
                "--mode",
                "ray",
            ],
            "mocksandbox: 'mocksandbox stress --mode ray' needs ray: pip install 'mocksandbox[ray]'",
        ),
    ]:
        done = venv.run(venv.bin / "mocksandbox", *argv, check=False)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n"), argv

    # The plugin is there with a plain install (and pytest, a base dependency, loads it).
    entry_points = venv.run(
        venv.bin / "python",
        "-c",
        "from importlib.metadata import entry_points; print([e.value for e in entry_points(group='pytest11')])",
    ).stdout
    assert "mocksandbox.pytest_plugin" in entry_points

    with _serve(venv) as served:
        assert "swedev: 4 instance(s)" in served.banner, served.banner
        assert "jupyter: off, /run_jupyter needs jupyter_client" in served.banner, served.banner
        _check_run_code(served.url)
        _check_console(served.url)
        # Scoring runs pytest in the server's interpreter: a base dependency, so a plain install scores.
        _check_swedev_episode(served.url)
        answer = _post(f"{served.url}/run_jupyter", {"cells": ["1"]})
        assert answer["status"] == "SandboxError"
        assert answer["message"].endswith("is not installed: pip install 'mocksandbox[jupyter]'"), answer

    took = venv.pip_install(f"{sdist}[contract]")
    print(f"[contract] from the sdist: {took:.1f} s")
    # The areas a plain install answers otherwise (no kernel side) and swedev's scoring: the whole
    # suite runs from the wheel below, and against the checkout three ways in `make test`.
    print(_check_contract(venv, False, "--", "-k", "jupyter or swedev or protocol"))


# -- the wheel with [contract,jupyter], and a user project -------------------------------------------

USER_TEST = """
import os

import pytest
import requests


def test_run_code(mocksandbox_env):
    reply = requests.post(os.environ["SANDBOX_FUSION_URL"], json={"code": "print(6 * 7)", "language": "python"})
    assert reply.json()["run_result"]["stdout"] == "42\\n"


def test_faults_and_journal(mocksandbox):
    mocksandbox.fail(504, first=1)
    assert requests.post(mocksandbox.run_code_url, json={"code": "print(1)", "language": "python"}).status_code == 504
    assert requests.post(mocksandbox.run_code_url, json={"code": "print(1)", "language": "python"}).status_code == 200
    mocksandbox.assert_requests(2, path="/run_code")


@pytest.mark.parametrize("n", range(4))
def test_each_worker_has_its_own_server(mocksandbox, n):
    reply = requests.post(mocksandbox.run_code_url, json={"code": f"print({n})", "language": "python"})
    assert reply.json()["run_result"]["stdout"] == f"{n}\\n"
    mocksandbox.assert_requests(1, path="/run_code")


def test_swedev_by_instance_id(mocksandbox):
    reply = requests.post(mocksandbox.url + "/start_instance", json={"instance_id": "textutils__slugger-42"})
    assert reply.status_code == 200 and reply.json()["sid"].isdigit()
"""


def test_wheel_with_extras_and_a_user_project(dists: tuple[Path, Path], tmp_path: Path) -> None:
    wheel, _ = dists
    venv = _make_venv(tmp_path, "venv-wheel")
    took = venv.pip_install(f"{wheel}[contract,jupyter]", "pytest-xdist")
    print(f"wheel with [contract,jupyter] and pytest-xdist: {took:.1f} s")

    version = venv.run(venv.bin / "python", "-m", "mocksandbox", "--version").stdout
    assert version == f"mocksandbox {mocksandbox.__version__}\n"
    location = venv.run(venv.bin / "python", "-c", "import mocksandbox; print(mocksandbox.__file__)").stdout
    assert Path(location.strip()).is_relative_to(venv.root), location  # the installed copy, not the checkout

    with _serve(venv) as served:
        _check_run_code(served.url)
        answer = _post(f"{served.url}/run_jupyter", {"cells": ["x = 2", "x * 21"]})
        assert answer["status"] == "Success", answer
        assert answer["cells"][1]["display"] == [{"text/plain": "42"}]
        _check_swedev_episode(served.url)
    print(_check_contract(venv, jupyter=True))

    project = venv.cwd / "project"
    (project / "tests").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "user-project"\nversion = "0"\n')
    (project / "tests" / "test_sandbox.py").write_text(textwrap.dedent(USER_TEST))
    venv.cwd = project
    done = venv.run(
        venv.bin / "python", "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", check=False
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert re.search(r"\b7 passed\b", done.stdout), done.stdout[-3000:]


def test_the_sources_the_build_needs_exist() -> None:
    for name in SOURCES:
        assert (REPO / name).exists(), name
    # The package's links into the checkout resolve (a broken one would ship nothing).
    for link in ("contract/suite", "contract/corpus", "datasets/samples", "sessions/samples", "recording/samples"):
        assert (REPO / "mocksandbox" / link).resolve().is_dir(), link
    assert json.loads((REPO / "mocksandbox/sessions/samples/pagekit/instance.json").read_text())[
        "instance_id"
    ]
