"""The dataset endpoints as plain methods: validated request in, answer (or :class:`DatasetHTTPError`) out."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from mocksandbox.datasets.errors import DatasetHTTPError
from mocksandbox.datasets.kinds import CodeRunner, DatasetClass, EvalContext
from mocksandbox.datasets.models import (
    EvalResult,
    GetMetricsFunctionRequest,
    GetMetricsFunctionResult,
    GetMetricsRequest,
    GetPromptByIdRequest,
    GetPromptsRequest,
    Prompt,
    SubmitRequest,
)
from mocksandbox.datasets.registry import SAMPLE_DATASETS_DIR, DatasetRegistry
from mocksandbox.datasets.tables import TableStore
from mocksandbox.datasets.tokenizer import Tokenizer, find_gpt2_tokenizer
from mocksandbox.settings import Settings

P = ParamSpec("P")
T = TypeVar("T")

#: The program each class's evaluation cannot do without, when the host may lack it.
_TOOLS = {"VerilogDataset": "iverilog", "MiniF2FLean4Dataset": "lake"}


def dataset_directories(extra: Iterable[str], include_samples: bool) -> list[Path]:
    """The sample directory (when wanted and present), then ``extra`` in order."""
    directories = [SAMPLE_DATASETS_DIR] if include_samples and SAMPLE_DATASETS_DIR.is_dir() else []
    return directories + [Path(directory) for directory in extra]


class DatasetService:
    """``/list_datasets``, ``/list_ids``, ``/get_prompts``, ``/get_prompt_by_id``, ``/submit``,
    ``/get_metrics`` and ``/get_metrics_function`` over a :class:`DatasetRegistry`; programs run on
    ``runner`` (the engine behind ``/run_code``)."""

    def __init__(
        self,
        registry: DatasetRegistry,
        runner: CodeRunner,
        *,
        max_runner_concurrency: int = 3,
        tokenizer: Tokenizer | None = None,
        tokenizer_note: str = "",
        assets_dir: str | None = None,
    ) -> None:
        self.registry = registry
        self.runner = runner
        self.max_runner_concurrency = max_runner_concurrency
        self.tokenizer = tokenizer
        self.tokenizer_note = tokenizer_note
        self.assets_dir = assets_dir
        #: Where the assets were found when nobody said (for the start-up lines), else empty.
        self.assets_note = ""

    @classmethod
    def from_settings(cls, settings: Settings, runner: CodeRunner) -> DatasetService:
        """The samples (``sample_datasets``) and ``datasets_dirs``, read and checked now: a bad file
        fails here with :class:`~mocksandbox.datasets.errors.DatasetLoadError`, not at a request."""
        directories = dataset_directories(settings.datasets_dirs, settings.sample_datasets)
        registry = DatasetRegistry(TableStore.from_directories(directories))
        assets_dir = settings.dataset_assets_dir or sandboxfusion_assets(settings.datasets_dirs)
        tokenizer, note = find_gpt2_tokenizer(assets_dir)
        service = cls(
            registry,
            runner,
            max_runner_concurrency=settings.max_runner_concurrency,
            tokenizer=tokenizer,
            tokenizer_note=note,
            assets_dir=assets_dir,
        )
        if assets_dir and not settings.dataset_assets_dir:
            service.assets_note = (
                f"assets (tokenizer, CRUXEval-X examples) from the SandboxFusion checkout: {assets_dir}"
            )
        return service

    def startup_notes(self) -> list[str]:
        """What the server's start-up lines say about datasets this host cannot fully serve."""
        notes = [self.assets_note] if self.assets_note else []
        for cls in self.registry.classes.values():
            tool = _TOOLS.get(cls.class_name)
            if tool and shutil.which(tool) is None:
                notes.append(f"{cls.class_name} needs {cls.needs}: {tool} not found, its submissions fail")
        if self.tokenizer is None:
            notes.append(f"RepobenchPDataset prompts are SandboxFusion's 500 ({self.tokenizer_note})")
        return notes

    def _context(self, cls: DatasetClass) -> EvalContext:
        return EvalContext(
            tables=self.registry.tables,
            runner=self.runner,
            table_name=lambda dataset: self.registry.table_for(cls, dataset),
            max_runner_concurrency=self.max_runner_concurrency,
            tokenizer=self.tokenizer,
            assets_dir=self.assets_dir,
        )

    def list_datasets(self) -> list[str]:
        return self.registry.dataset_ids()

    def list_ids(self, request: GetPromptsRequest) -> list[int | str]:
        cls = self.registry.class_for(request.dataset, request.config)
        return self._uncaught(cls.get_ids, request, self._context(cls))

    def get_prompts(self, request: GetPromptsRequest) -> list[Prompt]:
        cls = self.registry.class_for(request.dataset, request.config)
        return self._uncaught(cls.get_prompts, request, self._context(cls))

    def get_prompt_by_id(self, request: GetPromptByIdRequest) -> Prompt:
        cls = self.registry.class_for(request.dataset, request.config)
        return self._uncaught(cls.get_prompt_by_id, request, self._context(cls))

    def submit(self, request: SubmitRequest) -> EvalResult:
        cls = self.registry.class_for(request.dataset, request.config)
        return self._uncaught(cls.evaluate, request, self._context(cls))

    def get_metrics(self, request: GetMetricsRequest) -> dict[str, Any]:
        cls = self.registry.class_for(request.dataset, request.config)
        return self._uncaught(cls.metrics, request.results)

    def get_metrics_function(self, request: GetMetricsFunctionRequest) -> GetMetricsFunctionResult:
        cls = self.registry.class_for(request.dataset, request.config)
        return GetMetricsFunctionResult(function=cls.metrics_function())

    @staticmethod
    def _uncaught(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Call ``function``; whatever SandboxFusion's dataset code would let escape to its global
        handler (a missing column or row, a malformed value, custom extraction that raises) becomes
        that handler's 500 with the message and traceback."""
        try:
            return function(*args, **kwargs)
        except DatasetHTTPError:
            raise
        except Exception as exc:
            raise DatasetHTTPError.uncaught(exc) from None


def sandboxfusion_assets(datasets_dirs: list[str]) -> str | None:
    """The ``assets/`` of the SandboxFusion checkout a datasets dir is in (its
    ``sandbox/tests/datasets/samples``, say), where SandboxFusion itself finds them; else ``None``."""
    for directory in datasets_dirs:
        for candidate in (Path(directory).resolve(), *Path(directory).resolve().parents):
            if (candidate / "assets").is_dir() and (candidate / "sandbox").is_dir():
                return str(candidate / "assets")
    return None
