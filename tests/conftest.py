"""Fixtures shared by test packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mocksandbox.control.pooled import PooledControlState
from mocksandbox.control.shared import ControlStateServer, RemoteControlState
from mocksandbox.control.state import ControlState, LocalControlState


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
