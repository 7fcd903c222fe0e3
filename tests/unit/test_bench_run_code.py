"""``benchmarks/bench_run_code.py`` runs, and its rounds are medians with ratios taken per round; its
load spreads over client processes, and it reports each part's CPU and when the clients saturate.

Only what the script computes is checked here, never a speed: figures are the benchmark's to print.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from benchmark_scripts import load_benchmark

from mocksandbox.serving.single import running_server
from mocksandbox.settings import Settings


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    module = load_benchmark("bench_run_code")
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
    throughput = out.split("client cores\n", 1)[1].split("\n\n", 1)[0]  # the first table
    rows = [line.split() for line in throughput.splitlines() if line.startswith("mock-in-process ")]
    assert [(row[1], row[2]) for row in rows] == [("1", "8"), ("2", "8")]  # 2 rounds x 4 requests, all ok


@pytest.mark.parametrize("client", ["http", "new-connection"])
def test_client_processes_share_the_load_and_report_their_cpu(
    bench: ModuleType, client: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = tmp_path / "figures.json"
    argv = ["--modes", "in-process", "--concurrency", "1,3", "--requests", "5", "--client", client]
    argv += ["--client-processes", "2", "--warmup", "0", "--spawn-runs", "2", "--python", sys.executable]
    assert bench.main([*argv, "--json", str(figures)]) == 0
    out = capsys.readouterr().out
    assert f"client: {client}, 2 processes" in out
    levels = json.loads(figures.read_text())["targets"][0]["levels"]
    # Every request answered once; concurrency 1 needs one process, 3 is spread over both.
    assert [(lv["ok"], lv["client_processes"]) for lv in levels] == [(5, 1), (5, 2)]
    assert all(lv["client_cpu_ms"] > 0 and lv["client_cores_available"] >= 1 for lv in levels)


def test_a_level_whose_clients_used_their_cores_says_so(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    level = bench.Level(16, 10, 10, 0, 1.0, 10.0, 1.0, 1.0, 1.0)
    level.client_cores, level.client_cores_available, level.client_saturated = 1.9, 2, True
    spawn = {"python": "python", "runs": 1, "p50_ms": 1.0, "p95_ms": 1.0}
    ratios = {
        "first_mock": "mock",
        "mock_p50_over_spawn_p50": 1.0,
        "mock_p50_over_spawn_p50_at_concurrency": 16,
    }
    info = {"requests": 10, "workload": "print", "client_processes": 2, "client_cores_available": 2}
    bench.print_report([bench.Target("mock", "", [level])], spawn, ratios, info)
    assert "client saturated at mock c=16: clients used 1.9 of 2 cores" in capsys.readouterr().out


def test_the_meter_counts_new_processes_from_their_start_and_programs_from_the_cgroup(
    bench: ModuleType,
) -> None:
    def sample(relays: dict, reaped: dict, total: float | None) -> object:
        return bench.CpuSample({"server": {(1, 0.0): 2.0}, "launcher": {}, "relays": relays}, reaped, total)

    old, new = (10, 1.0), (11, 2.0)  # a relay that lived on, one born during the level
    before = sample({old: 1.0}, {old: 3.0}, 100.0)
    after = sample({old: 1.5, new: 0.25}, {old: 4.0, new: 0.5}, 103.0)
    spent = bench.CpuMeter.spent(before, after)
    assert (spent["server"], spent["relays"]) == (0.0, 0.75)
    assert spent["programs"] == pytest.approx(3.0 - 0.75)  # the cgroup's rest
    no_cgroup = bench.CpuMeter.spent(sample({old: 1.0}, {old: 3.0}, None), sample({}, {new: 0.5}, None))
    assert no_cgroup["programs"] == 0.5  # a relay gone takes its programs with it


@pytest.mark.slow  # two `mocksandbox serve` processes, one after the other
def test_served_workers_make_a_scaling_curve_with_each_part_s_cpu(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = tmp_path / "figures.json"
    argv = ["--modes", "fork", "--workers", "1,2", "--concurrency", "2", "--requests", "4"]
    argv += ["--client-processes", "2", "--warmup", "1", "--spawn-runs", "2", "--json", str(figures)]
    assert bench.main(argv) == 0
    assert "Scaling curve" in capsys.readouterr().out
    written = json.loads(figures.read_text())
    assert [(row["workers"], row["concurrency"]) for row in written["scaling"]] == [(1, 2), (2, 2)]
    for target in written["targets"]:
        (level,) = target["levels"]
        parts = ("server", "launcher", "relays", "programs", "client")
        assert all(level[f"{part}_cpu_ms"] is not None for part in parts)


def test_interleaved_targets_take_turns_and_each_level_is_over_all_of_its_turns(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns: list[tuple[str, int, int]] = []

    def load_turn(url: str, concurrency: int, total: int, *rest: object) -> object:
        turns.append((url, concurrency, total))
        # Target "b" answers twice as fast; each turn's latencies are its requests' own.
        seconds = total / (200 if url == "b" else 100)
        load = bench._Load([seconds / total] * total, 0, None, 0.0, 0.0, seconds)
        return bench._Turn([load], seconds, 0.0, seconds)

    monkeypatch.setattr(bench, "_load_turn", load_turn)
    entries = [bench.Entry("first", "a"), bench.Entry("second", "b")]
    targets = bench.measure_in_turns(entries, [1, 4], 10, 3, 0, 1.0)
    assert turns == [
        *[("a", 1, 4), ("b", 1, 4), ("b", 1, 3), ("a", 1, 3), ("a", 1, 3), ("b", 1, 3)],
        *[("a", 4, 4), ("b", 4, 4), ("b", 4, 3), ("a", 4, 3), ("a", 4, 3), ("b", 4, 3)],
    ]
    assert [t.name for t in targets] == ["first", "second"]
    for target, rps in zip(targets, (100, 200), strict=True):
        assert [(lv.concurrency, lv.ok) for lv in target.levels] == [(1, 10), (4, 10)]
        assert all(lv.rps == pytest.approx(rps) for lv in target.levels)
        assert target.levels[0].p50_ms == pytest.approx(1000 / rps)


def test_the_script_interleaves_its_targets_when_asked(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--modes", "in-process", "--concurrency", "2", "--requests", "5", "--interleave", "2"]
    assert bench.main([*argv, "--warmup", "0", "--spawn-runs", "2", "--python", sys.executable]) == 0
    throughput = capsys.readouterr().out.split("client cores\n", 1)[1].split("\n\n", 1)[0]
    rows = [line.split() for line in throughput.splitlines() if line.startswith("mock-in-process ")]
    assert [(row[1], row[2], row[3]) for row in rows] == [("2", "5", "0")]  # 3 + 2 requests, all ok
    with pytest.raises(SystemExit):
        bench.parse_args(["--requests", "5", "--interleave", "6"])


#: A process that spends ``SECONDS`` of CPU and ends (started with ``-S``: little start-up CPU).
_BUSY = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass"
#: A stand-in for SandboxFusion's server: for each line on stdin, a run (a shell's worth: a process
#: that starts the program and waits for it) that it waits for, then "done". Its runs end and are
#: reaped between two samples of a meter: no sample ever sees them alive.
_SERVER = """
import subprocess, sys
run = [sys.executable, "-S", "-c", "import subprocess, sys; subprocess.run([sys.executable, '-S', '-c', sys.argv[1]])"]
for line in sys.stdin:
    subprocess.run([*run, line.strip().replace("|", "\\n")], check=True)
    print("done", flush=True)
"""


def test_the_tree_meter_counts_the_short_lived_runs_its_tree_reaped(bench: ModuleType) -> None:
    server = subprocess.Popen(
        [sys.executable, "-S", "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        meter = bench.TreeMeter(server.pid)
        before = meter.sample()
        runs, seconds = 3, 0.25
        for _ in range(runs):
            server.stdin.write(_BUSY.format(seconds=seconds).replace("\n", "|") + "\n")
            server.stdin.flush()
            assert server.stdout.readline() == "done\n"  # the run and its program ended, and were reaped
        spent = meter.sample() - before
        # Every program's CPU is in (its shell's reaped children's time, then the server's); none of
        # it twice (that would be 1.5 s and more). The rest is each run's two interpreters starting.
        assert runs * seconds <= spent < 2 * runs * seconds - 0.2
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    with pytest.raises(RuntimeError, match=f"process {server.pid} is gone"):
        meter.sample()


def _cpu_level(bench: ModuleType, concurrency: int, machine: float | None, total: float | None) -> object:
    level = bench.Level(concurrency, 10, 10, 0, 1.0, 10.0, 1.0, 1.0, 1.0)
    level.machine_cpu_ms, level.total_cpu_ms = machine, total
    return level


def test_the_cpu_ratio_is_the_reference_s_over_the_mock_s_taken_per_round(bench: ModuleType) -> None:
    def target(name: str, source: str | None, *levels: tuple[int, float | None, float | None]) -> object:
        return bench.Target(name, "", [_cpu_level(bench, *lv) for lv in levels], total_cpu_from=source)

    mock = [target("mock", "parts", (16, 2.0, 1.0)), target("mock", "parts", (16, 4.0, 1.0))]
    reference = [target("reference", "tree", (16, 10.0, 7.0)), target("reference", "tree", (16, 12.0, 5.0))]
    (row,) = bench.cpu_ratio_rows(mock, reference, [16])
    assert row["machine_ratio_rounds"] == [5.0, 3.0] and row["machine_ratio"] == 4.0
    assert row["total_ratio"] == 6.0 and row["total_from"] == "tree vs parts"
    # A reference without --reference-pid: the machine's ratio alone.
    (row,) = bench.cpu_ratio_rows(mock[:1], [target("reference", None, (16, 10.0, None))], [16])
    assert row["machine_ratio"] == 5.0 and math.isnan(row["total_ratio"])


def test_the_cpu_ratio_lines_say_which_figures_were_compared(bench: ModuleType) -> None:
    rows = [
        {"concurrency": 16, "machine_ratio": 6.744, "total_ratio": 6.801, "total_from": "tree vs parts"},
        {"concurrency": 4, "machine_ratio": 5.0, "total_ratio": math.nan, "total_from": "- vs parts"},
        {"concurrency": 1, "machine_ratio": math.nan, "total_ratio": math.nan, "total_from": "- vs -"},
    ]
    assert bench.cpu_ratio_lines({"mock-fork": rows}) == [
        "",
        "CPU per run, c=16: reference / mock-fork = 6.74x (machine), 6.80x (tree vs parts)",
        "CPU per run, c=4: reference / mock-fork = 5.00x (machine)",
    ]
    rounds = {**rows[1], "machine_ratio_rounds": [4.5, 5.0, 5.5]}
    assert bench.cpu_ratio_lines({"mock": [rounds]})[1].endswith(
        "= 5.00x (machine)   machine by round: 4.50 5.00 5.50"
    )
    assert bench.cpu_ratio_lines({"mock": rows[2:]}) == []


def test_reference_pid_needs_a_reference_url_and_a_process(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    args = bench.parse_args(["--reference-url", "http://127.0.0.1:8090", "--reference-pid", str(os.getpid())])
    assert args.reference_pid == os.getpid() and args.interleave == 4  # a reference: in turns
    assert bench.parse_args(["--reference-url", "http://x", "--interleave", "0"]).interleave == 0
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    for argv, words in (
        (["--reference-pid", str(os.getpid())], "--reference-pid goes with --reference-url"),
        (["--reference-url", "http://x", "--reference-pid", str(gone.pid)], "no such process"),
        (["--reference-url", "http://x", "--reference-pid", "0"], "not a process id"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            bench.parse_args(argv)
        assert exit_info.value.code == 2
        assert words in capsys.readouterr().err


def test_the_script_gives_each_target_s_machine_cpu_and_the_reference_s_tree(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    figures = tmp_path / "figures.json"
    with running_server(Settings(pod_name=None, isolation="none")) as reference:
        argv = ["--modes", "in-process", "--concurrency", "2", "--requests", "6", "--warmup", "0"]
        argv += ["--reference-url", reference.url, "--reference-pid", str(os.getpid())]
        argv += ["--spawn-runs", "2", "--python", sys.executable, "--json", str(figures)]
        assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "each level in 4 turns, the targets taking turns" in out
    table = out.split("req/s/core\n", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    rows = {line.split()[0]: line.split() for line in table if line.startswith(("mock", "reference"))}
    # target conc req/s server launcher relays programs total machine client req/s/core
    assert rows["mock-in-process"][3:8] == ["-"] * 5  # in this process: no parts, no tree
    assert rows["reference"][3:7] == ["-"] * 4 and rows["reference"][7] != "-"  # its tree's total
    assert all(row[8] != "-" for row in rows.values())  # the machine's, for both
    assert "CPU per run, c=2: reference / mock-in-process = " in out
    (row,) = json.loads(figures.read_text())["ratios"]["cpu_reference_over_mock"]["mock-in-process"]
    assert row["concurrency"] == 2 and row["total_from"] == "tree vs -"


def test_a_busy_host_s_machine_figures_say_so(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    spawn = {"python": "python", "runs": 1, "p50_ms": 1.0, "p95_ms": 1.0}
    ratios = {"first_mock": "mock", "mock_p50_over_spawn_p50": 1.0, "mock_p50_over_spawn_p50_at_concurrency": 1}
    info = {"requests": 10, "workload": "print", "load_before": 0.0}
    targets = [bench.Target("mock", "", [_cpu_level(bench, 1, 2.0, 1.0)])]
    bench.print_report(targets, spawn, ratios, info)
    assert "the machine figures" not in capsys.readouterr().out
    bench.print_report(targets, spawn, ratios, {**info, "load_before": 4.0 * (os.cpu_count() or 1)})
    assert "others' work, is in\nthe machine figures" in capsys.readouterr().out
