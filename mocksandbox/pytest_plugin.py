"""pytest plugin: a real mock SandboxFusion server per test session (per xdist worker).

Registered through the ``pytest11`` entry point; importing it does nothing but define fixtures.

Fixtures
--------
``mocksandbox_url``
    Base URL (``http://127.0.0.1:<port>``) of a real server on a free loopback port, one per
    session (so one per xdist worker). Reachable from threads, subprocesses and Ray actors.
``mocksandbox``
    A :class:`MockSandboxHandle` for the current test: faults, journal, stats, capacity. Its state
    is reset at the *start* of every test; exceptions raised inside the server while the test ran
    are re-raised at its end.
``mocksandbox_env``
    Points ``SANDBOX_FUSION_URL`` (the full ``/run_code`` URL, as verl's tests read it) and
    ``SANDBOX_FUSION_ENDPOINT`` (the base URL, as the ``sandbox-fusion`` client reads it) at the
    server for the test's duration.
``mocksandbox_inprocess``
    No sockets: routes ``requests`` calls for ``http://mocksandbox.test`` into the app with the
    ``responses`` library. It cannot be reached from other processes, and only code that uses
    ``requests`` sees it.

Markers
-------
``@pytest.mark.mocksandbox_faults(rule, ...)``
    Fault rules (dicts, as in a fault file) active for one test.
``@pytest.mark.mocksandbox_capacity(max_in_flight=3, overload="reject")``
    A server-side concurrency cap for one test.
``@pytest.mark.mocksandbox_cassette("cassettes/x.jsonl", mode="strict")``
    The test's server answers from a cassette (``mocksandbox record``; path relative to the test
    file); ``mode`` ``fallback`` runs unmatched requests, ``prefer-local`` replays only languages
    this host lacks (see :mod:`mocksandbox.recording.replay`).
``@pytest.mark.mocksandbox_output_mode("sandboxfusion", **match)``
    The test's requests (those ``match`` accepts, as a fault rule's matcher does) get
    SandboxFusion's output behaviour: a program that writes more than ~128 KiB to a stream stalls
    and ends at ``run_timeout`` as there (see :mod:`mocksandbox.divergence`).
``@pytest.mark.mocksandbox_fail_on_divergence``
    The test fails if the mock answered one of its requests where SandboxFusion would have
    answered differently (as ``--mocksandbox-fail-on-divergence`` does for every test).
``@pytest.mark.mocksandbox_workers(2)``
    The test's ``mocksandbox`` handle is a server of N worker processes over one control state
    (``serve --workers N``), started once per session (and xdist worker) for each N asked for.
``mocksandbox_fleet`` and ``@pytest.mark.mocksandbox_fleet(replicas=3)``
    A :class:`MockSandboxHandle` for a Ray Serve fleet of the mock (``serve --ray``, see
    :mod:`mocksandbox.serving.fleet`) on the Ray cluster this process is connected to (a local one is
    started if none is), reset at the start of the test like ``mocksandbox``. One fleet per
    session and set of marker arguments (``replicas``, default 2, and other ``deploy`` options);
    needs ``mocksandbox[fleet]``.

Options
-------
``--mocksandbox-config FILE`` (or the ``mocksandbox_config`` ini value): settings for the server.
``--mocksandbox-workers N`` (or ini ``mocksandbox_workers``): worker processes behind the
``mocksandbox`` handle of every test without the marker (default 1: one in-process server).
``--mocksandbox-record URL``: marked tests talk to the live deployment at URL through a recorder
that re-records their cassettes (xdist-safe; see :mod:`mocksandbox.recording.pytest_support`).
``--mocksandbox-fail-on-divergence`` (or ini ``mocksandbox_fail_on_divergence = true``): a test
fails when the mock answered one of its requests where SandboxFusion would have answered
differently. Without it, those divergences are listed in the summary, test by test.
``--mocksandbox-export-env`` (or ini ``mocksandbox_export_env = true``): start the server when
pytest starts (in each xdist worker) and export ``SANDBOX_FUSION_URL`` / ``SANDBOX_FUSION_ENDPOINT``
before collection, so that suites which skip at import time without a live sandbox URL run.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mocksandbox.core import MockSandbox
    from mocksandbox.faults import FaultRule
    from mocksandbox.journal import JournalEntry
    from mocksandbox.serving.fleet import Fleet
    from mocksandbox.serving.single import ServerThread
    from mocksandbox.serving.workers import PoolControl

INPROCESS_BASE_URL = "http://mocksandbox.test"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mocksandbox", "mock SandboxFusion server")
    group.addoption(
        "--mocksandbox-config",
        metavar="FILE",
        default=None,
        help="settings file (.toml/.yaml/.json) for the mocksandbox server started by the fixtures",
    )
    parser.addini("mocksandbox_config", "settings file for the mocksandbox fixtures' server", default="")
    group.addoption(
        "--mocksandbox-workers",
        metavar="N",
        type=int,
        default=None,
        help="worker processes behind the mocksandbox fixture's server (default 1)",
    )
    parser.addini("mocksandbox_workers", "worker processes behind the mocksandbox fixture", default="1")
    group.addoption(
        "--mocksandbox-record",
        metavar="URL",
        default=None,
        help="re-record the cassettes of mocksandbox_cassette tests against the deployment at URL",
    )
    group.addoption(
        "--mocksandbox-fail-on-divergence",
        action="store_true",
        default=None,
        help="fail a test whose requests the mock answered where SandboxFusion would have answered "
        "differently (they are listed in the summary either way)",
    )
    parser.addini(
        "mocksandbox_fail_on_divergence",
        "fail tests on divergences from SandboxFusion",
        type="bool",
        default=False,
    )
    group.addoption(
        "--mocksandbox-require-isolation",
        action="store_true",
        default=None,
        help="make it an error (not a warning and a note beside every answer) when the fixtures' server "
        "could not give its runs a protection isolation auto asked for (a world, a non-root uid, seccomp)",
    )
    parser.addini(
        "mocksandbox_require_isolation",
        "error when the fixtures' server falls back from a protection of its runs",
        type="bool",
        default=False,
    )
    group.addoption(
        "--mocksandbox-export-env",
        action="store_true",
        default=None,
        help="start the mock server at start-up and export SANDBOX_FUSION_URL before collection",
    )
    parser.addini(
        "mocksandbox_export_env", "export SANDBOX_FUSION_URL before collection", type="bool", default=False
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "mocksandbox_faults(*rules): fault rules active for this test")
    config.addinivalue_line(
        "markers", "mocksandbox_capacity(**policy): server-side concurrency cap for this test"
    )
    config.addinivalue_line(
        "markers", "mocksandbox_workers(n): serve this test's mocksandbox from n worker processes"
    )
    config.addinivalue_line(
        "markers",
        "mocksandbox_output_mode(mode='sandboxfusion', **match): this test's requests get "
        "SandboxFusion's output behaviour (a program past ~128 KiB of output stalls)",
    )
    config.addinivalue_line(
        "markers",
        "mocksandbox_fail_on_divergence: fail if the mock answered a request of this test where "
        "SandboxFusion would have answered differently",
    )
    config.addinivalue_line(
        "markers", "mocksandbox_fleet(replicas=2, **deploy): the Ray Serve fleet behind mocksandbox_fleet"
    )
    config.addinivalue_line(
        "markers",
        "mocksandbox_cassette(path, mode='strict', timing=False, redact=()): answer this test's "
        "requests from a cassette (--mocksandbox-record URL re-records it)",
    )
    config.pluginmanager.register(_DivergenceSummary(), "mocksandbox-divergences")
    export = config.getoption("--mocksandbox-export-env") or config.getini("mocksandbox_export_env")
    is_xdist_controller = bool(getattr(config.option, "numprocesses", None)) and not hasattr(
        config, "workerinput"
    )
    if export and not is_xdist_controller:
        early = _EarlyServer(config)
        config.stash[_EARLY_SERVER] = early
        os.environ["SANDBOX_FUSION_URL"] = f"{early.server.url}/run_code"
        os.environ["SANDBOX_FUSION_ENDPOINT"] = early.server.url


def pytest_unconfigure(config: pytest.Config) -> None:
    early = config.stash.get(_EARLY_SERVER, None)
    if early is not None:
        early.close()
        del config.stash[_EARLY_SERVER]


class _EarlyServer:
    """The session's sandbox and server, started before collection for ``--mocksandbox-export-env``."""

    def __init__(self, config: pytest.Config) -> None:
        from mocksandbox.core import MockSandbox
        from mocksandbox.serving.single import ServerThread
        from mocksandbox.settings import load_settings

        settings = load_settings(_settings_file(config), overrides={"host": "127.0.0.1", "port": 0})
        self.sandbox = MockSandbox.create(settings)
        _hold_to_required_isolation(config, self.sandbox)
        self.server = ServerThread(self.sandbox, "127.0.0.1", 0).start()

    def close(self) -> None:
        self.server.stop()
        self.sandbox.close()


_EARLY_SERVER = pytest.StashKey["_EarlyServer"]()
#: What held for the runs of this process's session sandbox (DESIGN seam 10), once one was made.
_PROTECTIONS = pytest.StashKey[str]()


def _protections_line(sandbox: MockSandbox) -> str:
    from mocksandbox.execution.protections import protections, summary

    return summary(protections(sandbox.engine.isolation, sandbox.confinement))


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


def pytest_report_header(config: pytest.Config) -> list[str]:
    """What holds for runs here, when the server was started before collection (otherwise the
    summary says it once the first fixture has started one: nothing is started for a header)."""
    early = config.stash.get(_EARLY_SERVER, None)
    return [] if early is None else [f"mocksandbox protections: {_protections_line(early.sandbox)}"]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    line = config.stash.get(_PROTECTIONS, None)
    if line is not None:
        terminalreporter.section("mocksandbox: what held for the runs of this session's server")
        terminalreporter.write_line(line)


class MockSandboxHandle:
    """What a test holds: the sandbox's state and helpers to shape and inspect it."""

    def __init__(self, sandbox: MockSandbox | PoolControl | Fleet, url: str) -> None:
        #: The sandbox behind the server (a :class:`~mocksandbox.serving.workers.PoolControl` for workers,
        #: a :class:`~mocksandbox.serving.fleet.Fleet` for a Ray fleet).
        self.sandbox = sandbox
        #: Base URL of the server (``http://127.0.0.1:<port>``).
        self.url = url

    @property
    def run_code_url(self) -> str:
        return f"{self.url}/run_code"

    # -- faults ------------------------------------------------------------------------------

    def add_fault(self, spec: dict[str, Any] | None = None, **parts: Any) -> FaultRule:
        """Add a fault rule (see :mod:`mocksandbox.faults`)."""
        return self.sandbox.add_fault(spec, **parts)

    def fail(
        self, status: int, path: str | None = "/run_code", retry_after: float | None = None, **schedule: Any
    ) -> FaultRule:
        """Answer ``status`` (e.g. 429, 500, 504) on matching requests, per ``schedule``."""
        action: dict[str, Any] = {"type": "status", "status": status}
        if retry_after is not None:
            action["retry_after"] = retry_after
        return self.add_fault(match={"path": path}, action=action, schedule=schedule)

    def delay(self, seconds: float, path: str | None = "/run_code", **schedule: Any) -> FaultRule:
        """Hold matching requests for ``seconds`` before serving them."""
        return self.add_fault(
            match={"path": path}, action={"type": "delay", "seconds": seconds}, schedule=schedule
        )

    def drop(self, mode: str = "reset", path: str | None = "/run_code", **schedule: Any) -> FaultRule:
        """Drop matching connections without an answer (``reset`` or ``close``)."""
        return self.add_fault(match={"path": path}, action={"type": mode}, schedule=schedule)

    def sandbox_error(
        self, message: str | None = None, path: str | None = "/run_code", **schedule: Any
    ) -> FaultRule:
        """Answer 200 with ``status: SandboxError`` on matching requests."""
        action: dict[str, Any] = {"type": "sandbox_error"}
        if message is not None:
            action["message"] = message
        return self.add_fault(match={"path": path}, action=action, schedule=schedule)

    def output_mode(self, mode: str = "sandboxfusion", **match: Any) -> FaultRule:
        """Serve matching requests (all, by default) with this output mode: ``sandboxfusion`` for
        SandboxFusion's stalling reader, ``complete`` for the mock's (see
        :mod:`mocksandbox.divergence`)."""
        return self.add_fault(match=match, action={"type": "output_mode", "mode": mode})

    def clear_faults(self) -> None:
        self.sandbox.clear_faults()

    # -- capacity, journal, stats --------------------------------------------------------------

    def set_capacity(self, **policy: Any) -> None:
        """Server-side cap: ``max_in_flight``, ``overload`` (reject/queue), ``queue_timeout_s``, ..."""
        self.sandbox.set_capacity(**policy)

    def requests(self, **filters: Any) -> list[JournalEntry]:
        """Journal entries matching ``path``, ``method``, ``language`` and/or ``status``."""
        return self.sandbox.requests(**filters)

    def assert_requests(self, count: int, **filters: Any) -> list[JournalEntry]:
        """Assert exactly ``count`` matching requests; the failure shows the nearest calls."""
        return self.sandbox.assert_requests(count, **filters)

    def stats(self) -> dict[str, Any]:
        return self.sandbox.stats()

    def divergences(self) -> list[JournalEntry]:
        """The journal entries (since the test began) that SandboxFusion would have answered
        differently, each with its ``divergences`` notes."""
        return [entry for entry in self.sandbox.requests() if entry.divergences]

    def reset(self) -> None:
        self.sandbox.reset()


def _settings_file(config: pytest.Config) -> str | None:
    value = config.getoption("--mocksandbox-config") or config.getini("mocksandbox_config")
    return str(value) if value else None


@pytest.fixture(scope="session")
def mocksandbox_core(pytestconfig: pytest.Config) -> Iterator[MockSandbox]:
    """The session's :class:`~mocksandbox.core.MockSandbox` (engine, faults, journal)."""
    early = pytestconfig.stash.get(_EARLY_SERVER, None)
    if early is not None:
        yield early.sandbox
        return
    from mocksandbox.core import MockSandbox
    from mocksandbox.settings import load_settings

    settings = load_settings(_settings_file(pytestconfig), overrides={"host": "127.0.0.1", "port": 0})
    box = MockSandbox.create(settings)
    _hold_to_required_isolation(pytestconfig, box)
    pytestconfig.stash[_PROTECTIONS] = _protections_line(box)
    yield box
    box.close()


@pytest.fixture(scope="session")
def mocksandbox_server(mocksandbox_core: MockSandbox, pytestconfig: pytest.Config) -> Iterator[ServerThread]:
    """A real server for the session's sandbox on a free loopback port."""
    early = pytestconfig.stash.get(_EARLY_SERVER, None)
    if early is not None:
        yield early.server
        return
    from mocksandbox.serving.single import ServerThread

    server = ServerThread(mocksandbox_core, "127.0.0.1", 0).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mocksandbox_url(mocksandbox_server: ServerThread) -> str:
    """Base URL of the session's server."""
    return mocksandbox_server.url


def _prepare(box: MockSandbox | PoolControl | Fleet, node: pytest.Item) -> None:
    # Reset at the start: another fixture's teardown may still have sent requests after the last test.
    box.wait_idle()
    box.reset()
    for marker in node.iter_markers("mocksandbox_faults"):
        for rule in marker.args:
            box.add_fault(rule)
    for marker in node.iter_markers("mocksandbox_capacity"):
        box.set_capacity(**marker.kwargs)
    for marker in node.iter_markers("mocksandbox_output_mode"):
        mode = marker.args[0] if marker.args else marker.kwargs.get("mode", "sandboxfusion")
        match = {k: v for k, v in marker.kwargs.items() if k != "mode"}
        box.add_fault({"match": match, "action": {"type": "output_mode", "mode": mode}})
    if node.get_closest_marker("mocksandbox_cassette") is not None:
        from mocksandbox.recording.pytest_support import use_cassette

        use_cassette(box, node)


def _reraise_server_errors(box: MockSandbox | PoolControl | Fleet) -> None:
    errors = box.take_errors()
    if errors:
        first = errors[0]
        first.exception.add_note(
            f"raised inside the mocksandbox server while serving {first.path}"
            + (f" ({len(errors) - 1} more server error(s))" if len(errors) > 1 else "")
        )
        raise first.exception


class _WorkerPools:
    """Multi-worker servers of the session, one per worker count asked for, started on first use."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.pools: dict[int, PoolControl] = {}

    def get(self, workers: int) -> PoolControl:
        if workers not in self.pools:
            from mocksandbox.serving.workers import PoolControl, WorkerPool
            from mocksandbox.settings import load_settings

            settings = load_settings(
                _settings_file(self.config), overrides={"host": "127.0.0.1", "port": 0, "workers": workers}
            )
            self.pools[workers] = PoolControl(WorkerPool(settings, workers)).start()
        return self.pools[workers]

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()


@pytest.fixture(scope="session")
def _mocksandbox_worker_pools(pytestconfig: pytest.Config) -> Iterator[_WorkerPools]:
    pools = _WorkerPools(pytestconfig)
    yield pools
    pools.close()


def _workers_for(node: pytest.Item, config: pytest.Config) -> int:
    marker = node.get_closest_marker("mocksandbox_workers")
    if marker is not None:
        return int(marker.args[0] if marker.args else marker.kwargs.get("n", 1))
    option = config.getoption("--mocksandbox-workers")
    return int(option if option is not None else config.getini("mocksandbox_workers") or 1)


@pytest.fixture
def mocksandbox(request: pytest.FixtureRequest) -> Iterator[MockSandboxHandle]:
    """The session's server, reset for this test, as a :class:`MockSandboxHandle` (with
    ``mocksandbox_workers(n)`` or ``--mocksandbox-workers n``: a server of n worker processes)."""
    workers = _workers_for(request.node, request.config)
    box: MockSandbox | PoolControl
    if workers > 1:
        pool: PoolControl = request.getfixturevalue("_mocksandbox_worker_pools").get(workers)
        box, url = pool, pool.url
    else:
        server: ServerThread = request.getfixturevalue("mocksandbox_server")
        box, url = server.sandbox, server.url
    _prepare(box, request.node)
    yield MockSandboxHandle(box, url)
    _reraise_server_errors(box)


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
    from mocksandbox.web.inprocess import route_requests_to

    _prepare(mocksandbox_core, request.node)
    with route_requests_to(mocksandbox_core, INPROCESS_BASE_URL):
        yield MockSandboxHandle(mocksandbox_core, INPROCESS_BASE_URL)
    _reraise_server_errors(mocksandbox_core)


class _Fleets:
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


@pytest.fixture(scope="session")
def _mocksandbox_fleets() -> Iterator[_Fleets]:
    fleets = _Fleets()
    yield fleets
    fleets.close()


@pytest.fixture
def mocksandbox_fleet(request: pytest.FixtureRequest) -> Iterator[MockSandboxHandle]:
    """A Ray Serve fleet of the mock (``@pytest.mark.mocksandbox_fleet(replicas=3)``), reset for
    this test, as a :class:`MockSandboxHandle`; ``handle.sandbox`` is the
    :class:`~mocksandbox.serving.fleet.Fleet` (replicas, their nodes,
    :meth:`~mocksandbox.serving.fleet.Fleet.stop`)."""
    from mocksandbox.extras import MissingExtraError
    from mocksandbox.serving.fleet import require_fleet_extra

    try:
        require_fleet_extra()
    except MissingExtraError as exc:
        pytest.skip(str(exc))
    marker = request.node.get_closest_marker("mocksandbox_fleet")
    options = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and marker.args:
        options["replicas"] = int(marker.args[0])
    fleet = request.getfixturevalue("_mocksandbox_fleets").get(options)
    _prepare(fleet, request.node)
    yield MockSandboxHandle(fleet, fleet.url)
    _reraise_server_errors(fleet)


# -- where SandboxFusion would have answered differently (mocksandbox.divergence) --------------------

#: The report's user property holding a test's divergences: ``[(entry summary, [note, ...]), ...]``
#: (a user property, so that xdist brings it from the worker to the summary).
DIVERGENCE_PROPERTY = "mocksandbox_divergences"
_DIVERGED = pytest.StashKey[list[tuple[str, list[str]]]]()


def _remember_divergences(item: pytest.Item) -> list[tuple[str, list[str]]]:
    """The divergences of the requests the test's ``mocksandbox`` handles served (their journals
    were reset when the test began), kept on the item for its report."""
    diverged: list[tuple[str, list[str]]] = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, MockSandboxHandle):
            try:
                entries = value.divergences()
            except Exception:  # the server is gone (the test's own doing): nothing to report
                continue
            diverged += [(entry.summary(), list(entry.divergences)) for entry in entries]
    item.stash[_DIVERGED] = diverged
    return diverged


def _fails_on_divergence(item: pytest.Item) -> bool:
    config = item.config
    return bool(
        item.get_closest_marker("mocksandbox_fail_on_divergence") is not None
        or config.getoption("--mocksandbox-fail-on-divergence")
        or config.getini("mocksandbox_fail_on_divergence")
    )


def _describe_divergences(diverged: list[tuple[str, list[str]]]) -> str:
    lines = ["the mock answered where SandboxFusion would have answered differently:"]
    for summary, notes in diverged:
        lines.append(f"  {summary}")
        lines += [f"    {note}" for note in notes]
    return "\n".join(lines)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    try:
        result = yield
    except BaseException:
        _remember_divergences(item)
        raise
    diverged = _remember_divergences(item)
    if diverged and _fails_on_divergence(item):
        pytest.fail(_describe_divergences(diverged), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.when == "call":
        diverged = item.stash.get(_DIVERGED, None)
        if diverged:
            report.user_properties.append((DIVERGENCE_PROPERTY, diverged))
    return report


class _DivergenceSummary:
    """Collects the divergences of every test's report (from xdist workers too) for the summary."""

    def __init__(self) -> None:
        self.tests: list[tuple[str, list[tuple[str, list[str]]]]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == DIVERGENCE_PROPERTY and isinstance(value, list | tuple):
                self.tests.append((report.nodeid, [(str(s), [str(n) for n in notes]) for s, notes in value]))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.tests:
            return
        terminalreporter.section("mocksandbox: where SandboxFusion would have answered differently")
        for nodeid, diverged in self.tests:
            terminalreporter.write_line(nodeid)
            for summary, notes in diverged:
                terminalreporter.write_line(f"  {summary}")
                for note in notes:
                    terminalreporter.write_line(f"    {note}")
        terminalreporter.write_line(
            "(--mocksandbox-fail-on-divergence or @pytest.mark.mocksandbox_fail_on_divergence makes "
            "these failures; @pytest.mark.mocksandbox_output_mode('sandboxfusion') answers as "
            "SandboxFusion would)"
        )
