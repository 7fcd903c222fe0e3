"""Shared fixtures for the tool-calling rollout kit's tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mocksandbox.pytest_plugin import MockSandboxHandle
from mocksandbox.ratelimit import drop_shared_limiter
from mocksandbox.tools import CodeInterpreterTool, RolloutScript

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rollouts"
SEED_SAMPLE = FIXTURES / "seed_sample.json"


@pytest.fixture
def rollout_fixtures() -> Path:
    """``fixtures/rollouts`` of the checkout."""
    return FIXTURES


@pytest.fixture
def seed_script() -> RolloutScript:
    return RolloutScript.load(SEED_SAMPLE)


@pytest.fixture
def limiter_name() -> Iterator[str]:
    """A limiter name of this test's own: tools of other tests (other limits) never share it."""
    name = f"tools-test-{uuid.uuid4().hex[:8]}"
    yield name
    drop_shared_limiter(name)


@pytest.fixture
def make_tool(
    mocksandbox: MockSandboxHandle, limiter_name: str
) -> Iterator[Callable[..., CodeInterpreterTool]]:
    """``make_tool(**config)``: a code interpreter on the test's mock, closed after the test."""
    made: list[CodeInterpreterTool] = []

    def make(**config: Any) -> CodeInterpreterTool:
        settings: dict[str, Any] = {
            "sandbox_fusion_url": mocksandbox.url,
            "rate_limit": 4,
            "num_workers": 8,
            "rate_limiter_name": limiter_name,
        }
        settings.update(config)
        tool = CodeInterpreterTool(settings)
        made.append(tool)
        return tool

    yield make
    for tool in made:
        tool.close()
