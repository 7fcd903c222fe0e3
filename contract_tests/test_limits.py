"""memory_limit_MB as an address-space limit (contract §2.4)."""

from __future__ import annotations

import pytest
from contract_support import Target


def test_allocation_over_the_limit_fails(target: Target) -> None:
    body = target.run_code("x = bytearray(300 * 1024 * 1024)\nprint('allocated')", memory_limit_MB=200)
    run = body["run_result"]
    assert body["status"] == "Failed"
    assert run["stdout"] == ""
    assert run["return_code"] != 0


def test_allocation_under_the_limit_works(target: Target) -> None:
    body = target.run_code("x = bytearray(50 * 1024 * 1024)\nprint('allocated')", memory_limit_MB=512)
    assert body["run_result"]["stdout"] == "allocated\n"


@pytest.mark.parametrize("limit", [0, -1])
def test_non_positive_limit_means_none(target: Target, limit: int) -> None:
    body = target.run_code("x = bytearray(300 * 1024 * 1024)\nprint('allocated')", memory_limit_MB=limit)
    assert body["run_result"]["stdout"] == "allocated\n"
