"""Optional numba kernels for the CPU passes NumPy cannot make cheap.

Why: NumPy's float32 `exp` does not take a vectorised path, and the seed shape needs 34M
of them a step in the LM head's softmax alone, a sizeable part of a CPU step. The polynomial
exp below, which LLVM vectorises, fused with the row sum and the target pick in one pass, is
several times faster per element (benchmarks/results/cpu-*.md compares the step with and
without these kernels).
The other kernels fuse what NumPy runs as several passes with temporaries (GELU, AdamW,
LayerNorm, the attention softmax) or one slow call (add.at for the embedding gradient).

Everything here is optional (`pip install rustyflow-py[jit]`): this module is imported only
when numba is installed and CPU_JIT is not off; otherwise the op folders' cpu.py classes run
their NumPy formulation. Only float32 work comes here. The kernels release the GIL, so
RustyFlow's own thread pool spreads them over the cores exactly like the NumPy passes (no
second threading layer). Compiled code is cached on disk by numba; `warm_up()` compiles
before training.

Floating point: `contract` (FMA) and `reassoc` (vectorised sums) only; NaN and inf keep their
IEEE meaning so a diverging run is still caught by the trainer's non-finite-loss check.
"""

from __future__ import annotations

import functools
from typing import Any

import numba
import numpy as np

from .gelu.reference import GELU_C, GELU_K

VERSION = str(numba.__version__)
_FLAGS = {"contract", "reassoc"}
# error_model="numpy": x / 0 is inf as in NumPy; Python's ZeroDivisionError check would keep
# every loop with a division from vectorising.
jit = functools.partial(numba.njit, nogil=True, fastmath=_FLAGS, error_model="numpy",
                        cache=True)
f32 = np.float32


@jit(inline="always")
def _pow2(k: Any) -> Any:
    """2.0**k for an integer k in [-126, 127], from the float32 exponent bits."""
    return np.int32((k + np.int32(127)) << np.int32(23)).view(np.float32)


@jit(inline="always")
def fexp(x: Any) -> Any:
    """float32 exp within 1 ulp (tests/test_cpu_jit.py): 2**n * p(r) with x = n ln2 + r,
    |r| <= ln2 / 2 (Cody-Waite reduction, Cephes' degree-6 polynomial). exp(x) = 0 below
    -87.3 (no subnormals); branch-free after LLVM turns the two tests into selects."""
    n = np.floor(x * f32(1.44269504) + f32(0.5))
    r = x - n * f32(0.693359375)
    r = r - n * f32(-2.12194440e-4)
    p = f32(1.9875691500e-4)
    p = p * r + f32(1.3981999507e-3)
    p = p * r + f32(8.3334519073e-3)
    p = p * r + f32(4.1665795894e-2)
    p = p * r + f32(1.6666665459e-1)
    p = p * r + f32(5.0000001201e-1)
    p = p * r * r + r + f32(1.0)
    # 2**n as two factors 2**a * 2**b, a = floor(n / 2): each exponent stays in float32's
    # range for every n a finite result can have (-126..128)
    a = np.int32(np.floor(n * f32(0.5)))
    b = np.int32(n) - a
    scaled = p * _pow2(a) * _pow2(b)
    if x > f32(88.7228391):
        return f32(np.inf)
    if x < f32(-87.3365447):
        return f32(0.0)
    return scaled  # NaN in, NaN out (through p)


@jit
def softmax_xent(out: Any, x: Any, targets: Any, shift: bool, grad_n: int, nll: Any,
                 sums: Any) -> None:
    """Rows of a softmax cross-entropy: out <- exp(x - m) (m = row max, or 0 without shift),
    nll = log(sum) - (x[t] - m), sums = the row sums; grad_n > 0 then turns out into
    d(mean NLL over grad_n rows)/dx. x=None works in place on out: passing the same array
    twice would make LLVM's aliasing check fall back to scalar code."""
    src = out if x is None else x
    rows, v = out.shape
    for i in range(rows):
        m = f32(0.0)
        if shift:
            m = src[i, 0]
            for j in range(1, v):
                m = max(m, src[i, j])
        t = targets[i]
        picked = src[i, t] - m
        s = f32(0.0)
        for j in range(v):
            e = fexp(src[i, j] - m)
            out[i, j] = e
            s += e
        nll[i] = np.log(s) - picked
        sums[i] = s
        if grad_n > 0:
            scale = f32(1.0) / (s * f32(grad_n))
            for j in range(v):
                out[i, j] *= scale
            out[i, t] -= f32(1.0) / f32(grad_n)


@jit(inline="always")
def _sigmoid2u(z: Any, c: Any, ck: Any) -> Any:
    """sigmoid(2u), u = c (z + k z^3): GELU-tanh's 0.5 (1 + tanh u), with one exp."""
    return f32(1.0) / (f32(1.0) + fexp(-f32(2.0) * z * (c + ck * z * z)))


@jit
def gelu_forward(x: Any, bias: Any, out: Any) -> None:
    """out = GELU-tanh(x + bias) over a (rows, C) block; bias may be None."""
    c, ck = f32(GELU_C), f32(GELU_C * GELU_K)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            z = x[i, j] if bias is None else x[i, j] + bias[j]
            out[i, j] = z * _sigmoid2u(z, c, ck)


@jit
def gelu_backward(g: Any, x: Any, bias: Any, out: Any) -> None:
    """out = g * d/dz [z sigmoid(2u)] = g (s + z s (1 - s) 2 du/dz), z = x (+ bias)."""
    c, ck = f32(GELU_C), f32(GELU_C * GELU_K)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            z = x[i, j] if bias is None else x[i, j] + bias[j]
            s = _sigmoid2u(z, c, ck)
            du2 = f32(2.0) * (c + f32(3.0) * ck * z * z)
            out[i, j] = g[i, j] * (s + z * s * (f32(1.0) - s) * du2)


@jit
def layernorm_forward(x: Any, w: Any, b: Any, eps: float, y: Any, mean: Any,
                      rstd: Any) -> None:
    """y = (x - mean) * rstd * w + b over the rows of a (rows, C) block, one row at a time
    (NumPy's ~10 calls a block cost more than the arithmetic at the seed shape)."""
    n, c = x.shape
    for i in range(n):
        mu = f32(0.0)
        for j in range(c):
            mu += x[i, j]
        mu /= f32(c)
        var = f32(0.0)
        for j in range(c):
            d = x[i, j] - mu
            var += d * d
        r = f32(1.0) / np.sqrt(var / f32(c) + f32(eps))
        for j in range(c):
            y[i, j] = (x[i, j] - mu) * r * w[j] + b[j]
        mean[i, 0] = mu
        rstd[i, 0] = r


@jit
def layernorm_backward(g: Any, x: Any, w: Any, mean: Any, rstd: Any, dx: Any, dw: Any,
                       db: Any) -> None:
    """dx = rstd (g w - mean(g w) - xhat mean(g w xhat)) for a block of rows; the block's
    dw (sum of g xhat) and db (sum of g) are added into dw and db."""
    n, c = x.shape
    for i in range(n):
        mu, r = mean[i, 0], rstd[i, 0]
        mean_gw = f32(0.0)
        mean_gwx = f32(0.0)
        for j in range(c):
            xhat = (x[i, j] - mu) * r
            gw = g[i, j] * w[j]
            mean_gw += gw
            mean_gwx += gw * xhat
            dw[j] += g[i, j] * xhat
            db[j] += g[i, j]
        mean_gw /= f32(c)
        mean_gwx /= f32(c)
        for j in range(c):
            xhat = (x[i, j] - mu) * r
            dx[i, j] = r * (g[i, j] * w[j] - mean_gw - xhat * mean_gwx)


@jit
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


@jit
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


@jit
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


@jit
def scatter_add_rows(dst: Any, idx: Any, rows: Any) -> None:
    """dst[idx[i]] += rows[i] (NumPy's add.at is an unbuffered, slow per-element loop)."""
    for i in range(idx.size):
        dst[idx[i]] += rows[i]


@jit
def adamw(p: Any, g: Any, m: Any, v: Any, decay_until: int, decay: float, c1: float,
          c2: float, step_size: float, bias2: float, eps: float, g_scale: float) -> None:
    """One AdamW step over a block of the flat buffers (one read and write of each, where
    NumPy makes ~12 passes); elements below decay_until get the weight decay first. c1, c2
    are 1 - beta1, 1 - beta2 (from double: float32's 1 - 0.999 loses digits)."""
    d, k1, k2, gs = f32(decay), f32(c1), f32(c2), f32(g_scale)  # new names: stay float32
    sb1, sb2 = f32(1.0) - k1, f32(1.0) - k2
    lr, rb2, e = f32(step_size), f32(1.0 / bias2), f32(eps)
    for i in range(p.size):
        gi = g[i] * gs
        mi = sb1 * m[i] + k1 * gi
        vi = sb2 * v[i] + k2 * (gi * gi)
        m[i] = mi
        v[i] = vi
        pi = p[i] * d if i < decay_until else p[i]
        p[i] = pi - lr * mi / (np.sqrt(vi) * rb2 + e)


@jit
def adam_l2(p: Any, g: Any, m: Any, v: Any, decay_until: int, l2: float, c1: float,
            c2: float, step_size: float, bias2: float, eps: float, g_scale: float) -> None:
    """adamw's loop for Adam: elements below decay_until add l2 * p to their gradient."""
    wd, k1, k2, gs = f32(l2), f32(c1), f32(c2), f32(g_scale)
    sb1, sb2 = f32(1.0) - k1, f32(1.0) - k2
    lr, rb2, e = f32(step_size), f32(1.0 / bias2), f32(eps)
    for i in range(p.size):
        gi = g[i] * gs
        if i < decay_until:
            gi += wd * p[i]
        mi = sb1 * m[i] + k1 * gi
        vi = sb2 * v[i] + k2 * (gi * gi)
        m[i] = mi
        v[i] = vi
        p[i] = p[i] - lr * mi / (np.sqrt(vi) * rb2 + e)

@jit
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
    """Compile every kernel (or load it from numba's cache) for the array types training
    passes, so no training step, and no op in the profile, pays for compilation (slow on a
    first run, shorter from numba's cache, and never free)."""
    x, row, col = np.zeros((2, 4), f32), np.zeros(4, f32), np.zeros((2, 1), f32)
    nll, sums = np.zeros(2, f32), np.zeros(2, f32)
    cube, lse = np.zeros((1, 2, 2), f32), np.zeros((1, 2, 1), f32)
    for targets in (np.zeros(2, np.int32), np.zeros(2, np.int64)):
        softmax_xent(x, None, targets, False, 0, nll, sums)
        scatter_add_rows(x, targets, x)
    for bias in (row, None):
        gelu_forward(x, bias, x)
        gelu_backward(x, x, bias, x)
    layernorm_forward(x, row, row, 1e-5, x, col, col)
    layernorm_backward(x, x, row, col, col, x, row, row)
    causal_softmax_forward(cube, 1.0, lse)
    causal_softmax_forward(cube, 1.0, None)
    causal_softmax_recompute(cube, lse, 1.0)
    causal_softmax_backward(cube, cube, 1.0, cube)
    adamw(row, row, row, row, 0, 1.0, 0.1, 0.05, 1e-3, 1.0, 1e-8, 1.0)
    adam_l2(row, row, row, row, 0, 0.1, 0.1, 0.05, 1e-3, 1.0, 1e-8, 1.0)
    decode_attention(np.zeros((1, 3), f32), np.zeros((1, 1, 2, 1), f32),
                     np.zeros((1, 1, 2, 1), f32), 1, 1.0, np.zeros((1, 1), f32))
