"""The sampler's numba kernels (CPU_JIT): the nucleus edge and the inverse-CDF draw, each
one compiled pass. They take no liberty (`exact`): their sums run in NumPy's order, so a
seed draws the tokens the NumPy formulation draws."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..jit_compile import exact


@exact
def nucleus_edge(w: Any, log_w: Any, total: float, top_p: float, n_bins: int, span: float,
                 sorted_max: int) -> float:
    """sampling/cpu.py's nucleus_edge in one compiled pass (its histogram, then a sort of the
    one bin where the mass reaches top_p); `total` is w.sum() as NumPy adds it."""
    target = top_p * total
    if w.size <= sorted_max:
        return _edge_of(np.sort(w)[::-1], 0.0, target)
    scale = min(span, -log_w.min())
    scale = n_bins / (scale if scale != 0.0 else 1.0)
    bins = np.empty(w.size, np.int64)
    mass = np.zeros(n_bins)
    for i in range(w.size):
        bins[i] = np.int64(min(-log_w[i] * scale, float(n_bins - 1)))
        mass[bins[i]] += w[i]
    for i in range(1, n_bins):
        mass[i] += mass[i - 1]
    at = min(np.searchsorted(mass, target), np.searchsorted(mass, mass[-1]))
    above = mass[at - 1] if at else 0.0
    return _edge_of(np.sort(w[bins == at])[::-1], above, target)


@exact
def _edge_of(ordered: Any, above: float, target: float) -> float:
    reached, run = 0, 0.0
    for i in range(ordered.size - 1):
        run += ordered[i]
        reached += above + run < target
    return ordered[reached]


@exact
def inverse_cdf(w: Any, edge: float, u: float) -> int:
    """The index drawn at uniform u from weights w (V,) with those below `edge` zeroed: the
    count of cumulative sums at or below u times the total (side="right"), at most V - 1."""
    cdf = np.empty(w.size)
    run = 0.0
    for i in range(w.size):
        run += 0.0 if w[i] < edge else w[i]
        cdf[i] = run
    below = u * run
    at = 0
    for i in range(w.size):
        at += cdf[i] <= below
    return min(at, w.size - 1)


def warm_up() -> None:
    """Compile these kernels for the array types training and generation pass."""
    weights = np.ones(2)
    inverse_cdf(weights, nucleus_edge(weights, weights, 2.0, 0.5, 4, 1.0, 1), 0.5)
