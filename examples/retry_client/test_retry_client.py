"""The retry client against mocksandbox: exact call counts under each fault."""

from __future__ import annotations

import pytest
from retry_client import run_code

from mocksandbox.pytest_plugin import MockSandboxHandle


@pytest.fixture
def sleeps() -> list[float]:
    return []


def test_success_is_one_call(mocksandbox: MockSandboxHandle, sleeps: list[float]) -> None:
    outcome = run_code(mocksandbox.run_code_url, "print('ok')", sleep=sleeps.append)
    assert outcome.response is not None and outcome.response["run_result"]["stdout"] == "ok\n"
    mocksandbox.assert_requests(1, path="/run_code")
    assert sleeps == []


def test_504_twice_then_success(mocksandbox: MockSandboxHandle, sleeps: list[float]) -> None:
    mocksandbox.fail(504, first=2)
    outcome = run_code(mocksandbox.run_code_url, "print('ok')", sleep=sleeps.append)
    assert outcome.attempts == 3 and outcome.response is not None
    entries = mocksandbox.assert_requests(3, path="/run_code")
    assert [e.status for e in entries] == [504, 504, 200]
    assert sleeps == [1.0, 2.0]


def test_504_always_gives_up_after_three_calls(mocksandbox: MockSandboxHandle, sleeps: list[float]) -> None:
    mocksandbox.fail(504)
    outcome = run_code(mocksandbox.run_code_url, "print('ok')", sleep=sleeps.append)
    assert (outcome.response, outcome.error, outcome.attempts) == (None, "HTTP 504", 3)
    mocksandbox.assert_requests(3, path="/run_code", status=504)


@pytest.mark.mocksandbox_faults({"action": {"type": "status", "status": 429, "retry_after": 1}})
def test_429_is_not_retried(mocksandbox: MockSandboxHandle, sleeps: list[float]) -> None:
    outcome = run_code(mocksandbox.run_code_url, "print('ok')", sleep=sleeps.append)
    assert (outcome.error, outcome.attempts) == ("HTTP 429", 1)
    mocksandbox.assert_requests(1, path="/run_code")
    assert sleeps == []


def test_connection_reset_is_not_retried(mocksandbox: MockSandboxHandle, sleeps: list[float]) -> None:
    mocksandbox.drop("reset")
    outcome = run_code(mocksandbox.run_code_url, "print('ok')", sleep=sleeps.append)
    assert (outcome.error, outcome.attempts) == ("request failed: ConnectionError", 1)
    mocksandbox.assert_requests(1, path="/run_code")


def test_bad_json_is_not_retried(mocksandbox: MockSandboxHandle, sleeps: list[float]) -> None:
    mocksandbox.add_fault(action={"type": "malformed_json"})
    outcome = run_code(mocksandbox.run_code_url, "print('ok')", sleep=sleeps.append)
    assert (outcome.error, outcome.attempts) == ("bad JSON", 1)
