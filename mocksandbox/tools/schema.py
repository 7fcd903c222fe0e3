"""OpenAI function-tool schemas (verl's pydantic models) and the seed's ``code_interpreter`` schema.

The models mirror ``verl.tools.schemas`` field for field, in the same order, so that
``schema.model_dump()`` serialised with ``json.dumps`` is the very line a Qwen/Hermes chat template
puts inside ``<tools></tools>`` (the seed's sample shows it, ``"enum": null`` included).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter of a function."""

    type: str | list[str]
    description: str | None = None
    enum: list[Any] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    """The parameters of a function (a JSON-schema object)."""

    type: str
    properties: dict[str, OpenAIFunctionPropertySchema]
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    """A function: name, description, parameters."""

    name: str
    description: str
    parameters: OpenAIFunctionParametersSchema = Field(
        default_factory=lambda: OpenAIFunctionParametersSchema(type="object", properties={}, required=[])
    )
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """A tool in OpenAI format: ``{"type": "function", "function": {...}}``."""

    type: str
    function: OpenAIFunctionSchema

    def to_json(self) -> str:
        """The schema as one JSON line, as a chat template's ``tool | tojson`` writes it."""
        return json.dumps(self.model_dump(), ensure_ascii=False)


class OpenAIFunctionCallSchema(BaseModel):
    """A parsed call: the function's name and its arguments as an object."""

    name: str
    arguments: dict[str, Any]


class OpenAIFunctionToolCall(BaseModel):
    """A call in OpenAI's message format (``arguments`` as a JSON string)."""

    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCallSchema


def code_interpreter_schema(name: str = "code_interpreter") -> OpenAIFunctionToolSchema:
    """The seed design's tool schema, exactly: one required string ``code``, ``strict=False``."""
    return OpenAIFunctionToolSchema(
        type="function",
        function=OpenAIFunctionSchema(
            name=name,
            description="A tool for executing code.",
            parameters=OpenAIFunctionParametersSchema(
                type="object",
                properties={
                    "code": OpenAIFunctionPropertySchema(
                        type="string",
                        description="The code to execute.",
                        enum=None,
                    )
                },
                required=["code"],
            ),
            strict=False,
        ),
    )


#: The seed's schema (a fresh copy from :func:`code_interpreter_schema` is safer to mutate).
CODE_INTERPRETER_SCHEMA = code_interpreter_schema()
