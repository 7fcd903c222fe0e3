#!/usr/bin/env python3
"""Throughput and latency of POST /run_code (``print(1)``, a sleep, or a mixed corpus), next to the
cost of a bare spawn measured in the same run.

By default each exec mode (``--modes fork,spawn``) is served by its own ``mocksandbox serve``
process on 127.0.0.1 (a free port) and loaded at concurrency 1, 4 and 16 by client threads in this
process; ``--url`` measures a server you started instead. ``--reference-url`` measures a second
deployment (e.g. a real SandboxFusion you run yourself) with the same workload in the same run and
prints the mock/reference ratios. The load threads use keep-alive ``http.client`` connections
(light, so that more of a small machine goes to the servers); ``--client requests`` uses a
``requests.Session`` each instead, as verl's clients do.

Only loopback addresses are ever targeted unless you pass a URL yourself.

    python benchmarks/bench_run_code.py --requests 300
    python benchmarks/bench_run_code.py --reference-url http://127.0.0.1:8080 --json out.json
    python benchmarks/bench_run_code.py --workload mixed --client requests
    python benchmarks/bench_run_code.py --modes fork --workers 1,2 --concurrency 1,4,16,32,64

The report gives the CPU per request of each part of a served mock, read over its process tree:
its server processes, launchers, relays and programs (the programs exactly where it can run in a
cpuacct cgroup of its own), their total, and the req/s per core that this CPU allows. With several
``--workers`` counts it is the scaling curve. It also gives the load generator's own CPU:
``--client-processes N`` spreads the load over N processes (one Python process keeps about one core
busy), and the report says when the clients were the limit, not the server, or when the host's
cores were all busy.

    python benchmarks/bench_run_code.py --modes fork --workers 1,2,4,8 --concurrency 64 \
        --client-processes 4

To compare two targets on a machine whose speed drifts (a shared VM), ``--interleave TURNS`` keeps
every target of a round up at once and measures each level in turns, the targets taking turns:

    python benchmarks/bench_run_code.py --modes fork --isolation none,lite --concurrency 1,16 \
        --requests 2000 --rounds 5 --interleave 4

Of every target, a mock or the reference, the report gives the machine's CPU per request too: the
busy time of the cores this script may run on over the level, the load generator's own CPU taken
out (whatever else runs on the machine counts as well). ``--reference-pid PID`` meters the
reference's process tree as its total (what its processes spent and what they reaped: see
TreeMeter). A line per concurrency then gives the reference's CPU per request over each mock's, the
machine's and the totals'. With a reference, each level is measured in turns (``--interleave``: 4
unless told), so that both see the same machine:

    python benchmarks/bench_run_code.py --modes fork --workload verl --client new-connection \
        --concurrency 16 --requests 300 --reference-url http://127.0.0.1:8090 --reference-pid PID
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests

from mocksandbox.serving.single import is_loopback

PAYLOAD = {"code": "print(1)", "language": "python"}
EXPECTED_STDOUT = "1\n"

#: Workloads: a list of (request, expected stdout or None for "any 200 answer").
WORKLOADS: dict[str, list[tuple[dict[str, Any], str | None]]] = {
    "print": [(PAYLOAD, EXPECTED_STDOUT)],
    # What verl's reward and tool calls send: the same program under memory_limit_MB 1024.
    "verl": [({**PAYLOAD, "memory_limit_MB": 1024}, EXPECTED_STDOUT)],
    "sleep": [({"code": "import time\ntime.sleep(0.1)\nprint('slept')", "language": "python"}, "slept\n")],
    "mixed": [
        (PAYLOAD, EXPECTED_STDOUT),
        ({"code": "print(sum(i * i for i in range(100000)))", "language": "python"}, "333328333350000\n"),
        (
            {"code": "import json, re\nprint(json.dumps(re.findall('a+', 'caaab')))", "language": "python"},
            '["aaa"]\n',
        ),
        (
            {
                "code": "a, b = map(int, input().split())\nprint(a + b)",
                "language": "python",
                "stdin": "2 40\n",
            },
            "42\n",
        ),
        ({"code": "raise ValueError('boom')", "language": "python"}, ""),
        ({"code": "echo hi; exit 3", "language": "bash"}, "hi\n"),
    ],
}


@dataclass
class Level:
    """The figures of one target at one concurrency."""

    concurrency: int
    requests: int
    ok: int
    errors: int
    wall_s: float
    rps: float
    p50_ms: float
    p95_ms: float
    mean_ms: float
    first_error: str | None = None
    #: CPU per answered request (ms) of a served mock's parts (see CpuMeter): the server processes
    #: (the serve process and its workers), the launchers, the relays and the programs; ``None``
    #: where unmeasured (a server this script did not start).
    server_cpu_ms: float | None = None
    launcher_cpu_ms: float | None = None
    programs_cpu_ms: float | None = None
    relays_cpu_ms: float | None = None
    #: The server's CPU per answered request (ms) in all: a served mock's parts together, or a
    #: reference's process tree (``--reference-pid``, see TreeMeter); ``None`` where unmeasured.
    total_cpu_ms: float | None = None
    #: The machine's CPU per answered request (ms): the busy time of the cores this script may run
    #: on over the level, the load generator's own CPU taken out. Whatever else runs on the machine
    #: counts too; a server's helpers outside its tree (a container runtime) count as well.
    machine_cpu_ms: float | None = None
    #: With ``--rounds N``: each round's req/s, in round order (the figures above are medians).
    rounds_rps: list[float] = field(default_factory=list)
    #: The load generator: its processes, its CPU per answered request (ms), the cores it kept busy
    #: (its CPU seconds over the wall time), the cores it could use (``min(processes, cores)``, see
    #: CLIENT_SATURATED) and whether it used nearly all of them: the figures are then its limit.
    client_processes: int = 1
    client_cpu_ms: float | None = None
    client_cores: float | None = None
    client_cores_available: int | None = None
    client_saturated: bool = False
    #: How many of the cores this script may run on were busy (anyone's work, server's and
    #: clients' and other users') over the level; see HOST_FULL.
    host_cores_busy: float | None = None


def median_level(rounds: list[Level]) -> Level:
    """One level measured in several rounds: the median of each figure, and every round's req/s."""

    def median(name: str) -> Any:
        values = [getattr(lv, name) for lv in rounds if getattr(lv, name) is not None]
        values = [v for v in values if not (isinstance(v, float) and math.isnan(v))]
        unmeasured = None if name.endswith(("cpu_ms", "cores")) else math.nan
        return statistics.median(values) if values else unmeasured

    first = rounds[0]
    return Level(
        concurrency=first.concurrency,
        requests=sum(lv.requests for lv in rounds),
        ok=sum(lv.ok for lv in rounds),
        errors=sum(lv.errors for lv in rounds),
        wall_s=sum(lv.wall_s for lv in rounds),
        rps=median("rps"),
        p50_ms=median("p50_ms"),
        p95_ms=median("p95_ms"),
        mean_ms=median("mean_ms"),
        first_error=next((lv.first_error for lv in rounds if lv.first_error), None),
        server_cpu_ms=median("server_cpu_ms"),
        launcher_cpu_ms=median("launcher_cpu_ms"),
        programs_cpu_ms=median("programs_cpu_ms"),
        relays_cpu_ms=median("relays_cpu_ms"),
        total_cpu_ms=median("total_cpu_ms"),
        machine_cpu_ms=median("machine_cpu_ms"),
        rounds_rps=[lv.rps for lv in rounds],
        client_processes=first.client_processes,
        client_cpu_ms=median("client_cpu_ms"),
        client_cores=median("client_cores"),
        client_cores_available=first.client_cores_available,
        # Said if any round was the client's limit: that round's figure says nothing of the server.
        client_saturated=any(lv.client_saturated for lv in rounds),
        host_cores_busy=median("host_cores_busy"),
    )


@dataclass
class Target:
    name: str
    url: str
    levels: list[Level] = field(default_factory=list)
    #: A served mock's worker count, and its name without it: the targets of one series, measured
    #: with each ``--workers`` count, make a scaling curve.
    workers: int | None = None
    series: str | None = None
    #: Where the programs' CPU was read (see CpuMeter); ``None``: not measured.
    programs_cpu_from: str | None = None
    #: What ``total_cpu_ms`` is: ``"parts"`` (a served mock's), ``"tree"`` (a process tree's,
    #: ``--reference-pid``); ``None``: not measured.
    total_cpu_from: str | None = None

    def level(self, concurrency: int) -> Level:
        return next(lv for lv in self.levels if lv.concurrency == concurrency)


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (``pct`` in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def is_loopback_url(url: str) -> bool:
    return is_loopback(urlsplit(url).hostname or "")


def _check(status: int, text: str, expected_stdout: str | None) -> str | None:
    """``None`` if the answer is the expected one, else what was wrong with it."""
    if status != 200:
        return f"HTTP {status}: {text[:200]}"
    try:
        body = json.loads(text)
    except ValueError:
        return f"not JSON: {text[:200]}"
    run_result = body.get("run_result") or {}
    if expected_stdout is not None and run_result.get("stdout") != expected_stdout:
        return f"unexpected answer: {json.dumps(body)[:200]}"
    return None


class _RequestsPoster:
    """One ``requests.Session`` (what verl's clients use; about 2 ms of client CPU per call)."""

    def __init__(self, url: str) -> None:
        self.endpoint = url.rstrip("/") + "/run_code"
        self.session = requests.Session()
        # Never let a proxy variable take loopback traffic elsewhere.
        self.session.trust_env = not is_loopback_url(url)

    def post(self, payload: dict[str, Any], timeout: float) -> tuple[int, str]:
        response = self.session.post(self.endpoint, json=payload, timeout=timeout)
        return response.status_code, response.text

    def close(self) -> None:
        self.session.close()


class _HttpClientPoster:
    """One keep-alive ``http.client`` connection: a fraction of ``requests``' CPU per call, which
    on a small machine leaves more of the cores to the server being measured (either target)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path.rstrip("/") + "/run_code"
        self.connection: http.client.HTTPConnection | None = None

    def post(self, payload: dict[str, Any], timeout: float) -> tuple[int, str]:
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        for attempt in range(2):
            if self.connection is None:
                self.connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            try:
                self.connection.request("POST", self.path, body, headers)
                response = self.connection.getresponse()
                text = response.read().decode("utf-8", "replace")
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # The server closed an idle keep-alive connection: reconnect once.
                self.close()
                if attempt:
                    raise
                continue
            if response.will_close:
                self.close()
            return response.status, text
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


class _NewConnectionPoster(_HttpClientPoster):
    """A new ``http.client`` connection for every request, closed after it (``Connection: close``):
    what verl's ``requests.post`` without a session and ``urllib`` clients cost a server."""

    def post(self, payload: dict[str, Any], timeout: float) -> tuple[int, str]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            body = json.dumps(payload).encode()
            headers = {"Content-Type": "application/json", "Connection": "close"}
            connection.request("POST", self.path, body, headers)
            response = connection.getresponse()
            return response.status, response.read().decode("utf-8", "replace")
        finally:
            connection.close()


CLIENTS = {"http": _HttpClientPoster, "requests": _RequestsPoster, "new-connection": _NewConnectionPoster}


@dataclass
class _Load:
    """What one client process's threads measured in one level."""

    latencies: list[float]
    errors: int
    first_error: str | None
    #: CPU seconds its load threads used from the start signal to their end (their own clocks, so
    #: a server running in the same process, ``--modes in-process``, is not counted).
    cpu_s: float
    #: ``time.monotonic()`` at the start signal and when its last thread ended (one clock for every
    #: process of the machine).
    started: float
    ended: float


def _drive(
    url: str,
    threads: int,
    total: int,
    timeout: float,
    workload: list[tuple[dict[str, Any], str | None]],
    client: str,
    first_index: int = 0,
    on_ready: Callable[[], None] = lambda: None,
) -> _Load:
    """``total`` requests (workload items ``first_index`` on) from ``threads`` threads, each with its
    own connection; ``on_ready`` is called once every thread is ready to send, before the start."""
    latencies: list[float] = []
    errors: list[str] = []
    cpu: list[float] = []
    lock = threading.Lock()
    next_index = iter(range(first_index, first_index + total))
    ready = threading.Barrier(threads + 1)
    go = threading.Event()

    def worker() -> None:
        poster = CLIENTS[client](url)
        ready.wait()
        go.wait()
        cpu_started = time.thread_time()
        while True:
            with lock:
                index = next(next_index, None)
            if index is None:
                poster.close()
                break
            payload, expected = workload[index % len(workload)]
            started = time.perf_counter()
            try:
                problem = _check(*poster.post(payload, timeout), expected)
            except (requests.RequestException, OSError, http.client.HTTPException) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            elapsed = time.perf_counter() - started
            with lock:
                if problem is None:
                    latencies.append(elapsed)
                else:
                    errors.append(problem)
        with lock:
            cpu.append(time.thread_time() - cpu_started)

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for thread in pool:
        thread.start()
    ready.wait()
    on_ready()
    started = time.monotonic()
    go.set()
    for thread in pool:
        thread.join()
    return _Load(latencies, len(errors), errors[0] if errors else None, sum(cpu), started, time.monotonic())


def _split(count: int, parts: int) -> list[int]:
    """``count`` in ``parts`` shares that differ by one at most, the larger first."""
    return [count // parts + (i < count % parts) for i in range(parts)]


class ClientPool:
    """``size`` client processes, started once and kept for every level: a level's threads (and its
    requests, in proportion) are spread over them, so that the load is not bound to the one core
    that a Python process's threads share (they take turns holding its GIL).

    Each process is this script with ``--client-worker``, told its part of a level as a JSON line
    on stdin; it answers ``ready`` once its threads are, starts on ``go`` and answers its
    :class:`_Load` as a JSON line."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._procs: list[subprocess.Popen[str]] = []
        try:
            for _ in range(size):
                self._procs.append(
                    subprocess.Popen(
                        [sys.executable, os.path.abspath(__file__), "--client-worker"],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
        except BaseException:
            self.close()
            raise

    def _send(self, proc: subprocess.Popen[str], line: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    def _answer(self, proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"client process {proc.pid} stopped (exit status {proc.wait()})")
        return line

    def run(
        self,
        url: str,
        concurrency: int,
        total: int,
        timeout: float,
        workload: list[tuple[dict[str, Any], str | None]],
        client: str,
    ) -> tuple[list[_Load], float]:
        """One level over ``min(size, concurrency)`` processes: their loads and the wall time from
        the start signal to the end of the last."""
        procs = self._procs[: min(self.size, concurrency)]
        threads = _split(concurrency, len(procs))
        # Requests in proportion to threads, so that every process ends at about the same time.
        bounds = [0] + [round(total * sum(threads[: i + 1]) / concurrency) for i in range(len(procs))]
        for i, proc in enumerate(procs):
            job = {
                "url": url,
                "threads": threads[i],
                "requests": bounds[i + 1] - bounds[i],
                "first_index": bounds[i],
                "timeout": timeout,
                "workload": workload,
                "client": client,
            }
            self._send(proc, json.dumps(job))
        for proc in procs:
            if self._answer(proc).strip() != "ready":
                raise RuntimeError(f"client process {proc.pid} did not get ready")
        started = time.monotonic()
        for proc in procs:
            self._send(proc, "go")
        loads = [_Load(**json.loads(self._answer(proc))) for proc in procs]
        return loads, max(load.ended for load in loads) - started

    def close(self) -> None:
        for proc in self._procs:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()  # end of its jobs: it leaves
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def client_worker() -> int:
    """The loop of one :class:`ClientPool` process (``--client-worker``)."""

    def ready() -> None:
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit(1)

    while line := sys.stdin.readline():
        job = json.loads(line)
        workload = [(payload, expected) for payload, expected in job["workload"]]
        load = _drive(
            job["url"],
            job["threads"],
            job["requests"],
            job["timeout"],
            workload,
            job["client"],
            job["first_index"],
            ready,
        )
        print(json.dumps(asdict(load)), flush=True)
    return 0


#: The clients count as the limit from this share of the cores they can use on. Those are
#: ``min(client processes, cores this script may run on)``: each process's load threads take turns
#: holding its GIL, so one process can keep about one core busy however many threads it has. When
#: the server is the limit, the client threads mostly wait for answers and use far less (a third or
#: less of their cores at concurrency 16 on a 2-core host); when the clients are, some thread always
#: has an answer to handle and their CPU stays within a few tenths of a core of the most they can
#: use, what is missing going to the scheduler (the cores are shared with the server) and to GIL
#: hand-overs. 0.8 sits between the two and leaves room for that loss.
CLIENT_SATURATED = 0.8


#: The host counts as full from this many of the cores the clients may use busy: clients and
#: server then share the last of the CPU, and neither alone sets the figure. A core under 10%
#: idle over a level has work waiting for it most of the time (the kernel's own accounting).
HOST_FULL = 0.9


def client_cores_available() -> int:
    """The cores this script (and the client processes it starts) may run on."""
    return len(os.sched_getaffinity(0))


def _busy_seconds() -> float:
    """CPU seconds the cores of this script's affinity have not been idle since boot."""
    import psutil

    cpus = psutil.cpu_times(percpu=True)
    return sum(
        sum(cpus[i]) - cpus[i].idle - getattr(cpus[i], "iowait", 0.0)
        for i in os.sched_getaffinity(0)
        if i < len(cpus)
    )


@dataclass
class _Turn:
    """One stretch of load on one target (a level, or one turn of it): its loads, the wall time
    from the start signal to the end of the last, and the busy CPU seconds of this script's cores
    over ``elapsed_s``."""

    loads: list[_Load]
    wall_s: float
    busy_s: float
    elapsed_s: float


def _load_turn(
    url: str,
    concurrency: int,
    total: int,
    timeout: float,
    workload: list[tuple[dict[str, Any], str | None]],
    client: str,
    pool: ClientPool | None,
) -> _Turn:
    busy_before, started = _busy_seconds(), time.monotonic()
    if pool is None:
        load = _drive(url, concurrency, total, timeout, workload, client)
        loads, wall = [load], load.ended - load.started
    else:
        loads, wall = pool.run(url, concurrency, total, timeout, workload, client)
    return _Turn(loads, wall, _busy_seconds() - busy_before, time.monotonic() - started)


def level_of(concurrency: int, total: int, turns: list[_Turn]) -> Level:
    """The figures of one level measured in ``turns`` (one, unless ``--interleave``): req/s over
    their summed wall time, percentiles over all their requests."""
    loads = [load for turn in turns for load in turn.loads]
    wall = sum(turn.wall_s for turn in turns)
    # Over a little more than ``wall`` (the threads' start and end): all but the shortest levels
    # are long enough for that not to matter.
    host_busy = sum(turn.busy_s for turn in turns) / max(sum(turn.elapsed_s for turn in turns), 1e-9)
    latencies = [latency for load in loads for latency in load.latencies]
    ok = len(latencies)
    client_cpu = sum(load.cpu_s for load in loads)
    machine_cpu = sum(turn.busy_s for turn in turns) - client_cpu
    processes = max(len(turn.loads) for turn in turns)
    capacity = min(processes, client_cores_available())
    cores = client_cpu / wall if wall > 0 else 0.0
    return Level(
        concurrency=concurrency,
        requests=total,
        ok=ok,
        errors=sum(load.errors for load in loads),
        wall_s=wall,
        rps=ok / wall if wall > 0 else 0.0,
        p50_ms=percentile(latencies, 50) * 1000 if ok else math.nan,
        p95_ms=percentile(latencies, 95) * 1000 if ok else math.nan,
        mean_ms=statistics.fmean(latencies) * 1000 if ok else math.nan,
        first_error=next((load.first_error for load in loads if load.first_error), None),
        client_processes=processes,
        client_cpu_ms=client_cpu / ok * 1000 if ok else None,
        machine_cpu_ms=machine_cpu / ok * 1000 if ok else None,
        client_cores=cores,
        client_cores_available=capacity,
        client_saturated=cores >= CLIENT_SATURATED * capacity,
        host_cores_busy=host_busy,
    )


def run_level(
    url: str,
    concurrency: int,
    total: int,
    timeout: float,
    workload: list[tuple[dict[str, Any], str | None]] = WORKLOADS["print"],
    client: str = "http",
    pool: ClientPool | None = None,
) -> Level:
    """``total`` requests from ``concurrency`` threads, each with its own connection: threads of
    this process, or spread over the processes of ``pool``."""
    turn = _load_turn(url, concurrency, total, timeout, workload, client, pool)
    return level_of(concurrency, total, [turn])


@dataclass
class Entry:
    """A target of one round, up and reachable: its name, URL, (a served mock's) CPU meter and (a
    reference's, ``--reference-pid``) process tree meter."""

    name: str
    url: str
    meter: CpuMeter | None = None
    workers: int | None = None
    series: str | None = None
    tree: TreeMeter | None = None


def measure_in_turns(
    entries: list[Entry],
    levels: list[int],
    total: int,
    turns: int,
    warmup: int,
    timeout: float,
    workload: list[tuple[dict[str, Any], str | None]] = WORKLOADS["print"],
    client: str = "http",
    pool: ClientPool | None = None,
) -> list[Target]:
    """The targets ``entries``, all up, each warmed up, then measured at each level in ``turns``
    turns of ``total / turns`` requests, the order reversed every other turn (A B, B A, A B, ...):
    whatever drifts on the machine over seconds weighs on each target alike, where targets measured
    one after the other, a level each (one target, one turn: ``--interleave`` off), are compared
    across tens of seconds. Each level's figures are over all of its turns; the CPU of a served
    mock, of a metered process tree and of the machine is taken over the target's own turns only
    (the meters are read between turns, outside the machine's busy time)."""
    targets = [
        Target(
            entry.name,
            entry.url,
            workers=entry.workers,
            series=entry.series,
            programs_cpu_from=entry.meter.programs_from if entry.meter is not None else None,
            total_cpu_from="parts" if entry.meter is not None else "tree" if entry.tree is not None else None,
        )
        for entry in entries
    ]
    if warmup:
        for entry in entries:
            run_level(entry.url, 1, warmup, timeout, workload, client)
    shares = [share for share in _split(total, turns) if share]
    for concurrency in levels:
        measured: list[list[_Turn]] = [[] for _ in entries]
        spent: list[dict[str, float]] = [dict.fromkeys(CPU_PARTS, 0.0) for _ in entries]
        tree_spent = [0.0 for _ in entries]
        for number, share in enumerate(shares):
            order = list(range(len(entries)))
            if number % 2:
                order.reverse()
            for index in order:
                meter, tree = entries[index].meter, entries[index].tree
                before = meter.sample() if meter is not None else None
                tree_before = tree.sample() if tree is not None else None
                measured[index].append(
                    _load_turn(entries[index].url, concurrency, share, timeout, workload, client, pool)
                )
                if tree is not None and tree_before is not None:
                    tree_spent[index] += tree.sample() - tree_before
                if meter is not None and before is not None:
                    for part, seconds in meter.spent(before, meter.sample()).items():
                        spent[index][part] += seconds
        for index, target in enumerate(targets):
            level = level_of(concurrency, total, measured[index])
            if entries[index].meter is not None and level.ok:
                for part, seconds in spent[index].items():
                    setattr(level, f"{part}_cpu_ms", seconds / level.ok * 1000)
                level.total_cpu_ms = sum(spent[index].values()) / level.ok * 1000
            elif entries[index].tree is not None and level.ok:
                level.total_cpu_ms = tree_spent[index] / level.ok * 1000
            target.levels.append(level)
    return targets


_CPUACCT = "/sys/fs/cgroup/cpuacct"


#: The parts of a served mock whose CPU the meter tells apart, in its process tree.
CPU_PARTS = ("server", "launcher", "relays", "programs")


@dataclass
class CpuSample:
    """Cumulative CPU seconds of a served mock at one moment: for each part but the programs, each
    process's (keyed by pid and start time, as pids repeat); the relays' reaped children's
    (``reaped``, by relay); and its cpuacct cgroup's total (``None`` without one)."""

    parts: dict[str, dict[tuple[int, float], float]]
    reaped: dict[tuple[int, float], float]
    total: float | None


class CpuMeter:
    """CPU seconds spent by a served mock, over its process tree (psutil): the server processes
    (the serve process and its workers), the launchers (their children running
    ``launcher/__main__.py``), the relays (the launchers' children) and the programs (the relays'
    children).

    The launcher and the relays are single-threaded: their own time is read in nanoseconds
    (``/proc/PID/schedstat``). The server processes' is psutil's, in 1/100 s per process. The
    programs are gone by the time of a sample; where the served mock has a cpuacct cgroup of its
    own, they are the rest of its total (nanoseconds; with them, the time of any relay that exited
    during the level and of orphans no relay waited for). Without one they are what the kernel added
    to each relay's ``children_*`` times as it reaped them: 1/100 s per relay, and a relay that
    exits takes its programs' time with it (the launcher ignores SIGCHLD: no one waits for it)."""

    def __init__(self, pid: int, cgroup: str | None) -> None:
        import psutil

        self._psutil = psutil
        self.root = psutil.Process(pid)
        self.cgroup = cgroup
        self.programs_from = (
            "the rest of the mock's cpuacct cgroup"
            if cgroup is not None
            else "the relays' reaped children (no cpuacct cgroup here): a lower bound, by 1/100 s a relay"
        )

    def _children(self, process: Any) -> list[Any]:
        try:
            return list(process.children())
        except self._psutil.Error:
            return []

    def _cmdline(self, process: Any) -> str:
        try:
            return " ".join(process.cmdline())
        except self._psutil.Error:
            return ""

    @staticmethod
    def _schedstat(pid: int) -> float | None:
        """A single-threaded process's CPU seconds, to the nanosecond (``None``: not readable)."""
        try:
            with open(f"/proc/{pid}/schedstat") as handle:
                return int(handle.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            return None

    def sample(self) -> CpuSample:
        servers = [self.root] + [
            c for c in self._children(self.root) if "mocksandbox.serving.workers" in self._cmdline(c)
        ]
        launchers = [
            c for s in servers for c in self._children(s) if "launcher/__main__.py" in self._cmdline(c)
        ]
        relays = [c for launcher in launchers for c in self._children(launcher)]
        parts: dict[str, dict[tuple[int, float], float]] = {part: {} for part in CPU_PARTS}
        reaped: dict[tuple[int, float], float] = {}
        for part, processes in (("server", servers), ("launcher", launchers), ("relays", relays)):
            for process in processes:
                try:
                    key, times = (process.pid, process.create_time()), process.cpu_times()
                except self._psutil.Error:
                    continue  # gone since it was listed
                own = self._schedstat(process.pid) if part != "server" else None
                parts[part][key] = own if own is not None else times.user + times.system
                if part == "relays":
                    reaped[key] = times.children_user + times.children_system
        total = None
        if self.cgroup is not None:
            with open(os.path.join(self.cgroup, "cpuacct.usage")) as handle:
                total = int(handle.read()) / 1e9
        return CpuSample(parts, reaped, total)

    @staticmethod
    def spent(before: CpuSample, after: CpuSample) -> dict[str, float]:
        """CPU seconds of each part between two samples. A process that is new in ``after`` counts
        from its start; one gone from it counts nothing (see the class)."""

        def grown(earlier: dict[tuple[int, float], float], later: dict[tuple[int, float], float]) -> float:
            return sum(seconds - earlier.get(key, 0.0) for key, seconds in later.items())

        spent = {part: grown(before.parts[part], after.parts[part]) for part in CPU_PARTS[:3]}
        if before.total is not None and after.total is not None:
            spent["programs"] = after.total - before.total - sum(spent.values())
        else:
            spent["programs"] = grown(before.reaped, after.reaped)
        return spent


class TreeMeter:
    """CPU seconds of a server this script did not start, over its process tree (``--reference-pid``):
    each process's own time and its reaped children's, for the process and every descendant alive
    at a sample. A program that starts and ends between two samples (SandboxFusion's server starts
    one per run) is never seen alive: it is in its reaper's children's time by the second sample
    (1/100 s a process, as the kernel counts it), with whatever it reaped in turn. So nothing it
    spent is lost or counted twice as long as someone in the tree waits for it, as SandboxFusion's
    server does (an asyncio subprocess per run). What no one in the tree waits for is lost: an
    orphan the init process reaps, or the children the kernel reaps for a process that ignores
    SIGCHLD. A served mock's launcher ignores it while it waits for no run, so on a mock this
    meter misses some relays and their programs, more at high concurrency (``CpuMeter`` reads the
    parts apart).

    A sample is a consistent snapshot: a process that ends while the tree is read may be counted
    twice (its own time read, then its reaper's with it) or not at all (its reaper's read first,
    then its own gone), so a sample in which a listed process could not be read or is gone by its
    end is taken again (up to ``attempts`` times in all)."""

    def __init__(self, pid: int, attempts: int = 10) -> None:
        import psutil

        self._psutil = psutil
        self.root = psutil.Process(pid)  # psutil.NoSuchProcess where there is no such process
        self.attempts = attempts

    def _read(self, strict: bool) -> float | None:
        """The tree's CPU seconds; ``None`` if ``strict`` and the tree changed while being read."""
        try:  # psutil leaves out the descendants that end while it lists them
            processes = [self.root, *self.root.children(recursive=True)]
        except self._psutil.Error as exc:  # the root is gone, or its pid is another process's now
            raise RuntimeError(f"the reference's process {self.root.pid} is gone: {exc}") from exc
        total = 0.0
        for process in processes:
            try:
                times = process.cpu_times()
            except self._psutil.Error:
                if strict:
                    return None  # ended since it was listed: its reaper may or may not have it yet
                continue
            total += times.user + times.system + times.children_user + times.children_system
        if strict and not all(process.is_running() for process in processes):
            return None  # one ended while the others were read: its reaper may have it too
        return total

    def sample(self) -> float:
        for _ in range(self.attempts - 1):
            total = self._read(strict=True)
            if total is not None:
                return total
        # The tree never held still: the last reading, off by a process that ended while it was read.
        total = self._read(strict=False)
        assert total is not None
        return total


def _cpuacct_group() -> str | None:
    """A fresh cpuacct cgroup for one served mock, or ``None`` where none can be made."""
    try:
        path = os.path.join(_CPUACCT, f"mocksandbox-bench-{os.getpid()}-{time.monotonic_ns()}")
        os.mkdir(path)
        return path
    except OSError:
        return None


@contextlib.contextmanager
def served_mock(
    exec_mode: str, workers: int = 1, python: str | None = None, isolation: str | None = None
) -> Iterator[tuple[str, CpuMeter]]:
    """``mocksandbox serve --exec-mode MODE --workers N [--python P] [--isolation I]`` as its own
    process on 127.0.0.1 (free port), in a cpuacct cgroup of its own where possible: its URL and
    CPU meter."""
    group = _cpuacct_group()
    command = [sys.executable, "-m", "mocksandbox.cli", "serve", "--port", "0", "--exec-mode", exec_mode]
    command += ["--workers", str(workers)]
    if isolation:
        command += ["--isolation", isolation]
    if python:
        command += ["--python", python]
    if group is not None:  # the shell joins the group, then becomes the server: all it starts counts
        command = ["/bin/sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *command]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "serving on " not in line:
            raise RuntimeError(f"mocksandbox serve did not start: {line!r}")
        url = line.split("serving on ", 1)[1].split()[0]
        while not line.startswith("  press Ctrl-C"):  # ready: every worker is up
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("mocksandbox serve stopped while starting")
        yield url, CpuMeter(proc.pid, group)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if group is not None:
            with contextlib.suppress(OSError):
                os.rmdir(group)


def measure_spawn(python: str, runs: int) -> dict[str, Any]:
    """``python -c 'print(1)'`` with ``subprocess.run``, ``runs`` times, one after another."""
    subprocess.run([python, "-c", "print(1)"], capture_output=True, check=True)  # warm the page cache
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run([python, "-c", "print(1)"], capture_output=True, check=True)
        times.append(time.perf_counter() - started)
        if done.stdout != b"1\n":
            raise RuntimeError(f"{python} -c 'print(1)' printed {done.stdout!r}")
    return {
        "python": python,
        "runs": runs,
        "p50_ms": percentile(times, 50) * 1000,
        "p95_ms": percentile(times, 95) * 1000,
        "mean_ms": statistics.fmean(times) * 1000,
    }


@contextlib.contextmanager
def in_process_mock() -> Iterator[tuple[str, str, str]]:
    """A mock on 127.0.0.1 (free port) in a background thread: (url, user python, confinement)."""
    from mocksandbox.core import MockSandbox
    from mocksandbox.serving.single import ServerThread

    box = MockSandbox.create()
    server = ServerThread(box, "127.0.0.1", 0).start()
    try:
        yield server.url, box.settings.python, box.engine.confinement_name
    finally:
        server.stop()
        box.close()


def _no_nan(value: Any) -> Any:
    """``value`` with NaN floats as ``None``, so that the JSON file is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def _ratio_rows(first: Target, other: Target, levels: list[int]) -> list[dict[str, Any]]:
    """``first``'s throughput and p50 over ``other``'s, per concurrency level. Measured in several
    rounds, the throughput ratio is the median of the rounds' ratios (each round measures both, one
    after the other: a machine that is slower for a while weighs on both sides of a ratio)."""
    rows = []
    for c in levels:
        mine, theirs = first.level(c), other.level(c)
        row = {
            "concurrency": c,
            "rps_ratio": _ratio(mine.rps, theirs.rps),
            "p50_ratio": _ratio(mine.p50_ms, theirs.p50_ms),
        }
        if len(mine.rounds_rps) > 1 and len(mine.rounds_rps) == len(theirs.rounds_rps):
            per_round = [_ratio(a, b) for a, b in zip(mine.rounds_rps, theirs.rounds_rps, strict=True)]
            row["rps_ratio"] = statistics.median(per_round)
            row["rps_ratio_rounds"] = per_round
        rows.append(row)
    return rows


def _cpu_ratio(a: float | None, b: float | None) -> float:
    return _ratio(a, b) if a is not None and b is not None else math.nan


def cpu_ratio_rows(mock: list[Target], reference: list[Target], levels: list[int]) -> list[dict[str, Any]]:
    """The reference's CPU per run over a mock's, per concurrency level, from each round's figures
    (``mock[r]`` and ``reference[r]``: round ``r``'s): the machine's, and the totals' (the reference's
    process tree over the mock's parts, as ``total_from`` says) where both were metered. Over several
    rounds, the median of the rounds' ratios, each round's beside it."""
    rows = []
    for c in levels:
        machine = [
            _cpu_ratio(r.level(c).machine_cpu_ms, m.level(c).machine_cpu_ms)
            for m, r in zip(mock, reference, strict=True)
        ]
        total = [
            _cpu_ratio(r.level(c).total_cpu_ms, m.level(c).total_cpu_ms)
            for m, r in zip(mock, reference, strict=True)
        ]
        row: dict[str, Any] = {
            "concurrency": c,
            "machine_ratio": _median_of(machine),
            "total_ratio": _median_of(total),
            "total_from": f"{reference[0].total_cpu_from or '-'} vs {mock[0].total_cpu_from or '-'}",
        }
        if len(mock) > 1:
            row["machine_ratio_rounds"], row["total_ratio_rounds"] = machine, total
        rows.append(row)
    return rows


def _median_of(values: list[float]) -> float:
    measured = [v for v in values if not math.isnan(v)]
    return statistics.median(measured) if measured else math.nan


def cpu_ratio_lines(ratios: dict[str, list[dict[str, Any]]]) -> list[str]:
    """A line per mock and concurrency level where the reference's CPU per run and the mock's were
    both measured: ``CPU per run, c=16: reference / mock = 6.74x (machine), 6.80x (tree vs parts)``."""
    lines = []
    for name, rows in ratios.items():
        for row in rows:
            shown = []
            if not math.isnan(row["machine_ratio"]):
                shown.append(f"{row['machine_ratio']:.2f}x (machine)")
            if not math.isnan(row["total_ratio"]):
                shown.append(f"{row['total_ratio']:.2f}x ({row['total_from']})")
            if not shown:
                continue
            rounds = row.get("machine_ratio_rounds")
            by_round = "   machine by round: " + " ".join(f"{r:.2f}" for r in rounds) if rounds else ""
            lines.append(
                f"CPU per run, c={row['concurrency']}: reference / {name} = {', '.join(shown)}{by_round}"
            )
    return ["", *lines] if lines else []


def scaling_rows(targets: list[Target]) -> list[dict[str, Any]]:
    """The scaling curve: for each series measured with several worker counts, each concurrency and
    worker count, its req/s and their ratio to the fewest workers' at that concurrency."""
    counts: dict[str, set[int]] = {}
    for target in targets:
        if target.series is not None and target.workers is not None:
            counts.setdefault(target.series, set()).add(target.workers)
    rows = []
    for series in [name for name, workers in counts.items() if len(workers) > 1]:
        members = sorted((t for t in targets if t.series == series), key=lambda t: t.workers or 0)
        for lv in members[0].levels:
            base = lv.rps
            for target in members:
                mine = target.level(lv.concurrency)
                rows.append(
                    {
                        "series": series,
                        "target": target.name,
                        "concurrency": lv.concurrency,
                        "workers": target.workers,
                        "rps": mine.rps,
                        "rps_over_fewest_workers": _ratio(mine.rps, base),
                        "client_saturated": mine.client_saturated,
                    }
                )
    return rows


def _ms(value: float | None, width: int) -> str:
    return f"{value:>{width}.2f}" if value is not None else f"{'-':>{width}}"


def _print_cpu(
    targets: list[Target], curve: list[dict[str, Any]], cpu_ratios: dict[str, list[dict[str, Any]]]
) -> None:
    """CPU per request of each part, each target and level; where some series was measured with
    several worker counts, in the order of the scaling curve, with its req/s and their ratio."""
    by_name = {t.name: t for t in targets}
    rows: list[tuple[Target, Level, float | None]] = [
        (
            by_name[row["target"]],
            by_name[row["target"]].level(row["concurrency"]),
            row["rps_over_fewest_workers"],
        )
        for row in curve
    ]
    in_curve = {row["target"] for row in curve}
    rows += [(t, lv, None) for t in targets if t.name not in in_curve for lv in t.levels]
    print(
        "\nScaling curve: req/s by worker count (x: over the fewest workers, same concurrency), and CPU"
        if curve
        else "\nCPU"
    )
    print(
        "per request, ms: server (serve process + workers), launcher, relays, programs, total (their sum;\n"
        "a reference's: its process tree, --reference-pid), machine (the busy time of this script's cores\n"
        "over the level, the clients' CPU taken out), client (this script's load); req/s/core: what the\n"
        "total allows"
    )
    header = (
        f"{'target':<16} {'conc':>4} {'req/s':>8} {'x':>5} {'server':>7} {'launcher':>8} {'relays':>7} "
        f"{'programs':>8} {'total':>7} {'machine':>7} {'client':>7} {'req/s/core':>10}"
    )
    print(header + "\n" + "-" * len(header))
    for target, lv, ratio in rows:
        parts = [lv.server_cpu_ms, lv.launcher_cpu_ms, lv.relays_cpu_ms, lv.programs_cpu_ms]
        total = lv.total_cpu_ms
        per_core = f"{1000 / total:>10.0f}" if total is not None and total > 0 else f"{'-':>10}"
        shown_ratio = f"{ratio:>5.2f}" if ratio is not None else f"{'':>5}"
        print(
            f"{target.name:<16} {lv.concurrency:>4} {lv.rps:>8.1f} {shown_ratio} {_ms(parts[0], 7)} "
            f"{_ms(parts[1], 8)} {_ms(parts[2], 7)} {_ms(parts[3], 8)} {_ms(total, 7)} "
            f"{_ms(lv.machine_cpu_ms, 7)} {_ms(lv.client_cpu_ms, 7)} {per_core}"
        )
    for source in dict.fromkeys(t.programs_cpu_from for t, _, _ in rows if t.programs_cpu_from):
        print(f"programs: {source}")
    if any(t.total_cpu_from == "tree" for t, _, _ in rows):
        print(
            "total of a process tree: what its processes spent and what they reaped (TreeMeter): a run\n"
            "no one in the tree waits for is not in it"
        )
    if any(lv.server_cpu_ms is None for _, lv, _ in rows):
        print("'-' for the server's parts: a server this script did not start (its tree is not ours)")
    for line in cpu_ratio_lines(cpu_ratios):
        print(line)


def _client_cores(level: Level) -> str:
    """``used/available`` cores of the load generator, ``!`` where it was the limit."""
    if level.client_cores is None:
        return "-"
    return f"{level.client_cores:.2f}/{level.client_cores_available}" + (
        "!" if level.client_saturated else " "
    )


def print_report(
    targets: list[Target], spawn: dict[str, Any], ratios: dict[str, Any], info: dict[str, Any]
) -> None:
    rounds = info.get("rounds", 1)
    per = f"{info['requests']} requests per level" + (
        f", {rounds} rounds: medians, ratios per round" if rounds > 1 else ""
    )
    print(f"\nPOST /run_code, workload {info['workload']!r}  ({per})")
    for key in ("user_python", "turns", "host", "load_1min"):
        if info.get(key):
            print(f"  {key.replace('_', ' ')}: {info[key]}")
    processes = info.get("client_processes", 1)
    print(
        f"  client: {info.get('client', 'http')}, "
        + (f"{processes} processes" if processes > 1 else "threads of this process")
        + f", on {info.get('client_cores_available', '?')} cores"
    )
    header = (
        f"{'target':<16} {'conc':>4} {'ok':>5} {'err':>4} {'req/s':>8} "
        f"{'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8} {'client cores':>13}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for target in targets:
        for lv in target.levels:
            print(
                f"{target.name:<16} {lv.concurrency:>4} {lv.ok:>5} {lv.errors:>4} {lv.rps:>8.1f} "
                f"{lv.p50_ms:>8.1f} {lv.p95_ms:>8.1f} {lv.mean_ms:>8.1f} {_client_cores(lv):>13}"
            )
    _print_cpu(targets, scaling_rows(targets), ratios.get("cpu_reference_over_mock", {}))
    others = info.get("load_before")
    if others is not None and others >= (os.cpu_count() or 1):
        print(
            f"machine: the load before the run ({others:.1f} on {os.cpu_count()} CPUs), others' work, is in\n"
            "the machine figures, the more in a target's the longer its runs take: compare the totals"
        )
    print(
        f"\nbare spawn: {spawn['python']} -c 'print(1)' x{spawn['runs']}: "
        f"p50 {spawn['p50_ms']:.1f} ms, p95 {spawn['p95_ms']:.1f} ms"
    )
    print(
        f"{ratios['first_mock']} p50 at concurrency {ratios['mock_p50_over_spawn_p50_at_concurrency']}"
        f" / bare spawn p50 = {ratios['mock_p50_over_spawn_p50']:.2f}x"
    )
    tables = [
        (f"{ratios['first_mock']} / {name}", rows)
        for name, rows in ratios.get("first_mock_over_others", {}).items()
    ]
    tables += [(f"{name} / reference", rows) for name, rows in ratios.get("mock_over_reference", {}).items()]
    for title, rows in tables:
        print(f"\n{title}   (req/s ratio > 1: first faster;  p50 ratio < 1: first faster)")
        print(f"{'conc':>4} {'req/s ratio':>12} {'p50 ratio':>10}")
        for row in rows:
            rounds = row.get("rps_ratio_rounds")
            shown = "" if not rounds else "   rounds: " + " ".join(f"{r:.2f}" for r in rounds)
            print(f"{row['concurrency']:>4} {row['rps_ratio']:>12.2f} {row['p50_ratio']:>10.2f}{shown}")
    cores = info.get("client_cores_available") or client_cores_available()
    saturated = [(t, lv) for t in targets for lv in t.levels if lv.client_saturated]
    full = [
        (t, lv)
        for t in targets
        for lv in t.levels
        if not lv.client_saturated and (lv.host_cores_busy or 0.0) >= HOST_FULL * cores
    ]
    if saturated or full:
        print()
    for target, lv in saturated:
        print(
            f"client saturated at {target.name} c={lv.concurrency}: clients used {lv.client_cores:.1f} of "
            f"{lv.client_cores_available} cores; the figure is the client's limit, not the server's"
            + ("" if processes > 1 else " (try --client-processes)")
        )
    for target, lv in full:
        print(
            f"host full at {target.name} c={lv.concurrency}: {lv.host_cores_busy:.1f} of {cores} cores busy "
            f"(clients {lv.client_cores or 0.0:.1f}, the rest the server's and any other work); the figure "
            "is the host's limit, not the server's alone"
        )
    for target in targets:
        for lv in target.levels:
            if lv.first_error:
                print(f"\n{target.name} c={lv.concurrency}: {lv.errors} error(s), first: {lv.first_error}")


def _no_process(pid: int) -> str | None:
    """``None`` if the process ``pid`` is there to be metered, else why not."""
    import psutil

    if pid <= 0:  # psutil takes 0 for the kernel's idle task; negative pids are groups
        return "not a process id"
    try:
        psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return "no such process"
    except psutil.Error as exc:
        return f"its CPU times cannot be read: {exc}"
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="measure this server instead of an in-process mock")
    parser.add_argument("--reference-url", help="also measure this server and print mock/reference ratios")
    parser.add_argument(
        "--reference-pid",
        type=int,
        metavar="PID",
        help="the reference server's process id (uvicorn's, or a parent's whose tree holds it): its "
        "process tree's CPU per request is the reference's total, beside the mock's parts",
    )
    parser.add_argument("--requests", type=int, default=200, help="requests per concurrency level (200)")
    parser.add_argument(
        "--concurrency", default="1,4,16,64", help="comma-separated concurrency levels (default 1,4,16,64)"
    )
    parser.add_argument(
        "--workers",
        default="1",
        help="comma-separated worker counts: each exec mode is served with each (default 1), e.g. 1,2",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every target this many times, in turn (the order reversed every other round), "
        "and report medians: on a machine whose speed drifts, a ratio of two targets measured "
        "minutes apart says little (default 1)",
    )
    parser.add_argument(
        "--interleave",
        type=int,
        default=None,
        metavar="TURNS",
        help="in each round, keep every target up at once and measure each level in TURNS turns, the "
        "targets taking turns (A B, B A, ...): for a ratio of two targets on a machine whose speed "
        "drifts within a round (0: one target after the other, a level each; default 4 with "
        "--reference-url, so that both see the same machine, else 0)",
    )
    parser.add_argument("--spawn-runs", type=int, help="bare spawns to time (default: --requests)")
    parser.add_argument(
        "--python",
        help="interpreter of the served mocks' user code and of the bare spawn (default: the mock's "
        "configured one): give the reference's, so that both run the same",
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed requests per target first (5)")
    parser.add_argument("--timeout", type=float, default=60.0, help="client timeout per request, s (60)")
    parser.add_argument("--json", metavar="FILE", help="write the figures to FILE as JSON")
    parser.add_argument(
        "--modes",
        default="fork,spawn",
        help="exec modes to measure, each in its own `mocksandbox serve` process (default fork,spawn); "
        "'in-process' measures a ServerThread inside this process instead",
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="print", help="what to run (print)")
    parser.add_argument(
        "--isolation",
        default="",
        help="serve each mock with each of these isolations, e.g. none,lite (default: the server's own)",
    )
    parser.add_argument(
        "--client",
        choices=sorted(CLIENTS),
        default="http",
        help="HTTP client of the load threads: 'http' (keep-alive http.client, light; default), "
        "'requests' (a requests.Session each; about 2 ms more client CPU per call) or "
        "'new-connection' (a new connection per request, as verl's requests.post)",
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        metavar="N",
        help="spread each level's load threads over N client processes (default 1: threads of this "
        "process, which share one core): a large machine needs several to load its server; the "
        "report says when the clients, not the server, were the limit",
    )
    args = parser.parse_args(argv)
    try:
        args.levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
        args.worker_counts = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        parser.error("--concurrency and --workers take integers, e.g. 1,4,16 and 1,2")
    if not args.worker_counts or min(args.worker_counts) < 1:
        parser.error("--workers must be positive")
    args.isolations = [i.strip() for i in args.isolation.split(",") if i.strip()] or [None]
    if any(i not in ("none", "lite", "auto", None) for i in args.isolations):
        parser.error("--isolation takes none, lite or auto, e.g. none,lite")
    if args.rounds < 1:
        parser.error("--rounds must be positive")
    if args.client_processes < 1:
        parser.error("--client-processes must be positive")
    if args.interleave is None:
        args.interleave = min(4, args.requests) if args.reference_url else 0
    if args.interleave < 0 or args.interleave > args.requests:
        parser.error("--interleave takes 0 (off) up to --requests turns")
    if args.reference_pid is not None:
        if not args.reference_url:
            parser.error("--reference-pid goes with --reference-url")
        problem = _no_process(args.reference_pid)
        if problem:
            parser.error(f"--reference-pid {args.reference_pid}: {problem}")
    if not args.levels or min(args.levels) < 1 or args.requests < 1:
        parser.error("--concurrency and --requests must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workload = WORKLOADS[args.workload]
    load_before = os.getloadavg()[0]
    from mocksandbox.settings import load_settings

    python = args.python or load_settings().python
    rounds: list[list[Target]] = []

    def measure(entries: list[Entry], turns: int) -> list[Target]:
        return measure_in_turns(
            entries,
            args.levels,
            args.requests,
            turns,
            args.warmup,
            args.timeout,
            workload,
            args.client,
            pool,
        )

    def reachable(entry: Entry) -> Callable[[], AbstractContextManager[Entry]]:
        return lambda: contextlib.nullcontext(entry)

    def served(mode: str, workers: int, isolation: str | None) -> Callable[[], AbstractContextManager[Entry]]:
        @contextlib.contextmanager
        def up() -> Iterator[Entry]:
            with served_mock(mode, workers, args.python, isolation) as (url, meter):
                series = f"mock-{mode}" + (f"-{isolation}" if isolation else "")
                name = f"mock-{mode}" + (f"-w{workers}" if len(args.worker_counts) > 1 else "")
                name += f"-{isolation}" if isolation else ""
                yield Entry(name, url, meter, workers, series)

        return up

    with contextlib.ExitStack() as stack:
        pool = None
        if args.client_processes > 1:
            pool = ClientPool(args.client_processes)
            stack.callback(pool.close)
        #: Each target, as a context in which it is up (a served mock: only in it).
        plan: list[Callable[[], AbstractContextManager[Entry]]] = []
        if args.url:
            plan.append(reachable(Entry("mock", args.url)))
        else:
            for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
                if mode == "in-process":
                    url, python, _ = stack.enter_context(in_process_mock())
                    plan.append(reachable(Entry(f"mock-{mode}", url)))
                    continue
                plan += [
                    served(mode, workers, isolation)
                    for workers in args.worker_counts
                    for isolation in args.isolations
                ]
        if args.reference_url:
            tree = TreeMeter(args.reference_pid) if args.reference_pid is not None else None
            plan.append(reachable(Entry("reference", args.reference_url, tree=tree)))
        for number in range(args.rounds):
            if args.interleave:
                # Every target up at once for the round (an idle served mock takes next to no CPU), its
                # levels measured in turns (measure_in_turns).
                with contextlib.ExitStack() as round_stack:
                    rounds.append(measure([round_stack.enter_context(up()) for up in plan], args.interleave))
            else:
                # One served mock at a time: the others would share the cores while idle.
                order = list(range(len(plan)))
                if number % 2:
                    order.reverse()  # whatever drifts over a round weighs on each target alike
                measured = {}
                for index in order:
                    with plan[index]() as entry:
                        (measured[index],) = measure([entry], 1)
                rounds.append([measured[index] for index in range(len(plan))])
            if args.rounds > 1:
                print(f"round {number + 1} of {args.rounds} done", file=sys.stderr, flush=True)
        spawn = measure_spawn(python, args.spawn_runs or args.requests)

    targets = [
        Target(
            first.name,
            first.url,
            [median_level([r[index].level(c) for r in rounds]) for c in args.levels]
            if args.rounds > 1
            else first.levels,
            first.workers,
            first.series,
            first.programs_cpu_from,
            first.total_cpu_from,
        )
        for index, first in enumerate(rounds[0])
    ]
    mock = targets[0]
    lowest = min(args.levels)  # 1 unless --concurrency leaves it out
    ratios: dict[str, Any] = {
        "mock_p50_over_spawn_p50": _ratio(mock.level(lowest).p50_ms, spawn["p50_ms"]),
        "mock_p50_over_spawn_p50_at_concurrency": lowest,
        "first_mock": mock.name,
    }
    mocks = [t for t in targets if t.name != "reference"]
    if len(mocks) > 1:
        ratios["first_mock_over_others"] = {
            other.name: _ratio_rows(mock, other, args.levels) for other in mocks[1:]
        }
    if args.reference_url:
        reference = targets[-1]
        ratios["mock_over_reference"] = {m.name: _ratio_rows(m, reference, args.levels) for m in mocks}
        ratios["cpu_reference_over_mock"] = {
            target.name: cpu_ratio_rows([r[index] for r in rounds], [r[-1] for r in rounds], args.levels)
            for index, target in enumerate(targets[:-1])
        }
    turns = f"each level in {args.interleave} turns, the targets taking turns" if args.interleave else None
    info = {
        "requests": args.requests,
        "rounds": args.rounds,
        "workload": args.workload,
        "client": args.client,
        "client_processes": args.client_processes,
        "client_cores_available": client_cores_available(),
        "client_saturated_from": CLIENT_SATURATED,
        "host_full_from": HOST_FULL,
        "user_python": python,
        "turns": turns,
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}",
        # Other work on the machine skews every figure; this says how busy it was.
        "load_1min": f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after",
        "load_before": load_before,
    }
    print_report(targets, spawn, ratios, info)
    if args.json:
        figures = {
            "workload": workload,
            "info": info,
            "targets": [asdict(t) for t in targets],
            "spawn": spawn,
            "ratios": ratios,
            "scaling": scaling_rows(targets),
        }
        with open(args.json, "w") as handle:
            json.dump(_no_nan(figures), handle, indent=2, allow_nan=False)
            handle.write("\n")
        print(f"\nfigures written to {args.json}")
    failed = sum(lv.errors for t in targets for lv in t.levels)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(client_worker() if sys.argv[1:] == ["--client-worker"] else main())
