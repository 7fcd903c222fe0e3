"""pytest plugin: a real mock SandboxFusion server per test session (per xdist worker).

Registered by the ``pytest11`` entry point, this page is the plugin: options, markers, hooks and
fixtures (docs/testing/plugin.md says what each does). What they are made of is in
:mod:`mocksandbox.testing`. Importing it starts nothing and imports nothing of the server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from mocksandbox.testing import DIVERGENCE_PROPERTY, INPROCESS_BASE_URL, MockSandboxHandle, servers
from mocksandbox.testing.divergence_report import DivergenceReport
from mocksandbox.testing.handle import handle_for_test, inprocess_handle_for_test

if TYPE_CHECKING:
    from mocksandbox.core import MockSandbox
    from mocksandbox.serving.single import ServerThread

# Users import these from here (type hints), where they were defined before mocksandbox.testing.
__all__ = ["DIVERGENCE_PROPERTY", "INPROCESS_BASE_URL", "MockSandboxHandle"]

MARKERS = (
    "mocksandbox_faults(*rules): fault rules active for this test",
    "mocksandbox_capacity(**policy): server-side concurrency cap for this test",
    "mocksandbox_workers(n): serve this test's mocksandbox from n worker processes",
    "mocksandbox_output_mode(mode='sandboxfusion', **match): SandboxFusion's output behaviour for this test",
    "mocksandbox_fail_on_divergence: fail if the mock answered this test where SandboxFusion would not have",
    "mocksandbox_fleet(replicas=2, **deploy): the Ray Serve fleet behind mocksandbox_fleet",
    "mocksandbox_cassette(path, mode='strict', timing=False, redact=()): answer this test from a cassette",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mocksandbox", "mock SandboxFusion server")
    group.addoption("--mocksandbox-config", metavar="FILE", help="settings file (.toml/.yaml/.json)")
    parser.addini("mocksandbox_config", "settings file for the mocksandbox fixtures' server", default="")
    group.addoption("--mocksandbox-workers", metavar="N", type=int, help="worker processes (default 1)")
    parser.addini("mocksandbox_workers", "worker processes behind the mocksandbox fixture", default="1")
    group.addoption("--mocksandbox-record", metavar="URL", help="re-record the cassettes against URL")

    def switch(option: str, help: str) -> None:
        """``--mocksandbox-x`` turns it on for one run, the ini value ``mocksandbox_x = true`` for all."""
        group.addoption(option, action="store_true", default=None, help=help)
        parser.addini(option.removeprefix("--").replace("-", "_"), help, type="bool", default=False)

    switch("--mocksandbox-fail-on-divergence", "fail tests on divergences from SandboxFusion")
    switch("--mocksandbox-require-isolation", "error if the runs lack a protection isolation=auto asked for")
    switch("--mocksandbox-export-env", "start the server and export SANDBOX_FUSION_URL before collection")


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    # Its hooks keep each test's divergences on its report, fail it where asked, list them at the end.
    config.pluginmanager.register(DivergenceReport(), "mocksandbox-divergences")
    export = config.getoption("--mocksandbox-export-env") or config.getini("mocksandbox_export_env")
    if export and not servers.is_xdist_controller(config):
        # Before collection: suites that skip at import time without a live sandbox URL then run.
        early = config.stash[servers.EARLY_SERVER] = servers.EarlyServer(config)
        os.environ["SANDBOX_FUSION_URL"] = f"{early.server.url}/run_code"
        os.environ["SANDBOX_FUSION_ENDPOINT"] = early.server.url


def pytest_unconfigure(config: pytest.Config) -> None:
    if (early := config.stash.get(servers.EARLY_SERVER, None)) is not None:
        early.close()
        del config.stash[servers.EARLY_SERVER]


def pytest_report_header(config: pytest.Config) -> list[str]:
    # Only a server started before collection: none is started for a header (the summary says it then).
    early = config.stash.get(servers.EARLY_SERVER, None)
    return [] if early is None else [f"mocksandbox protections: {servers.protections_line(early.sandbox)}"]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if (line := config.stash.get(servers.PROTECTIONS, None)) is not None:
        terminalreporter.section("mocksandbox: what held for the runs of this session's server")
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def mocksandbox_core(pytestconfig: pytest.Config) -> Iterator[MockSandbox]:
    """The session's :class:`~mocksandbox.core.MockSandbox` (engine, faults, journal)."""
    yield from servers.session_sandbox(pytestconfig)


@pytest.fixture(scope="session")
def mocksandbox_server(mocksandbox_core: MockSandbox, pytestconfig: pytest.Config) -> Iterator[ServerThread]:
    """A real server for the session's sandbox on a free loopback port."""
    yield from servers.session_server(mocksandbox_core, pytestconfig)


@pytest.fixture(scope="session")
def mocksandbox_url(mocksandbox_server: ServerThread) -> str:
    """Base URL of the session's server."""
    return mocksandbox_server.url


@pytest.fixture
def mocksandbox(request: pytest.FixtureRequest) -> Iterator[MockSandboxHandle]:
    """The session's server, reset for this test, as a :class:`MockSandboxHandle` (with
    ``mocksandbox_workers(n)`` or ``--mocksandbox-workers n``: a server of n worker processes)."""
    box, url = servers.server_for_test(request)
    with handle_for_test(box, url, request.node) as handle:
        yield handle


@pytest.fixture
def mocksandbox_env(mocksandbox: MockSandboxHandle, monkeypatch: pytest.MonkeyPatch) -> MockSandboxHandle:
    """Point the usual environment variables at the server for this test."""
    monkeypatch.setenv("SANDBOX_FUSION_URL", mocksandbox.run_code_url)
    monkeypatch.setenv("SANDBOX_FUSION_ENDPOINT", mocksandbox.url)
    return mocksandbox


@pytest.fixture
def mocksandbox_inprocess(
    mocksandbox_core: MockSandbox, request: pytest.FixtureRequest
) -> Iterator[MockSandboxHandle]:
    """The sandbox without sockets: ``requests`` calls to ``http://mocksandbox.test`` go into the app.

    Only this process's ``requests`` calls are routed; other processes, other HTTP clients and Ray
    actors cannot reach it (use ``mocksandbox_url`` for those).
    """
    with inprocess_handle_for_test(mocksandbox_core, request.node) as handle:
        yield handle


@pytest.fixture
def mocksandbox_fleet(request: pytest.FixtureRequest) -> Iterator[MockSandboxHandle]:
    """A Ray Serve fleet of the mock (``@pytest.mark.mocksandbox_fleet(replicas=3)``), reset for this
    test, as a :class:`MockSandboxHandle`; ``handle.sandbox`` is the
    :class:`~mocksandbox.serving.fleet.Fleet` (replicas, their nodes, ``stop()``)."""
    fleet = request.getfixturevalue("_mocksandbox_fleets").get(servers.fleet_options(request.node))
    with handle_for_test(fleet, fleet.url, request.node) as handle:
        yield handle


@pytest.fixture(scope="session")
def _mocksandbox_worker_pools(pytestconfig: pytest.Config) -> Iterator[servers.WorkerPools]:
    pools = servers.WorkerPools(pytestconfig)
    yield pools
    pools.close()


@pytest.fixture(scope="session")
def _mocksandbox_fleets() -> Iterator[servers.Fleets]:
    fleets = servers.Fleets()
    yield fleets
    fleets.close()
