"""The dataset endpoints as plain methods: validated request in, answer (or :class:`DatasetHTTPError`) out."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from mocksandbox.datasets.errors import DatasetHTTPError, RowNotFound
from mocksandbox.datasets.extraction import CustomExtractionError
from mocksandbox.datasets.kinds import CodeRunner
from mocksandbox.datasets.models import (
    EvalResult,
    GetMetricsFunctionRequest,
    GetMetricsFunctionResult,
    GetMetricsRequest,
    GetPromptByIdRequest,
    GetPromptsRequest,
    Prompt,
    SubmitRequest,
    TestConfig,
)
from mocksandbox.datasets.registry import SAMPLE_DATASETS_DIR, DatasetRegistry
from mocksandbox.settings import Settings

P = ParamSpec("P")
T = TypeVar("T")


def _ids(rows: list[dict[str, Any]]) -> list[Any]:
    return [row["id"] for row in rows]


def dataset_directories(extra: Iterable[str], include_samples: bool) -> list[Path]:
    """The sample directory (when wanted and present), then ``extra`` in order."""
    directories = [SAMPLE_DATASETS_DIR] if include_samples and SAMPLE_DATASETS_DIR.is_dir() else []
    return directories + [Path(directory) for directory in extra]


class DatasetService:
    """``/list_datasets``, ``/list_ids``, ``/get_prompts``, ``/get_prompt_by_id``, ``/submit``,
    ``/get_metrics`` and ``/get_metrics_function`` over a :class:`DatasetRegistry`; programs run on
    ``runner`` (the engine behind ``/run_code``)."""

    def __init__(self, registry: DatasetRegistry, runner: CodeRunner) -> None:
        self.registry = registry
        self.runner = runner

    @classmethod
    def from_settings(cls, settings: Settings, runner: CodeRunner) -> DatasetService:
        """The samples (``sample_datasets``) and ``datasets_dirs``, read and checked now: a bad file
        fails here with :class:`~mocksandbox.datasets.errors.DatasetLoadError`, not at a request."""
        directories = dataset_directories(settings.datasets_dirs, settings.sample_datasets)
        return cls(DatasetRegistry.from_directories(directories), runner)

    def list_datasets(self) -> list[str]:
        return self.registry.dataset_ids()

    def list_ids(self, request: GetPromptsRequest) -> list[Any]:
        self.registry.kind_for(request.dataset, request.config)
        rows = self.registry.rows(request.dataset, request.config, request.offset, request.limit, ("id",))
        return self._uncaught(_ids, rows)  # provided_data rows need not have an id

    def get_prompts(self, request: GetPromptsRequest) -> list[Prompt]:
        kind = self.registry.kind_for(request.dataset, request.config)
        rows = self.registry.rows(
            request.dataset, request.config, request.offset, request.limit, kind.prompt_columns
        )
        return [self._uncaught(kind.prompt, row, request.dataset, request.config) for row in rows]

    def get_prompt_by_id(self, request: GetPromptByIdRequest) -> Prompt:
        kind = self.registry.kind_for(request.dataset, request.config)
        row = self._row(request.dataset, request.config, request.id, kind.prompt_columns)
        return self._uncaught(kind.prompt, row, request.dataset, request.config)

    def submit(self, request: SubmitRequest) -> EvalResult:
        kind = self.registry.kind_for(request.dataset, request.config)
        row = self._row(request.dataset, request.config, request.id, kind.submit_columns)
        return self._uncaught(kind.evaluate, row, request, self.runner)

    def get_metrics(self, request: GetMetricsRequest) -> dict[str, Any]:
        return self.registry.kind_for(request.dataset, request.config).metrics(request.results)

    def get_metrics_function(self, request: GetMetricsFunctionRequest) -> GetMetricsFunctionResult:
        kind = self.registry.kind_for(request.dataset, request.config)
        return GetMetricsFunctionResult(function=kind.metrics_function())

    # -- helpers --------------------------------------------------------------------------------

    def _row(
        self, dataset: str, config: TestConfig, row_id: int | str, columns: tuple[str, ...]
    ) -> dict[str, Any]:
        try:
            return self.registry.row_by_id(dataset, config, row_id, columns)
        except RowNotFound as exc:
            raise DatasetHTTPError.uncaught(exc) from None

    @staticmethod
    def _uncaught(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Call ``function``; what SandboxFusion's dataset code would let escape to its global
        handler (a row missing a column, custom extraction that raises) becomes that handler's 500."""
        try:
            return function(*args, **kwargs)
        except DatasetHTTPError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, CustomExtractionError) as exc:
            raise DatasetHTTPError.uncaught(exc) from None
