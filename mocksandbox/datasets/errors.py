"""The HTTP answers a dataset request can end with besides 200 and 422, as SandboxFusion words them."""

from __future__ import annotations

import traceback


class DatasetHTTPError(Exception):
    """An answer of ``status`` with ``{"detail": ...}``, plus ``"traceback"`` when SandboxFusion's
    global handler would have produced it (an exception its dataset code did not catch)."""

    def __init__(self, status: int, detail: str, traceback_lines: list[str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.traceback_lines = traceback_lines

    @classmethod
    def uncaught(cls, exc: BaseException) -> DatasetHTTPError:
        """A 500 as SandboxFusion's global handler sends it: ``str(exc)`` and the traceback lines."""
        lines = "".join(traceback.format_exception(exc)).split("\n")
        return cls(500, str(exc), lines)


class DatasetLoadError(ValueError):
    """A dataset file that cannot be served; the message names the file and line."""


class RowNotFound(TypeError):
    """No row has the id asked for. SandboxFusion then turns ``None`` into a dict and fails with this
    very message (HTTP 500 with a traceback)."""

    def __init__(self) -> None:
        super().__init__("'NoneType' object is not iterable")
