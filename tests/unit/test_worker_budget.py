"""Several workers share the host's budgets: their runs together stay within what the budget gives."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mocksandbox.execution.budget import MemoryLimit, ProcessLimit, plan_memory_budget, plan_process_budget
from mocksandbox.serving.workers import (
    budget_to_json,
    memory_budget_from_json,
    process_budget_from_json,
    split_budget,
)


@given(limit=st.integers(100, 5_000_000), workers=st.integers(1, 64))
def test_worker_shares_of_the_process_budget(limit: int, workers: int) -> None:
    budget = plan_process_budget([ProcessLimit("cgroup v1 pids.max of /ci", limit, 10)], 512)
    share = split_budget(budget, workers)
    assert budget.runs_total is not None and share.runs_total is not None
    assert share.runs_total * workers <= budget.runs_total or share.runs_total == 1
    assert share.per_run <= min(budget.per_run, share.runs_total)
    assert process_budget_from_json(budget_to_json(share)) == share


def test_worker_shares_of_the_memory_budget() -> None:
    gib = 1 << 30
    budget = plan_memory_budget(
        [MemoryLimit("cgroup v1 memory.limit_in_bytes of /ci", 4 * gib, gib // 2)], 4096
    )
    share = split_budget(budget, 4)
    assert budget.runs_total is not None and share.runs_total == budget.runs_total // 4
    assert share.per_run == min(budget.per_run, share.runs_total)
    assert memory_budget_from_json(budget_to_json(share)) == share


def test_an_unbounded_budget_stays_unbounded() -> None:
    budget = plan_process_budget([], 512)
    assert split_budget(budget, 8) == budget
    assert process_budget_from_json(budget_to_json(budget)) == budget
