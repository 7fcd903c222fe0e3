"""Fixtures for engine tests: a real engine whose temp dirs live in a directory we can inspect."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mocksandbox.core import MockSandbox
from mocksandbox.execution.confinement import CgroupConfinement
from mocksandbox.settings import load_settings


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(
    scope="module",
    params=[("cgroup", "fork"), ("cgroup", "spawn"), ("process-group", "fork")],
    ids=lambda p: "-".join(p),
)
def sandbox(request: pytest.FixtureRequest, runs_dir: Path) -> Iterator[MockSandbox]:
    """The real engine under each confinement this host offers, in both execution modes."""
    mode, exec_mode = request.param
    if mode == "cgroup" and not CgroupConfinement.available():
        pytest.skip("cgroup v1 pids/memory/freezer controllers are not writable here")
    overrides = {"tmp_root": str(runs_dir), "confinement": mode, "exec_mode": exec_mode}
    box = MockSandbox.create(load_settings(overrides=overrides))
    assert box.confinement.name == mode
    yield box
    box.close()
