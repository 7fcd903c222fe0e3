"""Fixtures shared by test packages."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from mocksandbox.control.pooled import PooledControlState
from mocksandbox.control.shared import ControlStateServer, RemoteControlState
from mocksandbox.control.state import ControlState, LocalControlState

#: ``require_or_skip(missing)``: see the fixture of that name.
RequireOrSkip = Callable[[str | None], None]


def everything_required() -> bool:
    """Whether a test that finds an optional part missing fails instead of skipping: under CI
    (``CI``, which CI services set) and under ``.ci/run`` (``MOCKSANDBOX_REQUIRE_ALL=1``), where
    ``make test`` has installed every part and a skip would hide one that did not come."""
    return os.environ.get("MOCKSANDBOX_REQUIRE_ALL") == "1" or bool(os.environ.get("CI"))


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
