"""``benchmarks/bench_reward_batch.py`` scores a batch with verl's own ``compute_score`` against a
served mock and a reference URL in one run, prints its two tables, and fails loudly when a case got
no pass or fail from the sandbox (never a silent zero reward).

Only what the script computes and prints is checked here, never a speed. The reference is a mock
served in this process; verl's files come from ``.venv/test-vendor`` (skipped without them).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from benchmark_scripts import load_benchmark

from mocksandbox.serving.single import ServerThread, running_server
from mocksandbox.settings import Settings


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    module = load_benchmark("bench_reward_batch")
    try:
        module.find_verl()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return module


@pytest.fixture(scope="module")
def reference() -> Iterator[ServerThread]:
    """A mock standing in for SandboxFusion behind ``--reference-url``."""
    with running_server(Settings(pod_name=None, isolation="none")) as server:
        yield server


def _table(out: str, column: str) -> list[list[str]]:
    """The rows of the table whose header has ``column`` (up to the blank line after them)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("target ") and column in line.split())
    assert set(lines[start + 1]) == {"-"}  # the header's rule
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip() or line.startswith(("reference /", "programs:")):
            break
        rows.append(line.split())
    return rows


def test_the_completions_are_right_and_their_cases_hold_200_numbers(bench: ModuleType) -> None:
    (completion,) = bench.make_batch(1, 2, seed=3)
    program = completion.text.split("```python\n", 1)[1].split("```", 1)[0]
    cases = completion.test_cases
    for stdin, expected in zip(cases["inputs"], cases["outputs"], strict=True):
        assert len(stdin.split()) == 1 + bench.NUMBERS_PER_CASE
        done = subprocess.run([sys.executable, "-c", program], input=stdin, capture_output=True, text=True)
        assert done.stdout == expected
    other = bench.make_batch(2, 2, seed=3)[1]
    assert other.text != completion.text  # each completion folds its own way


def test_a_case_without_a_pass_or_fail_is_an_error(bench: ModuleType) -> None:
    scored = bench.Scored()
    metadata = [
        {"status": "success"},
        {"status": "wrong_answer"},
        {"status": "api_error", "api_request_error": "API Call Failed: Connection refused"},
    ]
    scored.add(1 / 3, metadata, 4)  # one case short: compute_score gave up on it
    assert (scored.runs, scored.passed, scored.failed, scored.errors) == (4, 1, 1, 2)
    assert scored.first_error == "api_error: API Call Failed: Connection refused"


def test_the_script_scores_a_batch_on_the_mock_and_the_reference_in_one_run(
    bench: ModuleType, reference: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--completions", "3", "--cases", "2", "--threads", "2", "--warmup", "1"]
    # auto: lite where this host has it (the script's default), so that the test runs on any host.
    argv += ["--isolation", "auto", "--reference-url", reference.url]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "3 completions x 2 stdin cases = 6 runs a target" in out
    batch = _table(out, "runs")
    assert [row[:5] for row in batch] == [["mock", "6", "6", "0", "0"], ["reference", "6", "6", "0", "0"]]
    assert all(float(row[5]) > 0 for row in batch)
    assert "reference / mock batch time: " in out
    cpu = _table(out, "machine")
    assert [row[0] for row in cpu] == ["mock", "reference"]
    mock, ref = cpu
    assert len(mock) == 9 and all(cell != "-" for cell in mock[2:7])  # each part of the served mock
    assert ref[2:7] == ["-"] * 5  # a server the script did not start: no parts
    assert "reference / mock machine CPU per run: " in out


def test_runs_the_sandbox_did_not_score_fail_the_script_loudly(
    bench: ModuleType, reference: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    (completion,) = bench.make_batch(1, 2)
    marker = completion.test_cases["inputs"][1].split("\n", 1)[1][:40]  # one case's numbers
    rule = reference.sandbox.add_fault(
        {"match": {"path": "/run_code", "body_contains": marker}, "action": {"type": "sandbox_error"}}
    )
    try:
        argv = ["--url", reference.url, "--completions", "1", "--cases", "2", "--warmup", "0"]
        assert bench.main([*argv, "--client", "keep-alive"]) == 1
    finally:
        reference.sandbox.remove_fault(rule.id)
    out = capsys.readouterr().out
    assert [row[:5] for row in _table(out, "runs")] == [["mock", "2", "1", "0", "1"]]
    assert "mock: 1 run(s) not scored by the sandbox, 0 wrong answer(s)" in out
    assert "first error: sandbox_error" in out


def test_a_bad_reference_url_is_an_error_not_a_traceback(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    assert bench.main(["--reference-url", f"http://127.0.0.1:{closed}", "--completions", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_reward_batch: error: --reference-url: nothing answers POST ")
    assert "Traceback" not in err
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--reference-url", "127.0.0.1:8080"])
    assert exit_info.value.code == 2
    assert "--reference-url takes an http(s) URL" in capsys.readouterr().err
