"""Request bodies validated as FastAPI 0.103 validates them, down to the 422 ``detail`` items."""

from __future__ import annotations

import functools
import json
from email.message import Message
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)


class RequestValidationError(Exception):
    """A request that does not fit its schema; ``detail`` is FastAPI's list of problems."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        super().__init__(detail)
        self.detail = detail


class BodyParseError(Exception):
    """A body FastAPI cannot parse (not text, or JSON nested too deep): it answers 400."""


class UndecodableTextError(BodyParseError):
    """A body of a non-JSON content type that is not UTF-8. FastAPI decodes it for the 422 it
    would echo it in, and the ``UnicodeDecodeError`` reaches SandboxFusion's global handler: a 500
    (measured). ``error`` is that exception."""

    def __init__(self, error: UnicodeDecodeError) -> None:
        super().__init__(str(error))
        self.error = error


@functools.lru_cache(maxsize=256)  # parsed with the email package: costly, and nearly always the same
def _is_json_content_type(content_type: str | None) -> bool:
    if not content_type:
        return True  # FastAPI parses a body without Content-Type as JSON
    message = Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def read_body(raw: bytes, content_type: str | None) -> Any:
    """The body as FastAPI hands it to validation: parsed JSON, raw text, or ``None`` when empty."""
    if not raw:
        return None
    if not _is_json_content_type(content_type):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UndecodableTextError(exc) from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ["body", exc.pos],
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": exc.msg},
                }
            ]
        ) from None
    except Exception:
        # FastAPI answers 400 to any other failure of ``request.json()``: bytes that are not UTF-8,
        # an integer too long to convert, or nesting deeper than the parser's recursion limit
        # (RecursionError; ``[`` x 1000 is past it, 100 levels are not).
        raise BodyParseError from None


def _jsonable(value: Any) -> Any:
    """``value`` as JSON data: objects that are not (exceptions in ``ctx``) become their text.

    Lists and dicts are kept as they are: they come from the parsed body, which is JSON data
    already, and may be nested nearly as deep as the parser allows, too deep to copy recursively.
    """
    if isinstance(value, str | int | float | bool | list | dict) or value is None:
        return value
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return str(value)


def validate_body(model: type[ModelT], body: Any, docs_version: str) -> ModelT:
    """Validate ``body`` into ``model`` in pydantic's lax mode, or raise FastAPI's 422 detail list."""
    if body is None:
        raise RequestValidationError(
            [
                {
                    "type": "missing",
                    "loc": ["body"],
                    "msg": "Field required",
                    "input": None,
                    "url": f"https://errors.pydantic.dev/{docs_version}/v/missing",
                }
            ]
        )
    try:
        # from_attributes makes a non-object body fail as `model_attributes_type`, as FastAPI does.
        return model.model_validate(body, from_attributes=True)
    except ValidationError as exc:
        detail = []
        for error in exc.errors(include_url=False):
            item: dict[str, Any] = {
                "type": error["type"],
                "loc": ["body", *error["loc"]],
                "msg": error["msg"],
                "input": _jsonable(error["input"]),
            }
            if "ctx" in error:
                item["ctx"] = {str(k): _jsonable(v) for k, v in error["ctx"].items()}
            item["url"] = f"https://errors.pydantic.dev/{docs_version}/v/{error['type']}"
            detail.append(item)
        raise RequestValidationError(detail) from None
