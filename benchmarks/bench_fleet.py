#!/usr/bin/env python3
"""The Ray fleet next to one server on this machine: what a request costs through Serve.

Starts ``mocksandbox serve`` (one process, 127.0.0.1, a free port) and a fleet of ``--replicas``
replicas on a new local Ray instance (loopback, no dashboard), then loads each with ``POST
/run_code {"code": "print(1)"}`` from client threads with keep-alive connections:

* concurrency 1: p50 and p90 latency of each, and the fleet's p50 overhead (fleet - single);
* concurrency 16 and 64 (``--concurrency``): throughput of each;
* the per-request CPU of the fleet's parts, measured from their processes (``ray::ControlActor``,
  ``ray::ServeReplica``, ``ray::ProxyActor``, and the programs they run), and the round trip of
  one ``admit`` + ``finish`` pair to the control actor. These are what a projection to N nodes
  rests on: proxies, replicas and programs scale out with the nodes, the one control actor does
  not, so ``1 / (control actor CPU per request)`` is the fleet-wide ceiling of that design;
* the fleet's other request paths (``--cap``): with a cap in force (replicas admit on permits
  leased in blocks), with a fault rule for another path, and with one that matches every request
  (the actor decides on each), each with the actor's CPU and calls per request.

    python benchmarks/bench_fleet.py
    python benchmarks/bench_fleet.py --replicas 2 --requests 300 --json fleet.json

Measured, not asserted. Only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import psutil

BODY = json.dumps({"code": "print(1)", "language": "python"}).encode()
HEADERS = {"Content-Type": "application/json"}


def load(url: str, concurrency: int, requests: int) -> dict[str, Any]:
    """``requests`` calls from ``concurrency`` threads, one keep-alive connection each."""
    parts = urlsplit(url)
    latencies: list[float] = []
    failures = 0
    lock = threading.Lock()
    counter = iter(range(requests))

    def worker() -> None:
        nonlocal failures
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        while True:
            with lock:
                if next(counter, None) is None:
                    break
            started = time.perf_counter()
            try:
                connection.request("POST", "/run_code", BODY, HEADERS)
                reply = connection.getresponse()
                data = reply.read()
                ok = reply.status == 200 and b'"stdout":"1\\n"' in data
            except (OSError, http.client.HTTPException):
                ok = False
                connection.close()
                connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
            elapsed = time.perf_counter() - started
            with lock:
                latencies.append(elapsed)
                failures += not ok
        connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    latencies.sort()
    return {
        "concurrency": concurrency,
        "requests": requests,
        "failures": failures,
        "req_per_s": requests / wall,
        "p50_ms": 1000 * statistics.median(latencies),
        "p90_ms": 1000 * latencies[int(0.9 * (len(latencies) - 1))],
    }


def start_single_server(workers: int = 1) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "mocksandbox.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(
        [*command, "--workers", str(workers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    match = re.search(r"serving on (http://\S+)", proc.stdout.readline())
    if not match:
        proc.kill()
        raise SystemExit("could not start mocksandbox serve")
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain the banner
    return proc, match.group(1)


GROUPS = {
    "control actor": "ray::ControlActor",
    "replicas": "ray::ServeReplica",
    "proxies": "ray::ProxyActor",
    "node servers": "ray::NodeServer",
}


def _group_of(process: psutil.Process) -> str | None:
    try:
        title = " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    for group, mark in GROUPS.items():
        if title.startswith(mark):
            return group
    return None


def fleet_cpu() -> dict[str, float]:
    """CPU seconds so far of the fleet's processes by part; ``programs``: the replicas' children
    (launchers and the programs they run), counted when they are reaped."""
    totals = dict.fromkeys([*GROUPS, "programs"], 0.0)
    for process in psutil.process_iter():
        group = _group_of(process)
        if group is None:
            continue
        try:
            times = process.cpu_times()
            totals[group] += times.user + times.system
            if group in ("replicas", "node servers"):
                totals["programs"] += times.children_user + times.children_system
                for child in process.children(recursive=True):
                    child_times = child.cpu_times()
                    totals["programs"] += child_times.user + child_times.system
        except psutil.NoSuchProcess:
            continue
    return totals


def control_round_trip(fleet: Any, samples: int = 300) -> float:
    """Median seconds of one admit + finish pair from this process to the control actor."""
    from mocksandbox.control.state import IncomingRequest

    timings = []
    request = IncomingRequest("POST", "/bench", "", BODY, "bench:0")
    for _ in range(samples):
        started = time.perf_counter()
        admission = fleet.control.admit(request)
        fleet.control.finish(admission.entry_id, 200, b"{}")
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def measure_nodes(
    counts: list[int], requests: int, concurrency: int, ingress: str = "node"
) -> list[dict[str, Any]]:
    """The fleet on a simulated cluster (``ray.cluster_utils.Cluster``, loopback) of each node
    count, one replica per node: throughput, and what the one control actor spends per request
    (CPU, calls). On one machine the nodes share its cores: throughput cannot grow with them, but
    the actor's share per request shows whether it stays flat."""
    import ray
    from ray.cluster_utils import Cluster

    from mocksandbox.serving.fleet import deploy
    from mocksandbox.settings import load_settings

    rows = []
    node: dict[str, Any] = {"num_cpus": 2, "node_ip_address": "127.0.0.1", "object_store_memory": 80 << 20}
    for count in counts:
        if ray.is_initialized():
            ray.shutdown()
        cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
        try:
            for _ in range(count - 1):
                cluster.add_node(**node)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, log_to_driver=False, _node_ip_address="127.0.0.1")
            fleet = deploy(
                load_settings(overrides={"host": "127.0.0.1", "port": 0}),
                replicas=count,
                max_replicas_per_node=1,
                name=f"bench{count}",
                ingress=ingress,  # type: ignore[arg-type]
            )
            try:
                load(fleet.url, 4, 40)  # warm
                calls_before, cpu_before = fleet.control.call_counts(), fleet_cpu()
                served_before = fleet.stats()["requests_total"]
                row = load(fleet.url, concurrency, requests)
                calls_after, cpu_after = fleet.control.call_counts(), fleet_cpu()
                served = max(1, fleet.stats()["requests_total"] - served_before)
                row["nodes"] = count
                row["control_actor_cpu_ms"] = (
                    1000 * (cpu_after["control actor"] - cpu_before["control actor"]) / served
                )
                row["control_calls_per_request"] = (
                    sum(calls_after.values()) - sum(calls_before.values())
                ) / served
                rows.append(row)
            finally:
                fleet.stop()
        finally:
            ray.shutdown()
            cluster.shutdown()
    return rows


def bridge_cost(requests: int = 3000) -> dict[str, float]:
    """CPU per request (µs) of the mock's app called as WSGI, and through a2wsgi's ASGI bridge (what a
    Serve replica does), for ``GET /v1/ping``, in this process: the bridge's share of a replica."""
    import asyncio
    import io

    from a2wsgi import WSGIMiddleware

    from mocksandbox.core import MockSandbox
    from mocksandbox.settings import load_settings
    from mocksandbox.web import create_app

    box = MockSandbox.create(load_settings(overrides={"port": 0}))
    app = create_app(box)

    def direct() -> None:
        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": "/v1/ping",
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "80",
            "HTTP_HOST": "127.0.0.1",
            "wsgi.input": io.BytesIO(b""),
            "wsgi.url_scheme": "http",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "REMOTE_PORT": "1",
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
            "wsgi.version": (1, 0),
        }
        b"".join(app(environ, lambda status, headers, exc_info=None: None))

    bridge = WSGIMiddleware(app, workers=8)  # type: ignore[arg-type]

    async def bridged() -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/v1/ping",
            "raw_path": b"/v1/ping",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"127.0.0.1")],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            return None

        await bridge(scope, receive, send)  # type: ignore[arg-type]

    async def many(count: int) -> float:
        started = time.process_time()
        for _ in range(count):
            await bridged()
        return time.process_time() - started

    try:
        started = time.process_time()
        for _ in range(requests):
            direct()
        alone = (time.process_time() - started) / requests * 1e6
        asyncio.run(many(200))  # warm
        through = asyncio.run(many(requests)) / requests * 1e6
    finally:
        box.close()
    return {"app_us": alone, "through_bridge_us": through, "bridge_us": through - alone}


def measure_paths(fleet: Any, cap: int, concurrency: int, requests: int) -> list[dict[str, Any]]:
    """The fleet with a cap in force (its permits leased to replicas in blocks), with a fault rule
    for another path (requests stay off the actor's path), and with a rule that matches every
    request and never fires (the actor decides on each), each at ``concurrency``: throughput, the
    control actor's CPU and calls per request."""
    rows = []
    for name, arrange in (
        (f"cap {cap} (leased)", lambda: fleet.set_capacity(max_in_flight=cap)),
        ("a rule for another path", lambda: fleet.add_fault(
            {"match": {"path": "/submit"}, "action": {"type": "status", "status": 503}}
        )),
        ("a rule matching each", lambda: fleet.add_fault(
            {"match": {"path": "/run_code"}, "action": {"type": "status", "status": 503},
             "schedule": {"after": 10**9}}
        )),
    ):  # fmt: skip
        fleet.reset()
        arrange()
        load(fleet.url, 4, 40)  # warm (the blocks grow to the load)
        calls_before = sum(fleet.control.call_counts().values())
        cpu_before, served_before = fleet_cpu(), fleet.stats()["requests_total"]
        row = load(fleet.url, concurrency, requests)
        cpu_after, served_after = fleet_cpu(), fleet.stats()["requests_total"]
        served = max(1, served_after - served_before)
        calls = sum(fleet.control.call_counts().values()) - calls_before
        row.update(
            path=name,
            control_actor_cpu_ms=1000 * (cpu_after["control actor"] - cpu_before["control actor"]) / served,
            control_calls_per_request=calls / served,
        )
        rows.append(row)
    fleet.reset()
    return rows


def projection(cpu_ms: dict[str, float], nodes: int = 100, cores: int = 64) -> dict[str, float]:
    """What ``nodes`` nodes of ``cores`` cores would serve, from the measured CPU per request: the
    parts that scale out with nodes (proxies, replicas, programs) against the one control actor."""
    scaled = sum(v for k, v in cpu_ms.items() if k != "control actor")
    actor = cpu_ms.get("control actor", 0.0)
    capacity = nodes * cores * 1000 / scaled if scaled > 0 else float("inf")
    ceiling = 1000 / actor if actor > 0 else float("inf")
    return {"nodes": nodes, "cores": cores, "nodes_capacity": capacity, "actor_ceiling": ceiling}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--requests", type=int, default=300, help="per concurrency level (300)")
    parser.add_argument("--concurrency", default="16,64", help="levels besides 1 (16,64)")
    parser.add_argument("--json", metavar="FILE", help="write the figures here")
    parser.add_argument(
        "--baseline-workers",
        type=int,
        default=2,
        help="also measure `serve --workers N` (2): the fleet's target is a share of its throughput",
    )
    parser.add_argument(
        "--ingress",
        choices=["serve", "node"],
        default="node",
        help="the fleet's ingress: each replica's own server on its node (node, the default, as "
        "serve --ray), or Ray Serve's proxies (serve)",
    )
    parser.add_argument(
        "--cap",
        type=int,
        default=64,
        help="also the fleet with this cap in force (leased permits), and with fault rules (64)",
    )
    parser.add_argument(
        "--nodes",
        default="",
        help="also a simulated cluster of each node count (e.g. 1,2,4), one replica per node: "
        "throughput and the control actor's CPU and calls per request",
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "replicas": args.replicas,
    }

    proc, single_url = start_single_server()
    try:
        load(single_url, 4, 40)  # warm
        results["single"] = [load(single_url, 1, args.requests)] + [
            load(single_url, c, args.requests) for c in levels
        ]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if args.baseline_workers > 1:
        proc, workers_url = start_single_server(args.baseline_workers)
        try:
            load(workers_url, 4, 40)  # warm
            results["workers"] = [load(workers_url, 1, args.requests)] + [
                load(workers_url, c, args.requests) for c in levels
            ]
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    from mocksandbox.serving.fleet import deploy
    from mocksandbox.settings import load_settings

    fleet = deploy(
        load_settings(overrides={"host": "127.0.0.1", "port": 0}),
        replicas=args.replicas,
        name="bench",
        ingress=args.ingress,
    )
    results["ingress"] = args.ingress
    try:
        load(fleet.url, 4, 40)  # warm
        results["fleet"] = [load(fleet.url, 1, args.requests)]
        before, requests_before = fleet_cpu(), fleet.stats()["requests_total"]
        for c in levels:
            results["fleet"].append(load(fleet.url, c, args.requests))
        calls = fleet.control.call_counts()  # (the whole run's, warm-up included)
        after, requests_after = fleet_cpu(), fleet.stats()["requests_total"]
        served = max(1, requests_after - requests_before)
        results["cpu_ms_per_request"] = {k: 1000 * (after[k] - before[k]) / served for k in after}
        results["control_calls_per_request"] = sum(calls.values()) / max(1, requests_after)
        results["control_round_trip_ms"] = 1000 * control_round_trip(fleet)
        results["paths"] = measure_paths(fleet, args.cap, levels[0] if levels else 16, args.requests)
    finally:
        fleet.stop()

    single1, fleet1 = results["single"][0], results["fleet"][0]
    results["p50_overhead_ms"] = fleet1["p50_ms"] - single1["p50_ms"]
    actor_ms = results["cpu_ms_per_request"]["control actor"]
    results["control_actor_ceiling_req_per_s"] = 1000 / actor_ms if actor_ms > 0 else None

    print(f"{'':10}{'conc':>6}{'req/s':>10}{'p50 ms':>10}{'p90 ms':>10}{'fail':>6}")
    for name in ("single", "workers", "fleet"):
        for row in results.get(name, []):
            print(
                f"{name:10}{row['concurrency']:>6}{row['req_per_s']:>10.1f}{row['p50_ms']:>10.2f}"
                f"{row['p90_ms']:>10.2f}{row['failures']:>6}"
            )
    print(f"fleet p50 overhead at concurrency 1: {results['p50_overhead_ms']:.2f} ms")
    print(
        "fleet CPU per request (ms): "
        + ", ".join(f"{k} {v:.2f}" for k, v in results["cpu_ms_per_request"].items())
    )
    print(f"control actor admit+finish round trip: {results['control_round_trip_ms']:.2f} ms")
    print(f"control actor calls per request: {results['control_calls_per_request']:.2f}")
    if "workers" in results:
        for fleet_row, workers_row in zip(results["fleet"][1:], results["workers"][1:], strict=True):
            share = fleet_row["req_per_s"] / workers_row["req_per_s"]
            print(
                f"fleet / serve --workers {args.baseline_workers} at concurrency "
                f"{fleet_row['concurrency']}: {share:.2f} of its throughput"
            )
    print(f"fleet p50 / single p50 at concurrency 1: {fleet1['p50_ms'] / single1['p50_ms']:.2f}x")
    print(f"\nthe fleet's request paths at concurrency {results['paths'][0]['concurrency']}:")
    print(f"{'path':28}{'req/s':>10}{'p50 ms':>10}{'actor CPU ms/req':>18}{'actor calls/req':>17}")
    for row in results["paths"]:
        print(
            f"{row['path']:28}{row['req_per_s']:>10.1f}{row['p50_ms']:>10.2f}"
            f"{row['control_actor_cpu_ms']:>18.3f}{row['control_calls_per_request']:>17.2f}"
        )
    bridge = bridge_cost()
    results["bridge"] = bridge
    print(
        f"a replica's ASGI bridge (a2wsgi), GET /v1/ping in this process: the app alone "
        f"{bridge['app_us']:.0f} µs of CPU, through the bridge {bridge['through_bridge_us']:.0f} µs"
    )
    projected = projection(results["cpu_ms_per_request"])
    results["projection"] = projected
    print(
        f"projection to {projected['nodes']} nodes of {projected['cores']} cores: their proxies, replicas "
        f"and programs could serve ~{projected['nodes_capacity']:.0f} req/s; the one control actor "
        f"caps the fleet at ~{projected['actor_ceiling']:.0f} req/s"
    )
    if args.nodes:
        counts = [int(n) for n in args.nodes.split(",")]
        levels_c = levels[0] if levels else 16
        results["nodes"] = measure_nodes(counts, args.requests, levels_c, args.ingress)
        print(f"\nsimulated cluster, one replica per node, concurrency {levels_c}:")
        print(f"{'nodes':>6}{'req/s':>10}{'p50 ms':>10}{'actor CPU ms/req':>18}{'actor calls/req':>17}")
        for row in results["nodes"]:
            print(
                f"{row['nodes']:>6}{row['req_per_s']:>10.1f}{row['p50_ms']:>10.2f}"
                f"{row['control_actor_cpu_ms']:>18.3f}{row['control_calls_per_request']:>17.2f}"
            )
    if results["control_actor_ceiling_req_per_s"]:
        print(
            f"one control actor's ceiling: ~{results['control_actor_ceiling_req_per_s']:.0f} req/s fleet-wide"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
