#!/usr/bin/env python3
"""What the control state costs per request, for each way a server holds it.

A request takes two steps through the control state: ``admit`` (journal entry, cap, faults) and
``finish`` (the answer, out of the in-flight count). This measures both, back to back, from
worker-like client processes (threads in each), for the following. Back to back is the worst case
for the shared counters' lock, which real requests, milliseconds apart, rarely contend for.

``local``          one process: :class:`LocalControlState`, plain objects and locks;
``shared``         a state server and its clients, every step a round trip on a Unix socket
                   (what ``serve --workers N`` did before the shared counters);
``pooled``         ``serve --workers N`` now: shared counters and one-way channels (fast path);
``pooled+fault``   the same with a fault rule in force, so each admission asks the master.

For each it prints microseconds of wall time and of CPU per request in the client processes and
in the process holding the state (this one), measured with ``os.times`` and ``resource``.

    python benchmarks/bench_control_state.py
    python benchmarks/bench_control_state.py --requests 20000 --clients 2 --threads 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from mocksandbox.control.pooled import PooledControlState
from mocksandbox.control.shared import ControlStateServer
from mocksandbox.control.state import CapacityPolicy, LocalControlState
from mocksandbox.faults import FaultSpec

#: A client process: THREADS threads, each admitting and finishing REQUESTS requests; it prints
#: its wall time and its own CPU seconds as JSON.
_CLIENT = """
import json, resource, sys, threading, time
from mocksandbox.control.shared import RemoteControlState
from mocksandbox.control.state import IncomingRequest, LocalControlState

path, requests, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
state = LocalControlState() if path == "local" else RemoteControlState(path)
body = b'{"code": "print(1)", "language": "python"}'
answer = b'{"status":"Success","run_result":{"stdout":"1\\\\n"}}'

def serve(index):
    request = IncomingRequest("POST", "/run_code", "", body, f"127.0.0.1:{index}", "worker")
    for _ in range(requests):
        admission = state.admit(request)
        state.finish(admission.entry_id, 200 if admission.admitted else 429, answer)

workers = [threading.Thread(target=serve, args=(i,)) for i in range(threads)]
ready = resource.getrusage(resource.RUSAGE_SELF)
started = time.perf_counter()
for w in workers: w.start()
for w in workers: w.join()
wall = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_SELF)
state.close()
cpu = (usage.ru_utime - ready.ru_utime) + (usage.ru_stime - ready.ru_stime)
print(json.dumps({"wall": wall, "cpu": cpu}))
"""


def _measure(kind: str, clients: int, threads: int, requests: int) -> dict[str, float]:
    """Per request: wall µs (the slowest client's wall over its requests), client CPU µs, and the
    state holder's CPU µs."""
    holder: LocalControlState | None = None
    server: ControlStateServer | None = None
    if kind == "local":
        path = "local"
    else:
        holder = LocalControlState() if kind == "shared" else PooledControlState()
        holder.set_capacity(CapacityPolicy(max_in_flight=10_000))
        if kind == "pooled+fault":  # a rule that never fires, but must be decided by the master
            holder.add_faults(
                [FaultSpec.model_validate({"match": {"path": "/never"}, "action": {"type": "close"}})]
            )
        server = ControlStateServer(holder)
        path = server.path
    try:
        before = os.times()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _CLIENT, path, str(requests), str(threads)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(clients)
        ]
        results = [json.loads(proc.communicate()[0]) for proc in procs]
        if holder is not None:
            holder.stats()  # every told message applied: its cost counts
        after = os.times()
    finally:
        if server is not None:
            server.close()
        if holder is not None:
            holder.close()
    total = clients * threads * requests
    holder_cpu = (after.user - before.user) + (after.system - before.system)
    return {
        "wall_us": max(r["wall"] for r in results) / (threads * requests) * 1e6,
        "client_cpu_us": sum(r["cpu"] for r in results) / total * 1e6,
        "holder_cpu_us": holder_cpu / total * 1e6 if holder is not None else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=5000, help="requests per client thread (5000)")
    parser.add_argument("--clients", type=int, default=2, help="client processes, as workers (2)")
    parser.add_argument("--threads", type=int, default=4, help="threads per client process (4)")
    parser.add_argument("--kinds", default="local,shared,pooled,pooled+fault", help="what to measure")
    args = parser.parse_args(argv)
    print(
        f"admit + finish, {args.clients} client process(es) x {args.threads} threads x "
        f"{args.requests} requests"
    )
    header = (
        f"{'state':<14} {'wall us/req':>12} {'client CPU us':>14} {'holder CPU us':>14} {'total CPU us':>13}"
    )
    print(header + "\n" + "-" * len(header))
    for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        clients = 1 if kind == "local" else args.clients
        figures = _measure(kind, clients, args.threads, args.requests)
        total = figures["client_cpu_us"] + figures["holder_cpu_us"]
        print(
            f"{kind:<14} {figures['wall_us']:>12.1f} {figures['client_cpu_us']:>14.1f} "
            f"{figures['holder_cpu_us']:>14.1f} {total:>13.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
