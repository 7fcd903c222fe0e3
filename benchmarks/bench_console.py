#!/usr/bin/env python3
"""What an open web console costs ``POST /run_code``: req/s with and without it, in the same run.

One ``mocksandbox serve`` process on 127.0.0.1 (a free port; ``--workers N`` for a pool) is
loaded with ``print(1)`` at concurrency 16 by keep-alive ``http.client`` threads, in phases of a
fixed length that alternate: nobody watching, then the console open, again and again (so that
drift, a warm page cache or a noisy neighbour, falls on both sides alike). The figures are the
medians of each side and the cost, ``1 - watched / unwatched``.

Who watches (``--observer``):

* ``browser``: Debian's headless ``chromium`` (through ``chromedriver`` and Selenium, as the
  console's tests drive it) with ``/_mock/ui`` open on its Live tab; between watched phases it
  shows ``about:blank``, so the browser itself is running on both sides and the difference is
  the page. It shares this machine's cores with the server, as a console opened on the host does.
* ``sse``: a process reading ``/_mock/events`` (the server's side of the cost only).

    python benchmarks/bench_console.py
    python benchmarks/bench_console.py --observer sse --phase-seconds 5 --rounds 5
    python benchmarks/bench_console.py --workers 2 --screenshot docs/console.png

Only loopback addresses are ever used.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import psutil

from mocksandbox.live import LIVE_INTERVAL_S

PAYLOAD = json.dumps({"code": "print(1)", "language": "python"}).encode()


@dataclass
class Phase:
    watched: bool
    requests: int
    errors: int
    seconds: float
    #: CPU seconds the server's long-lived processes used (the feed's cost lands there; a run's
    #: own process ends before it can be counted).
    server_cpu_s: float
    #: CPU seconds the observer used (the browser, or the ``sse`` reader; ``None`` when detached).
    browser_cpu_s: float | None = None

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_ms_per_request(self) -> float:
        return 1000 * self.server_cpu_s / max(1, self.requests)


def cpu_by_process(pid: int) -> dict[int, float]:
    """User + system CPU so far of a process and each of its descendants alive now, by pid."""
    seen: dict[int, float] = {}
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            seen[process.pid] = times.user + times.system
    return seen


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used between two :func:`cpu_by_process` looks by the processes alive at the second (a
    process that ended between them is not counted: the server's runs, the blank page's renderer)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def load(url: str, concurrency: int, seconds: float) -> tuple[int, int, float]:
    """``concurrency`` threads posting ``print(1)`` for ``seconds``: (answered, errors, wall time)."""
    parts = urlsplit(url)
    counts = [0] * concurrency
    errors = [0] * concurrency
    gate = threading.Barrier(concurrency + 1)
    stop = threading.Event()

    def worker(index: int) -> None:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        gate.wait()
        while not stop.is_set():
            try:
                connection.request("POST", "/run_code", PAYLOAD, {"Content-Type": "application/json"})
                response = connection.getresponse()
                body = response.read()
                if response.status == 200 and b'"stdout":"1\\n"' in body:
                    counts[index] += 1
                else:
                    errors[index] += 1
                if response.will_close:
                    connection.close()
                    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
            except (OSError, http.client.HTTPException):
                errors[index] += 1
                connection.close()
                connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        connection.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    gate.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return sum(counts), sum(errors), time.perf_counter() - started


class Observer(Protocol):
    def attach(self) -> None: ...
    def detach(self) -> None: ...
    def cpu(self) -> dict[int, float] | None: ...
    def close(self) -> None: ...


#: The ``sse`` observer: a process reading the feed and parsing each event, as a page would.
SSE_READER = """
import http.client, json, sys
from urllib.parse import urlsplit
parts = urlsplit(sys.argv[1])
connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
connection.request("GET", "/_mock/events", headers={"Accept": "text/event-stream"})
for line in connection.getresponse():
    if line.startswith(b"data: "):
        json.loads(line[6:])
"""


class SseObserver:
    """A process reading the live feed (not a thread of this one: the load's threads would share
    its interpreter lock and the client, not the server, would pay)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._process: subprocess.Popen[bytes] | None = None

    def attach(self) -> None:
        self._process = subprocess.Popen([sys.executable, "-c", SSE_READER, self.url])

    def detach(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None

    def cpu(self) -> dict[int, float] | None:
        return None if self._process is None else cpu_by_process(self._process.pid)

    def close(self) -> None:
        self.detach()


class BrowserObserver:
    """Headless Chromium with the console open (attached) or ``about:blank`` (detached)."""

    def __init__(self, url: str) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        browser = shutil.which("chromium")
        driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
        if browser is None:
            raise SystemExit("no chromium: apt-get install -y chromium chromium-driver (or --observer sse)")
        self.url = url
        self._profile = tempfile.TemporaryDirectory(prefix="bench-console-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = browser
        for flag in (
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-proxy-server",
            "--window-size=1360,900",
            f"--user-data-dir={self._profile.name}",
        ):
            options.add_argument(flag)
        self.driver = webdriver.Chrome(service=Service(executable_path=driver), options=options)

    def attach(self) -> None:
        self.driver.get(f"{self.url}/_mock/ui#live")
        deadline = time.monotonic() + 20
        while self.driver.find_element("id", "connection").text != "live":
            if time.monotonic() > deadline:
                raise RuntimeError("the console's live feed did not connect")
            time.sleep(0.05)

    def detach(self) -> None:
        self.driver.get("about:blank")

    def cpu(self) -> dict[int, float] | None:
        """The browser's CPU so far: chromedriver and every chromium process under it."""
        return cpu_by_process(self.driver.service.process.pid)

    def screenshot(self, path: str) -> None:
        self.driver.save_screenshot(path)

    def close(self) -> None:
        self.driver.quit()
        self._profile.cleanup()


def feed_cost_us(per_look: int = 100, looks: int = 30) -> tuple[float, float]:
    """The live feed's own CPU, measured in this process, free of the machine's noise: (µs per
    request an update lists, µs per look at an idle state). A request is journaled as the server
    journals a ``print(1)``; each look is :meth:`LiveFeed.poll` plus the event's encoding."""
    from mocksandbox.control.state import IncomingRequest, LocalControlState
    from mocksandbox.live import LiveFeed, sse_event

    state = LocalControlState()
    feed = LiveFeed(state)
    answer = json.dumps(
        {"status": "Success", "message": "", "run_result": {"status": "Finished", "stdout": "1\n"}}
    ).encode()

    def look(requests: int) -> float:
        for _ in range(requests):
            admission = state.admit(IncomingRequest("POST", "/run_code", "", PAYLOAD, "127.0.0.1:1"))
            state.finish(admission.entry_id, 200, answer)
        started = time.process_time()
        update = feed.poll()
        if update is not None:
            sse_event("update", update, feed.cursor.event_id())
        return time.process_time() - started

    look(per_look)  # the first look lists the backlog
    busy = statistics.median(look(per_look) for _ in range(looks))
    idle = statistics.median(look(0) for _ in range(looks))
    return 1e6 * busy / per_look, 1e6 * idle


@contextlib.contextmanager
def served_mock(workers: int) -> Iterator[tuple[str, int]]:
    """``mocksandbox serve --port 0 --workers N`` on 127.0.0.1, ready: its URL and pid."""
    command = [sys.executable, "-m", "mocksandbox.cli", "serve", "--port", "0", "--workers", str(workers)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        url = None
        for line in process.stdout:
            if "serving on " in line and url is None:
                url = line.split("serving on ", 1)[1].split()[0]
            if line.startswith("  press Ctrl-C"):
                break
        if url is None:
            raise RuntimeError("mocksandbox serve did not start")
        # Drain the banner's pipe from now on, so that the server never blocks on it.
        threading.Thread(target=lambda: [None for _ in process.stdout or ()], daemon=True).start()
        yield url, process.pid
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--observer", choices=("browser", "sse"), default="browser")
    parser.add_argument("--workers", type=int, default=1, help="serve --workers N (default 1)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--phase-seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=4, help="pairs of phases (unwatched, watched)")
    parser.add_argument("--screenshot", metavar="PNG", help="save the console at the end (PNG)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)

    with served_mock(args.workers) as (url, pid):
        observer: Any = BrowserObserver(url) if args.observer == "browser" else SseObserver(url)
        phases: list[Phase] = []
        try:
            load(url, args.concurrency, min(3.0, args.phase_seconds))  # warm-up
            for round_index in range(args.rounds):
                for watched in (False, True):
                    if watched:
                        observer.attach()
                    server_before, browser_before = cpu_by_process(pid), observer.cpu()
                    answered, errors, wall = load(url, args.concurrency, args.phase_seconds)
                    cpu = cpu_between(server_before, cpu_by_process(pid))
                    browser_after = observer.cpu()
                    browser = None
                    if browser_before is not None and browser_after is not None:
                        browser = cpu_between(browser_before, browser_after)
                    last = round_index == args.rounds - 1
                    if watched and last and args.screenshot and isinstance(observer, BrowserObserver):
                        observer.screenshot(args.screenshot)
                    if watched:
                        observer.detach()
                    phases.append(phase := Phase(watched, answered, errors, wall, cpu, browser))
                    side = "console open" if watched else "no console  "
                    shown = "" if browser is None else f", observer {100 * browser / wall:5.1f}% of a core"
                    print(
                        f"  round {round_index + 1} {side}: {phase.rps:8.1f} req/s, "
                        f"server {phase.cpu_ms_per_request:.3f} CPU ms/request{shown} ({errors} errors)"
                    )
        finally:
            observer.close()

    unwatched = statistics.median(p.rps for p in phases if not p.watched)
    watched = statistics.median(p.rps for p in phases if p.watched)
    cost = 1 - watched / unwatched
    cpu_unwatched = statistics.median(p.cpu_ms_per_request for p in phases if not p.watched)
    cpu_watched = statistics.median(p.cpu_ms_per_request for p in phases if p.watched)
    print(
        f"\nPOST /run_code print(1), concurrency {args.concurrency}, workers {args.workers}, "
        f"observer {args.observer}, {args.rounds} x {args.phase_seconds:g} s per side:\n"
        f"  without the console: {unwatched:8.1f} req/s, server {cpu_unwatched:.3f} CPU ms/request\n"
        f"  with the console:    {watched:8.1f} req/s, server {cpu_watched:.3f} CPU ms/request (medians)\n"
        f"  cost: {cost * 100:+.1f}% of throughput, "
        f"{(cpu_watched / cpu_unwatched - 1) * 100:+.1f}% of server CPU per request"
    )
    shares = [100 * p.browser_cpu_s / p.seconds for p in phases if p.watched and p.browser_cpu_s is not None]
    if shares:
        print(f"  the observer itself: {statistics.median(shares):.1f}% of a core with the console open")
    per_request, per_idle_look = feed_cost_us()
    print(
        f"  the feed's own CPU (in-process, noise-free): {per_request:.1f} µs per request it lists, "
        f"{per_idle_look:.0f} µs per look at an idle state ({1 / LIVE_INTERVAL_S:g} looks/s)"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "observer": args.observer,
                    "workers": args.workers,
                    "concurrency": args.concurrency,
                    "phases": [{**p.__dict__, "rps": p.rps, "cpu_ms": p.cpu_ms_per_request} for p in phases],
                    "unwatched_rps": unwatched,
                    "watched_rps": watched,
                    "cost": cost,
                    "unwatched_cpu_ms_per_request": cpu_unwatched,
                    "watched_cpu_ms_per_request": cpu_watched,
                    "feed_us_per_request": per_request,
                    "feed_us_per_idle_look": per_idle_look,
                },
                out,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
