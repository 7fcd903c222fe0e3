"""The contract suite: checks a SandboxFusion (or swedev) deployment over HTTP only.

    pytest contract_tests --sandbox-url http://127.0.0.1:8080
    pytest contract_tests                       # starts the mock itself (`mocksandbox serve`)
    mocksandbox contract --url URL [--junit FILE]

Nothing here imports mocksandbox: without a URL the mock is started as a separate process, as a
user would start it. Capabilities (endpoints, languages, the mock's extras) are detected, and a
missing optional capability is a skip with its reason, never a failure.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contract_support import Target
from hypothesis import HealthCheck, settings

AREAS = {
    "test_protocol": "protocol & errors",
    "test_run_code": "run_code",
    "test_compiled": "compiled languages",
    "test_languages": "languages",
    "test_limits": "limits",
    "test_properties": "generated programs",
    "test_jupyter": "run_jupyter",
    "test_datasets": "datasets",
    "test_swedev": "swedev",
    "test_mock_extras": "mock extras",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("contract", "SandboxFusion contract suite")
    group.addoption(
        "--sandbox-url", default=os.environ.get("CONTRACT_SANDBOX_URL"), help="base URL of the target"
    )
    group.addoption(
        "--contract-thorough",
        action="store_true",
        default=False,
        help="many more generated programs per property (slow)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # Generated programs: few and fixed in CI, many and random with --contract-thorough.
    thorough = config.getoption("--contract-thorough")
    settings.register_profile(
        "contract",
        max_examples=200 if thorough else 8,
        derandomize=not thorough,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    settings.load_profile("contract")
    config.addinivalue_line("markers", "mock_only: about the mock's extras; skipped against other targets")
    config.addinivalue_line("markers", "needs_endpoint(path): skipped when the target lacks this endpoint")
    config.addinivalue_line("markers", "needs_language(name): skipped when the target cannot run it")
    config.addinivalue_line(
        "markers", "needs_jupyter_kernel: skipped when the target's /run_jupyter has no kernel side installed"
    )


def _start_mock() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "mocksandbox.cli", "serve", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"serving on (http://\S+)", line)
    if not match:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise RuntimeError(f"could not start the mock: {line!r} {err}")
    return proc, match.group(1)


@pytest.fixture(scope="session")
def target(pytestconfig: pytest.Config) -> Iterator[Target]:
    """The deployment under test (started here when no URL was given)."""
    url = pytestconfig.getoption("--sandbox-url")
    proc = None
    if not url:
        proc, url = _start_mock()
    target = Target(url.rstrip("/"))
    deadline = time.monotonic() + 120
    while not target.is_up():
        if time.monotonic() > deadline:
            raise RuntimeError(f'{url}/v1/ping did not answer "pong" within 120 s')
        time.sleep(0.5)
    yield target
    target.close()
    if proc is not None:
        proc.send_signal(signal.SIGINT)
        try:
            _, said = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return
        # A fault of a relay (not of a run's program) is the mock's: it must not pass unseen.
        faults = [line for line in (said or "").splitlines() if line.startswith("mocksandbox relay ")]
        assert not faults, "the mock's relays said:\n" + "\n".join(faults)


@pytest.fixture(autouse=True)
def _capabilities(request: pytest.FixtureRequest) -> None:
    """Skip, with the reason, what the target cannot do."""
    markers = list(request.node.iter_markers())
    if not any(
        m.name in ("mock_only", "needs_endpoint", "needs_language", "needs_jupyter_kernel") for m in markers
    ):
        return
    target: Target = request.getfixturevalue("target")
    for marker in markers:
        if marker.name == "mock_only" and not target.is_mock():
            pytest.skip("about mocksandbox's extras (/_mock/...): the target is not a mocksandbox")
        if marker.name == "needs_endpoint":
            path = marker.args[0]
            if not target.has_endpoint(path):
                pytest.skip(f"the target has no {path} endpoint")
        if marker.name == "needs_language":
            language = marker.args[0]
            reason = target.cannot_run(language)
            if reason:
                pytest.skip(f"the target cannot run {language}: {reason}")
        if marker.name == "needs_jupyter_kernel" and target.has_endpoint("/run_jupyter"):
            reason = target.cannot_run_jupyter()
            if reason:
                pytest.skip(f"/run_jupyter: {reason}")


def _area(nodeid: str) -> str:
    module = Path(nodeid.split("::", 1)[0]).stem
    return AREAS.get(module, module)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """A readable summary at the end: passed, failed and skipped per area, and why things were skipped."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    reasons: dict[str, set[str]] = defaultdict(set)
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            if not nodeid or (outcome == "passed" and report.when != "call"):
                continue
            area = _area(nodeid)
            counts[area][outcome] += 1
            if outcome == "skipped" and isinstance(report.longrepr, tuple):
                reasons[area].add(str(report.longrepr[2]).removeprefix("Skipped: "))
    if not counts:
        return
    write = terminalreporter.write_line
    terminalreporter.section("contract summary")
    write(f"{'area':<22}{'passed':>8}{'failed':>8}{'skipped':>9}")
    for area in sorted(counts):
        c = counts[area]
        write(f"{area:<22}{c['passed']:>8}{c['failed'] + c['error']:>8}{c['skipped']:>9}")
    for area in sorted(reasons):
        for reason in sorted(reasons[area]):
            write(f"  skipped in {area}: {reason}")
