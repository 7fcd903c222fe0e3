"""A pytest plugin for the guest's side of ``tests/vm``: it writes every test report of the guest's
pytest run as a line of JSON to ``$CG2VM_REPORT`` (a file in the dir the host shares read-write), so
that the host's pytest run can give each guest test a result of its own (``cg2vm.py``).

It also gives a host shape its ``systemd`` unit: with ``CG2VM_UNIT_PARENT`` set (e.g.
``/sys/fs/cgroup/system.slice``), every server a host-shape test starts (and the ``doctor`` it runs)
is started alone (without the ``unshare`` and shell of its host shape) in a fresh cgroup
``<parent>/mocksandbox-test-<n>.service``, whose ancestors hand the controllers down and whose own
``cgroup.subtree_control`` is left empty: what ``systemd`` gives a unit with ``Delegate=yes``. (The
test runner itself sits in a sibling unit, as a CI job would.)

Loaded by ``cg2vm_guest.py`` with ``pytest.main(plugins=[...])``: nothing here runs on the host.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

#: How much of a failure's text is kept per report (the host shows it as the test's failure).
LONGREPR_CHARS = 30_000


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


class GuestReport:
    """Writes collection, each report and the session's end to ``path``, one JSON object a line,
    flushed at once (a guest that dies mid-run still leaves what ran)."""

    def __init__(self, path: str) -> None:
        self._out = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the session)
        self._write({"event": "start", "uptime": _uptime(), "time": time.time()})

    def _write(self, record: dict[str, Any]) -> None:
        self._out.write(json.dumps(record) + "\n")
        self._out.flush()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        nodeids = [item.nodeid for item in session.items]
        self._write({"event": "collected", "uptime": _uptime(), "nodeids": nodeids})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        reason = None
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        self._write(
            {
                "event": "report",
                "nodeid": report.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "duration": round(report.duration, 3),
                "skip_reason": reason,
                "wasxfail": getattr(report, "wasxfail", None),
                "longrepr": report.longreprtext[-LONGREPR_CHARS:] if report.failed else "",
                "uptime": _uptime(),
            }
        )

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self._write({"event": "finish", "uptime": _uptime(), "exitstatus": int(exitstatus)})

    def close(self) -> None:
        self._out.close()


class DelegatedUnits:
    """Starts each host-shape server (and ``doctor``) alone in a unit cgroup of its own, as
    ``systemd`` starts a ``Delegate=yes`` service: by wrapping ``serve_process.shape_command``."""

    def __init__(self, parent: Path, server_tests: Path) -> None:
        self.parent = parent
        self.made: list[Path] = []
        if str(server_tests) not in sys.path:
            sys.path.insert(0, str(server_tests))
        import serve_process  # tests/server/serve_process.py

        original = serve_process.shape_command

        def in_a_unit(shape: str, command: list[str], home: Path | None = None) -> list[str]:
            # The server alone moves, from inside the shape's PID namespace (``$$`` is read there):
            # ``unshare --fork`` and a PID 1 shell stay where the test runner is, as systemd's
            # ExecStart would be the server itself.
            unit = self.new_unit()
            script = 'mkdir "$1" && echo $$ > "$1/cgroup.procs" && shift && exec "$@"'
            wrapped: list[str] = original(shape, ["/bin/sh", "-c", script, "sh", str(unit), *command], home)
            return wrapped

        serve_process.shape_command = in_a_unit

    def new_unit(self) -> Path:
        unit = self.parent / f"mocksandbox-test-{uuid.uuid4().hex[:8]}.service"
        self.made.append(unit)
        return unit

    def remove(self) -> None:
        """Remove each unit's cgroup, as ``systemd`` does when the unit stops; one that the server
        left populated, or with child cgroups, stays (and the guest's leftover check shows it)."""
        for unit in self.made:
            try:
                unit.rmdir()
            except OSError:
                pass


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``CG2VM_HOST_SHAPES`` (e.g. ``root``), only those shapes of test_host_shapes.py run."""
    shapes = os.environ.get("CG2VM_HOST_SHAPES")
    if shapes is None:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        shape = callspec.params.get("shape") if callspec is not None else None
        in_shapes_file = item.nodeid.startswith("tests/server/test_host_shapes.py::")
        (drop if in_shapes_file and shape not in shapes.split() else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


_report: GuestReport | None = None
_units: DelegatedUnits | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _report, _units
    if path := os.environ.get("CG2VM_REPORT"):
        _report = GuestReport(path)
        config.pluginmanager.register(_report, "cg2vm-guest-report")
    if parent := os.environ.get("CG2VM_UNIT_PARENT"):
        _units = DelegatedUnits(Path(parent), config.rootpath / "tests" / "server")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _units is not None:
        _units.remove()
    if _report is not None:
        _report.close()
