"""The servers behind the plugin's fixtures: the session's sandbox, the one started before
collection (``--mocksandbox-export-env``), worker pools and Ray fleets.

Each is made on first use, from the plugin's settings file; the server's own modules (Flask, the
engine, Ray) are imported then, never when this module is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mocksandbox.core import MockSandbox
    from mocksandbox.serving.fleet import Fleet
    from mocksandbox.serving.single import ServerThread
    from mocksandbox.serving.workers import PoolControl


def settings_file(config: pytest.Config) -> str | None:
    """The settings file of ``--mocksandbox-config`` or the ``mocksandbox_config`` ini value."""
    value = config.getoption("--mocksandbox-config") or config.getini("mocksandbox_config")
    return str(value) if value else None


def create_sandbox(config: pytest.Config) -> MockSandbox:
    """A sandbox from the plugin's settings, to be served on a free loopback port."""
    from mocksandbox.core import MockSandbox
    from mocksandbox.settings import load_settings

    settings = load_settings(settings_file(config), overrides={"host": "127.0.0.1", "port": 0})
    sandbox = MockSandbox.create(settings)
    _hold_to_required_isolation(config, sandbox)
    return sandbox


def _hold_to_required_isolation(config: pytest.Config, sandbox: MockSandbox) -> None:
    """With ``mocksandbox_require_isolation``, a protection ``auto`` could not give is an error."""
    required = config.getoption("--mocksandbox-require-isolation") or config.getini(
        "mocksandbox_require_isolation"
    )
    missing = sandbox.engine.isolation.missing()
    if required and missing:
        sandbox.close()
        pytest.fail(
            "mocksandbox_require_isolation: not in force for the server's runs: "
            + "; ".join(missing)
            + " (mocksandbox doctor says what would give them)",
            pytrace=False,
        )


def protections_line(sandbox: MockSandbox) -> str:
    """What holds for the sandbox's runs, in one line (DESIGN seam 10)."""
    from mocksandbox.execution.protections import protections, summary

    return summary(protections(sandbox.engine.isolation, sandbox.confinement, sandbox.engine.proofs))


class EarlyServer:
    """The session's sandbox and server, started before collection for ``--mocksandbox-export-env``."""

    def __init__(self, config: pytest.Config) -> None:
        from mocksandbox.serving.single import ServerThread

        self.sandbox = create_sandbox(config)
        self.server = ServerThread(self.sandbox, "127.0.0.1", 0).start()

    def close(self) -> None:
        self.server.stop()
        self.sandbox.close()


#: The server started before collection, when one was.
EARLY_SERVER = pytest.StashKey[EarlyServer]()
#: What held for the runs of this process's session sandbox (DESIGN seam 10), once one was made.
PROTECTIONS = pytest.StashKey[str]()


def is_xdist_controller(config: pytest.Config) -> bool:
    """Whether this process hands tests to xdist workers (and so runs none itself)."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def session_sandbox(config: pytest.Config) -> Iterator[MockSandbox]:
    """The session's sandbox: the one started before collection, else a new one (closed after,
    and what holds for its runs kept for the summary)."""
    early = config.stash.get(EARLY_SERVER, None)
    if early is not None:
        yield early.sandbox
        return
    sandbox = create_sandbox(config)
    config.stash[PROTECTIONS] = protections_line(sandbox)
    yield sandbox
    sandbox.close()


def session_server(sandbox: MockSandbox, config: pytest.Config) -> Iterator[ServerThread]:
    """The session's server for ``sandbox``: the one started before collection, else a new one on a
    free loopback port (stopped after)."""
    early = config.stash.get(EARLY_SERVER, None)
    if early is not None:
        yield early.server
        return
    from mocksandbox.serving.single import ServerThread

    with ServerThread(sandbox, "127.0.0.1", 0) as server:
        yield server


# -- worker pools ------------------------------------------------------------------------------------


def workers_for(node: pytest.Item, config: pytest.Config) -> int:
    """Worker processes behind the test's ``mocksandbox``: its marker's, else the option's."""
    marker = node.get_closest_marker("mocksandbox_workers")
    if marker is not None:
        return int(marker.args[0] if marker.args else marker.kwargs.get("n", 1))
    option = config.getoption("--mocksandbox-workers")
    return int(option if option is not None else config.getini("mocksandbox_workers") or 1)


def server_for_test(request: pytest.FixtureRequest) -> tuple[MockSandbox | PoolControl, str]:
    """The sandbox and URL behind the test's ``mocksandbox``: the session's server, or with more than
    one worker (marker or option) the session's pool of that many."""
    workers = workers_for(request.node, request.config)
    if workers > 1:
        pool: PoolControl = request.getfixturevalue("_mocksandbox_worker_pools").get(workers)
        return pool, pool.url
    server: ServerThread = request.getfixturevalue("mocksandbox_server")
    return server.sandbox, server.url


class WorkerPools:
    """Multi-worker servers of the session, one per worker count asked for, started on first use."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.pools: dict[int, PoolControl] = {}

    def get(self, workers: int) -> PoolControl:
        if workers not in self.pools:
            from mocksandbox.serving.workers import PoolControl, WorkerPool
            from mocksandbox.settings import load_settings

            settings = load_settings(
                settings_file(self.config), overrides={"host": "127.0.0.1", "port": 0, "workers": workers}
            )
            self.pools[workers] = PoolControl(WorkerPool(settings, workers)).start()
        return self.pools[workers]

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()


# -- Ray fleets --------------------------------------------------------------------------------------


def fleet_options(node: pytest.Item) -> dict[str, Any]:
    """The ``deploy`` options of the test's ``mocksandbox_fleet`` marker; skips the test without
    ``mocksandbox[fleet]``."""
    from mocksandbox.extras import MissingExtraError
    from mocksandbox.serving.fleet import require_fleet_extra

    try:
        require_fleet_extra()
    except MissingExtraError as exc:
        pytest.skip(str(exc))
    marker = node.get_closest_marker("mocksandbox_fleet")
    options = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and marker.args:
        options["replicas"] = int(marker.args[0])
    return options


class Fleets:
    """The session's Ray fleet, deployed on first use on the Ray cluster connected then, and
    replaced when a test asks for other marker arguments (one fleet at a time: they would share
    Serve's proxies). A test module that brings its own cluster and shuts it down takes the fleet
    with it: it is forgotten when the cluster changes."""

    def __init__(self) -> None:
        self.fleet: Fleet | None = None
        self.key: tuple[str, tuple[tuple[str, Any], ...]] | None = None

    def get(self, options: dict[str, Any]) -> Fleet:
        import ray

        from mocksandbox.serving.fleet import deploy

        cluster = ray.get_runtime_context().gcs_address if ray.is_initialized() else ""
        key = (cluster, tuple(sorted(options.items())))
        if self.fleet is not None and self.key == key:
            return self.fleet
        if self.fleet is not None:
            if self.key is not None and self.key[0] == cluster:
                self.fleet.stop()
            self.fleet = None  # (on another cluster: gone with it)
        fleet = deploy(**{"replicas": 2, "port": 0, "name": "mocksandbox-fixture", **options})
        self.fleet, self.key = fleet, (ray.get_runtime_context().gcs_address, key[1])
        return fleet

    def close(self) -> None:
        import ray

        if self.fleet is None or self.key is None or not ray.is_initialized():
            return
        if ray.get_runtime_context().gcs_address == self.key[0]:  # (else: gone with its cluster)
            self.fleet.stop()
        self.fleet = self.key = None
