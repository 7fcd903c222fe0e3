#!/usr/bin/env python3
"""The job users run: verl's own reward function for code, ``sandbox_fusion.compute_score``, over a
batch of stdin test cases, against a served mock and (``--reference-url``) a SandboxFusion, in one
run: each batch's wall time, their ratio, and the CPU per run of each.

verl's files are used unchanged (``verl/utils/reward_score/sandbox_fusion/``, loaded by path from
verl's wheel so that ``verl/__init__.py``, which needs numpy, torch and ray, never runs; ``make
test`` installs it apart in ``.venv/test-vendor``). As in verl: every stdin case is one JSON body
and one ``requests.post`` (a new connection, closed after the answer), verl's ``check_correctness``
starts a thread per case of a completion, and one semaphore (verl's ``max_concurrent``, 64) is
shared by every call. Completions are scored by ``--threads`` threads (8) at once. Each completion
is a verl-like answer: a fenced Python program that reads 200 numbers from stdin, folds them and
prints one line; every one of them is right, so every case must come back a pass. A case that got
no pass or fail from the sandbox (a connection error, an HTTP error, a ``SandboxError``, a run
that failed) is an error: reported, and the exit status is 1. Never a silent zero reward.

    python benchmarks/bench_reward_batch.py --reference-url http://127.0.0.1:8080
    python benchmarks/bench_reward_batch.py --reference-url http://127.0.0.1:8080 --client keep-alive
    python benchmarks/bench_reward_batch.py --completions 16 --cases 4 --rounds 3

The mock is a ``mocksandbox serve`` process this script starts on 127.0.0.1 (a free port), as
``bench_run_code.py`` starts its served mocks: default settings, ``--isolation lite``, the user
Python the runtime gives (``mocksandbox runtime install --languages python``: CPython 3.10, as
SandboxFusion's image runs user code). ``--url`` measures a mock you started instead.

CPU per run: the machine's (every core's busy time over the batch, this script's own CPU taken
out: what serving the batch cost, whoever else spent some of it too), for both targets; for the
served mock its parts as ``bench_run_code.py`` meters them (server, launcher, relays, programs);
for the reference, given ``--reference-pid``, its process tree's. On a machine others share, the
parts are the figures to compare: the machine's counts their work too. ``--client
keep-alive`` keeps connections: each call borrows an idle ``requests.Session`` (one per thread at
a time, made on first need) in place of verl's ``requests.post``, whose calls are otherwise the
same. Nothing is asserted about speed: the figures are printed next to the baseline measured in
the same run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.util
import math
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import requests

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))  # bench_run_code.py, beside this script

from bench_run_code import CPU_PARTS, CpuMeter, TreeMeter, _busy_seconds, served_mock  # noqa: E402

#: What verl's trainer passes (``reward.sandbox_fusion.memory_limit_mb``) and its default
#: ``compute_score`` timeout (compile and run, seconds).
MEMORY_LIMIT_MB = 1024
CASE_TIMEOUT = 10
#: The numbers each stdin case holds, as the issue's verl-like case.
NUMBERS_PER_CASE = 200
_MODULUS = 1_000_000_007
#: The package name verl's sandbox_fusion files are loaded under (not ``verl.…``: verl's own
#: ``__init__`` must not run).
_VERL_PACKAGE = "_bench_verl_sandbox_fusion"
_HEAVY_MODULES = ("torch", "ray", "numpy", "transformers", "verl")
#: verl's per-case statuses (``metadata["status"]``) that are a sandbox's pass or fail.
PASS, FAIL = "success", "wrong_answer"
CLIENTS = ("new-connection", "keep-alive")


# -- verl -------------------------------------------------------------------------------------------


def find_verl(explicit: str | None = None) -> Path:
    """verl's package directory: ``explicit``, else the test-only install (``MOCKSANDBOX_TEST_VENDOR``
    or ``.venv/test-vendor``), else a verl installed in this environment (found, not imported)."""
    candidates = [Path(explicit)] if explicit else []
    vendor = os.environ.get("MOCKSANDBOX_TEST_VENDOR") or _HERE.parent / ".venv" / "test-vendor"
    candidates.append(Path(vendor) / "verl")
    if not explicit:
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec("verl")  # finds the package without running it
            if spec is not None and spec.origin:
                candidates.append(Path(spec.origin).parent)
    for candidate in candidates:
        if (candidate / "utils" / "reward_score" / "sandbox_fusion" / "utils.py").is_file():
            return candidate
        if explicit:
            break
    raise FileNotFoundError(
        f"verl's reward_score/sandbox_fusion not found (looked in {', '.join(map(str, candidates))}); "
        f"install it apart: pip install --no-deps --target {vendor} verl==0.9.1 (make test does)"
    )


def verl_version(verl_dir: Path) -> str:
    infos = sorted(verl_dir.parent.glob("verl-*.dist-info"))
    return infos[-1].name.removeprefix("verl-").removesuffix(".dist-info") if infos else "?"


def load_verl_sandbox_fusion(verl_dir: Path) -> ModuleType:
    """``verl.utils.reward_score.sandbox_fusion`` (``compute_score``; its ``utils`` module holds
    ``check_correctness``) from ``verl_dir``, as a package of its own: none of verl's other modules
    and none of its heavy dependencies are imported."""
    if _VERL_PACKAGE in sys.modules:
        return sys.modules[_VERL_PACKAGE]
    package_dir = verl_dir / "utils" / "reward_score" / "sandbox_fusion"
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location(
        _VERL_PACKAGE, package_dir / "__init__.py", submodule_search_locations=[str(package_dir)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_VERL_PACKAGE] = module  # its `from .utils import ...` looks the package up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for name in set(sys.modules) - before:
            del sys.modules[name]
        raise
    pulled = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in _HEAVY_MODULES)
    if pulled:
        raise RuntimeError(f"loading verl's sandbox_fusion imported heavy modules: {pulled}")
    return module


class SessionPerThread:
    """Stands in for the ``requests`` module inside verl's ``sandbox_fusion/utils.py``
    (``--client keep-alive``): ``post`` borrows an idle ``requests.Session`` (made on first need),
    so that each is used by one thread at a time and its connections are kept between calls; every
    other name is ``requests``' own. verl starts a thread per case, so a session per thread of its
    own would never be used twice."""

    def __init__(self) -> None:
        self._idle: list[requests.Session] = []
        self._lock = threading.Lock()
        self.sessions: list[requests.Session] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(requests, name)

    def post(self, url: str, **kwargs: Any) -> requests.Response:
        with self._lock:
            session = self._idle.pop() if self._idle else None
        if session is None:
            session = requests.Session()
            with self._lock:
                self.sessions.append(session)
        try:
            return session.post(url, **kwargs)
        finally:
            with self._lock:
                self._idle.append(session)

    def close(self) -> None:
        for session in self.sessions:
            session.close()


@contextlib.contextmanager
def verl_client(sandbox_fusion: ModuleType, client: str) -> Iterator[SessionPerThread | None]:
    """verl's HTTP client as asked: its own ``requests.post`` (``new-connection``), or the module's
    ``requests`` swapped for a :class:`SessionPerThread` (``keep-alive``) while in the block."""
    if client == "new-connection":
        yield None
        return
    utils = sys.modules[f"{sandbox_fusion.__name__}.utils"]
    pool = SessionPerThread()
    utils.requests = pool
    try:
        yield pool
    finally:
        utils.requests = requests
        pool.close()


# -- the batch --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    """One response to score: its text (a fenced program, as a model writes it) and its cases."""

    text: str
    test_cases: dict[str, list[str]]


def _program(multiplier: int) -> str:
    return (
        "import sys\n\n\n"
        "def main():\n"
        "    data = sys.stdin.read().split()\n"
        "    n = int(data[0])\n"
        "    nums = [int(x) for x in data[1 : n + 1]]\n"
        "    acc = 0\n"
        "    for x in nums:\n"
        f"        acc = (acc * {multiplier} + x) % {_MODULUS}\n"
        "    print(acc)\n\n\n"
        "main()\n"
    )


def _fold(numbers: list[int], multiplier: int) -> int:
    acc = 0
    for x in numbers:
        acc = (acc * multiplier + x) % _MODULUS
    return acc


def make_batch(completions: int, cases: int, seed: int = 0) -> list[Completion]:
    """``completions`` verl-like answers (each its own fold, all right) of ``cases`` stdin cases."""
    rng = random.Random(seed)
    batch = []
    for index in range(completions):
        multiplier = 31 + 2 * index
        text = (
            "Read the numbers, then fold them into one hash.\n\n```python\n"
            + _program(multiplier)
            + "```\n\nThis reads all of stdin at once and prints the hash."
        )
        inputs, outputs = [], []
        for _ in range(cases):
            numbers = [rng.randint(-(10**6), 10**6) for _ in range(NUMBERS_PER_CASE)]
            inputs.append(f"{len(numbers)}\n" + " ".join(map(str, numbers)) + "\n")
            outputs.append(f"{_fold(numbers, multiplier)}\n")
        batch.append(Completion(text, {"inputs": inputs, "outputs": outputs}))
    return batch


@dataclass
class Scored:
    """What a batch came back as: each case's verl status, the first error's words, the scores."""

    statuses: Counter[str] = field(default_factory=Counter)
    first_error: str | None = None
    scores: list[float] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return sum(self.statuses.values())

    @property
    def passed(self) -> int:
        return self.statuses[PASS]

    @property
    def failed(self) -> int:
        return self.statuses[FAIL]

    @property
    def errors(self) -> int:
        return self.runs - self.passed - self.failed

    def add(self, score: float, metadata: list[dict[str, Any]], cases: int) -> None:
        self.scores.append(score)
        for entry in metadata:
            status = str(entry.get("status") or entry.get("error") or "no status")
            self.statuses[status] += 1
            if status not in (PASS, FAIL) and self.first_error is None:
                self.first_error = _error_words(status, entry)
        missing = cases - len(metadata)
        if missing > 0:  # compute_score gave up before the cases (e.g. a completion without a block)
            self.statuses["not run"] += missing
            self.first_error = self.first_error or f"not run: {metadata[:1]}"


def _error_words(status: str, entry: dict[str, Any]) -> str:
    detail = entry.get("api_request_error") or entry.get("stderr") or entry.get("api_status") or ""
    return f"{status}: {str(detail).strip()[:300]}" if detail else status


def score_batch(
    sandbox_fusion: ModuleType, url: str, batch: list[Completion], threads: int, max_concurrent: int
) -> Scored:
    """Every completion scored by verl's ``compute_score`` from ``threads`` threads sharing one
    semaphore of ``max_concurrent``."""
    semaphore = threading.Semaphore(max_concurrent)
    scored = Scored()

    def score(completion: Completion) -> tuple[float, list[dict[str, Any]]]:
        return sandbox_fusion.compute_score(
            url, semaphore, MEMORY_LIMIT_MB, completion.text, completion.test_cases, timeout=CASE_TIMEOUT
        )

    with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
        for completion, (score_value, metadata) in zip(batch, pool.map(score, batch), strict=True):
            scored.add(score_value, metadata, len(completion.test_cases["inputs"]))
    return scored


# -- measuring --------------------------------------------------------------------------------------


@dataclass
class Measured:
    """One target's batch: its wall time, what came back, and its CPU (seconds)."""

    wall_s: float
    scored: Scored
    #: Busy CPU of the cores of this script's affinity over the batch, and this script's own.
    busy_s: float
    client_s: float
    #: A served mock's parts (bench_run_code.CPU_PARTS); ``None``: a server this script did not start.
    parts_s: dict[str, float] | None = None
    #: A reference's process tree (``--reference-pid``); ``None``: not metered.
    tree_s: float | None = None

    def per_run_ms(self, seconds: float) -> float:
        return seconds / self.scored.runs * 1000 if self.scored.runs else math.nan

    @property
    def machine_ms(self) -> float:
        return self.per_run_ms(self.busy_s - self.client_s)

    @property
    def server_ms(self) -> float:
        """The server's own CPU per run: a served mock's parts together, or a reference's tree."""
        if self.parts_s is not None:
            return self.per_run_ms(sum(self.parts_s.values()))
        return self.per_run_ms(self.tree_s) if self.tree_s is not None else math.nan


@dataclass
class Target:
    name: str
    url: str
    meter: CpuMeter | None = None
    tree: TreeMeter | None = None
    rounds: list[Measured] = field(default_factory=list)


def measure(
    sandbox_fusion: ModuleType,
    target: Target,
    batch: list[Completion],
    threads: int,
    max_concurrent: int,
    client: str,
) -> Measured:
    before = target.meter.sample() if target.meter is not None else None
    tree_before = target.tree.sample() if target.tree is not None else None
    with verl_client(sandbox_fusion, client):
        busy, own, started = _busy_seconds(), time.process_time(), time.perf_counter()
        scored = score_batch(sandbox_fusion, target.url, batch, threads, max_concurrent)
        wall = time.perf_counter() - started
        own, busy = time.process_time() - own, _busy_seconds() - busy
    parts = None
    if target.meter is not None and before is not None:
        parts = target.meter.spent(before, target.meter.sample())
    tree = None
    if target.tree is not None and tree_before is not None:
        tree = target.tree.sample() - tree_before
    return Measured(wall, scored, busy, own, parts, tree)


def run_code_url(url: str) -> str:
    """The ``/run_code`` endpoint verl is given (``sandbox_fusion.url``), from a base URL or itself."""
    url = url.rstrip("/")
    return url if url.endswith("/run_code") else url + "/run_code"


def check_reference(url: str, timeout: float = 30.0) -> str | None:
    """``None`` if ``url`` answers ``print(1)`` as SandboxFusion does, else what is wrong."""
    body = {"code": "print(1)", "language": "python"}
    try:
        response = requests.post(url, json=body, timeout=timeout)
    except requests.RequestException as exc:
        return f"nothing answers POST {url}: {type(exc).__name__}: {exc}"
    if response.status_code != 200:
        return f"POST {url} answered HTTP {response.status_code}: {response.text[:200]!r}"
    try:
        answer = response.json()
    except ValueError:
        return f"POST {url} answered what is not JSON: {response.text[:200]!r}"
    run_result = answer.get("run_result") if isinstance(answer, dict) else None
    if answer.get("status") != "Success" or not run_result or run_result.get("stdout") != "1\n":
        return f"POST {url} did not run print(1) as SandboxFusion does: {response.text[:300]!r}"
    return None


# -- the report -------------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def _ms(value: float | None, width: int) -> str:
    return f"{value:>{width}.2f}" if value is not None and not math.isnan(value) else f"{'-':>{width}}"


def print_report(targets: list[Target], info: dict[str, Any]) -> None:
    rounds = len(targets[0].rounds)
    print(
        f"\nverl reward batch: {info['completions']} completions x {info['cases']} stdin cases = "
        f"{info['completions'] * info['cases']} runs a target"
        + (f", {rounds} rounds (medians)" if rounds > 1 else "")
    )
    for key in ("verl", "load", "client", "mock", "reference", "host", "load_1min"):
        if info.get(key):
            print(f"  {key.replace('_', ' ')}: {info[key]}")
    header = f"{'target':<10} {'runs':>5} {'pass':>5} {'fail':>5} {'err':>4} {'batch s':>8} {'runs/s':>8}" + (
        "   batch s by round" if rounds > 1 else ""
    )
    print("\n" + header + "\n" + "-" * len(header))
    for target in targets:
        runs = sum(m.scored.runs for m in target.rounds)
        passed = sum(m.scored.passed for m in target.rounds)
        failed = sum(m.scored.failed for m in target.rounds)
        errors = sum(m.scored.errors for m in target.rounds)
        wall = _median([m.wall_s for m in target.rounds])
        rate = _median([m.scored.runs / m.wall_s for m in target.rounds if m.wall_s > 0])
        by_round = "   " + " ".join(f"{m.wall_s:.2f}" for m in target.rounds) if rounds > 1 else ""
        print(
            f"{target.name:<10} {runs:>5} {passed:>5} {failed:>5} {errors:>4} {wall:>8.2f} {rate:>8.1f}"
            + by_round
        )
    reference = next((t for t in targets if t.name == "reference"), None)
    mock = targets[0]
    if reference is not None:
        per_round = [_ratio(r.wall_s, m.wall_s) for m, r in zip(mock.rounds, reference.rounds, strict=True)]
        shown = "   rounds: " + " ".join(f"{r:.2f}" for r in per_round) if rounds > 1 else ""
        print(f"\nreference / mock batch time: {_median(per_round):.2f}x  (> 1: the mock is faster){shown}")
    print(
        "\nCPU per run, ms: machine (the busy time of every core over the batch, this script's own CPU\n"
        "taken out); a served mock's parts as bench_run_code.py meters them: server (serve process),\n"
        "launcher, relays, programs, and their sum; client: this script (verl's client and its threads)"
    )
    header = (
        f"{'target':<10} {'machine':>8} {'server':>7} {'launcher':>8} {'relays':>7} {'programs':>8} "
        f"{'parts':>6} {'client':>7} {'runs/s/core':>11}"
    )
    print(header + "\n" + "-" * len(header))
    for target in targets:
        machine = _median([m.machine_ms for m in target.rounds])
        parts: dict[str, float | None] = dict.fromkeys(CPU_PARTS)
        if all(m.parts_s is not None for m in target.rounds):
            for part in CPU_PARTS:
                parts[part] = _median([m.per_run_ms((m.parts_s or {})[part]) for m in target.rounds])
        total = _median([m.server_ms for m in target.rounds])
        client = _median([m.per_run_ms(m.client_s) for m in target.rounds])
        per_core = f"{1000 / machine:>11.0f}" if machine > 0 else f"{'-':>11}"
        print(
            f"{target.name:<10} {_ms(machine, 8)} {_ms(parts['server'], 7)} {_ms(parts['launcher'], 8)} "
            f"{_ms(parts['relays'], 7)} {_ms(parts['programs'], 8)} {_ms(total, 6)} {_ms(client, 7)} "
            f"{per_core}"
        )
    if reference is not None:
        per_round = [
            _ratio(r.machine_ms, m.machine_ms) for m, r in zip(mock.rounds, reference.rounds, strict=True)
        ]
        print(f"reference / mock machine CPU per run: {_median(per_round):.2f}x")
        per_round = [
            _ratio(r.server_ms, m.server_ms) for m, r in zip(mock.rounds, reference.rounds, strict=True)
        ]
        if not math.isnan(_median(per_round)):
            print(f"reference / mock parts CPU per run: {_median(per_round):.2f}x")
    if mock.meter is not None:
        print(f"programs: {mock.meter.programs_from}")
    if any(t.tree is not None for t in targets):
        print("reference parts: its process tree's CPU (--reference-pid), server and programs together")
    for target in targets:
        errors = sum(m.scored.errors for m in target.rounds)
        failed = sum(m.scored.failed for m in target.rounds)
        if errors or failed:
            statuses: Counter[str] = Counter()
            for m in target.rounds:
                statuses.update(m.scored.statuses)
            first = next((m.scored.first_error for m in target.rounds if m.scored.first_error), None)
            print(
                f"\n{target.name}: {errors} run(s) not scored by the sandbox, {failed} wrong answer(s) "
                f"(every completion is right); by verl's status: {dict(statuses)}"
                + (f"\n  first error: {first}" if first else "")
            )


# -- the command ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--reference-url",
        help="also score the batch on this SandboxFusion (its base URL or its /run_code) and print "
        "the reference/mock ratios",
    )
    parser.add_argument(
        "--reference-pid",
        type=int,
        metavar="PID",
        help="the reference server's process id (uvicorn's, or a parent's whose tree holds it): its "
        "process tree's CPU per run is given too, a figure other work on the machine does not touch",
    )
    parser.add_argument(
        "--url",
        help="score on this mock instead of one this script serves (its CPU parts are then not metered)",
    )
    parser.add_argument("--completions", type=int, default=64, help="completions in the batch (64)")
    parser.add_argument("--cases", type=int, default=8, help="stdin cases of each completion (8)")
    parser.add_argument(
        "--threads",
        type=int,
        default=8,
        help="threads scoring completions at once, each calling compute_score (8)",
    )
    parser.add_argument(
        "--max-concurrent",
        type=int,
        default=64,
        help="the semaphore all calls share: verl's reward.sandbox_fusion.max_concurrent (64)",
    )
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default="new-connection",
        help="new-connection: verl's requests.post, unchanged (a connection per case; default); "
        "keep-alive: a requests.Session per thread at a time in its place, connections kept",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="score the batch on every target this many times, the order reversed every other "
        "round, and report medians (1)",
    )
    parser.add_argument(
        "--warmup", type=int, default=2, help="completions scored on each target first, untimed (2)"
    )
    parser.add_argument(
        "--isolation",
        choices=("lite", "none", "auto"),
        default="lite",
        help="isolation of the served mock (lite, the default settings' choice on a host that has it)",
    )
    parser.add_argument(
        "--verl", metavar="DIR", help="verl's package directory (default: .venv/test-vendor/verl)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the stdin cases' numbers (0)")
    args = parser.parse_args(argv)
    for name in ("completions", "cases", "threads", "max_concurrent", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.warmup < 0:
        parser.error("--warmup must be 0 or more")
    if args.reference_pid is not None and not args.reference_url:
        parser.error("--reference-pid goes with --reference-url")
    for option, url in (("--reference-url", args.reference_url), ("--url", args.url)):
        if url is not None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                parser.error(f"{option} takes an http(s) URL such as http://127.0.0.1:8080, not {url!r}")
            try:
                parts.port  # noqa: B018 - a bad port raises here
            except ValueError as exc:
                parser.error(f"{option} {url!r}: {exc}")
    return args


def _fail(message: str) -> int:
    print(f"bench_reward_batch: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        verl_dir = find_verl(args.verl)
        sandbox_fusion = load_verl_sandbox_fusion(verl_dir)
    except (FileNotFoundError, ImportError, RuntimeError) as exc:
        return _fail(str(exc))
    with _no_proxy_for_loopback():
        return _run(args, verl_dir, sandbox_fusion)


@contextlib.contextmanager
def _no_proxy_for_loopback() -> Iterator[None]:
    """verl's ``requests.post`` honours proxy variables: none may take loopback traffic elsewhere."""
    saved = {name: os.environ.get(name) for name in ("NO_PROXY", "no_proxy")}
    for name, value in saved.items():
        os.environ[name] = ",".join(filter(None, (value, "127.0.0.1,localhost,::1")))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run(args: argparse.Namespace, verl_dir: Path, sandbox_fusion: ModuleType) -> int:
    reference_url = run_code_url(args.reference_url) if args.reference_url else None
    if reference_url is not None:
        problem = check_reference(reference_url)
        if problem is not None:
            return _fail(f"--reference-url: {problem}")
    tree = None
    if args.reference_pid is not None:
        import psutil

        try:
            tree = TreeMeter(args.reference_pid)
        except psutil.Error as exc:
            return _fail(f"--reference-pid {args.reference_pid}: {exc}")
    from mocksandbox.settings import load_settings

    settings = load_settings()
    batch = make_batch(args.completions, args.cases, args.seed)
    warmup = make_batch(args.warmup, args.cases, args.seed + 1) if args.warmup else []
    load_before = os.getloadavg()[0]
    with contextlib.ExitStack() as stack:
        if args.url:
            mock = Target("mock", run_code_url(args.url))
            if (problem := check_reference(mock.url)) is not None:
                return _fail(f"--url: {problem}")
            mock_words = f"{args.url} (started elsewhere: its parts are not metered)"
        else:
            try:
                url, meter = stack.enter_context(served_mock(settings.exec_mode, 1, None, args.isolation))
            except RuntimeError as exc:
                return _fail(f"the mock did not start: {exc}")
            mock = Target("mock", run_code_url(url), meter)
            mock_words = (
                f"mocksandbox serve (exec mode {settings.exec_mode}, isolation {args.isolation}, 1 process), "
                f"user python {settings.python}"
            )
        targets = [mock] + ([Target("reference", reference_url, tree=tree)] if reference_url else [])
        for target in targets:
            if warmup:
                with verl_client(sandbox_fusion, args.client):
                    score_batch(sandbox_fusion, target.url, warmup, args.threads, args.max_concurrent)
        for number in range(args.rounds):
            order = targets if number % 2 == 0 else targets[::-1]
            for target in order:
                target.rounds.append(
                    measure(sandbox_fusion, target, batch, args.threads, args.max_concurrent, args.client)
                )
    client_words = {
        "new-connection": "new-connection (verl's requests.post, unchanged: a connection per case)",
        "keep-alive": "keep-alive (a requests.Session per thread at a time in place of requests.post)",
    }[args.client]
    info = {
        "completions": args.completions,
        "cases": args.cases,
        "verl": f"{verl_version(verl_dir)} at {verl_dir}: sandbox_fusion.compute_score, unchanged",
        "load": f"{args.threads} scoring threads, one semaphore of {args.max_concurrent} for every call",
        "client": client_words,
        "mock": mock_words,
        "reference": reference_url,
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}",
        # Other work on the machine weighs on every figure, the machine's CPU most: this says how busy.
        "load_1min": f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after",
    }
    print_report(targets, info)
    unscored = sum(m.scored.errors + m.scored.failed for t in targets for m in t.rounds)
    return 1 if unscored else 0


if __name__ == "__main__":
    sys.exit(main())
