"""The harness's figures on hand-made stamps (no sockets, no threads)."""

from __future__ import annotations

import itertools
import random

import pytest

from mocksandbox.stress import analysis
from mocksandbox.stress.harness import ConfigError, StressConfig, plan_jobs


def test_max_overlap_counts_a_hand_over_at_the_same_instant_as_one() -> None:
    assert analysis.max_overlap([]) == 0
    assert analysis.max_overlap([(0, 1), (1, 2), (2, 3)]) == 1
    assert analysis.max_overlap([(0, 2), (1, 3), (1.5, 1.6)]) == 3


def test_overlap_steps_follow_the_count() -> None:
    assert analysis.overlap_steps([(10, 12), (11, 13)], origin=10) == [(0, 1), (1, 2), (2, 1), (3, 0)]


def test_percentiles_interpolate_and_report_max() -> None:
    stats = analysis.percentiles([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert stats["p50"] == pytest.approx(5.5)
    assert stats["p95"] == pytest.approx(9.55)
    assert stats["max"] == 10
    assert analysis.percentiles([])["p99"] is None


def _brute_inversions(pairs: list[tuple[float, float]], tolerance: float) -> int:
    return sum(
        1
        for (a_ask, a_grant), (b_ask, b_grant) in itertools.permutations(pairs, 2)
        if b_ask - a_ask > tolerance and b_grant < a_grant
    )


def test_fifo_inversions_match_a_brute_force_count() -> None:
    rng = random.Random(7)
    for _ in range(50):
        pairs = [(rng.uniform(0, 1), rng.uniform(0, 1)) for _ in range(rng.randint(0, 40))]
        for tolerance in (0.0, 0.05):
            assert analysis.fifo_inversions(pairs, tolerance) == _brute_inversions(pairs, tolerance)


def test_fifo_order_has_no_inversion_and_lifo_has_all() -> None:
    fifo = [(i, 10 + i) for i in range(10)]
    lifo = [(i, 20 - i) for i in range(10)]
    assert analysis.fifo_inversions(fifo) == 0
    assert analysis.fifo_inversions(lifo) == 45


def test_peak_rate_is_the_busiest_window() -> None:
    assert analysis.peak_rate([0.0, 0.1, 0.2, 1.5, 1.6], window=1.0) == (3, 3.0)
    assert analysis.peak_rate([i * 0.25 for i in range(9)], window=1.0) == (4, 4.0)
    assert analysis.peak_rate([]) == (0, 0.0)


def test_plan_marks_planned_failures_and_gateway_requests_reproducibly() -> None:
    config = StressConfig(url="http://x", limit=3, requests=40, failure_rate=0.1, workload="gateway")
    jobs, failing, gateway = plan_jobs(config)
    assert len(jobs) == 40 and len(failing) == 4 and len(gateway) == 12
    assert plan_jobs(config)[1:] == (failing, gateway)  # same seed, same plan
    assert all(job.spec is not None and job.spec.planned_failure == (job.index in failing) for job in jobs)
    program = jobs[0].spec.program if jobs[0].spec else None
    assert program is not None and "# MSBX-REQ-0;" in program
    ping_jobs, ping_failing, _ = plan_jobs(StressConfig(url="http://x", limit=1, workload="ping"))
    assert not ping_failing and ping_jobs[0].spec is not None and ping_jobs[0].spec.program is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"limit": 0}, "--limit"),
        ({"mode": "fibers"}, "--mode"),
        ({"limiter": "a:b", "executor": "c:d"}, "not both"),
        ({"workload": "nope"}, "--workload"),
        ({"kill_holders": 1}, "processes or ray"),
        ({"mode": "processes", "kill_holders": 3}, "below --limit"),
        ({"failure_rate": 2.0}, "--failure-rate"),
    ],
)
def test_config_errors_say_what_is_wrong(changes: dict[str, object], message: str) -> None:
    config = StressConfig(url="http://x", limit=3)
    for key, value in changes.items():
        setattr(config, key, value)
    with pytest.raises(ConfigError, match=message):
        config.validate()
