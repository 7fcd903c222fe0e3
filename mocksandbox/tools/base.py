"""What every tool offers (verl's ``BaseTool`` shape): per-trajectory instances, async calls."""

from __future__ import annotations

import abc
from typing import Any, NamedTuple

from mocksandbox.tools.schema import OpenAIFunctionToolSchema


class ToolResult(NamedTuple):
    """What ``execute`` returns: unpacks as ``(text, reward, metrics)``, as verl's tuple does."""

    #: The observation the model reads (inside ``<tool_response>``, or as a ``tool`` turn).
    text: str
    #: The step reward of this call.
    reward: float
    #: What happened, for logs and tests: ``kind``, statuses, return code, timings, ...
    metrics: dict[str, Any]


class UnknownInstanceError(KeyError):
    """``execute``/``calc_reward``/``release`` for an instance that was never created (or released)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown instance"


class BaseTool(abc.ABC):
    """A tool a model can call during a rollout.

    ``create`` starts the state of one trajectory (``instance_id``), ``execute`` runs one call in
    it, ``calc_reward`` scores the trajectory's use of the tool, ``release`` forgets it. All four
    are coroutines, so a rollout driver can run the calls of many trajectories at once.
    """

    def __init__(self, config: Any, tool_schema: OpenAIFunctionToolSchema) -> None:
        self.config = config
        self.tool_schema = tool_schema

    @property
    def name(self) -> str:
        return self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    @abc.abstractmethod
    async def create(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Start an instance; returns its id (a new one when ``instance_id`` is None)."""

    @abc.abstractmethod
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> ToolResult:
        """Run one call with the model's ``parameters``; never raises for bad parameters."""

    @abc.abstractmethod
    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The instance's tool reward."""

    @abc.abstractmethod
    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forget the instance."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free what the tool holds (threads, actors). The default holds nothing."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
