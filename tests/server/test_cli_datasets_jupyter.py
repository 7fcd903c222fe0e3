"""`mocksandbox serve` with the dataset and Jupyter options: parsed, served, and nothing left behind."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from mocksandbox.cli import build_parser


def test_options_are_parsed() -> None:
    argv = "serve --datasets a --datasets b --jupyter-pool-size 0 --jupyter-prewarm --jupyter-launcher spawn"
    args = build_parser().parse_args(argv.split())
    assert (args.datasets, args.jupyter_pool_size, args.jupyter_prewarm, args.jupyter_launcher) == (
        ["a", "b"],
        0,
        True,
        "spawn",
    )


def test_a_missing_datasets_directory_stops_the_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mocksandbox.cli",
            "serve",
            "--port",
            "0",
            "--datasets",
            str(tmp_path / "nope"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"dataset directory {tmp_path / 'nope'} does not exist" in done.stderr


def test_a_broken_dataset_file_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "code_eval_broken.jsonl").write_text('{"id": 1}\nnot json\n')
    done = subprocess.run(
        [sys.executable, "-m", "mocksandbox.cli", "serve", "--port", "0", "--datasets", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "code_eval_broken.jsonl:2: not JSON" in done.stderr


def test_serve_datasets_and_prewarmed_kernels_then_stop(tmp_path: Path) -> None:
    pytest.importorskip("ipykernel", reason="the jupyter extra is not installed")
    row = {
        "id": 1,
        "content": "Return 7.",
        "labels": {"test_setup_code": ""},
        "test_list": ["assert seven() == 7"],
    }
    (tmp_path / "code_eval_mine.jsonl").write_text(json.dumps(row) + "\n")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "mocksandbox.cli", "serve", "--port", "0", "--datasets", str(tmp_path)),
            *("--jupyter-prewarm", "--jupyter-pool-size", "1"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = [proc.stdout.readline()]
        while "press Ctrl-C" not in banner[-1] and banner[-1]:
            banner.append(proc.stdout.readline())
        match = re.search(r"serving on (http://\S+)", banner[0])
        assert match
        url = match.group(1)
        assert "  jupyter: 1 warm kernel(s) (fork), filling now\n" in banner
        # The banner counts them (SandboxFusion's 53 registered ids, the samples and `mine`); `mocksandbox
        # datasets` lists them, registered ids first, then the recognised files.
        assert any(line.startswith("  datasets: 56 (mocksandbox datasets lists them") for line in banner)
        listed = subprocess.run(
            [sys.executable, "-m", "mocksandbox.cli", "datasets", "--datasets", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.splitlines()
        assert listed[1].split()[:2] == ["aider_benchmark_v1", "AiderBenchmarkDataset"]
        ids = [line.split()[0] for line in listed[1:57]]
        assert ids[-4:] == ["verilogeval_machine", "code_contests_sample", "humaneval_sample", "mine"]
        assert listed[56].split() == ["mine", "MBPPDataset", "1", "rows"]
        session = requests.Session()
        session.trust_env = False  # loopback only
        assert "mine" in session.get(url + "/list_datasets").json()
        completion = "```python\ndef seven():\n    return 7\n```"
        result = session.post(
            url + "/submit", json={"dataset": "mine", "id": 1, "config": {}, "completion": completion}
        )
        assert result.json()["accepted"] is True
        answer = session.post(url + "/run_jupyter", json={"cells": ["6 * 7"]}).json()
        assert answer["cells"][0]["display"] == [{"text/plain": "42"}]
        server = psutil.Process(proc.pid)
        deadline = time.monotonic() + 30
        while len(server.children(recursive=True)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # the fork server and the replacement kernel
        helpers = server.children(recursive=True)
        assert helpers
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert "stopping" in out
        _, alive = psutil.wait_procs(helpers, timeout=10)
        assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
