"""The wire schema of SandboxFusion's dataset endpoints (shared/contract/sandboxfusion.md §4).

Field order is the order of keys in responses and of 422 items, as for the models in
:mod:`mocksandbox.models`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from mocksandbox.models import Language, RunCodeResponse

#: How the code of a completion was found (see :mod:`mocksandbox.datasets.extraction`).
ExtractedType = Literal["fenced", "incomplete_fenced", "heuristic", "empty"]


class TestConfig(BaseModel):
    """Per-request options of every dataset endpoint; all optional (``{}`` is fine)."""

    __test__ = False  # not a pytest test class, whatever its name says

    #: Class name of the dataset, used only for dataset ids that are not registered.
    dataset_type: str | None = None
    language: Language | None = None
    locale: str | None = None
    is_fewshot: bool | None = None
    compile_timeout: float | None = None
    run_timeout: float | None = None
    #: Python that calls ``submit_code_blocks([...])`` to add code blocks of its own.
    custom_extract_logic: str | None = None
    #: Rows sent inline instead of read from the dataset: a list, or one row for by-id and submit.
    provided_data: list[dict[str, Any]] | dict[str, Any] | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class GetPromptsRequest(BaseModel):
    """Body of ``/list_ids`` and ``/get_prompts``."""

    dataset: str
    config: TestConfig
    offset: int = 0
    limit: int = 1000000


class GetPromptByIdRequest(BaseModel):
    """Body of ``/get_prompt_by_id``."""

    dataset: str
    config: TestConfig
    id: int | str


class SubmitRequest(BaseModel):
    """Body of ``/submit``: one completion to evaluate."""

    dataset: str
    id: int | str
    completion: str
    config: TestConfig


class Prompt(BaseModel):
    """One problem as the model is to be asked it."""

    id: int | str
    prompt: str | list[dict[str, Any]]
    labels: dict[str, Any] = Field(default_factory=dict)


class EvalTestCase(BaseModel):
    """One run of the completion: the program's answer and, for stdin/stdout cases, the case."""

    passed: bool
    exec_info: RunCodeResponse
    test_info: dict[str, Any] | None = None


class EvalResult(BaseModel):
    """Answer of ``/submit``."""

    id: int | str
    accepted: bool
    extracted_code: str
    full_code: str | None = None
    test_code: str | None = None
    tests: list[EvalTestCase]
    extracted_type: ExtractedType | None = None
    extra: dict[str, Any] | None = None


class GetMetricsRequest(BaseModel):
    """Body of ``/get_metrics``."""

    dataset: str
    config: TestConfig
    results: list[EvalResult]


class GetMetricsFunctionRequest(BaseModel):
    """Body of ``/get_metrics_function``."""

    dataset: str
    config: TestConfig


class GetMetricsFunctionResult(BaseModel):
    """Answer of ``/get_metrics_function``."""

    function: str | None
