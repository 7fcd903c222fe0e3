"""Fixtures for engine tests: a real engine whose temp dirs live in a directory we can inspect."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mocksandbox.core import MockSandbox
from mocksandbox.execution import cgroup_v2
from mocksandbox.execution.budget import MemoryBudget, ProcessBudget
from mocksandbox.execution.confinement import CgroupConfinement, Confinement
from mocksandbox.execution.engine import ExecutionEngine, create_engine
from mocksandbox.execution.launcher import Launcher
from mocksandbox.execution.world import lite_unavailable_reason
from mocksandbox.settings import Settings, load_settings


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


#: A root server's runs without idmapped mounts (``idmapped_mounts: off``: what a kernel before 6.3,
#: whose tmpfs refuses them, gives; the relays stay the host's root and each program joins the runs'
#: user namespace): the fixtures' worlds are made that way too, as ``<isolation>-noidmap``. (A server
#: that is not root has no idmapped mounts to turn off.)
NO_IDMAP = "-noidmap"
_AS_ROOT = os.geteuid() == 0


def cgroup_unavailable_reason() -> str | None:
    """Why confinement ``cgroup`` cannot be had here (``None``: it can), as ``create_confinement``
    chooses it: cgroup v1 where its controllers are writable, else cgroup v2 where the server's
    own cgroup is given ``pids`` and ``memory`` and is writable (a pure v2 host: most hosts users
    have, and the cgroup v2 guest of ``tests/vm``). Building the v2 tree proves the rest: a v2
    host whose check passes and whose build fails (a home shared with other processes) fails the
    test, as it would fail the server's start."""
    if CgroupConfinement.available():
        return None
    why_not_v2 = cgroup_v2.unavailable_reason()
    if why_not_v2 is None:
        return None
    return f"no cgroup confinement here: cgroup v1 controllers are not writable, and {why_not_v2}"


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
        *(
            [
                ("cgroup", "fork", "lite" + NO_IDMAP),
                ("cgroup", "spawn", "lite" + NO_IDMAP),
                ("process-group", "fork", "lite" + NO_IDMAP),
            ]
            if _AS_ROOT
            else []
        ),
    ],
    ids=lambda p: "-".join(p),
)
def sandbox(request: pytest.FixtureRequest, runs_dir: Path) -> Iterator[MockSandbox]:
    """The real engine under each confinement this host offers, in both execution modes, with
    and without a world of its own per run (isolation lite where this host allows it; as root,
    with idmapped mounts and without). ``cgroup`` is v1 where its controllers are writable, else
    v2 (:func:`cgroup_unavailable_reason`)."""
    mode, exec_mode, isolation = request.param
    idmapped_mounts = "off" if isolation.endswith(NO_IDMAP) else "auto"
    isolation = isolation.removesuffix(NO_IDMAP)
    if mode == "cgroup" and (why_no_cgroup := cgroup_unavailable_reason()) is not None:
        pytest.skip(why_no_cgroup)
    if isolation == "lite" and (reason := lite_unavailable_reason()) is not None:
        pytest.skip(reason)
    overrides = {
        "tmp_root": str(runs_dir),
        "confinement": mode,
        "exec_mode": exec_mode,
        "isolation": isolation,
        "idmapped_mounts": idmapped_mounts,
    }
    box = MockSandbox.create(load_settings(overrides=overrides))
    assert box.confinement.name == mode
    assert box.engine.isolation.mode == isolation
    assert_idmapped_mounts_as_asked(box, idmapped_mounts)
    yield box
    box.close()


def assert_idmapped_mounts_as_asked(box: MockSandbox, idmapped_mounts: str) -> None:
    """A root server's lite runs are an unprivileged uid either way: without idmapped mounts where
    that was asked for; with ``auto``, with them where the kernel takes them (Linux 6.3 and later,
    on a root file system that takes them), else without, saying what refused them."""
    isolation = box.engine.isolation
    if isolation.mode != "lite" or not _AS_ROOT:
        return
    assert isolation.run_uid is not None, isolation.run_as_reason
    if idmapped_mounts == "off":
        assert isolation.without_idmapped_mounts == "the setting idmapped_mounts is off", isolation
    else:
        assert "idmapped_mounts is off" not in isolation.without_idmapped_mounts, isolation


@pytest.fixture(scope="module", params=["fork", "spawn", *(["fork" + NO_IDMAP] if _AS_ROOT else [])])
def lite_sandbox(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MockSandbox]:
    """A real engine under isolation lite (skipped where this host gives none), in each execution
    mode (as root, also without idmapped mounts), one per test module: runs one after another go
    to one relay (the launcher hands out the last one given back)."""
    if (reason := lite_unavailable_reason()) is not None:
        pytest.skip(reason)
    idmapped_mounts = "off" if request.param.endswith(NO_IDMAP) else "auto"
    overrides = {
        "tmp_root": str(tmp_path_factory.mktemp("runs")),
        "exec_mode": request.param.removesuffix(NO_IDMAP),
        "isolation": "lite",
        "idmapped_mounts": idmapped_mounts,
        # A root kept past its second (runs slowed by a loaded machine) is made again, which tests
        # of what keeps or drops a root would read as dropped.
        "kept_root_max_age_s": 3600,
    }
    box = MockSandbox.create(load_settings(overrides=overrides))
    assert_idmapped_mounts_as_asked(box, idmapped_mounts)
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
