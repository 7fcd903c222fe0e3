"""Fixtures for the session tests: session managers over the real engine's runner, no sockets."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mocksandbox.core import MockSandbox
from mocksandbox.execution.engine import program_environment
from mocksandbox.sessions import InstanceRegistry, SessionConfig, SessionManager
from mocksandbox.sessions.executor import LocalExecutor
from mocksandbox.settings import load_settings


@pytest.fixture(scope="session")
def engine_box() -> Iterator[MockSandbox]:
    """A sandbox whose engine runner the managers share (as the server's sessions do)."""
    box = MockSandbox.create(load_settings(overrides={"port": 0}))
    yield box
    box.close()


@pytest.fixture(scope="session")
def registry() -> InstanceRegistry:
    """The shipped instances (their base repositories are built once per test session)."""
    return InstanceRegistry.from_paths([])


@pytest.fixture
def make_manager(
    engine_box: MockSandbox, registry: InstanceRegistry, tmp_path: Path
) -> Iterator[Callable[..., SessionManager]]:
    """Build managers with config overrides; all are closed at the end of the test."""
    made: list[SessionManager] = []
    python = engine_box.settings.python
    env = program_environment(os.environ)
    env["PATH"] = f"{Path(python).parent}:{env.get('PATH', os.defpath)}"

    def make(clock: Callable[[], float] | None = None, **overrides: Any) -> SessionManager:
        config = replace(SessionConfig(python=python, tmp_root=str(tmp_path)), **overrides)
        manager = SessionManager(
            config,
            registry,
            LocalExecutor(engine_box.engine.runner, env),
            **({"clock": clock} if clock else {}),
            runs_in_worlds=engine_box.engine.isolation.mode == "lite",
        )
        made.append(manager)
        return manager

    yield make
    for manager in made:
        manager.close()
