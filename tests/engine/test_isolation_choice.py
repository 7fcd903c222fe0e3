"""Which isolation a server starts with, and what it says when it cannot have the one asked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mocksandbox import divergence
from mocksandbox.core import MockSandbox
from mocksandbox.execution.engine import IsolationError
from mocksandbox.models import RunCodeRequest
from mocksandbox.settings import load_settings


@pytest.fixture
def lite_unavailable(monkeypatch: pytest.MonkeyPatch) -> str:
    """A host where worlds cannot be had (what the engine reads of it, as a kernel without overlayfs
    or user namespaces would answer)."""
    reason = "lite needs overlayfs (modprobe overlay)"
    monkeypatch.setattr("mocksandbox.execution.engine.lite_unavailable_reason", lambda: reason)
    return reason


def test_auto_falls_back_to_none_and_says_why(tmp_path: Path, lite_unavailable: str) -> None:
    box = MockSandbox.create(load_settings(overrides={"tmp_root": str(tmp_path), "isolation": "auto"}))
    try:
        assert box.engine.isolation.mode == "none"
        assert lite_unavailable in box.engine.isolation.describe()  # the reason, and what it would take
        # ... and beside every answer (seam 10), never in it.
        with divergence.collecting() as notes:
            answer = box.engine.run_code(RunCodeRequest(code="print(1)", language="python"))
        assert answer.run_result is not None and answer.run_result.stdout == "1\n"
        assert notes == [f"isolation: not in force for this run: a world of its own ({lite_unavailable})"]
    finally:
        box.close()


def test_lite_where_it_cannot_be_had_is_a_clear_error(tmp_path: Path, lite_unavailable: str) -> None:
    settings = load_settings(overrides={"tmp_root": str(tmp_path), "isolation": "lite"})
    with pytest.raises(IsolationError, match=r"^isolation lite is not available here: lite needs overlayfs"):
        MockSandbox.create(settings)
    assert list(tmp_path.iterdir()) == []  # nothing made, nothing left


def test_an_unprivileged_run_user_where_it_cannot_be_had_is_a_clear_error(
    tmp_path: Path, lite_unavailable: str
) -> None:
    settings = load_settings(overrides={"tmp_root": str(tmp_path), "run_as": "user"})
    with pytest.raises(IsolationError, match=r"^runs cannot be an unprivileged user: isolation lite is not"):
        MockSandbox.create(settings)


def test_serve_asked_for_what_cannot_be_had_exits_2_saying_why() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mocksandbox.cli",
            "serve",
            "--port",
            "0",
            "--isolation",
            "none",
            "--run-as",
            "user",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(
        "mocksandbox: runs cannot be an unprivileged user: isolation none was asked for"
    ), result.stderr
    assert "Traceback" not in result.stderr


def test_runs_as_the_hosts_root_when_asked_and_it_says_so(tmp_path: Path) -> None:
    box = MockSandbox.create(load_settings(overrides={"tmp_root": str(tmp_path), "run_as": "root"}))
    try:
        if box.engine.isolation.mode != "lite":
            pytest.fail(f"isolation lite did not start here: {box.engine.isolation.describe()}")
        assert box.engine.isolation.run_uid is None
        assert "runs are the host's root" in box.engine.isolation.describe()
        answer = box.engine.run_code(RunCodeRequest(code="cat /proc/self/uid_map", language="bash"))
        assert answer.run_result is not None
        assert answer.run_result.stdout.split() == ["0", "0", "4294967295"]
    finally:
        box.close()


def test_none_is_asked_for_and_said() -> None:
    box = MockSandbox.create(load_settings(overrides={"isolation": "none"}))
    try:
        assert box.engine.isolation.describe().startswith("none: runs share this host's")
        assert box.engine.runs_root is None
    finally:
        box.close()
