"""The swedev session endpoints (contract swedev.md), when the target has them.

A session needs an instance the target knows: the mock lists its own (/_mock/instances); for
another target, pass one with the environment variable CONTRACT_SWEDEV_INSTANCE_HASH.
"""

from __future__ import annotations

import os

import pytest
from contract_support import Target

pytestmark = pytest.mark.needs_endpoint("/start_instance")


@pytest.fixture(scope="module")
def instance_hash(target: Target) -> str:
    given = os.environ.get("CONTRACT_SWEDEV_INSTANCE_HASH")
    if given:
        return given
    if target.is_mock():
        instances = target.get("/_mock/instances").json()["instances"]
        if not instances:
            pytest.skip("the mock has no swedev instances loaded (serve it with --instances DIR)")
        return str(instances[0]["instance_hash"])
    pytest.skip("no instance known on this target: set CONTRACT_SWEDEV_INSTANCE_HASH")


def start(target: Target, instance_hash: str) -> str:
    reply = target.post("/start_instance", {"instance_hash": instance_hash}, timeout=600)
    assert reply.status_code == 200, reply.text[:300]
    sid = reply.json()["sid"]
    assert isinstance(sid, str) and sid.isdigit()  # verl calls int(sid)
    return sid


def test_a_whole_episode(target: Target, instance_hash: str) -> None:
    sid = start(target, instance_hash)
    action = "Let me look.\n<function=execute_bash>\n<parameter=command>echo contract-check</parameter>\n</function>"
    reply = target.post("/process_action", {"sid": sid, "content": action})
    assert reply.status_code == 200
    content = reply.json()["content"]
    assert content.startswith("EXECUTION RESULT of [execute_bash]:") and "contract-check" in content
    # The sid travels through a tensor in verl: an int must address the same session.
    again = target.post("/process_action", {"sid": int(sid), "content": action})
    assert again.status_code == 200 and "contract-check" in again.json()["content"]
    assert isinstance(target.post("/postprocess", {"sid": sid}, timeout=600).json(), dict)
    # Rewards are fetched after the rollout: the result survives post-processing.
    reward = target.post("/compute_reward", {"sid": int(sid)}, timeout=300)
    assert reward.status_code == 200
    assert isinstance(reward.json()["reward"], int | float)


def test_instance_hash_as_int(target: Target, instance_hash: str) -> None:
    reply = target.post("/start_instance", {"instance_hash": int(instance_hash)}, timeout=600)
    assert reply.status_code == 200
    target.post("/postprocess", {"sid": reply.json()["sid"]}, timeout=600)


def test_unknown_session_is_a_client_error(target: Target) -> None:
    reply = target.post("/process_action", {"sid": "1", "content": "<function=finish>\n</function>"})
    if reply.status_code == 200:
        pytest.skip("the target answers an unknown session with 200 (verl treats any answer alike)")
    assert 400 <= reply.status_code < 500, reply.text[:300]


@pytest.mark.mock_only
def test_the_mock_also_starts_by_instance_id(target: Target, instance_hash: str) -> None:
    listed = target.get("/_mock/instances").json()["instances"]
    instance_id = next(i["instance_id"] for i in listed if i["instance_hash"] == instance_hash)
    reply = target.post("/start_instance", {"instance_id": instance_id}, timeout=600)
    assert reply.status_code == 200, reply.text[:300]
    target.post("/postprocess", {"sid": reply.json()["sid"]}, timeout=600)
    both = target.post("/start_instance", {"instance_id": instance_id, "instance_hash": instance_hash})
    assert both.status_code == 422 and both.json()["detail"][0]["loc"] == ["body"]
