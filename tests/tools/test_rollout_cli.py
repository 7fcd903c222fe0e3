"""``mocksandbox rollout``: replay scripts from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mocksandbox.cli import main
from mocksandbox.pytest_plugin import MockSandboxHandle
from mocksandbox.tools import load_jsonl


def test_replays_the_seed_sample_on_a_mock_it_starts(
    rollout_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["rollout", str(rollout_fixtures / "seed_sample.json")]) == 0
    out = capsys.readouterr().out
    assert "started a mock sandbox at http://127.0.0.1:" in out
    assert "score 0.0, tool responses ['220000.0\\n'], matches the recorded rollout" in out
    assert "mock sandbox: 1 request(s), at most 1 at once" in out


def test_batch_against_a_url_with_jsonl(
    rollout_fixtures: Path, mocksandbox: MockSandboxHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "records.jsonl"
    code = main(
        [
            "rollout",
            str(rollout_fixtures / "seed_sample.json"),
            "--url",
            mocksandbox.url,
            "--repeat",
            "6",
            "--rate-limit",
            "2",
            "--numeric",
            "--jsonl",
            str(out_file),
        ]
    )
    assert code == 0
    rows = load_jsonl(out_file)
    assert [row["score"] for row in rows] == [1.0] * 6
    assert mocksandbox.stats()["max_in_flight"] <= 2
    assert capsys.readouterr().out.count("score 1.0") == 6


def test_a_rollout_that_differs_from_its_recording(
    rollout_fixtures: Path, mocksandbox: MockSandboxHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mocksandbox.sandbox_error("down for maintenance")
    script = tmp_path / "seed.json"
    script.write_text((rollout_fixtures / "seed_sample.json").read_text())
    assert main(["rollout", str(script), "--url", mocksandbox.url]) == 1
    out = capsys.readouterr().out
    assert "[sandbox error] The sandbox failed to run the code: down for maintenance" in out
    assert "DIFFERS from the recorded rollout" in out


def test_unusable_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"prompt": []}))
    assert main(["rollout", str(bad), "--url", "http://127.0.0.1:9"]) == 2
    assert "cannot read a script" in capsys.readouterr().err
