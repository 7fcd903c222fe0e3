"""``POST /run_jupyter``: cells run in a brand-new IPython kernel (see :mod:`mocksandbox.jupyter`)."""

from __future__ import annotations

from flask import Blueprint, Response, request

from mocksandbox.jupyter import RunJupyterRequest
from mocksandbox.web.responses import json_response
from mocksandbox.web.sandbox_api import sandbox
from mocksandbox.web.validation import read_body, validate_body

blueprint = Blueprint("jupyter_api", __name__)


@blueprint.post("/run_jupyter")
def run_jupyter() -> Response:
    box = sandbox()
    body = read_body(request.get_data(cache=True), request.content_type)
    run_request = validate_body(RunJupyterRequest, body, box.settings.pydantic_docs_version)
    return json_response(box.jupyter.run_jupyter(run_request))
