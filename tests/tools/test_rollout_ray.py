"""The batch case with the seed's Ray shape: the execution pool is a threaded Ray actor and the
limiter a cluster-wide named actor (``pool_mode: ray``). Ray starts once for this module."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")

from mocksandbox.pytest_plugin import MockSandboxHandle  # noqa: E402
from mocksandbox.ratelimit.ray_limiter import RayLimiter, start_local_ray  # noqa: E402
from mocksandbox.tools import (  # noqa: E402
    CodeInterpreterTool,
    PolicyInput,
    RolloutDriver,
    StopReason,
    format_tool_call,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]
NAMESPACE = "mocksandbox-tools-tests"


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    if ray.is_initialized():
        ray.shutdown()
    start_local_ray(num_cpus=2, namespace=NAMESPACE)
    try:
        yield
    finally:
        ray.shutdown()


def square_policy(a: int) -> Callable[[PolicyInput], str]:
    def play(view: PolicyInput) -> str:
        if view.turn == 0:
            code = f"import time\ntime.sleep(0.05)\nprint({a} * {a})"
            return format_tool_call("code_interpreter", {"code": code})
        return f"#### {view.last_tool_responses[0].strip()}"

    return play


def test_batch_through_a_ray_pool(local_ray: None, mocksandbox: MockSandboxHandle) -> None:
    name = f"tools-ray-{uuid.uuid4().hex[:8]}"
    tool = CodeInterpreterTool(
        {
            "sandbox_fusion_url": mocksandbox.url,
            "pool_mode": "ray",
            "rate_limit": 2,
            "num_workers": 8,
            "rate_limiter_name": name,
            "ray_namespace": NAMESPACE,
        }
    )
    try:
        driver = RolloutDriver([tool])
        batch = [
            driver.create_request(f"{i}^2?", square_policy(i), ground_truth=str(i * i)) for i in range(12)
        ]
        records = driver.run_sync(batch)
        assert [r.score for r in records] == [1.0] * 12
        assert all(r.stop_reason == StopReason.FINAL_ANSWER for r in records)
        assert 1 <= mocksandbox.stats()["max_in_flight"] <= 2
        limiter = RayLimiter.attach(name, namespace=NAMESPACE)
        stats = limiter.stats()
        assert stats["grants"] == 12 and stats["max_in_flight"] <= 2 and stats["in_flight"] == 0
    finally:
        tool.close()
        RayLimiter.attach(name, namespace=NAMESPACE).destroy()


def test_api_failures_come_back_typed_through_ray(local_ray: None, mocksandbox: MockSandboxHandle) -> None:
    mocksandbox.fail(429, retry_after=1)
    name = f"tools-ray-{uuid.uuid4().hex[:8]}"
    tool = CodeInterpreterTool(
        {
            "sandbox_fusion_url": mocksandbox.url,
            "pool_mode": "ray",
            "rate_limit": 2,
            "rate_limiter_name": name,
            "ray_namespace": NAMESPACE,
        }
    )
    try:
        driver = RolloutDriver([tool])
        [record] = driver.run_sync(
            driver.create_request("q", [format_tool_call("code_interpreter", {"code": "print(1)"}), "#### 1"])
        )
        assert [c.kind for c in record.tool_calls] == ["rate_limited"]
        assert "HTTP 429 Too Many Requests (retry after 1 s)" in record.tool_responses[0]
    finally:
        tool.close()
        RayLimiter.attach(name, namespace=NAMESPACE).destroy()
