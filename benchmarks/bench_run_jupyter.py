#!/usr/bin/env python3
"""Latency of POST /run_jupyter: a fresh kernel per request (cold) against the warm pool, in one run.

Each mode gets its own mock (``ServerThread`` on 127.0.0.1, a free port) and sends the contract's
example (``x = 2``, ``x * 21``, ``print("hi")``) one request at a time:

* ``cold-spawn``: pool size 0, kernels spawned (``python -m ipykernel_launcher``), as SandboxFusion
  starts one inside every request: the baseline;
* ``cold-fork``: pool size 0, kernels forked from the pre-imported template;
* ``warm``: the pool (``--pool-size``, forked kernels) is full when each request arrives, as between
  the turns of a tool-calling rollout;
* ``back-to-back``: the same pool with no pause between requests, so it refills while it serves
  (on a small machine it cannot keep up and some requests start their own kernel).

Every kernel serves one request and is then killed, in every mode. Figures are printed, never
asserted. Only loopback addresses are used.

    python benchmarks/bench_run_jupyter.py                  # ~30 s
    python benchmarks/bench_run_jupyter.py --requests 20 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import requests

from mocksandbox.core import MockSandbox
from mocksandbox.serving.single import ServerThread
from mocksandbox.settings import Settings

PAYLOAD = {"cells": ["x = 2", "x * 21", 'print("hi")']}


@dataclass
class Figures:
    mode: str
    requests: int
    warm: int
    cold: int
    p50_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float


def check(answer: dict[str, Any]) -> None:
    cells = answer.get("cells") or []
    if answer.get("status") != "Success" or len(cells) != 3:
        raise SystemExit(f"unexpected answer: {json.dumps(answer)[:500]}")
    if cells[1]["display"] != [{"text/plain": "42"}] or cells[2]["stdout"] != "hi\n":
        raise SystemExit(f"wrong cell outputs: {json.dumps(cells)}")


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise SystemExit("the kernel pool did not fill in time")
        time.sleep(0.01)


def measure(mode: str, settings: Settings, count: int, pace_full: bool) -> Figures:
    box = MockSandbox.create(settings)
    server = ServerThread(box, "127.0.0.1", 0).start()
    session = requests.Session()
    session.trust_env = False  # no proxies: loopback only
    pool_size = settings.jupyter_pool_size
    try:
        if pool_size:
            box.jupyter.warm()
        # One request first (the fork server starts, imports are cached), not counted.
        check(session.post(f"{server.url}/run_jupyter", json=PAYLOAD, timeout=120).json())
        box.jupyter.reset()
        latencies = []
        for _ in range(count):
            if pace_full:
                wait_for(lambda: box.jupyter.stats().get("ready", 0) >= pool_size)
            started = time.perf_counter()
            answer = session.post(f"{server.url}/run_jupyter", json=PAYLOAD, timeout=120).json()
            latencies.append((time.perf_counter() - started) * 1000)
            check(answer)
        stats = box.jupyter.stats()
    finally:
        server.stop()
        box.close()
    return Figures(
        mode=mode,
        requests=count,
        warm=stats.get("warm", 0),
        cold=stats.get("cold", 0),
        p50_ms=statistics.median(latencies),
        mean_ms=statistics.fmean(latencies),
        min_ms=min(latencies),
        max_ms=max(latencies),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=10, help="requests per mode (10)")
    parser.add_argument("--pool-size", type=int, default=2, help="warm kernels kept ready (2)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)

    base = Settings(pod_name=None)
    modes = [
        ("cold-spawn", base.replace(jupyter_pool_size=0, jupyter_launcher="spawn"), False),
        ("cold-fork", base.replace(jupyter_pool_size=0, jupyter_launcher="fork"), False),
        ("warm", base.replace(jupyter_pool_size=args.pool_size, jupyter_launcher="fork"), True),
        ("back-to-back", base.replace(jupyter_pool_size=args.pool_size, jupyter_launcher="fork"), False),
    ]
    print(
        f"POST /run_jupyter, {args.requests} sequential requests per mode; "
        f"python {platform.python_version()}, {os.cpu_count()} CPU(s)"
    )
    print(f"{'mode':<14}{'warm':>6}{'cold':>6}{'p50 ms':>10}{'mean ms':>10}{'min ms':>10}{'max ms':>10}")
    results: dict[str, Figures] = {}
    for mode, settings, pace_full in modes:
        figures = measure(mode, settings, args.requests, pace_full)
        results[mode] = figures
        print(
            f"{mode:<14}{figures.warm:>6}{figures.cold:>6}{figures.p50_ms:>10.1f}{figures.mean_ms:>10.1f}"
            f"{figures.min_ms:>10.1f}{figures.max_ms:>10.1f}",
            flush=True,
        )
    baseline = results["cold-spawn"].p50_ms
    ratios = {
        "cold-spawn / warm": baseline / results["warm"].p50_ms,
        "cold-fork / warm": results["cold-fork"].p50_ms / results["warm"].p50_ms,
        "cold-spawn / back-to-back (mean)": results["cold-spawn"].mean_ms / results["back-to-back"].mean_ms,
    }
    print("ratios (p50 unless said):")
    for name, value in ratios.items():
        print(f"  {name:<34}{value:>7.1f}x")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {"modes": {m: asdict(f) for m, f in results.items()}, "ratios": ratios}, handle, indent=2
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
