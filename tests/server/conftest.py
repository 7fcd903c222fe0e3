"""Shared by the client compatibility tests: a real server, loopback-only clients, the official
client pointed at the server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mocksandbox.serving.single import ServerThread, running_server
from mocksandbox.settings import Settings

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    """A real server on a free loopback port, with no pod name (as outside SandboxFusion's cloud)."""
    with running_server(Settings(pod_name=None)) as srv:
        yield srv


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients use ``requests``/``aiohttp`` with the environment's proxies: keep every byte on loopback."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@pytest.fixture
def sf_endpoint(server: ServerThread) -> Iterator[str]:
    """The official client pointed at the mock with ``set_endpoint``; its module state restored after."""
    from sandbox_fusion import config as sf_config
    from sandbox_fusion import set_endpoint

    saved = (sf_config.SANDBOX_ENDPOINT, sf_config.DATASET_ENDPOINT)
    set_endpoint(server.url + "/")  # the client strips a trailing slash
    try:
        yield server.url
    finally:
        sf_config.SANDBOX_ENDPOINT, sf_config.DATASET_ENDPOINT = saved
