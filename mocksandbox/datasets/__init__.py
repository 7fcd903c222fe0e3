"""SandboxFusion's dataset endpoints: a registry of datasets read from JSON Lines files, code
extraction from completions, and evaluation through the same engine as ``/run_code``."""

from mocksandbox.datasets.errors import DatasetHTTPError, DatasetLoadError
from mocksandbox.datasets.registry import DatasetRegistry
from mocksandbox.datasets.service import DatasetService

__all__ = ["DatasetHTTPError", "DatasetLoadError", "DatasetRegistry", "DatasetService"]
