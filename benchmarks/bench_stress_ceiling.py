"""The stress harness's own ceiling: requests/s it drives through a limiter against ``/v1/ping``,
beside a plain threaded client loop, in the same run and against the same server.

    python benchmarks/bench_stress_ceiling.py [--requests 2000] [--workers 8] [--modes threads,asyncio]

The server runs in its own process (``mocksandbox serve --port 0``) so that its threads do not
compete with the clients for this interpreter's GIL. The plain loop is W threads, each with a
keep-alive ``requests.Session``, sending GET /v1/ping until M requests are done: the most a Python
client can push at this server here. The harness runs the ``ping`` workload with W workers through
the reference limiter, once with the limit equal to W (uncontested: the harness's bookkeeping cost)
and once with W/2 (contested: permits change hands on every call). Measured, not asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests


def start_server() -> tuple[subprocess.Popen[str], str]:
    script = Path(sys.executable).with_name("mocksandbox")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "mocksandbox.cli"]
    server = subprocess.Popen(
        [*command, "serve", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert server.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        match = re.search(r"serving on (http://\S+)", line)
        if match:
            return server, match.group(1)
    server.kill()
    raise RuntimeError("the server did not start")


def plain_loop(url: str, total: int, workers: int) -> float:
    """Requests per second of W threads hammering /v1/ping with keep-alive sessions."""
    remaining = [total]
    lock = threading.Lock()

    def work() -> None:
        session = requests.Session()
        while True:
            with lock:
                if remaining[0] == 0:
                    return
                remaining[0] -= 1
            session.get(f"{url}/v1/ping", timeout=30).raise_for_status()

    threads = [threading.Thread(target=work) for _ in range(workers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return total / (time.perf_counter() - started)


def harness(url: str, total: int, workers: int, limit: int, mode: str) -> tuple[float, dict[str, object]]:
    from mocksandbox.stress.harness import StressConfig, run_stress

    report = run_stress(
        StressConfig(
            url=url,
            limit=limit,
            mode=mode,  # type: ignore[arg-type]
            requests=total,
            workers=workers,
            workload="ping",
            failure_rate=0,
            conflict_check=False,
        )
    )
    return float(report["attempts_rps"]), report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--modes", default="threads,asyncio", help="comma-separated harness modes")
    args = parser.parse_args()
    server, url = start_server()
    try:
        requests.get(f"{url}/v1/ping", timeout=10).raise_for_status()
        plain_loop(url, min(200, args.requests), args.workers)  # warm up connections and the server
        baseline = plain_loop(url, args.requests, args.workers)
        rows = [("plain threaded loop (no limiter)", args.workers, "-", baseline, None)]
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            for limit in (args.workers, max(1, args.workers // 2)):
                rps, report = harness(url, args.requests, args.workers, limit, mode)
                assert report["verdict"]["passed"], report["verdict"]
                rows.append((f"harness, {mode}, reference limiter", args.workers, limit, rps, report))
    finally:
        server.terminate()
        server.wait(timeout=10)

    print(f"target {url}, {args.requests} GET /v1/ping per row, {os.cpu_count()} CPU(s)")
    print(f"{'client':<40} {'workers':>7} {'limit':>5} {'req/s':>9} {'vs plain':>9} {'server max':>10}")
    for name, workers, limit, rps, report in rows:
        ratio = f"{rps / baseline:.0%}"
        peak = "-" if report is None else str(report["max_in_flight"])
        print(f"{name:<40} {workers:>7} {limit!s:>5} {rps:>9.0f} {ratio:>9} {peak:>10}")


if __name__ == "__main__":
    main()
