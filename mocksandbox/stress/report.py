"""The report: figures from the outcomes, a verdict with reasons, JSON and a summary table.

Top-level keys of the JSON (all times in seconds):

``max_in_flight``             the most requests in flight at once as the *server* saw it (from
                              ``/_mock/`` when the target is the mock, else from the programs'
                              own start/end stamps); ``max_in_flight_source`` says which
``in_flight``                 ``server``, ``programs`` and ``client`` (calls holding a permit) maxima
``http``                      status counts (client side, every attempt), 429s, 5xx, no answer; the
                              mock's own counts under ``server``
``throughput_rps``, ``duration_s``, ``latency_s`` (per attempt), ``wait_s`` (ask → permit)
``longest_wait``              the starvation figure: the longest wait and which request had it
``fifo_inversions``           requests served before one that asked more than ``fifo_tolerance_s``
                              earlier
``permits``                   ``in_flight_after`` (what the subject reports after the run),
                              ``effective_after`` (capacity probe), ``leaked``, ``extra``
``errors``                    planned failures and what reached the caller: ``typed``,
                              ``swallowed`` (a value came back), ``wrong_type``; ``foreign``
                              (raised by the limiter/executor itself); ``reached_caller_typed``
``rate``                      ``peak_rps`` (most starts in one second) against ``--rate``
``permit_time``               seconds permits were held, on the wire, and ``idle_fraction``
``limit_conflict``            a second pool asking for ``limit + 1``: ``refused``, ``honoured``,
                              ``first-limit-wins`` or ``inconclusive``
``verdict``                   ``status`` (pass / warn / fail), ``reasons`` (fail), ``warnings``
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mocksandbox.stress import analysis
from mocksandbox.stress.runner import Outcome

if TYPE_CHECKING:
    from mocksandbox.stress.harness import StressConfig
    from mocksandbox.stress.target import ServerView

MAX_TIMELINE_POINTS = 20_000


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _rounded(stats: dict[str, float | None]) -> dict[str, float | None]:
    return {k: _round(v) for k, v in stats.items()}


def _short(type_name: str | None) -> str:
    return (type_name or "?").rpartition(".")[2]


def build_report(
    *,
    config: StressConfig,
    label: str,
    kind: str,
    is_mock: bool,
    outcomes: list[Outcome],
    failing: set[int],
    gateway: set[int],
    started: float,
    ended: float,
    server: ServerView | None,
    conflict: dict[str, Any],
    probe: dict[str, Any],
    in_flight_after: int | None,
    killed: int,
    workers: int,
    run_id: str,
) -> dict[str, Any]:
    from mocksandbox.stress.harness import config_dict

    calls = sorted((o for o in outcomes if o.kind == "call"), key=lambda o: o.index)
    limit = config.limit
    duration = max(1e-9, ended - started)

    holds = [h for o in calls for h in o.holds]
    programs = [o.program for o in calls if o.program is not None]
    attempts = [a for o in calls for a in o.attempts]
    client_max = analysis.max_overlap(holds)
    programs_max = analysis.max_overlap(programs) if programs else None
    server_max = server.max_in_flight if server is not None else None
    if server_max is not None:
        max_in_flight: int | None = server_max
        source = "mock /_mock/timeline"
    elif programs_max is not None:
        max_in_flight, source = programs_max, "program stamps"
    else:
        max_in_flight, source = None, "unavailable"

    statuses = Counter("none" if a.status is None else str(a.status) for a in attempts)
    status_429 = statuses.get("429", 0)
    status_5xx = sum(n for s, n in statuses.items() if s.isdigit() and 500 <= int(s) < 600)

    waits = [o.granted - o.requested for o in calls if o.granted is not None]
    longest = max(((o.granted - o.requested, o.index) for o in calls if o.granted is not None), default=None)
    inversions = analysis.fifo_inversions(
        [(o.requested, o.granted) for o in calls if o.granted is not None], config.fifo_tolerance
    )
    peak_count, peak_rps = analysis.peak_rate([a.start for a in attempts], 1.0)
    held = analysis.total_length(holds)
    wire = sum(max(0.0, a.end - a.start) for a in attempts)
    idle_fraction = max(0.0, 1.0 - wire / held) if held > 0 else None

    # -- errors ---------------------------------------------------------------------------------
    planned = [o for o in calls if o.planned_failure]
    typed = [o for o in planned if o.planned_failure_typed]
    swallowed = [o for o in calls if o.result == "returned"]
    # A planned failure that raised something else lost its type, unless that something else is a
    # failure of the limiter/executor itself that unplanned calls met as well (an acquire that failed
    # before the program ran).
    unplanned_types = {o.error_type for o in calls if o.result == "raised" and not o.planned_failure}
    wrong_type = [
        o
        for o in planned
        if o.result == "raised"
        and not o.planned_failure_typed
        and (o.attempts or o.error_type not in unplanned_types)
    ]
    foreign = [o for o in calls if o.result == "raised" and o.origin == "foreign" and o not in wrong_type]
    sandbox_errors = [
        o for o in calls if o.result == "raised" and o.origin == "sandbox" and not o.planned_failure
    ]
    release_errors = [o for o in outcomes if o.release_error]
    completed_ok = [o for o in calls if o.result == "ok"]

    effective = probe.get("effective")
    probe_clean = not probe.get("errors")
    leaked = max(0, limit - effective) if effective is not None and probe_clean else 0
    extra = max(0, effective - limit) if effective is not None else 0

    report: dict[str, Any] = {
        "run_id": run_id,
        "subject": {"label": label, "kind": kind},
        "target": {"url": config.url, "is_mock": is_mock},
        "config": config_dict(config),
        "limit": limit,
        "max_in_flight": max_in_flight,
        "max_in_flight_source": source,
        "in_flight": {"server": server_max, "programs": programs_max, "client": client_max},
        "requests": {
            "planned": config.requests,
            "completed": len(calls),
            "ok": len(completed_ok),
            "raised": sum(1 for o in calls if o.result == "raised"),
            "returned_other": len(swallowed),
            "attempts": len(attempts),
            "reached_server": server.requests if server is not None else len(attempts),
        },
        "http": {
            "by_status": dict(sorted(statuses.items())),
            "status_429": status_429,
            "status_5xx": status_5xx,
            "no_answer": statuses.get("none", 0),
            "server": None
            if server is None
            else {
                "by_status": server.by_status,
                "rejected_by_cap": server.rejected_by_cap,
                "cap": server.cap,
                "in_flight_after": server.in_flight_now,
                "timeline_exact": server.exact,
            },
        },
        "duration_s": _round(duration),
        "throughput_rps": _round(len(completed_ok) / duration, 2),
        "attempts_rps": _round(len(attempts) / duration, 2),
        "latency_s": _rounded(analysis.percentiles([a.end - a.start for a in attempts])),
        "wait_s": _rounded(analysis.percentiles(waits)),
        "longest_wait": None if longest is None else {"seconds": _round(longest[0]), "request": longest[1]},
        "fifo_inversions": inversions,
        "fifo_tolerance_s": config.fifo_tolerance,
        "permits": {
            "in_flight_after": in_flight_after,
            "effective_after": effective,
            "leaked": leaked,
            "extra": extra,
            "holders_killed": killed,
            "probe": probe,
        },
        "errors": {
            "planned_failures": len(planned),
            "typed": len(typed),
            "swallowed": len(swallowed),
            "wrong_type": len(wrong_type),
            "wrong_types": dict(Counter(_short(o.error_type) for o in wrong_type)),
            "reached_caller_typed": (not swallowed and not wrong_type) if planned or swallowed else None,
            "sandbox": dict(Counter(_short(o.error_type) for o in sandbox_errors)),
            "foreign": dict(Counter(_short(o.error_type) for o in foreign)),
            "foreign_examples": [o.error_message for o in foreign[:3]],
            "release_errors": len(release_errors),
            "release_error_examples": [o.release_error for o in release_errors[:3]],
        },
        "rate": {
            "limit_rps": config.rate,
            "peak_rps": _round(peak_rps, 2),
            "peak_starts_in_1s": peak_count,
        },
        "permit_time": {
            "held_s": _round(held),
            "on_wire_s": _round(wire),
            "idle_fraction": _round(idle_fraction, 3),
        },
        "limit_conflict": conflict,
        "gateway_504_planned": len(gateway),
        "workers": workers,
        "mode": config.mode,
        "timeline": _timelines(calls, started, server),
    }
    report["verdict"] = judge(report, config)
    return report


def _timelines(calls: list[Outcome], origin: float, server: ServerView | None) -> dict[str, Any]:
    client = analysis.overlap_steps([h for o in calls for h in o.holds], origin)
    programs = analysis.overlap_steps([o.program for o in calls if o.program is not None], origin)
    server_points: list[tuple[float, int]] = []
    if server is not None and server.points:
        # The mock's clock has its own origin: line its first point up with the first request sent.
        first_sent = min((a.start for o in calls for a in o.attempts), default=origin)
        shift = (first_sent - origin) - server.points[0][0]
        server_points = [(t + shift, n) for t, n in server.points]
    return {
        "client": [(round(t, 4), n) for t, n in client[:MAX_TIMELINE_POINTS]],
        "programs": [(round(t, 4), n) for t, n in programs[:MAX_TIMELINE_POINTS]],
        "server": [(round(t, 4), n) for t, n in server_points[:MAX_TIMELINE_POINTS]],
    }


def judge(report: dict[str, Any], config: StressConfig) -> dict[str, Any]:
    """The verdict: ``reasons`` make it fail (non-zero exit); ``warnings`` are worth a look."""
    limit = report["limit"]
    reasons: list[str] = []
    warnings: list[str] = []
    inf = report["in_flight"]
    if inf["server"] is not None and inf["server"] > limit:
        reasons.append(
            f"cap exceeded: the server saw {inf['server']} requests in flight at once (limit {limit})"
        )
    elif inf["programs"] is not None and inf["programs"] > limit:
        reasons.append(f"cap exceeded: {inf['programs']} programs ran at once (limit {limit})")
    if inf["client"] > limit:
        reasons.append(f"cap exceeded: {inf['client']} calls held a permit at once (limit {limit})")

    permits = report["permits"]
    probe = permits["probe"]
    after = permits["in_flight_after"]
    if permits["extra"]:
        reasons.append(
            f"permits grew: after the run {permits['effective_after']} calls held a permit at once "
            f"(limit {limit}); releases without acquires add permits"
        )
    if permits["leaked"]:
        killed = permits["holders_killed"]
        cause = f" ({killed} holder(s) were killed holding one)" if killed else ""
        reasons.append(
            f"permits leaked: after the run only {permits['effective_after']} of {limit} permits could "
            f"be held at once ({permits['leaked']} lost){cause}"
        )
    elif probe.get("errors"):
        warnings.append(f"capacity probe inconclusive: probe calls failed ({probe['errors']})")
    if after is not None and after > 0:
        reasons.append(f"permits leaked: the subject reports {after} permit(s) still held after the run")
    elif after is not None and after < 0:
        reasons.append(
            f"permits created: the subject's in-flight count went to {after} (releases without acquires)"
        )

    errors = report["errors"]
    if errors["swallowed"]:
        reasons.append(
            f"errors swallowed: {errors['swallowed']} call(s) came back as a value instead of raising "
            f"({errors['planned_failures']} planned failure(s)); the caller cannot tell what failed"
        )
    if errors["wrong_type"]:
        reasons.append(
            f"errors lost their type: {errors['wrong_type']} planned failure(s) reached the caller as "
            f"{errors['wrong_types']}, not ProgramFailed"
        )
    if not errors["planned_failures"]:
        warnings.append("error propagation not checked: no planned failures (use --failure-rate)")
    if errors["foreign"]:
        total = sum(errors["foreign"].values())
        kinds = ", ".join(f"{name} ×{n}" for name, n in errors["foreign"].items())
        reached = report["requests"]["reached_server"]
        tail = "; no request reached the server" if not reached else ""
        reasons.append(
            f"the limiter/executor itself failed {total} of {report['requests']['completed']} "
            f"call(s) ({kinds}){tail}"
        )
    if errors["release_errors"]:
        reasons.append(
            f"release failed {errors['release_errors']} time(s): {errors['release_error_examples'][0]}"
        )

    rate = report["rate"]
    # A paced limiter lets at most rate + 1 starts into any one-second window; allow 20 % and two
    # more for the stamps' own jitter.
    if config.rate is not None and rate["peak_starts_in_1s"] > config.rate * 1.2 + 2:
        reasons.append(
            f"rate exceeded: {rate['peak_starts_in_1s']} requests started within one second "
            f"(--rate {config.rate:g}/s); a service that limits the rate answers 429"
        )

    conflict = report["limit_conflict"]
    if conflict.get("outcome") == "first-limit-wins":
        reasons.append(
            f"first limit wins: a second pool asking for limit {conflict['asked']} was silently given "
            f"the first one's {conflict['effective']}"
        )
    elif conflict.get("outcome") == "inconclusive":
        warnings.append(f"limit conflict check inconclusive: {conflict.get('probe')}")

    idle = report["permit_time"]["idle_fraction"]
    if idle is not None and idle > config.idle_warning:
        warnings.append(
            f"permits idle: {idle:.0%} of the time permits were held, no request was on the wire "
            "(held through retry back-off sleeps?); the cap throttles more than it should"
        )
    http = report["http"]
    if http["status_429"]:
        warnings.append(f"the server answered 429 to {http['status_429']} request(s)")
    planned_504 = report["gateway_504_planned"]
    unplanned_5xx = http["status_5xx"] - planned_504
    if unplanned_5xx > 0:
        warnings.append(f"the server answered 5xx to {unplanned_5xx} request(s) beyond the planned 504s")
    if report["fifo_inversions"]:
        warnings.append(
            f"{report['fifo_inversions']} FIFO inversion(s): requests got a permit before others that "
            f"asked more than {config.fifo_tolerance * 1000:g} ms earlier"
        )
    if report["max_in_flight"] is None:
        warnings.append("the server's in-flight count is unavailable (not the mock, no program stamps)")

    status = "fail" if reasons or (config.strict and warnings) else ("warn" if warnings else "pass")
    return {"status": status, "passed": status != "fail", "reasons": reasons, "warnings": warnings}


def write_json(report: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=2, default=str) + "\n")


def summary_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The figures of the summary table, as (name, value) text."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.1f} ms"

    inf = report["in_flight"]
    lat, wait = report["latency_s"], report["wait_s"]
    errors, permits = report["errors"], report["permits"]
    conflict = report["limit_conflict"]
    http = report["http"]
    longest = report["longest_wait"]
    rows = [
        ("subject", f"{report['subject']['label']} ({report['subject']['kind']}, {report['mode']})"),
        ("limit / workers", f"{report['limit']} / {report['workers']}"),
        ("max in flight", f"{report['max_in_flight']} ({report['max_in_flight_source']})"),
        ("  server / programs / client", f"{inf['server']} / {inf['programs']} / {inf['client']}"),
        (
            "requests ok / raised / returned",
            f"{report['requests']['ok']} / {report['requests']['raised']} / "
            f"{report['requests']['returned_other']}",
        ),
        ("HTTP 429 / 5xx / no answer", f"{http['status_429']} / {http['status_5xx']} / {http['no_answer']}"),
        ("throughput", f"{report['throughput_rps']} calls/s in {report['duration_s']:.2f} s"),
        ("latency p50 / p95 / p99", f"{ms(lat['p50'])} / {ms(lat['p95'])} / {ms(lat['p99'])}"),
        ("wait p50 / p95 / p99", f"{ms(wait['p50'])} / {ms(wait['p95'])} / {ms(wait['p99'])}"),
        (
            "longest wait (starvation)",
            "-" if longest is None else f"{ms(longest['seconds'])} (request {longest['request']})",
        ),
        ("FIFO inversions", str(report["fifo_inversions"])),
        (
            "permits after run",
            f"in flight {permits['in_flight_after']}, capacity {permits['effective_after']}, "
            f"leaked {permits['leaked']}, extra {permits['extra']}",
        ),
        (
            "errors to caller",
            f"{errors['typed']}/{errors['planned_failures']} typed, {errors['swallowed']} swallowed, "
            f"{errors['wrong_type']} wrong type, foreign {errors['foreign'] or 0}",
        ),
        (
            "peak rate",
            f"{report['rate']['peak_starts_in_1s']} starts in 1 s"
            + (f" (--rate {report['rate']['limit_rps']:g}/s)" if report["rate"]["limit_rps"] else ""),
        ),
        ("permit idle fraction", str(report["permit_time"]["idle_fraction"])),
        ("limit conflict check", str(conflict.get("outcome", "not checked"))),
    ]
    return rows


def render_summary(report: dict[str, Any], console: Any = None) -> None:
    """Print the summary table and the verdict with ``rich``."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"mocksandbox stress — {report['target']['url']}", show_header=False)
    table.add_column("figure", style="bold")
    table.add_column("value")
    for name, value in summary_rows(report):
        table.add_row(name, value)
    console.print(table)
    verdict = report["verdict"]
    colour = {"pass": "green", "warn": "yellow", "fail": "red"}[verdict["status"]]
    console.print(f"[bold {colour}]verdict: {verdict['status'].upper()}[/]")
    for reason in verdict["reasons"]:
        console.print(f"  [red]✗[/] {reason}", highlight=False)
    for warning in verdict["warnings"]:
        console.print(f"  [yellow]![/] {warning}", highlight=False)
