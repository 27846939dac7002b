"""The softmax cross-entropy's numba kernel (CPU_JIT): exp, row sum, NLL and gradient of a
block of rows in one pass, with the polynomial exp that LLVM vectorises (NumPy's float32 exp
is scalar, and the LM head's softmax needs tens of millions a step)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..jit_compile import f32, fexp, kernel


@kernel
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


def warm_up() -> None:
    """Compile these kernels for the array types training and generation pass."""
    x, nll, sums = np.zeros((2, 4), f32), np.zeros(2, f32), np.zeros(2, f32)
    for targets in (np.zeros(2, np.int32), np.zeros(2, np.int64)):
        softmax_xent(x, None, targets, False, 0, nll, sums)
