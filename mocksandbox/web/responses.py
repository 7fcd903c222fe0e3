"""JSON answers serialised as FastAPI serialises them: compact, non-ASCII kept, keys in model order.

An answer that cannot be encoded (NaN or infinity echoed from the request, a lone surrogate, data
nested past the encoder's recursion limit) fails in SandboxFusion when its ``JSONResponse`` is
rendered, and its global handler answers 500 instead. The mock does the same on SandboxFusion's own
endpoints (:data:`SANDBOXFUSION_BLUEPRINTS`). Its own endpoints (swedev, ``/_mock/``) have no
original to imitate: there it answers valid JSON instead (see :func:`encode_json_leniently`).
"""

from __future__ import annotations

import json
import math
import traceback
from typing import Any

from flask import Response, has_request_context, request
from pydantic import BaseModel

#: Blueprints serving SandboxFusion's own endpoints (contract §1).
SANDBOXFUSION_BLUEPRINTS = frozenset({"sandbox_api", "jupyter_api", "datasets_api"})
#: Depth below which :func:`encode_json_leniently` replaces nested data with ``"..."``.
LENIENT_MAX_DEPTH = 100
#: json.dumps' message for NaN and infinities (Python 3.11, as measured on SandboxFusion).
_NOT_COMPLIANT = "Out of range float values are not JSON compliant"


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``content`` (a model or plain JSON data) as FastAPI's ``JSONResponse`` would send it."""
    if isinstance(content, BaseModel):
        content = content.model_dump(mode="json")
    try:
        body = encode_json(content)
    except (ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        if has_request_context() and request.blueprint in SANDBOXFUSION_BLUEPRINTS:
            return Response(unencodable_answer_body(exc), status=500, content_type="application/json")
        body = encode_json_leniently(content)
    return Response(body, status=status, headers=headers, content_type="application/json")


def unencodable_answer_body(exc: ValueError | RecursionError) -> bytes:
    """SandboxFusion's 500 body for an answer :func:`encode_json` could not encode (NaN echoed, a
    lone surrogate): its global handler's. That is SandboxFusion's answer, not a bug of the mock,
    so it is not recorded as a server error."""
    if str(exc).startswith(_NOT_COMPLIANT):  # newer Pythons append the value
        exc = ValueError(_NOT_COMPLIANT).with_traceback(exc.__traceback__)
    return server_error_body(exc)


def encode_json(content: Any) -> bytes:
    """Starlette's ``JSONResponse.render``: raises ``ValueError`` on NaN or infinity,
    ``UnicodeEncodeError`` on a lone surrogate, ``RecursionError`` on very deep data."""
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8")


def encode_json_leniently(content: Any) -> bytes:
    """Valid JSON for anything :func:`encode_json` cannot encode.

    NaN and infinities become the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (the tokens
    the client sent, still recognisable, where ``null`` would hide them); lone surrogates are sent
    as ``\\udXXX`` escapes (the rest of the text as ``\\uXXXX`` too: the body is ASCII); lists and
    dicts nested deeper than :data:`LENIENT_MAX_DEPTH` levels become ``"..."``.
    """
    return json.dumps(_finite(content, LENIENT_MAX_DEPTH), ensure_ascii=True, separators=(",", ":")).encode(
        "ascii"
    )


def _finite(value: Any, depth: int) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict | list | tuple) and depth <= 0:
        return "..."
    if isinstance(value, dict):
        return {k: _finite(v, depth - 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v, depth - 1) for v in value]
    return value


def server_error_content(exc: BaseException) -> dict[str, Any]:
    """The body of SandboxFusion's global exception handler: the message and the traceback lines."""
    lines = "".join(traceback.format_exception(exc)).split("\n")  # format_exc().split("\n")
    return {"detail": str(exc), "traceback": lines}


def server_error_body(exc: BaseException) -> bytes:
    """The body of SandboxFusion's 500 for ``exc``, always encodable (whatever the message holds)."""
    content = server_error_content(exc)
    try:
        return encode_json(content)
    except (ValueError, RecursionError):
        return encode_json_leniently(content)


def server_error_response(exc: BaseException) -> Response:
    """SandboxFusion's 500 for ``exc``."""
    return Response(server_error_body(exc), status=500, content_type="application/json")
