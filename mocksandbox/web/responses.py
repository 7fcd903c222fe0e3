"""JSON answers serialised as FastAPI serialises them: compact, non-ASCII kept, keys in model order."""

from __future__ import annotations

import json
from typing import Any

from flask import Response
from pydantic import BaseModel


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``content`` (a model or plain JSON data) as FastAPI's ``JSONResponse`` would send it."""
    if isinstance(content, BaseModel):
        content = content.model_dump(mode="json")
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates echoed from the request: escape instead of failing
        body = json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    return Response(body, status=status, headers=headers, content_type="application/json")
