"""The swedev endpoints verl's agentic rollout calls, and ``GET /_mock/sessions``.

``POST /start_instance {"instance_hash"}`` -> ``{"sid": "<digits>"}``;
``POST /process_action {"sid", "content"}`` -> ``{"content": "EXECUTION RESULT of [...]:\\n..."}``;
``POST /postprocess {"sid"}`` -> a JSON object; ``POST /compute_reward {"sid"}`` -> ``{"reward", ...}``.
``sid`` and ``instance_hash`` may be ints or strings. Unknown ones answer 404 with a ``detail`` that
says which; malformed bodies 422 as everywhere else; a scoring run in which no test could run (not
the model's doing) 500 with a ``detail`` that names the cause and quotes the test output's end.
"""

from __future__ import annotations

from flask import Blueprint, Flask, Response, request
from pydantic import BaseModel, model_validator

from mocksandbox.sessions import (
    ScoringError,
    SessionEndedError,
    SessionLimitError,
    UnknownInstanceError,
    UnknownSessionError,
)
from mocksandbox.sessions.errors import SessionError
from mocksandbox.web.responses import json_response
from mocksandbox.web.sandbox_api import sandbox
from mocksandbox.web.validation import read_body, validate_body

blueprint = Blueprint("swedev_api", __name__)
control_blueprint = Blueprint("swedev_control", __name__, url_prefix="/_mock")


class StartInstanceRequest(BaseModel):
    """Body of ``/start_instance``: exactly one of ``instance_hash`` (what verl sends: md5 of the
    ``instance_id`` mod 2**63, as an int or a decimal string) and ``instance_id`` (a string)."""

    instance_hash: int | str | None = None
    instance_id: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StartInstanceRequest:
        # A model-level check: FastAPI reports it as one `value_error` item with loc ["body"].
        if (self.instance_hash is None) == (self.instance_id is None):
            raise ValueError(
                "give exactly one of instance_hash (md5(instance_id) mod 2**63, an int or a decimal "
                "string) and instance_id (a string)"
            )
        return self


class ProcessActionRequest(BaseModel):
    """Body of ``/process_action``: the model's decoded action text."""

    sid: int | str
    content: str


class SessionRequest(BaseModel):
    """Body of ``/postprocess`` and ``/compute_reward``."""

    sid: int | str


def register(app: Flask, control_api: bool) -> None:
    """Add the swedev endpoints to ``app`` (and ``/_mock/sessions``, ``/_mock/instances`` with the
    control API)."""
    app.register_blueprint(blueprint)
    if control_api:
        app.register_blueprint(control_blueprint)


def _body() -> object:
    return read_body(request.get_data(cache=True), request.content_type)


_STATUS = {
    UnknownInstanceError: 404,
    UnknownSessionError: 404,
    SessionEndedError: 409,
    SessionLimitError: 503,
    ScoringError: 500,
}


@blueprint.errorhandler(SessionError)
def _session_error(exc: SessionError) -> Response:
    status = next((code for kind, code in _STATUS.items() if isinstance(exc, kind)), 500)
    headers = {"Retry-After": "1"} if status == 503 else None
    return json_response({"detail": str(exc)}, status=status, headers=headers)


@blueprint.post("/start_instance")
def start_instance() -> Response:
    box = sandbox()
    body = validate_body(StartInstanceRequest, _body(), box.settings.pydantic_docs_version)
    if body.instance_id is not None:
        key: int | str = box.sessions.registry.get(body.instance_id).instance_hash  # 404 if unknown
    else:
        assert body.instance_hash is not None  # the model holds exactly one of the two
        key = body.instance_hash
    return json_response({"sid": box.sessions.start(key)})


@blueprint.post("/process_action")
def process_action() -> Response:
    box = sandbox()
    body = validate_body(ProcessActionRequest, _body(), box.settings.pydantic_docs_version)
    return json_response({"content": box.sessions.process_action(body.sid, body.content)})


@blueprint.post("/postprocess")
def postprocess() -> Response:
    box = sandbox()
    body = validate_body(SessionRequest, _body(), box.settings.pydantic_docs_version)
    return json_response(box.sessions.postprocess(body.sid))


@blueprint.post("/compute_reward")
def compute_reward() -> Response:
    box = sandbox()
    body = validate_body(SessionRequest, _body(), box.settings.pydantic_docs_version)
    return json_response(box.sessions.compute_reward(body.sid))


@control_blueprint.get("/sessions")
def list_sessions() -> Response:
    return json_response(sandbox().sessions.list_sessions())


@control_blueprint.get("/sessions/<sid>")
def describe_session(sid: str) -> Response:
    try:
        return json_response(sandbox().sessions.describe(sid))
    except UnknownSessionError as exc:
        return json_response({"detail": str(exc)}, status=404)


@control_blueprint.get("/sessions/<sid>/patch")
def session_patch(sid: str) -> Response:
    """The model's diff so far: a live session's work tree against its base, an ended one's patch."""
    box = sandbox()
    try:
        return json_response({"sid": sid, "patch": box.sessions.patch_so_far(sid)})
    except UnknownSessionError as exc:
        return json_response({"detail": str(exc)}, status=404)


@control_blueprint.get("/instances")
def list_instances() -> Response:
    return json_response({"instances": [inst.summary() for inst in sandbox().sessions.registry.all()]})
