"""Fixtures shared by test packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mocksandbox.control.shared import ControlStateServer, RemoteControlState
from mocksandbox.control.state import ControlState, LocalControlState


@pytest.fixture(params=["local", "shared"])
def state(request: pytest.FixtureRequest) -> Iterator[ControlState]:
    """A control state, as one process holds it (``local``) and as worker processes reach it over
    the state server's socket (``shared``): a test that asks for it runs against both."""
    local = LocalControlState()
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
