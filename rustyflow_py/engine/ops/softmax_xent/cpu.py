"""CPU softmax cross-entropy over the vocabulary, alone and fused with the tied LM head.

The (B*T, V) logits are the largest array of a step, so every pass over them counts: rows are
processed in cache-sized blocks that go through exp, row sum, NLL and gradient while in
cache, and the LM head never forms d(logits) at all (see lm_head_xent).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..cpu_pool import Blocks
from .reference import CrossEntropyReference

_XENT_BLOCK = 256 * 1024  # a row block of the vocabulary-wide softmax, in elements
_SAFE_SUM = 2.0**-60  # least row sum of unshifted exponentials that keeps full precision


def _redo_shifted(
    source: tuple[np.ndarray, np.ndarray], e: np.ndarray, targets: np.ndarray,
    nll: np.ndarray, sums: np.ndarray,
) -> None:
    """Redo the rows of an unshifted softmax (see _softmax_rows) whose sum left the safe
    range, with the usual max shift, from their logits h[rows] @ w.T (a small GEMM, rarely
    needed: not timed as a matmul)."""
    rows = np.flatnonzero(~((sums >= _SAFE_SUM) & (sums < np.inf)))
    if not rows.size:
        return
    h, w = source
    logits = h[rows] @ w.T
    logits -= logits.max(axis=1, keepdims=True)
    picked = logits[np.arange(rows.size), targets[rows]]
    np.exp(logits, out=logits)
    e[rows] = logits
    sums[rows] = logits.sum(axis=1)
    nll[rows] = np.log(sums[rows]) - picked


class CpuCrossEntropy(CrossEntropyReference):
    uses = ("_parallel", "_jit_for", "_ones_vector", "_workspace", "_give_back")

    def _softmax_rows(
        self, logits: np.ndarray, out: np.ndarray, targets: np.ndarray, grad_of_mean: bool,
        source: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """out <- exp(logits - shift) and per-row NLL, in row blocks that stay in cache
        through all their passes. With grad_of_mean, the same pass turns `out` into
        d(mean NLL)/d(logits). Returns (NLL, row sums of the exponentials).

        The shift is the row max, unless `source` = (h, w) with logits = h @ w.T says how to
        rebuild a row (and out is logits): then the shift is 0, which saves a max pass and a
        subtraction. That is exact while the row sum s is finite and
        >= _SAFE_SUM (no exp overflowed; what underflowed weighs < 1e-15 of s); the rare row
        outside is recomputed from `source` with the max shift."""
        n, v = logits.shape
        nll = np.empty(n, logits.dtype)
        sums = np.empty_like(nll)
        ones = self._ones_vector(v, logits.dtype)
        jit = self._jit_for(logits)

        def worker(blocks: Blocks) -> None:
            for i, j in blocks:
                x, e, t = logits[i:j], out[i:j], targets[i:j]
                if jit is not None:
                    jit.softmax_xent.softmax_xent(e, None if out is logits else x, t,
                                                  source is None, n if grad_of_mean else 0,
                                                  nll[i:j], sums[i:j])
                    continue
                idx = np.arange(j - i)
                if source is None:
                    np.subtract(x, x.max(axis=1, keepdims=True), out=e)
                picked = e[idx, t]  # the target's shifted logit
                # (errstate is per thread) an unshifted row that overflows is redone below
                with np.errstate(over="ignore", divide="ignore"):
                    np.exp(e, out=e)
                    s = e @ ones  # row sums as a BLAS GEMV, cheaper than sum()
                    nll[i:j] = np.log(s) - picked
                sums[i:j] = s
                if grad_of_mean:
                    e *= (1.0 / (s * n))[:, None]
                    e[idx, t] -= 1.0 / n

        self._parallel(worker, n, _XENT_BLOCK // v, logits.size)
        if source is not None:
            _redo_shifted(source, out, targets, nll, sums)
        return nll, sums

    def cross_entropy(
        self, logits: Any, targets: Any, need_grad: bool, inplace: bool
    ) -> tuple[Any, Any]:
        out = logits if inplace else np.empty_like(logits)
        nll, _ = self._softmax_rows(logits, out, targets, need_grad)
        return nll.mean(dtype=logits.dtype), (out if need_grad else None)

    def cross_entropy_backward(self, state: Any, g: Any) -> Any:
        if float(g) == 1.0:  # the usual seed gradient: skip a full pass
            return state
        state *= g
        return state

    def _lm_head(
        self, h: Any, w: Any, v: int, targets: Any, need_grad: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        """Keeps e = exp(logits - shift) in a reused buffer and never forms d(logits) =
        g (e - s onehot) / (s N): backward subtracts each row sum s at its target (N writes)
        and folds the row scale g / (s N) into the GEMMs' (N, E)-sized operand or result, so
        the (N, V) matrix sees one GEMM write and one cache-blocked pass in total."""
        e = self._workspace((h.shape[0], w.shape[0]), np.result_type(h, w))  # (N, V)
        mm(h, w, transpose_b=True, out=e)
        nll, sums = self._softmax_rows(e, e, targets, False, source=(h, w))
        loss = nll.mean(dtype=e.dtype)
        if not need_grad:
            self._give_back(e)
            return loss, None
        return loss, (e, sums, h, w, targets)

    def _lm_head_backward(
        self, state: Any, g: Any, need_h: bool, need_w: bool, mm: Callable[..., Any],
        w_into: Any = None,
    ) -> tuple[Any, Any]:
        e, sums, h, w, targets = state
        n = e.shape[0]
        e[np.arange(n), targets] -= sums
        row_scale = (np.asarray(g, e.dtype) / (sums * n))[:, None]  # (N, 1)
        dh = dw = None
        if need_h:
            dh = mm(e, w, gradient="a")
            dh *= row_scale
        if need_w and w_into is not None:
            mm(e.T, h * row_scale, out=w_into, accumulate=True, gradient="a")
        elif need_w:
            dw = mm(e.T, h * row_scale, gradient="a")
        self._give_back(e)
        return dh, dw
