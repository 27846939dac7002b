"""The run record's curves: training loss, validation perplexity and learning rate by step.

A run keeps every step's loss, but a record is one line of a log that is read back whole, so
the record keeps at most ``MAX_POINTS`` evenly spaced points of each curve (the first and the
last always among them): enough to draw it, and the same size for a 100-step run and a
100,000-step one. Records written before curves existed have none; readers get empty lists.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

MAX_POINTS = 500
CURVES = ("loss", "val_ppl", "lr")  # the curves of a record, each a list of [step, value]
_BARS = "▁▂▃▄▅▆▇█"

Point = tuple[int, float]


def evenly_spaced(count: int, limit: int = MAX_POINTS) -> list[int]:
    """Indices of at most `limit` evenly spaced items out of `count`, in order, the first and
    the last included (all of them when `count` <= `limit`)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if count <= limit:
        return list(range(count))
    if limit == 1:
        return [count - 1]
    return [round(i * (count - 1) / (limit - 1)) for i in range(limit)]


def sample(points: Sequence[Any], limit: int = MAX_POINTS) -> list[Any]:
    """`points` thinned to at most `limit` evenly spaced ones (see `evenly_spaced`)."""
    return [points[i] for i in evenly_spaced(len(points), limit)]


def curve(record: dict[str, Any], name: str) -> list[Point]:
    """The record's curve `name` as (step, value) pairs; [] when the record has none (older
    records) and without points whose value is missing or not finite."""
    curves = record.get("curves")
    raw = curves.get(name) if isinstance(curves, dict) else None
    out: list[Point] = []
    for point in raw if isinstance(raw, list) else []:
        if (isinstance(point, list | tuple) and len(point) == 2
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in point)
                and math.isfinite(point[1])):
            out.append((int(point[0]), float(point[1])))
    return out


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """`values` as at most `width` block characters (each the mean of its share of the
    values), lowest ▁ to highest █: a curve's shape in a terminal, with no dependency."""
    if not values:
        return ""
    n = min(width, len(values))
    means = [sum(chunk) / len(chunk) for chunk in
             (values[i * len(values) // n:(i + 1) * len(values) // n] for i in range(n))]
    lo, hi = min(means), max(means)
    scale = (len(_BARS) - 1) / (hi - lo) if hi > lo else 0.0
    return "".join(_BARS[round((v - lo) * scale)] for v in means)
