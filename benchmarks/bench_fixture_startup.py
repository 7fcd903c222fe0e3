"""Fixture start-up and per-test reset cost, beside pytest-httpserver's server start (same run).

    python benchmarks/bench_fixture_startup.py [--repeat 20]

Measures, in this process, what the ``mocksandbox_url`` fixture does (build the sandbox, start
the server thread on a free loopback port, first answered ``/v1/ping``), what the per-test reset
costs, and the start of a pytest-httpserver ``HTTPServer`` to its first answered request.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import requests


def mocksandbox_start() -> tuple[float, float]:
    from mocksandbox.core import MockSandbox
    from mocksandbox.serving.single import ServerThread

    started = time.perf_counter()
    box = MockSandbox.create()
    server = ServerThread(box, "127.0.0.1", 0).start()
    requests.get(server.url + "/v1/ping", timeout=10).raise_for_status()
    first_ping = time.perf_counter() - started
    resets = []
    for _ in range(50):
        t = time.perf_counter()
        box.wait_idle()
        box.reset()
        resets.append(time.perf_counter() - t)
    server.stop()
    box.close()
    return first_ping, statistics.median(resets)


def httpserver_start() -> float:
    from pytest_httpserver import HTTPServer

    started = time.perf_counter()
    server = HTTPServer(host="127.0.0.1", port=0)
    server.expect_request("/ping").respond_with_data("pong")
    server.start()
    requests.get(server.url_for("/ping"), timeout=10).raise_for_status()
    elapsed = time.perf_counter() - started
    server.clear()
    server.stop()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # pytest-httpserver logs every request
    ours, resets, theirs = [], [], []
    for _ in range(args.repeat):
        first_ping, reset = mocksandbox_start()
        ours.append(first_ping)
        resets.append(reset)
        theirs.append(httpserver_start())
    med_ours, med_theirs = statistics.median(ours), statistics.median(theirs)
    print(f"{'measure':<44}{'median ms':>12}{'min ms':>10}")
    rows = [
        ("mocksandbox: fixture to first ping", ours),
        ("mocksandbox: per-test reset", resets),
        ("pytest-httpserver: start to first answer", theirs),
    ]
    for label, values in rows:
        print(f"{label:<44}{statistics.median(values) * 1e3:>12.3f}{min(values) * 1e3:>10.3f}")
    ratio = med_ours / med_theirs
    print(f"ratio mocksandbox / pytest-httpserver start: {ratio:.2f}x  (repeat={args.repeat})")


if __name__ == "__main__":
    main()
