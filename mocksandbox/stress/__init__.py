"""The rate-limiter stress harness: ``run_stress(StressConfig(...))`` or ``mocksandbox stress``.

It drives calls through a limiter or an executor against a SandboxFusion-like server (the mock, or
a real one) and reports, with numbers, whether the cap held, whether waiting was fair, whether
permits leaked and whether errors reached the caller with their type. See
:mod:`mocksandbox.stress.harness` for the run and :mod:`mocksandbox.stress.report` for the figures.

Importing this package is cheap: the harness is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mocksandbox.stress.harness import ConfigError, StressConfig, run_stress

__all__ = ["ConfigError", "StressConfig", "run_stress"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from mocksandbox.stress import harness

        return getattr(harness, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
