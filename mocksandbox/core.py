"""The composition root: one object owns settings, engine and (later) every other stateful part.

The HTTP layer, the CLI and the pytest fixtures all reach the core through a :class:`MockSandbox`;
nothing is created at import time.
"""

from __future__ import annotations

from mocksandbox.execution.confinement import Confinement
from mocksandbox.execution.engine import ExecutionEngine, create_engine
from mocksandbox.settings import Settings, load_settings


class MockSandbox:
    """Everything one mock server holds. Build it with :meth:`create`; :meth:`close` when done."""

    def __init__(self, settings: Settings, engine: ExecutionEngine, confinement: Confinement) -> None:
        self.settings = settings
        self.engine = engine
        self.confinement = confinement

    @classmethod
    def create(cls, settings: Settings | None = None) -> MockSandbox:
        """A sandbox with the real engine, confined as the host allows."""
        settings = settings or load_settings()
        engine, confinement = create_engine(settings)
        return cls(settings, engine, confinement)

    def reset(self) -> None:
        """Forget per-test state. The engine itself keeps none between requests."""

    def close(self) -> None:
        """Release host resources (the per-run cgroup parents)."""
        self.confinement.close()
