"""User code apart from the server: with a Python runtime in the runtime dir (what ``make serve``
installs, here with a short requirements file to keep it quick), programs run in its venv, never in
the server's: they cannot import mocksandbox nor the server's packages. The venv is made on
production's CPython 3.10 where this machine has one, and its Jupyter kernels run there too. Without
one, the banner says that user code shares the server's environment and how to give it its own.

The runtime install fetches from the package index: where pip cannot reach one, that test skips
saying so (or fails, where everything is required: ``require_or_skip`` in ``tests/conftest.py``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from serve_process import NO_PROXY, start_serve, stop_serve

from mocksandbox.runtime.catalog import JUPYTER_KERNEL_REQUIREMENTS
from mocksandbox.runtime.interpreters import find_python

pytestmark = pytest.mark.slow

#: The one package the runtime venv gets: small, pure Python, and not one the server has.
REQUIREMENT = "tabulate==0.9.0"


def package_index_unreachable(scratch: Path) -> str | None:
    """Why pip cannot fetch :data:`REQUIREMENT` here (one line), or ``None`` when it can: the same
    pip, index and configuration as the runtime install, asked for one file with a short timeout."""
    try:
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(scratch),
             "--timeout", "5", "--retries", "0", "--disable-pip-version-check", "--quiet", REQUIREMENT],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"the package index did not answer within 60 s (pip download {REQUIREMENT})"
    if fetched.returncode == 0:
        return None
    last = (fetched.stderr.strip().splitlines() or ["no output"])[-1]
    return f"needs a package index: pip download {REQUIREMENT} failed ({last})"


@pytest.fixture
def with_package_index(tmp_path: Path, require_or_skip: Callable[[str | None], None]) -> None:
    """The runtime install fetches :data:`REQUIREMENT` from the package index."""
    require_or_skip(package_index_unreachable(tmp_path / "probe"))


@pytest.mark.usefixtures("with_package_index")
def test_user_code_runs_in_the_runtime_venv_and_cannot_import_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Production's version, for the install and the server (the suite's is its own: conftest.py).
    monkeypatch.setenv("MOCKSANDBOX_PRODUCTION_PYTHON", "3.10")
    python_310 = find_python("3.10").found
    runtime = tmp_path / "runtime"
    requirements = tmp_path / "requirements.txt"
    # The kernel side of /run_jupyter as the default profile pins it for 3.10 (and 7.4 for later).
    requirements.write_text(f"{REQUIREMENT}\n" + "\n".join(JUPYTER_KERNEL_REQUIREMENTS) + "\n")
    installed = subprocess.run(
        [sys.executable, "-m", "mocksandbox.cli", "runtime", "install", "--languages", "python",
         "--runtime-dir", str(runtime), "--python-requirements", str(requirements)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    if python_310 is not None:
        assert f"python runtime on {python_310.describe()}" in installed.stdout
    server = start_serve("--runtime-dir", str(runtime))
    try:
        banner = "".join(server.banner)
        assert f"user python: {runtime}/python/venv/bin/python" in banner
        assert "shares this server's environment" not in banner
        assert "python runtime: CPython 3.10." in banner or python_310 is None
        assert ("NOT production's version" in banner) == (python_310 is None)
        if python_310 is not None:
            version = server.run("import sys; print(sys.version_info[:2])")
            assert version["run_result"]["stdout"] == "(3, 10)\n"  # type: ignore[index]
            # Kernels in the same runtime, on the same 3.10 (SandboxFusion's image does the same).
            jupyter = requests.post(
                f"{server.url}/run_jupyter",
                json={"cells": ["import sys; print(sys.prefix, sys.version_info[:2])"]},
                timeout=120,
                proxies=NO_PROXY,
            ).json()
            assert jupyter["status"] == "Success", jupyter
            assert jupyter["cells"][0]["stdout"] == f"{runtime}/python/venv (3, 10)\n"
        code = (
            "import importlib.util, sys\n"
            "print([name for name in ('mocksandbox', 'flask', 'requests', 'hypothesis', 'tabulate')"
            " if importlib.util.find_spec(name)])\n"
            "print(sys.prefix)\n"
        )
        answer = server.run(code)
        assert answer["status"] == "Success", answer
        lines = str(answer["run_result"]["stdout"]).splitlines()  # type: ignore[index]
        assert lines == ["['tabulate']", f"{runtime}/python/venv"]
    finally:
        stop_serve(server.process)


def test_without_a_runtime_the_banner_says_user_code_shares_the_servers_environment(tmp_path: Path) -> None:
    server = start_serve("--runtime-dir", str(tmp_path / "none"))
    try:
        banner = "".join(server.banner)
        assert f"user python: {sys.executable}" in banner
        assert "user code shares this server's environment" in banner
        assert "mocksandbox runtime install --languages python" in banner
        answer = server.run("import mocksandbox; print('the server is one import away')")
        assert answer["status"] == "Success"  # what the banner warns of
    finally:
        stop_serve(server.process)
