"""A PNG timeline of requests in flight against the limit (matplotlib, Agg; no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _steps(points: list[Any]) -> tuple[list[float], list[int]]:
    xs = [0.0] + [float(t) for t, _n in points]
    ys = [0] + [int(n) for _t, n in points]
    return xs, ys


def plot_timeline(report: dict[str, Any], path: str | Path) -> None:
    """Draw client, program and server in-flight counts over the run, with the limit."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    timeline = report["timeline"]
    limit = report["limit"]
    figure = Figure(figsize=(10, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    series = [
        ("server", "server: requests in flight (mock)", "tab:blue", 2.0),
        ("programs", "programs running (their own stamps)", "tab:green", 1.2),
        ("client", "client: calls holding a permit", "tab:orange", 1.2),
    ]
    top = limit
    for key, label, colour, width in series:
        points = timeline.get(key) or []
        if not points:
            continue
        xs, ys = _steps(points)
        axes.step(xs, ys, where="post", label=label, color=colour, linewidth=width)
        top = max(top, max(ys))
    axes.axhline(limit, color="tab:red", linestyle="--", linewidth=1.5, label=f"limit ({limit})")
    axes.set_ylim(0, top + 1)
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("seconds since the run started")
    axes.set_ylabel("in flight")
    verdict = report["verdict"]["status"].upper()
    axes.set_title(
        f"{report['subject']['label']} — {report['mode']}, limit {limit}: max in flight "
        f"{report['max_in_flight']} — {verdict}",
        fontsize=10,
    )
    axes.legend(loc="best", fontsize=8, framealpha=0.8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(str(path))
