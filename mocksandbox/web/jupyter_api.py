"""``POST /run_jupyter``: cells run in a brand-new IPython kernel (see :mod:`mocksandbox.jupyter`)."""

from __future__ import annotations

from flask import Blueprint, Response, request

from mocksandbox.extras import jupyter_missing
from mocksandbox.jupyter import RunJupyterRequest, RunJupyterResponse
from mocksandbox.models import RunStatus
from mocksandbox.web.responses import json_response
from mocksandbox.web.sandbox_api import sandbox
from mocksandbox.web.validation import read_body, validate_body

blueprint = Blueprint("jupyter_api", __name__)


@blueprint.post("/run_jupyter")
def run_jupyter() -> Response:
    box = sandbox()
    body = read_body(request.get_data(cache=True), request.content_type)
    run_request = validate_body(RunJupyterRequest, body, box.settings.pydantic_docs_version)
    missing = jupyter_missing(box.settings.python)
    if missing is not None:
        # Without the `jupyter` extra: a SandboxError (SandboxFusion's answer when its driver cannot
        # run) whose message names what to install, not a bare "No module named 'zmq'".
        return json_response(
            RunJupyterResponse(
                status=RunStatus.SandboxError, message=missing, executor_pod_name=box.settings.pod_name
            )
        )
    return json_response(box.jupyter.run_jupyter(run_request))
