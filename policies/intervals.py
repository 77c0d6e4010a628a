"""Sets of time intervals ``(start, end)``: unions, differences and lengths (the
metrics and the per-step breakdown of a run)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

Interval = tuple[float, float]


def merged(intervals: Iterable[Interval]) -> list[Interval]:
    """Disjoint, sorted union of ``intervals``."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        elif end > start:
            out.append((start, end))
    return out


def minus(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """``a`` without ``b`` (both disjoint and sorted)."""
    out: list[Interval] = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k, cur = j, start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


class Measure:
    """Length of a disjoint sorted interval set inside any window, by prefix sums."""

    def __init__(self, intervals: list[Interval]) -> None:
        self._starts = [s for s, _ in intervals]
        self._intervals = intervals
        self._prefix = [0.0]
        for s, e in intervals:
            self._prefix.append(self._prefix[-1] + e - s)

    def _upto(self, t: float) -> float:
        i = bisect.bisect_right(self._starts, t)
        if i == 0:
            return 0.0
        s, e = self._intervals[i - 1]
        return self._prefix[i - 1] + min(e, t) - s

    def within(self, start: float, end: float) -> float:
        return self._upto(end) - self._upto(start)


def length(intervals: Iterable[Interval]) -> float:
    return sum(hi - lo for lo, hi in intervals)


def intersect_length(a: list[Interval], b: list[Interval]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def complement(busy: list[Interval], start: float, end: float) -> list[Interval]:
    out, cursor = [], start
    for lo, hi in busy:
        if lo > cursor:
            out.append((cursor, min(lo, end)))
        cursor = max(cursor, hi)
    if cursor < end:
        out.append((cursor, end))
    return [iv for iv in out if iv[1] > iv[0]]
