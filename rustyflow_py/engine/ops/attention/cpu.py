"""CPU causal attention softmax over (B, H, T, T) scores, computing only what the mask keeps.

Blocks of whole (T, T) matrices, and within them blocks of _QUERY_BLOCK query rows that touch
only the keys up to their last row: the rest is masked, so it is zeroed without being
computed (at T=256, 5/8 of the exps and passes remain).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..cpu_pool import BLOCK, Blocks
from .reference import AttentionReference

_QUERY_BLOCK = 64  # attention rows per block: keys past a block's last row are all masked


class CpuAttention(AttentionReference):
    uses = ("_parallel", "_jit_for")

    def __init__(self, kernels: Any) -> None:
        super().__init__(kernels)
        self._notmask: dict[int, np.ndarray] = {}

    def _causal_pass(self, arrays: tuple[Any, ...], fn: Callable[..., None],
                     jit_fn: Callable[[slice], None] | None = None) -> None:
        """fn(*views, mats, rows) for blocks of the (M, T, T) arrays, each view being
        array[mats, rows, :rows.stop] (the keys those query rows can see); the keys past
        rows.stop are masked for all of them and are zeroed in arrays[0]. jit_fn(mats), a
        numba kernel bound to its arrays, replaces that per block of matrices when given."""
        first, t = arrays[0], arrays[0].shape[-1]

        def worker(blocks: Blocks) -> None:
            for i, j in blocks:
                if jit_fn is not None:
                    jit_fn(slice(i, j))
                    continue
                for r0 in range(0, t, _QUERY_BLOCK):
                    r1 = min(r0 + _QUERY_BLOCK, t)
                    fn(*(a[i:j, r0:r1, :r1] for a in arrays), slice(i, j), slice(r0, r1))
                    first[i:j, r0:r1, r1:] = 0

        per = max(1, BLOCK // (_QUERY_BLOCK * t))
        self._parallel(worker, first.shape[0], per, first.size)

    def _masked(self, t: int) -> np.ndarray:
        if t not in self._notmask:
            self._notmask[t] = ~self.causal_mask(t)
        return self._notmask[t]

    def causal_softmax_forward(self, scores: Any, scale: float, with_lse: bool = False) -> Any:
        t = scores.shape[-1]
        s = np.ascontiguousarray(scores).reshape(-1, t, t)
        lse = np.empty((s.shape[0], t, 1), s.dtype) if with_lse else None
        masked = self._masked(t)

        def block(x: Any, mats: slice, rows: slice) -> None:
            x *= scale
            np.copyto(x[..., rows], -np.inf, where=masked[rows, rows])  # the diagonal square
            m = x.max(axis=-1, keepdims=True)
            x -= m
            np.exp(x, out=x)
            z = x.sum(axis=-1, keepdims=True)
            x /= z
            if lse is not None:
                np.log(z, out=z)
                np.add(z, m, out=lse[mats, rows])

        jit = self._jit_for(s)
        self._causal_pass((s,), block, jit and (lambda mats: jit.attention.causal_softmax_forward(
            s[mats], scale, None if lse is None else lse[mats])))
        probs = s.reshape(scores.shape)
        return (probs, lse.reshape((*scores.shape[:-1], 1))) if lse is not None else probs

    def causal_softmax_recompute(self, scores: Any, lse: Any, scale: float) -> Any:
        t = scores.shape[-1]
        s = np.ascontiguousarray(scores).reshape(-1, t, t)
        rows_lse = lse.reshape(-1, t, 1)
        masked = self._masked(t)

        def block(x: Any, mats: slice, rows: slice) -> None:
            x *= scale
            np.copyto(x[..., rows], -np.inf, where=masked[rows, rows])  # before exp: no overflow
            x -= rows_lse[mats, rows]
            np.exp(x, out=x)

        jit = self._jit_for(s, rows_lse)
        self._causal_pass((s,), block, jit and (lambda mats: jit.attention.causal_softmax_recompute(
            s[mats], rows_lse[mats], scale)))
        return s.reshape(scores.shape)

    def causal_softmax_backward(self, g: Any, probs: Any, scale: float) -> Any:
        t = probs.shape[-1]
        ds = np.empty((probs.size // (t * t), t, t), np.result_type(g, probs))

        def block(d: Any, p: Any, gb: Any, *_: slice) -> None:
            np.multiply(gb, p, out=d)
            dot = d.sum(axis=-1, keepdims=True)
            np.subtract(gb, dot, out=d)
            d *= p  # p (g - <g, p>)
            d *= scale

        p3, g3 = probs.reshape(-1, t, t), g.reshape(-1, t, t)
        jit = self._jit_for(p3, g3)
        self._causal_pass((ds, p3, g3), block, jit and (
            lambda mats: jit.attention.causal_softmax_backward(g3[mats], p3[mats], scale,
                                                               ds[mats])))
        return ds.reshape(probs.shape)

    def decode_attention(self, qkv: Any, keys: Any, values: Any, pos: Any, scale: float,
                         n: int) -> Any:
        """attention/jit.py's decode_attention for float32 (positions 0..pos only: `n`, the
        reference's window, is not needed); the reference formulation otherwise."""
        jit = self._jit_for(qkv, keys, values)
        if jit is None or not (qkv.flags.c_contiguous and keys.flags.c_contiguous
                               and values.flags.c_contiguous):
            return super().decode_attention(qkv, keys, values, pos, scale, n)
        y = np.empty((qkv.shape[0], qkv.shape[1] // 3), dtype=qkv.dtype)  # (B, E)
        jit.attention.decode_attention(qkv, keys, values, int(pos[0]), scale, y)
        return y
