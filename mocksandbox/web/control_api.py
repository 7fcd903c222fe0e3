"""The control endpoints under ``/_mock/``: faults, journal, stats, capacity, reset.

They call the same :class:`~mocksandbox.core.MockSandbox` methods as the pytest fixtures, so a
test in another process (or language) can drive the mock over HTTP alone.
"""

from __future__ import annotations

from typing import Any, Literal

from flask import Blueprint, Response, request
from pydantic import BaseModel, ConfigDict, Field

from mocksandbox.core import describe_entries
from mocksandbox.faults import FaultError
from mocksandbox.web.responses import json_response
from mocksandbox.web.sandbox_api import sandbox
from mocksandbox.web.validation import read_body, validate_body

blueprint = Blueprint("control_api", __name__, url_prefix="/_mock")


class CapacityUpdate(BaseModel):
    """Body of ``PUT /_mock/capacity``: only the given fields change."""

    # No NaN or infinity (a wait of Infinity overflows); the 422 echoes them as strings.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_in_flight: int | None = Field(None, ge=1)
    overload: Literal["reject", "queue"] | None = None
    queue_timeout_s: float | None = Field(None, ge=0)
    retry_after_s: float | None = Field(None, ge=0)


def _body() -> Any:
    return read_body(request.get_data(cache=True), request.content_type)


@blueprint.get("/faults")
def list_faults() -> Response:
    return json_response({"faults": [rule.describe() for rule in sandbox().fault_rules()]})


@blueprint.post("/faults")
def add_faults() -> Response:
    body = _body()
    specs = body if isinstance(body, list) else [body]
    try:
        if not all(isinstance(spec, dict) for spec in specs):
            raise FaultError("a fault rule must be a JSON object (or a list of them)")
        added = sandbox().add_faults(specs)  # all or nothing
    except FaultError as exc:
        return json_response({"detail": str(exc)}, status=422)
    return json_response({"faults": [rule.describe() for rule in added]}, status=201)


@blueprint.delete("/faults")
def clear_faults() -> Response:
    return json_response({"removed": sandbox().clear_faults()})


@blueprint.delete("/faults/<rule_id>")
def delete_fault(rule_id: str) -> Response:
    if not sandbox().remove_fault(rule_id):
        return json_response({"detail": f"no fault rule with id {rule_id!r}"}, status=404)
    return json_response({"removed": [rule_id]})


@blueprint.get("/journal")
def journal() -> Response:
    box = sandbox()
    language = request.args.get("language")
    path = request.args.get("path")
    entries = box.requests(path=path, language=language)
    limit = request.args.get("limit", type=int)
    if limit is not None and limit >= 0:
        entries = entries[-limit:] if limit else []
    return json_response({"entries": describe_entries(entries)})


@blueprint.get("/stats")
def stats() -> Response:
    return json_response(sandbox().stats())


@blueprint.get("/timeline")
def timeline() -> Response:
    box = sandbox()
    return json_response({"limit": box.capacity.max_in_flight, "points": box.timeline()})


@blueprint.get("/capacity")
def get_capacity() -> Response:
    return json_response(sandbox().capacity.__dict__)


@blueprint.put("/capacity")
def put_capacity() -> Response:
    box = sandbox()
    update = validate_body(CapacityUpdate, _body(), box.settings.pydantic_docs_version)
    changes = update.model_dump(exclude_unset=True)
    return json_response(box.set_capacity(**changes).__dict__)


@blueprint.post("/reset")
def reset() -> Response:
    sandbox().reset()
    return json_response({"reset": True})
