"""The next token on the CPU: with top-k, only the kept logits are exponentiated and summed.

Why a kernel of its own: the reference keeps every row (B, V) whole, so a draw with top-k 50
still takes an exp, a cumulative sum and a comparison over the whole vocabulary in float64.
Here a row's work over V is its conversion, the partition that finds the k-th largest and
one comparison; the rest runs over the k kept entries (and their ties), in vocabulary order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .reference import SamplingReference


class CpuSampling(SamplingReference):

    def sample_rows(self, logits: Any, u: Any, temperature: float, top_k: int,
                    top_p: float) -> Any:
        """The reference's rules; without a top-k cut (0 or >= V), the reference itself."""
        b, v = logits.shape
        if not 0 < top_k < v:
            return super().sample_rows(logits, u, temperature, top_k, top_p)
        ids = np.empty(b, dtype=np.int64)
        for r in range(b):
            z = logits[r].astype(np.float64) / temperature  # (V,)
            kept = np.flatnonzero(z >= np.partition(z, v - top_k)[v - top_k])  # (>= k,)
            w = z[kept]
            w = np.exp(w - w.max(), out=w)  # the kept tokens' unnormalised probabilities
            if top_p < 1.0:
                ordered = np.sort(w)[::-1]  # most likely first; ties with the k-th last
                before = np.cumsum(ordered)[:-1] / w.sum()  # mass before the next token
                w[w < ordered[np.count_nonzero(before < top_p)]] = 0.0
            cdf = np.cumsum(w)
            at = np.count_nonzero(cdf <= u[r] * cdf[-1])  # searchsorted, side="right"
            ids[r] = kept[min(at, kept.size - 1)]
        return ids
