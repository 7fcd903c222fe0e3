#!/usr/bin/env python3
"""How long pure-Python work of the kind reward code runs takes on CPython 3.10 (production's user
Python: SandboxFusion's ``sandbox-runtime``) against other minor versions, on this machine.

The figures behind ``PRODUCTION_SLOWDOWN`` in ``mocksandbox/runtime/production.py``: the time a
run takes on 3.10 relative to the time it takes on another minor version. A run that finished near
its ``run_timeout`` on a faster runtime than production's gets a ``runtime`` divergence note.

Eight kernels of the kind solutions and reward code run (loops with integer arithmetic, float
arithmetic, dict and list work, recursion, string building, a 2-D dynamic programme, small
objects with method calls, a generator pipeline), each sized to take about 0.05 s on 3.10. Each
interpreter runs every kernel in a fresh process per round: one warm-up call, then the fastest of
``--inner`` calls. Time is the process's CPU time (``time.process_time``), not the wall clock's:
on a shared machine the wall clock also counts the time other programs had the core (on this
2-core machine, shared, the wall time of one call varied threefold while its CPU time varied by
a tenth), and what else runs only ever adds time, hence the fastest call. The rounds interleave
the interpreters, rotating their order, so that whatever else the machine does falls on all of
them alike. Per kernel and interpreter: the median of the rounds, and the spread of the rounds
around it. Per interpreter: the ratio ``time on the baseline / time here`` per
kernel, their geometric mean, and their range.

    python benchmarks/bench_python_versions.py                       # pyenv's 3.8 .. 3.13, 5 rounds
    python benchmarks/bench_python_versions.py --rounds 3 --versions 3.10,3.11
    python benchmarks/bench_python_versions.py --python 3.11=/usr/bin/python3.11 --json out.json

Interpreters are found as ``$PYENV_ROOT/versions/<X.Y.Z>/bin/pythonX.Y`` (newest patch of each
minor), or named with ``--python X.Y=PATH``. The baseline (``--baseline``, default 3.10) is
measured in the same run as the others.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

#: Run in each interpreter (3.6 and later syntax) as ``-c KERNELS INNER [NAMES]``: prints
#: {kernel: the fastest of INNER calls, in seconds of the process's CPU time} as JSON.
KERNELS = r"""
import json, sys, time


def arith(n=150_000):
    total = 0
    for i in range(n):
        total += (i * i) % 7 - (i >> 3) + (i & 5)
    return total


def primes(n=60_000):
    found = []
    for candidate in range(2, n):
        for p in found:
            if p * p > candidate:
                found.append(candidate)
                break
            if candidate % p == 0:
                break
        else:
            found.append(candidate)
    return len(found)


def floats(steps=125_000):
    x, y, vx, vy = 1.0, 0.0, 0.0, 0.5
    dt = 0.001
    for _ in range(steps):
        r2 = x * x + y * y
        r3 = r2 * r2 ** 0.5
        vx -= x / r3 * dt
        vy -= y / r3 * dt
        x += vx * dt
        y += vy * dt
    return x + y


def dicts(n=125_000):
    counts = {}
    words = ["w%d" % (i % 997) for i in range(n)]
    for word in words:
        counts[word] = counts.get(word, 0) + 1
    pairs = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    groups = {}
    for i, (word, count) in enumerate(pairs):
        groups.setdefault(count % 13, []).append(word)
    return len(groups) + sum(len(v) for v in groups.values())


def recursion(n=26):
    def fib(k):
        return k if k < 2 else fib(k - 1) + fib(k - 2)

    return fib(n)


def strings(n=85_000):
    parts = []
    for i in range(n):
        s = "item-" + str(i)
        if s.endswith("7"):
            s = s.upper()
        parts.append(s[::-1] if i % 3 == 0 else s)
    text = ",".join(parts)
    return len(text.split(",")) + text.count("M")


def dynamic(n=340):
    a = [(i * 7) % 26 for i in range(n)]
    b = [(i * 11) % 26 for i in range(n)]
    table = [[0] * (n + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        row, prev = table[i], table[i - 1]
        for j in range(1, n + 1):
            if a[i - 1] == b[j - 1]:
                row[j] = prev[j - 1] + 1
            else:
                row[j] = max(prev[j], row[j - 1])
    return table[n][n]


class Node:
    __slots__ = ("value", "children")

    def __init__(self, value):
        self.value = value
        self.children = []

    def add(self, child):
        self.children.append(child)
        return child

    def total(self):
        return self.value + sum(child.total() for child in self.children)


def objects(n=40_000):
    root = Node(0)
    nodes = [root]
    for i in range(1, n):
        nodes.append(nodes[(i - 1) // 3].add(Node(i % 10)))
    return root.total()


def pipeline(n=200_000):
    squares = (i * i for i in range(n))
    odd = (s for s in squares if s & 1)
    return sum(s % 1000 for s in odd)


KERNELS = [arith, primes, floats, dicts, recursion, strings, dynamic, objects, pipeline]
inner = int(sys.argv[1])
names = sys.argv[2].split(",") if len(sys.argv) > 2 else [k.__name__ for k in KERNELS]
times = {}
for kernel in KERNELS:
    if kernel.__name__ not in names:
        continue
    kernel()  # warm-up (3.11+ specialises the bytecode on its first calls)
    best = float("inf")
    for _ in range(inner):
        start = time.process_time()
        kernel()
        best = min(best, time.process_time() - start)
    times[kernel.__name__] = best
print(json.dumps(times))
"""


def minor(version: str) -> tuple[int, int]:
    major, minor_, *_ = version.split(".")
    return int(major), int(minor_)


def pyenv_interpreters() -> dict[str, str]:
    """``X.Y`` → pyenv's newest ``X.Y.Z`` interpreter of that minor version."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found: dict[str, tuple[tuple[int, ...], str]] = {}
    for entry in root.glob("*") if root.is_dir() else []:
        if not re.fullmatch(r"3\.\d+\.\d+", entry.name):
            continue
        key = ".".join(entry.name.split(".")[:2])
        python = entry / "bin" / f"python{key}"
        version = tuple(map(int, entry.name.split(".")))
        if python.exists() and (key not in found or version > found[key][0]):
            found[key] = (version, str(python))
    return {key: path for key, (_, path) in found.items()}


def full_version(python: str) -> str:
    done = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.strip()


def measure(
    pythons: dict[str, str], rounds: int, inner: int, kernels: str | None
) -> dict[str, dict[str, list[float]]]:
    """``X.Y`` → kernel → the seconds of each round."""
    results: dict[str, dict[str, list[float]]] = {key: {} for key in pythons}
    order = list(pythons)
    for number in range(rounds):
        shift = number % len(order)
        for key in order[shift:] + order[:shift]:
            args = [pythons[key], "-I", "-S", "-c", KERNELS, str(inner)] + ([kernels] if kernels else [])
            done = subprocess.run(args, capture_output=True, text=True, check=True)
            for name, seconds in json.loads(done.stdout).items():
                results[key].setdefault(name, []).append(seconds)
        print(f"  round {number + 1}/{rounds} done", file=sys.stderr)
    return results


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(map(math.log, values)))


def spread(values: list[float]) -> float:
    """The largest distance of a round from the median, as a fraction of the median."""
    middle = statistics.median(values)
    return max(abs(v - middle) for v in values) / middle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", default="3.8,3.9,3.10,3.11,3.12,3.13", help="minor versions")
    parser.add_argument("--baseline", default="3.10", help="production's minor version")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--inner", type=int, default=3, help="calls per kernel and round (the fastest counts)"
    )
    parser.add_argument("--kernels", help="a comma-separated subset of the kernels")
    parser.add_argument("--python", action="append", default=[], metavar="X.Y=PATH",
                        help="the interpreter of a version (else pyenv's)")  # fmt: skip
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args(argv)

    wanted = [v.strip() for v in args.versions.split(",") if v.strip()]
    if args.baseline not in wanted:
        wanted.insert(0, args.baseline)
    known = pyenv_interpreters()
    for item in args.python:
        key, _, path = item.partition("=")
        known[key] = path
    missing = [v for v in wanted if v not in known]
    pythons = {v: known[v] for v in sorted(wanted, key=minor) if v in known}
    if args.baseline not in pythons:
        parser.error(f"no interpreter for the baseline {args.baseline} (--python {args.baseline}=PATH)")
    versions = {key: full_version(path) for key, path in pythons.items()}

    command = "python benchmarks/bench_python_versions.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"command: {command.strip()}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print("interpreters: " + ", ".join(f"{versions[k]} ({p})" for k, p in pythons.items()))
    if missing:
        print(f"not found (skipped): {', '.join(missing)}")
    print(
        f"rounds: {args.rounds}, a fresh process per interpreter and round; per kernel one warm-up call, "
        f"then the fastest of {args.inner} calls in CPU time"
    )
    results = measure(pythons, args.rounds, args.inner, args.kernels)

    base = results[args.baseline]
    kernels = list(base)
    print()
    print("median CPU seconds per kernel (± largest distance of a round from the median)")
    print("kernel      " + "".join(f"{versions[k]:>16}" for k in pythons))
    for name in kernels:
        cells = "".join(
            f"{statistics.median(results[k][name]):>9.4f} ±{spread(results[k][name]):>4.0%}" for k in pythons
        )
        print(f"{name:<12}{cells}")
    for label, statistic in (("median", statistics.median), ("fastest", min)):
        print()
        print(
            f"time on {versions[args.baseline]} / time on each, from the {label} round of each kernel "
            f"(above 1: {args.baseline} is slower)"
        )
        print("kernel      " + "".join(f"{versions[k]:>10}" for k in pythons))
        ratios: dict[str, list[float]] = {k: [] for k in pythons}
        for name in kernels:
            row = []
            for key in pythons:
                ratio = statistic(base[name]) / statistic(results[key][name])
                ratios[key].append(ratio)
                row.append(f"{ratio:>10.2f}")
            print(f"{name:<12}{''.join(row)}")
        print("geomean     " + "".join(f"{geomean(ratios[k]):>10.2f}" for k in pythons))
        print("min         " + "".join(f"{min(ratios[k]):>10.2f}" for k in pythons))
        print("max         " + "".join(f"{max(ratios[k]):>10.2f}" for k in pythons))
    worst = max(spread(results[k][name]) for k in pythons for name in kernels)
    print(f"\nlargest distance of one round from its median: {worst:.0%}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"command": command, "versions": versions, "seconds": results}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
