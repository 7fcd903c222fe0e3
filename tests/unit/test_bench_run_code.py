"""``benchmarks/bench_run_code.py`` runs, and its rounds are medians with ratios taken per round.

Only what the script computes is checked here, never a speed: figures are the benchmark's to print.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_run_code.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_run_code", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _level(bench: ModuleType, rps: float, p50: float, cpu: float | None = None) -> object:
    return bench.Level(1, 10, 10, 0, 1.0, rps, p50, p50, p50, server_cpu_ms=cpu)


def test_a_level_of_several_rounds_is_their_median(bench: ModuleType) -> None:
    merged = bench.median_level(
        [_level(bench, r, p, c) for r, p, c in ((100, 3, 1.0), (300, 1, None), (200, 2, 3.0))]
    )
    assert (merged.rps, merged.p50_ms, merged.server_cpu_ms) == (200, 2, 2.0)
    assert merged.rounds_rps == [100, 300, 200] and merged.ok == 30


def test_a_ratio_over_rounds_pairs_each_round(bench: ModuleType) -> None:
    first = bench.Target("a", "", [bench.median_level([_level(bench, r, 1) for r in (100, 200, 300)])])
    other = bench.Target("b", "", [bench.median_level([_level(bench, r, 1) for r in (50, 400, 150)])])
    (row,) = bench._ratio_rows(first, other, [1])
    assert row["rps_ratio_rounds"] == [2.0, 0.5, 2.0] and row["rps_ratio"] == 2.0


def test_the_script_measures_in_rounds_and_says_so(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--modes", "in-process", "--concurrency", "1,2", "--requests", "4", "--rounds", "2"]
    assert bench.main([*argv, "--warmup", "0", "--spawn-runs", "2", "--python", sys.executable]) == 0
    out = capsys.readouterr().out
    assert "2 rounds: medians" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("mock-in-process ")]
    rows = [row for row in rows if row[1].isdigit()]  # the throughput table's lines
    assert [(row[1], row[2]) for row in rows] == [("1", "8"), ("2", "8")]  # 2 rounds x 4 requests, all ok
