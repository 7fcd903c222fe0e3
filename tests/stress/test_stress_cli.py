"""``mocksandbox stress`` in a subprocess against a real mock server: the issue's "Done when"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mocksandbox.pytest_plugin import MockSandboxHandle


def mocksandbox_command() -> list[str]:
    script = Path(sys.executable).with_name("mocksandbox")
    return [str(script)] if script.exists() else [sys.executable, "-m", "mocksandbox.cli"]


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*mocksandbox_command(), "stress", *args], capture_output=True, text=True, timeout=timeout
    )


def test_reference_run_holds_the_cap_and_exits_0(mocksandbox: MockSandboxHandle, tmp_path: Path) -> None:
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    result = run_cli(
        "--url", mocksandbox.url, "--limit", "3", "--mode", "threads", "--requests", "60",
        "--json", str(out), "--plot", str(png),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["max_in_flight"] <= 3 and report["verdict"]["passed"]
    assert report["requests"]["completed"] == 60
    assert mocksandbox.stats()["max_in_flight"] <= 3
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "verdict:" in result.stdout and "max in flight" in result.stdout
    assert "stress run" in result.stderr  # the progress bar


def test_seed_shaped_executor_exceeds_the_cap_and_exits_non_zero(
    mocksandbox: MockSandboxHandle, tmp_path: Path
) -> None:
    out = tmp_path / "seed.json"
    result = run_cli(
        "--url", mocksandbox.url, "--limit", "3", "--mode", "threads", "--requests", "60",
        "--executor", "mocksandbox.ratelimit.faulty:seed_execution_worker", "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["max_in_flight"] > 3
    assert mocksandbox.stats()["max_in_flight"] > 3
    assert report["permits"]["in_flight_after"] < 0  # fifteen releases without an acquire
    assert report["errors"]["swallowed"] >= 1  # the seed also turns failures into None
    assert any("cap exceeded" in reason for reason in report["verdict"]["reasons"])
    assert "FAIL" in result.stdout


def test_unusable_options_exit_2(mocksandbox: MockSandboxHandle, tmp_path: Path) -> None:
    out = str(tmp_path / "x.json")
    bad_factory = run_cli(
        "--url", mocksandbox.url, "--limit", "3", "--executor", "nope:nothing", "--json", out
    )
    assert bad_factory.returncode == 2 and "cannot import 'nope'" in bad_factory.stderr
    unreachable = run_cli("--url", "http://127.0.0.1:9", "--limit", "3", "--json", out)
    assert unreachable.returncode == 2 and "cannot reach" in unreachable.stderr
    threads_kill = run_cli("--url", mocksandbox.url, "--limit", "3", "--kill-holders", "1", "--json", out)
    assert threads_kill.returncode == 2 and "processes or ray" in threads_kill.stderr
