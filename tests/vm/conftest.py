"""The cgroup v2 guest's tests (``test_cgroup2_guest.py``, harness in ``cg2vm.py``): collected only
when asked for, by path (``pytest tests/vm``) or with ``MOCKSANDBOX_CG2VM=1``, because a guest under
software emulation takes minutes (``make test``'s own run leaves them to a pytest run of their own).

Each test the guest runs is a test here: ``test_in_guest[<suite>/<guest node id>]``, listed by
collecting the guest's selection on this side (cached by the test files' contents). The guest's
timings and memory are printed at the end of the run (section "cgroup v2 guest").
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cg2vm import SUITES, collect_cached, select, unavailable_reason

HERE = Path(__file__).resolve().parent


def _asked_for(config: pytest.Config) -> bool:
    if os.environ.get("MOCKSANDBOX_CG2VM") == "1":
        return True
    base = config.invocation_params.dir
    for arg in config.args:
        path = (base / arg.split("::", 1)[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.name == "test_cgroup2_guest.py" and not _asked_for(config):
        return True
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``suite``: each shape; ``guest_test``: each (shape, guest node id). Where the guest cannot be
    made, one ``guest_test`` per shape (which skips, or fails in CI, saying why)."""
    if "suite" in metafunc.fixturenames:
        metafunc.parametrize("suite", [s.name for s in SUITES])
    if "guest_test" in metafunc.fixturenames:
        params = []
        available = unavailable_reason(os.environ.get("CG2VM_ROOT", "ext4")) is None
        for suite in SUITES:
            if not available:
                params.append(pytest.param((suite.name, None), id=f"{suite.name}/all"))
                continue
            try:
                chosen = select(suite, collect_cached(suite.files, getattr(metafunc.config, "cache", None)))
            except Exception as error:  # a test file that does not collect: one failing test says so
                params.append(pytest.param((suite.name, f"!{error}"), id=f"{suite.name}/collection"))
                continue
            params += [pytest.param((suite.name, nodeid), id=f"{suite.name}/{nodeid}") for nodeid in chosen]
        metafunc.parametrize("guest_test", params)


#: Facts of each guest boot, gathered from the reports (they come from xdist's workers too).
_FACTS: dict[str, dict[str, object]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == "cg2vm":
            facts = json.loads(str(value))
            _FACTS[str(facts["suite"])] = facts


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _FACTS:
        return
    terminalreporter.section("cgroup v2 guest")
    for suite, facts in _FACTS.items():
        terminalreporter.write_line(
            f"{suite}: " + ", ".join(f"{k}: {v}" for k, v in facts.items() if k != "suite")
        )
