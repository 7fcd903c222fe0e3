"""Which isolation a server starts with, and what it says when it cannot have the one asked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mocksandbox.core import MockSandbox
from mocksandbox.execution.engine import IsolationError
from mocksandbox.settings import load_settings


def test_auto_falls_back_to_none_and_says_why(tmp_path: Path) -> None:
    box = MockSandbox.create(
        load_settings(overrides={"tmp_root": str(tmp_path), "confinement": "process-group", "isolation": "auto"})
    )
    try:
        assert box.engine.isolation.mode == "none"
        assert "lite needs" in box.engine.isolation.describe()  # the reason, and what it would take
    finally:
        box.close()


def test_lite_where_it_cannot_be_had_is_a_clear_error(tmp_path: Path) -> None:
    settings = load_settings(
        overrides={"tmp_root": str(tmp_path), "confinement": "process-group", "isolation": "lite"}
    )
    with pytest.raises(IsolationError, match=r"^isolation lite is not available here: "):
        MockSandbox.create(settings)
    assert list(tmp_path.iterdir()) == []  # nothing made, nothing left


def test_serve_with_lite_where_it_cannot_be_had_exits_2_saying_why() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mocksandbox.cli", "serve", "--port", "0", "--confinement", "process-group",
         "--isolation", "lite"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("mocksandbox: isolation lite is not available here:")
    assert "Traceback" not in result.stderr


def test_none_is_asked_for_and_said() -> None:
    box = MockSandbox.create(load_settings(overrides={"isolation": "none"}))
    try:
        assert box.engine.isolation.describe().startswith("none: runs share this host's")
        assert box.engine.runs_root is None
    finally:
        box.close()
