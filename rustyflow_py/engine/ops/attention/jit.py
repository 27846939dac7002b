"""The attention's numba kernels (CPU_JIT): the causal softmax (forward, recompute from the
log-sum-exp, backward) over the keys each query sees, and generation's one-position
attention over the KV cache."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..jit_compile import f32, fexp, kernel


@kernel
def causal_softmax_forward(s: Any, scale: float, lse: Any) -> None:
    """In place over (M, T, T) scores: row r <- softmax(scale * s[r, :r+1]), zeros past r;
    lse (M, T, 1), unless None, gets each row's log-sum-exp of the scaled scores."""
    sc = f32(scale)
    for m in range(s.shape[0]):
        for r in range(s.shape[1]):
            row = s[m, r]
            top = row[0] * sc
            for c in range(1, r + 1):
                top = max(top, row[c] * sc)
            total = f32(0.0)
            for c in range(r + 1):
                e = fexp(row[c] * sc - top)
                row[c] = e
                total += e
            inv = f32(1.0) / total
            for c in range(r + 1):
                row[c] *= inv
            row[r + 1:] = 0
            if lse is not None:
                lse[m, r, 0] = np.log(total) + top


@kernel
def causal_softmax_recompute(s: Any, lse: Any, scale: float) -> None:
    """In place: the probabilities back from the scores and their saved log-sum-exp."""
    sc = f32(scale)
    for m in range(s.shape[0]):
        for r in range(s.shape[1]):
            row = s[m, r]
            shift = lse[m, r, 0]
            for c in range(r + 1):
                row[c] = fexp(row[c] * sc - shift)
            row[r + 1:] = 0


@kernel
def causal_softmax_backward(g: Any, p: Any, scale: float, ds: Any) -> None:
    """ds = scale * p (g - <g, p>) row by row; zeros past the diagonal."""
    sc = f32(scale)
    for m in range(p.shape[0]):
        for r in range(p.shape[1]):
            dot = f32(0.0)
            for c in range(r + 1):
                dot += g[m, r, c] * p[m, r, c]
            for c in range(r + 1):
                ds[m, r, c] = sc * p[m, r, c] * (g[m, r, c] - dot)
            ds[m, r, r + 1:] = 0


@kernel
def decode_attention(qkv: Any, keys: Any, values: Any, pos: int, scale: float, y: Any) -> None:
    """One new position per sequence: its key and value from qkv (B, 3E) written at `pos`
    into keys/values (B, H, S, D), then its query over positions 0..pos into y (B, E): the
    reference's dozen NumPy calls a layer cost more than this arithmetic at batch 1."""
    n_b, heads, _, d = keys.shape
    e = heads * d
    scores = np.empty(pos + 1, f32)
    for b in range(n_b):
        for h in range(heads):
            q = qkv[b, h * d:(h + 1) * d]
            keys[b, h, pos, :] = qkv[b, e + h * d:e + (h + 1) * d]
            values[b, h, pos, :] = qkv[b, 2 * e + h * d:2 * e + (h + 1) * d]
            top = f32(-np.inf)
            for j in range(pos + 1):
                s = f32(0.0)
                for i in range(d):
                    s += q[i] * keys[b, h, j, i]
                scores[j] = s * f32(scale)
                top = max(top, scores[j])
            total = f32(0.0)
            for j in range(pos + 1):
                scores[j] = fexp(scores[j] - top)
                total += scores[j]
            out = y[b, h * d:(h + 1) * d]
            out[:] = f32(0.0)
            for j in range(pos + 1):
                w = scores[j] / total
                for i in range(d):
                    out[i] += w * values[b, h, j, i]


def warm_up() -> None:
    """Compile these kernels for the array types training and generation pass."""
    cube, lse = np.zeros((1, 2, 2), f32), np.zeros((1, 2, 1), f32)
    causal_softmax_forward(cube, 1.0, lse)
    causal_softmax_forward(cube, 1.0, None)
    causal_softmax_recompute(cube, lse, 1.0)
    causal_softmax_backward(cube, cube, 1.0, cube)
    decode_attention(np.zeros((1, 3), f32), np.zeros((1, 1, 2, 1), f32),
                     np.zeros((1, 1, 2, 1), f32), 1, 1.0, np.zeros((1, 1), f32))
