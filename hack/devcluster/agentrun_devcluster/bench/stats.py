"""Summaries of measurements: percentiles, and figures formatted for the report."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Summary", "fmt", "medians_by_size", "percentile", "ratio", "summarize"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 to 100) of ``values``, interpolating linearly between the
    two nearest ranks (numpy's default method). Raises ValueError when ``values`` is empty."""
    if not values:
        raise ValueError("no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is not between 0 and 100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = math.ceil(position)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Summary:
    count: int
    p50: float
    p99: float
    max: float

    def __str__(self) -> str:
        return f"p50 {self.p50:.3f} s, p99 {self.p99:.3f} s, max {self.max:.3f} s (n={self.count})"


def summarize(values: Sequence[float]) -> Summary | None:
    """p50, p99 and max of ``values``; None when there are none."""
    if not values:
        return None
    return Summary(len(values), percentile(values, 50), percentile(values, 99), max(values))


def medians_by_size(pairs: Iterable[tuple[int, float]]) -> dict[int, float]:
    """The median of the values measured at each size, by size (ascending): a size run
    several times (e.g. ``--turns 20,20,20,1000``) counts once, by its middle value, so a
    ratio to it does not hang on one short, noisy run."""
    values: dict[int, list[float]] = {}
    for size, value in pairs:
        values.setdefault(size, []).append(value)
    return {size: percentile(values[size], 50) for size in sorted(values)}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    """A figure for the report: ``-`` when it was not measured."""
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return f"{text} {unit}" if unit else text
