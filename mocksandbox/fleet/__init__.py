"""Kept for imports written before serving became one package: the Ray fleet now lives in
:mod:`mocksandbox.serving.fleet` (see :mod:`mocksandbox.serving` for the three shapes)."""

from mocksandbox.serving.fleet import Fleet, FleetError, deploy, require_fleet_extra

__all__ = ["Fleet", "FleetError", "deploy", "require_fleet_extra"]
