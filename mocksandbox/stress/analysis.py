"""Figures from stamps: overlap, percentiles, FIFO inversions, peak rate. Pure functions, no I/O."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

Interval = tuple[float, float]


def _events(intervals: Iterable[Interval]) -> list[tuple[float, int]]:
    # At equal times an end sorts before a start: a permit handed from one holder to the next at
    # the same instant is not two in flight.
    events = []
    for start, end in intervals:
        events.append((start, 1))
        events.append((max(start, end), -1))
    events.sort(key=lambda e: (e[0], e[1]))
    return events


def max_overlap(intervals: Iterable[Interval]) -> int:
    """The most intervals open at one instant."""
    current = peak = 0
    for _t, step in _events(intervals):
        current += step
        peak = max(peak, current)
    return peak


def overlap_steps(intervals: Iterable[Interval], origin: float = 0.0) -> list[tuple[float, int]]:
    """The count of open intervals after each change, as ``(time - origin, count)`` points."""
    current = 0
    points: list[tuple[float, int]] = []
    for t, step in _events(intervals):
        current += step
        if points and points[-1][0] == t - origin:
            points[-1] = (t - origin, current)
        else:
            points.append((t - origin, current))
    return points


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95, 99)) -> dict[str, float | None]:
    """Linear-interpolated percentiles plus ``max``; ``None`` throughout when there are no values."""
    data = sorted(values)
    out: dict[str, float | None] = {}
    for q in qs:
        key = f"p{q:g}"
        if not data:
            out[key] = None
            continue
        pos = (len(data) - 1) * q / 100
        lo, hi = math.floor(pos), math.ceil(pos)
        out[key] = data[lo] + (data[hi] - data[lo]) * (pos - lo)
    out["max"] = data[-1] if data else None
    return out


class _Fenwick:
    def __init__(self, size: int) -> None:
        self.tree = [0] * (size + 1)

    def add(self, i: int) -> None:
        i += 1
        while i < len(self.tree):
            self.tree[i] += 1
            i += i & -i

    def prefix(self, i: int) -> int:
        """How many added indices are < i."""
        total = 0
        while i > 0:
            total += self.tree[i]
            i -= i & -i
        return total


def fifo_inversions(pairs: Sequence[tuple[float, float]], tolerance: float = 0.0) -> int:
    """Pairs served out of order: ``a`` asked more than ``tolerance`` before ``b``, yet ``b`` got in first.

    ``pairs`` are ``(asked, granted)`` times. O(n log n).
    """
    if len(pairs) < 2:
        return 0
    by_ask = sorted(pairs)
    grants = sorted(g for _a, g in by_ask)
    rank = {g: i for i, g in enumerate(grants)}  # equal grant times share a rank: not inverted
    tree = _Fenwick(len(grants))
    inserted = 0
    count = 0
    asks = [a for a, _g in by_ask]
    for j, (ask_j, grant_j) in enumerate(by_ask):
        # Insert every earlier request that asked more than `tolerance` before this one.
        limit = bisect.bisect_left(asks, ask_j - tolerance, 0, j)
        while inserted < limit:
            tree.add(rank[by_ask[inserted][1]])
            inserted += 1
        # Of those, the ones granted strictly later than this one are inversions.
        count += inserted - tree.prefix(rank[grant_j] + 1)
    return count


def peak_rate(starts: Sequence[float], window: float = 1.0) -> tuple[int, float]:
    """The most starts in any ``window`` seconds, and that count per second."""
    times = sorted(starts)
    best = 0
    lo = 0
    for hi, t in enumerate(times):
        while times[lo] <= t - window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best, best / window


def total_length(intervals: Iterable[Interval]) -> float:
    return sum(max(0.0, end - start) for start, end in intervals)
