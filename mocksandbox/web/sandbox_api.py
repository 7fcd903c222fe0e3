"""SandboxFusion's own endpoints: ``GET /v1/ping`` and ``POST /run_code``."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, request

from mocksandbox.core import MockSandbox
from mocksandbox.models import RunCodeRequest
from mocksandbox.web.responses import json_response
from mocksandbox.web.validation import read_body, validate_body

blueprint = Blueprint("sandbox_api", __name__)


def sandbox() -> MockSandbox:
    """The :class:`MockSandbox` this app serves."""
    box: MockSandbox = current_app.extensions["mocksandbox"]
    return box


@blueprint.get("/v1/ping")
def ping() -> Response:
    return json_response("pong")


@blueprint.post("/run_code")
def run_code() -> Response:
    box = sandbox()
    body = read_body(request.get_data(cache=True), request.content_type)
    run_request = validate_body(RunCodeRequest, body, box.settings.pydantic_docs_version)
    return json_response(box.engine.run_code(run_request))
