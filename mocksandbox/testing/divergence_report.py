"""Where SandboxFusion would have answered a test's requests differently (:mod:`mocksandbox.divergence`):
kept on the test's report, failing the test where it asks to, and listed in the run's summary.

:class:`DivergenceReport` holds the hooks that do it; the plugin registers one at configure time.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from mocksandbox.testing.handle import MockSandboxHandle

#: The report's user property holding a test's divergences: ``[(entry summary, [note, ...]), ...]``
#: (a user property, so that xdist brings it from the worker to the summary).
DIVERGENCE_PROPERTY = "mocksandbox_divergences"
_DIVERGED = pytest.StashKey[list[tuple[str, list[str]]]]()


class DivergenceReport:
    """The plugin's divergence hooks: a test's divergences go on its report of the call (and fail it
    with the marker or option), and every test's (from xdist workers too) into the run's summary."""

    def __init__(self) -> None:
        self.tests: list[tuple[str, list[tuple[str, list[str]]]]] = []

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
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
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.when == "call":
            diverged = item.stash.get(_DIVERGED, None)
            if diverged:
                report.user_properties.append((DIVERGENCE_PROPERTY, diverged))
        return report

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
