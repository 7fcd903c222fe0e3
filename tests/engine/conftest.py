"""Fixtures for engine tests: a real engine whose temp dirs live in a directory we can inspect."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mocksandbox.core import MockSandbox
from mocksandbox.execution.budget import MemoryBudget, ProcessBudget
from mocksandbox.execution.confinement import CgroupConfinement, Confinement
from mocksandbox.execution.engine import ExecutionEngine, create_engine
from mocksandbox.execution.launcher import Launcher
from mocksandbox.execution.world import lite_unavailable_reason
from mocksandbox.settings import Settings, load_settings


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(
    scope="module",
    params=[
        ("cgroup", "fork", "lite"),
        ("cgroup", "spawn", "lite"),
        ("cgroup", "fork", "none"),
        ("cgroup", "spawn", "none"),
        ("process-group", "fork", "none"),
        # A world with no cgroup (a cgroup v2 host without delegation): rlimits bound its runs.
        ("process-group", "fork", "lite"),
    ],
    ids=lambda p: "-".join(p),
)
def sandbox(request: pytest.FixtureRequest, runs_dir: Path) -> Iterator[MockSandbox]:
    """The real engine under each confinement this host offers, in both execution modes, with
    and without a world of its own per run (isolation lite where this host allows it)."""
    mode, exec_mode, isolation = request.param
    if mode == "cgroup" and not CgroupConfinement.available():
        pytest.skip("cgroup v1 pids/memory/freezer controllers are not writable here")
    if isolation == "lite" and (reason := lite_unavailable_reason()) is not None:
        pytest.skip(reason)
    overrides = {
        "tmp_root": str(runs_dir),
        "confinement": mode,
        "exec_mode": exec_mode,
        "isolation": isolation,
    }
    box = MockSandbox.create(load_settings(overrides=overrides))
    assert box.confinement.name == mode
    assert box.engine.isolation.mode == isolation
    yield box
    box.close()


@pytest.fixture(scope="module", params=["fork", "spawn"])
def lite_sandbox(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MockSandbox]:
    """A real engine under isolation lite (skipped where this host gives none), in each execution
    mode, one per test module: runs one after another go to one relay (the launcher hands out the
    last one given back)."""
    if (reason := lite_unavailable_reason()) is not None:
        pytest.skip(reason)
    overrides = {
        "tmp_root": str(tmp_path_factory.mktemp("runs")),
        "exec_mode": request.param,
        "isolation": "lite",
    }
    box = MockSandbox.create(load_settings(overrides=overrides))
    yield box
    box.close()


@pytest.fixture
def budgeted_engine(tmp_path: Path) -> Iterator[Callable[..., ExecutionEngine]]:
    """Make real engines under cgroup confinement with the budgets given (``create_engine``, as the
    server makes its own); each is closed after the test."""
    if not CgroupConfinement.available():
        pytest.skip("cgroup v1 pids/memory/freezer controllers are not writable here")
    made: list[tuple[ExecutionEngine, Confinement, Launcher]] = []

    def make(
        process_budget: ProcessBudget | None = None,
        memory_budget: MemoryBudget | None = None,
        exec_mode: str = "fork",
        isolation: str = "auto",
    ) -> ExecutionEngine:
        settings = Settings(
            tmp_root=str(tmp_path),
            exec_mode=exec_mode,  # type: ignore[arg-type]
            confinement="cgroup",
            isolation=isolation,  # type: ignore[arg-type]
        )
        engine, confinement, launcher = create_engine(settings, process_budget, memory_budget)
        made.append((engine, confinement, launcher))
        return engine

    yield make
    for engine, confinement, launcher in made:
        launcher.close()
        engine.close()
        confinement.close()
