"""The next token on the CPU: nothing is sorted but a few of the most likely tokens.

Why a kernel of its own: the reference keeps every row (B, V) whole, and its top-p sorts the
whole vocabulary in float64 each token (about 2 ms of a small model's 4 ms token on 2 cores).
Here top-k keeps its partition's entries only (exponentiated, summed and drawn from in
vocabulary order), and top-p finds its threshold from a histogram of the probability mass
over log-probability bins: only the tokens of the bin where the mass reaches p are sorted.
With numba (CPU_JIT), the histogram and the draw are a compiled loop each (sampling/jit.py's
nucleus_edge, inverse_cdf) instead of a dozen NumPy passes with their temporaries; they add
in NumPy's order, so a seed draws the same tokens either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .reference import SamplingReference

SORTED_MAX = 2048  # top-p sorts a row of at most this many kept tokens outright
BINS = 4096  # log-probability bins of top-p's histogram
SPAN = 40.0  # the bins cover log-probabilities down to -SPAN below the largest; the rest share
# the last bin (e^-40 of the top token: mass that top-p reaches only with p within 1e-17 of 1)


def nucleus_edge(w: np.ndarray, log_w: np.ndarray, top_p: float) -> float:
    """Top-p's threshold for the unnormalised probabilities w (log_w = log w, the largest 0):
    the first weight of a descending sort at which the mass reaches top_p. Tokens at or above
    it (ties included) are kept, as reference.py keeps them."""
    if w.size <= SORTED_MAX:
        return _edge_of(np.sort(w)[::-1], 0.0, top_p * w.sum())
    total = w.sum()
    scale = BINS / (min(SPAN, -float(log_w.min())) or 1.0)  # 1.0: every token equally likely
    # bin 0 holds the most likely tokens; a larger weight is never in a later bin
    bins = np.minimum(-log_w * scale, BINS - 1).astype(np.int64)
    mass = np.cumsum(np.bincount(bins, weights=w, minlength=BINS))  # mass of bins 0..i
    # the bin where the mass reaches top_p; when rounding leaves it short, the last holding any
    at = min(int(np.searchsorted(mass, top_p * total)), int(np.searchsorted(mass, mass[-1])))
    above = mass[at - 1] if at else 0.0
    return _edge_of(np.sort(w[bins == at])[::-1], above, top_p * total)


def _edge_of(ordered: np.ndarray, above: float, target: float) -> float:
    """The first of the descending weights `ordered` at which `above` plus their running sum
    reaches target (the last one when rounding leaves the sum short)."""
    reached = np.count_nonzero(above + np.cumsum(ordered)[:-1] < target)
    return float(ordered[reached])


class CpuSampling(SamplingReference):
    uses = ("jit",)

    def sample_rows(self, logits: Any, u: Any, temperature: float, top_k: int,
                    top_p: float) -> Any:
        """The reference's rules, row by row."""
        b, v = logits.shape
        ids = np.empty(b, dtype=np.int64)
        for r in range(b):
            z = logits[r].astype(np.float64) / temperature  # (V,)
            kept = None  # the ids of the entries top-k keeps (and their ties); None: all
            if 0 < top_k < v:
                kept = np.flatnonzero(z >= np.partition(z, v - top_k)[v - top_k])  # (>= k,)
                z = z[kept]
            log_w = z - z.max()
            w = np.exp(log_w)  # the kept tokens' unnormalised probabilities
            if self.jit is not None:  # the same rules, compiled: see sampling/jit.py
                edge = -np.inf if top_p >= 1.0 else self.jit.sampling.nucleus_edge(
                    w, log_w, w.sum(), top_p, BINS, SPAN, SORTED_MAX)
                at = self.jit.sampling.inverse_cdf(w, edge, u[r])
            else:
                if top_p < 1.0:
                    w[w < nucleus_edge(w, log_w, top_p)] = 0.0
                cdf = np.cumsum(w)
                at = min(np.count_nonzero(cdf <= u[r] * cdf[-1]), w.size - 1)  # side="right"
            ids[r] = at if kept is None else kept[at]
        return ids
