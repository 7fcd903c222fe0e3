"""Fixtures shared by test packages."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Where every part is required, a skip not on CI's list of what its machine cannot have fails.
from ci_skips import everything_required, pytest_runtest_makereport  # noqa: F401
from visible_dirs import visible_dir

from mocksandbox.control.pooled import PooledControlState
from mocksandbox.control.shared import ControlStateServer, RemoteControlState
from mocksandbox.control.state import ControlState, LocalControlState

#: ``require_or_skip(missing)``: see the fixture of that name.
RequireOrSkip = Callable[[str | None], None]


@pytest.fixture(scope="session")
def require_or_skip() -> RequireOrSkip:
    """``require_or_skip(missing)``: where ``missing`` says what this machine lacks for the test (an
    extra, a package index, a browser) and how to get it, skip the test with that reason, or fail
    with it where :func:`everything_required`; ``None`` (nothing missing) lets the test go on."""

    def check(missing: str | None) -> None:
        if missing is None:
            return
        if everything_required():
            pytest.fail(f"{missing} (required here: CI or MOCKSANDBOX_REQUIRE_ALL=1)")
        pytest.skip(missing)

    return check


def pytest_configure(config: pytest.Config) -> None:
    """Production's Python is, for this suite, the one user code runs on here (the runtime's, else
    this interpreter's), unless MOCKSANDBOX_PRODUCTION_PYTHON says otherwise: tests that count an
    answer's divergence notes then count the ones they are about, on any machine. The notes of
    another version are tested in tests/runtime/test_python_runtime.py, which sets it per server.
    (Set here, it reaches servers started in subprocesses and pytester runs too.)"""
    from mocksandbox.runtime.production import interpreter_version
    from mocksandbox.settings import SettingsError, load_settings

    try:
        settings = load_settings()
    except SettingsError:
        return
    version = interpreter_version(settings.python)
    if version is not None:
        os.environ.setdefault("MOCKSANDBOX_PRODUCTION_PYTHON", f"{version[0]}.{version[1]}")
        # The same runtime for servers started with another HOME (pytester's): where `make serve`
        # installed one, theirs would otherwise be this interpreter, another version than the one
        # just set, and every answer would carry a note the tests do not count.
        os.environ.setdefault("MOCKSANDBOX_RUNTIME_DIR", settings.runtime_dir)


@pytest.fixture(params=["local", "shared", "pooled"])
def state(request: pytest.FixtureRequest) -> Iterator[ControlState]:
    """A control state, as one process holds it (``local``), as worker processes reach it over
    the state server's socket (``shared``), and as a worker pool's workers do, admitting by
    themselves through the shared counters and telling the master one way (``pooled``): a test
    that asks for it runs against all three."""
    local = LocalControlState() if request.param != "pooled" else PooledControlState()
    if request.param == "local":
        yield local
        return
    server = ControlStateServer(local)
    client = RemoteControlState(server.path)
    try:
        yield client
    finally:
        client.close()
        server.close()
        local.close()


@pytest.fixture
def visible_tmp_path() -> Iterator[Path]:
    """:func:`visible_dir` for one test, removed after it."""
    path = visible_dir("visible-")
    yield path
    shutil.rmtree(path, ignore_errors=True)
