"""``mocksandbox stress``: the command line of the harness. Cheap to import: the harness, rich,
matplotlib and Ray are imported inside the handler."""

from __future__ import annotations

import argparse
import sys
from typing import Any

EPILOG = """\
exit status: 0 pass (or warnings only), 1 fail (cap exceeded, permit leaked, error swallowed, ...),
2 the run could not be made (bad options, factory, or target).

examples:
  mocksandbox stress --url http://127.0.0.1:8080 --limit 3 --mode threads --requests 60 --json out.json
  mocksandbox stress --url URL --limit 3 --mode threads --requests 60 \\
      --executor mocksandbox.ratelimit.faulty:seed_execution_worker --json out.json --plot out.png
"""


def _sleeps(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds separated by commas, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("sleeps must not be negative")
    return values


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "stress",
        help="stress-test a rate limiter (or executor) against a sandbox and judge it",
        description="Drive requests through a limiter or executor against a SandboxFusion-like "
        "server and report whether it held the cap, stayed fair and survived failures.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", required=True, help="base URL of the sandbox (the mock, or a real one)")
    parser.add_argument("--limit", required=True, type=int, metavar="N", help="the cap under test")
    parser.add_argument(
        "--mode", choices=["threads", "asyncio", "processes", "ray"], default="threads", help="workers"
    )
    parser.add_argument("--requests", type=int, default=60, metavar="M", help="calls to make (60)")
    parser.add_argument(
        "--workers", type=int, metavar="W", help="concurrent callers (default 4 × limit, at least limit+2)"
    )
    subject = parser.add_mutually_exclusive_group()
    subject.add_argument(
        "--limiter", metavar="pkg.mod:factory", help="factory(limit) -> limiter (default: the reference)"
    )
    subject.add_argument("--executor", metavar="pkg.mod:factory", help="factory(limit) -> executor")
    parser.add_argument(
        "--workload",
        choices=["short", "sleep", "fail", "gateway", "ping"],
        default="sleep",
        help="short programs, programs that sleep --sleep seconds (default), programs that fail, "
        "programs behind a gateway that answers 504 first (the client retries), or GET /v1/ping",
    )
    parser.add_argument("--sleep", type=float, default=0.1, metavar="S", help="sleep workload (0.1 s)")
    parser.add_argument(
        "--failure-rate", type=float, default=0.05, metavar="P", help="share of failing programs (0.05)"
    )
    parser.add_argument("--json", required=True, metavar="FILE", help="write the report here")
    parser.add_argument("--plot", metavar="FILE", help="write a PNG timeline of in-flight vs the limit")
    parser.add_argument("--rate", type=float, metavar="R", help="requests/s the service allows (pacing)")
    parser.add_argument(
        "--kill-holders", type=int, default=0, metavar="K", help="kill K permit holders (processes, ray)"
    )
    parser.add_argument(
        "--gateway-rate", type=float, default=0.3, metavar="P", help="gateway workload: share of 504s"
    )
    parser.add_argument(
        "--retry-sleeps",
        type=_sleeps,
        default=(1.0, 2.0),
        metavar="S,S",
        help="client back-off on 504 (verl: 1,2)",
    )
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S", help="per-request timeout")
    parser.add_argument("--seed", type=int, default=0, help="which requests fail or meet a 504")
    parser.add_argument("--probe-seconds", type=float, metavar="S", help="capacity probe hold time")
    parser.add_argument(
        "--no-conflict-check", action="store_true", help="skip the second-pool (limit+1) check"
    )
    parser.add_argument("--strict", action="store_true", help="fail on warnings too")
    parser.add_argument("--ray-address", metavar="ADDR", help="Ray cluster to join (default: start one)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    parser.set_defaults(handler=_stress)


def _stress(args: argparse.Namespace) -> int:
    from mocksandbox.extras import require

    # Checked before the run, not after it: rich draws the progress bar and the table, matplotlib
    # the plot (the `stress` extra), Ray drives --mode ray (the `ray` extra).
    if not args.quiet:
        require("'mocksandbox stress' (without --quiet)", "rich")
    if args.plot:
        require("'mocksandbox stress --plot'", "matplotlib")
    if args.mode == "ray":
        require("'mocksandbox stress --mode ray'", "ray")
    from mocksandbox.stress.harness import ConfigError, StressConfig, run_stress
    from mocksandbox.stress.report import render_summary, write_json
    from mocksandbox.stress.target import TargetError

    config = StressConfig(
        url=args.url,
        limit=args.limit,
        mode=args.mode,
        requests=args.requests,
        workers=args.workers,
        limiter=args.limiter,
        executor=args.executor,
        workload=args.workload,
        sleep_seconds=args.sleep,
        failure_rate=args.failure_rate,
        rate=args.rate,
        kill_holders=args.kill_holders,
        gateway_rate=args.gateway_rate,
        retry_sleeps=args.retry_sleeps,
        timeout=args.timeout,
        seed=args.seed,
        probe_seconds=args.probe_seconds,
        conflict_check=not args.no_conflict_check,
        strict=args.strict,
        ray_address=args.ray_address,
    )
    try:
        report = run_stress(config) if args.quiet else _with_progress(config, run_stress)
    except (ConfigError, TargetError) as exc:
        print(f"mocksandbox stress: {exc}", file=sys.stderr)
        return 2
    write_json(report, args.json)
    if args.plot:
        from mocksandbox.stress.plot import plot_timeline

        plot_timeline(report, args.plot)
    if not args.quiet:
        render_summary(report)
    return 0 if report["verdict"]["passed"] else 1


def _with_progress(config: Any, run: Any) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mocksandbox.stress.harness import Phase

    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        current: dict[str, Any] = {}

        def start(name: str, total: int) -> None:
            current["task"] = progress.add_task(name, total=total)

        def advance() -> None:
            progress.advance(current["task"])

        return run(config, Phase(start, advance))
