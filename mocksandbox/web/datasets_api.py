"""SandboxFusion's dataset endpoints (see :mod:`mocksandbox.datasets`): parse, call, serialise.

Their 400 and 500 answers (``{"detail": ...}``, plus ``"traceback"`` where SandboxFusion's global
handler sends one) are :class:`DatasetHTTPError` raised by the core and shaped here.
"""

from __future__ import annotations

from typing import Any, TypeVar

from flask import Blueprint, Response, request
from pydantic import BaseModel

from mocksandbox.datasets import DatasetHTTPError
from mocksandbox.datasets.models import (
    GetMetricsFunctionRequest,
    GetMetricsRequest,
    GetPromptByIdRequest,
    GetPromptsRequest,
    SubmitRequest,
)
from mocksandbox.web.responses import json_response
from mocksandbox.web.sandbox_api import sandbox
from mocksandbox.web.validation import read_body, validate_body

blueprint = Blueprint("datasets_api", __name__)

ModelT = TypeVar("ModelT", bound=BaseModel)


def _body(model: type[ModelT]) -> ModelT:
    body = read_body(request.get_data(cache=True), request.content_type)
    return validate_body(model, body, sandbox().settings.pydantic_docs_version)


@blueprint.errorhandler(DatasetHTTPError)
def _dataset_error(exc: DatasetHTTPError) -> Response:
    content: dict[str, Any] = {"detail": exc.detail}
    if exc.traceback_lines is not None:
        content["traceback"] = exc.traceback_lines
    return json_response(content, status=exc.status)


@blueprint.get("/list_datasets")
def list_datasets() -> Response:
    return json_response(sandbox().datasets.list_datasets())


@blueprint.post("/list_ids")
def list_ids() -> Response:
    return json_response(sandbox().datasets.list_ids(_body(GetPromptsRequest)))


@blueprint.post("/get_prompts")
def get_prompts() -> Response:
    prompts = sandbox().datasets.get_prompts(_body(GetPromptsRequest))
    return json_response([prompt.model_dump(mode="json") for prompt in prompts])


@blueprint.post("/get_prompt_by_id")
def get_prompt_by_id() -> Response:
    return json_response(sandbox().datasets.get_prompt_by_id(_body(GetPromptByIdRequest)))


@blueprint.post("/submit")
def submit() -> Response:
    return json_response(sandbox().datasets.submit(_body(SubmitRequest)))


@blueprint.post("/get_metrics")
def get_metrics() -> Response:
    return json_response(sandbox().datasets.get_metrics(_body(GetMetricsRequest)))


@blueprint.post("/get_metrics_function")
def get_metrics_function() -> Response:
    return json_response(sandbox().datasets.get_metrics_function(_body(GetMetricsFunctionRequest)))
