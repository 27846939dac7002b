"""LayerNorm's numba kernels (CPU_JIT): a row at a time, forward and backward, where NumPy
makes about ten calls a block."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..jit_compile import f32, kernel


@kernel
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


@kernel
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


def warm_up() -> None:
    """Compile these kernels for the array types training and generation pass: generation's
    forward also takes strided rows (the last position of each prompt of a batch, a view into
    the prefill's (B, T, E))."""
    x, row, col = np.zeros((2, 4), f32), np.zeros(4, f32), np.zeros((2, 1), f32)
    layernorm_forward(x, row, row, 1e-5, x, col, col)
    layernorm_forward(np.zeros((2, 8), f32)[:, 4:], row, row, 1e-5, x, col, col)
    layernorm_backward(x, x, row, col, col, x, row, row)
