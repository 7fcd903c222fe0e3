"""The harness against a real mock server: every reference limiter passes, every fault is caught.

Each faulty subject comes from ``mocksandbox.ratelimit.faulty`` (one per fault in
``../shared/contract/ratelimit.md``); the assertions name the figure that catches it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mocksandbox.core import MockSandbox
from mocksandbox.pytest_plugin import MockSandboxHandle
from mocksandbox.ratelimit import FairLimiter, RetryPolicy, ThreadExecutionPool, faulty
from mocksandbox.serving.single import ServerThread
from mocksandbox.settings import load_settings
from mocksandbox.stress.harness import StressConfig, run_stress
from mocksandbox.stress.workload import is_gateway_timeout

SMALL: dict[str, Any] = {"requests": 24, "workload": "sleep", "sleep_seconds": 0.05, "workers": 8}


@pytest.fixture(autouse=True)
def _fresh_faulty_singletons() -> Iterator[None]:
    faulty.reset()
    yield
    faulty.reset()


def stress(url: str, **changes: Any) -> dict[str, Any]:
    return run_stress(StressConfig(url=url, limit=3, **{**SMALL, **changes}))


def reasons(report: dict[str, Any]) -> str:
    return "\n".join(report["verdict"]["reasons"])


def warnings(report: dict[str, Any]) -> str:
    return "\n".join(report["verdict"]["warnings"])


def assert_passes(report: dict[str, Any], mocksandbox: MockSandboxHandle | None = None) -> None:
    assert report["verdict"]["passed"], report["verdict"]
    assert report["max_in_flight"] is not None and report["max_in_flight"] <= 3
    assert report["in_flight"]["client"] <= 3
    permits = report["permits"]
    assert permits["leaked"] == 0 and permits["extra"] == 0 and permits["effective_after"] == 3
    assert permits["in_flight_after"] in (0, None)
    assert report["errors"]["swallowed"] == 0 and report["errors"]["wrong_type"] == 0
    assert not report["errors"]["foreign"]
    if mocksandbox is not None:
        assert mocksandbox.stats()["max_in_flight"] <= 3  # the mock agrees


# -- every reference limiter passes ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["threads", "asyncio", "processes"])
def test_reference_limiter_passes(mocksandbox: MockSandboxHandle, mode: str) -> None:
    report = stress(mocksandbox.url, mode=mode, failure_rate=0.15)
    assert_passes(report, mocksandbox)
    errors = report["errors"]
    assert errors["planned_failures"] == 4 and errors["typed"] == 4 and errors["reached_caller_typed"]
    assert report["max_in_flight_source"] == "mock /_mock/timeline"
    expected = "refused" if mode == "processes" else "honoured"  # a named table refuses limit + 1
    assert report["limit_conflict"]["outcome"] == expected
    assert report["requests"]["ok"] == 20 and report["throughput_rps"] > 0
    assert report["wait_s"]["p50"] is not None and report["latency_s"]["p99"] is not None


def test_reference_thread_pool_executor_passes(mocksandbox: MockSandboxHandle) -> None:
    def pool(limit: int) -> ThreadExecutionPool:
        return ThreadExecutionPool(4 * limit, FairLimiter(limit))

    assert_passes(stress(mocksandbox.url, executor=pool, failure_rate=0.15), mocksandbox)


def test_reference_limiter_passes_against_a_server_that_is_not_the_mock() -> None:
    box = MockSandbox.create(load_settings(overrides={"control_api": False, "port": 0}))
    server = ServerThread(box, "127.0.0.1", 0).start()
    try:
        report = stress(server.url, workload="sleep", sleep_seconds=0.1)
    finally:
        server.stop()
        box.close()
    assert not report["target"]["is_mock"]
    assert report["max_in_flight_source"] == "program stamps"
    assert_passes(report)


def test_the_server_cap_shows_as_429s(mocksandbox: MockSandboxHandle) -> None:
    mocksandbox.set_capacity(max_in_flight=2)  # the gateway allows fewer than the limiter lets through
    report = stress(mocksandbox.url, failure_rate=0, conflict_check=False)
    assert report["http"]["status_429"] > 0
    assert report["http"]["server"]["rejected_by_cap"] == report["http"]["status_429"]
    assert "429" in warnings(report)


# -- one faulty subject per fault -----------------------------------------------------------------


def test_fault1_release_without_acquire_exceeds_the_cap(mocksandbox: MockSandboxHandle) -> None:
    report = stress(
        mocksandbox.url,
        executor=faulty.release_without_acquire,
        sleep_seconds=0.1,
        workers=12,
        failure_rate=0,
    )
    assert not report["verdict"]["passed"]
    # Every failed acquire was "released": the count went negative and the cap grew.
    assert report["permits"]["in_flight_after"] < 0
    assert report["max_in_flight"] > 3 and mocksandbox.stats()["max_in_flight"] > 3
    assert "cap exceeded" in reasons(report)
    assert "AcquireFailed" in reasons(report)


def test_fault2_swallowed_exceptions_are_caught(mocksandbox: MockSandboxHandle) -> None:
    report = stress(mocksandbox.url, executor=faulty.swallowing_executor, failure_rate=0.25)
    errors = report["errors"]
    assert errors["planned_failures"] == 6 and errors["swallowed"] == 6 and errors["typed"] == 0
    assert errors["reached_caller_typed"] is False
    assert "errors swallowed" in reasons(report)
    assert report["max_in_flight"] <= 3  # the cap itself holds: only the errors are lost


def test_fault3_first_limit_wins_is_caught_by_the_conflict_check(mocksandbox: MockSandboxHandle) -> None:
    report = stress(mocksandbox.url, limiter=faulty.first_limit_wins, probe_seconds=0.1)
    conflict = report["limit_conflict"]
    assert conflict["outcome"] == "first-limit-wins"
    assert conflict["asked"] == 4 and conflict["effective"] == 3 and conflict["reported_limit"] == 4
    assert "first limit wins" in reasons(report)


def test_fault4_no_pacing_is_caught_with_rate(mocksandbox: MockSandboxHandle) -> None:
    faulty_report = stress(
        mocksandbox.url, limiter=faulty.concurrency_only, rate=5.0, workload="short", requests=20
    )
    assert faulty_report["rate"]["peak_starts_in_1s"] > 5 * 1.2 + 2
    assert "rate exceeded" in reasons(faulty_report)

    paced = stress(mocksandbox.url, rate=5.0, workload="short", requests=10, conflict_check=False)
    assert "rate exceeded" not in reasons(paced)
    assert paced["duration_s"] >= 9 / 5  # ten starts, 1/5 s apart at least
    assert_passes(paced)


def test_fault5_dead_holders_leak_permits_without_leases(mocksandbox: MockSandboxHandle) -> None:
    report = stress(
        mocksandbox.url,
        mode="processes",
        limiter=faulty.no_lease_process_limiter,
        kill_holders=1,
        workload="short",
        requests=12,
        workers=5,
        probe_seconds=0.1,
        conflict_check=False,
    )
    permits = report["permits"]
    assert permits["holders_killed"] == 1
    assert permits["leaked"] == 1 and permits["effective_after"] == 2
    assert "permits leaked" in reasons(report)

    reference = stress(
        mocksandbox.url,
        mode="processes",
        kill_holders=1,
        workload="short",
        requests=12,
        workers=5,
        conflict_check=False,
    )
    assert reference["permits"]["holders_killed"] == 1
    assert_passes(reference)


def test_fault6_permits_held_through_retry_sleeps(mocksandbox: MockSandboxHandle) -> None:
    common: dict[str, Any] = {
        "workload": "gateway",
        "gateway_rate": 1.0,  # every first attempt meets a 504; the client retries after 0.4 s
        "retry_sleeps": (0.4,),
        "requests": 9,
        "failure_rate": 0,
        "conflict_check": False,
    }
    held = stress(mocksandbox.url, executor=faulty.hold_through_retries, **common)
    assert held["http"]["by_status"]["504"] == 9 and held["requests"]["ok"] == 9
    assert held["permit_time"]["idle_fraction"] > 0.5
    assert "permits idle" in warnings(held)

    def pool(limit: int) -> ThreadExecutionPool:
        policy = RetryPolicy(is_gateway_timeout, sleeps=(0.4,))
        return ThreadExecutionPool(4 * limit, FairLimiter(limit), retry=policy)

    released = stress(mocksandbox.url, executor=pool, **common)
    assert released["requests"]["ok"] == 9
    assert "permits idle" not in warnings(released)
    reference = stress(mocksandbox.url, **common)  # the harness's own integration: per attempt
    assert reference["permit_time"]["idle_fraction"] < 0.5 and reference["requests"]["ok"] == 9


def test_fault7_disabled_global_limit_crashes_every_call(mocksandbox: MockSandboxHandle) -> None:
    report = stress(mocksandbox.url, executor=faulty.disabled_global_limit, conflict_check=False)
    assert report["errors"]["foreign"] == {"AttributeError": 24}
    assert report["requests"]["reached_server"] == 0
    assert "no request reached the server" in reasons(report)


def test_ping_workload_measures_the_server_side(mocksandbox: MockSandboxHandle) -> None:
    report = stress(mocksandbox.url, workload="ping", requests=30, conflict_check=False)
    assert_passes(report, mocksandbox)
    assert report["requests"]["reached_server"] == 30
    assert "error propagation not checked" in warnings(report)
