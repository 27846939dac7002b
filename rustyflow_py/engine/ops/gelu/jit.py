"""GELU's numba kernels (CPU_JIT): forward and backward with the bias add, each one pass and
one exp per element."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..jit_compile import f32, fexp, kernel
from .reference import GELU_C, GELU_K


@kernel(inline="always")
def _sigmoid2u(z: Any, c: Any, ck: Any) -> Any:
    """sigmoid(2u), u = c (z + k z^3): GELU-tanh's 0.5 (1 + tanh u), with one exp."""
    return f32(1.0) / (f32(1.0) + fexp(-f32(2.0) * z * (c + ck * z * z)))


@kernel
def gelu_forward(x: Any, bias: Any, out: Any) -> None:
    """out = GELU-tanh(x + bias) over a (rows, C) block; bias may be None."""
    c, ck = f32(GELU_C), f32(GELU_C * GELU_K)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            z = x[i, j] if bias is None else x[i, j] + bias[j]
            out[i, j] = z * _sigmoid2u(z, c, ck)


@kernel
def gelu_backward(g: Any, x: Any, bias: Any, out: Any) -> None:
    """out = g * d/dz [z sigmoid(2u)] = g (s + z s (1 - s) 2 du/dz), z = x (+ bias)."""
    c, ck = f32(GELU_C), f32(GELU_C * GELU_K)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            z = x[i, j] if bias is None else x[i, j] + bias[j]
            s = _sigmoid2u(z, c, ck)
            du2 = f32(2.0) * (c + f32(3.0) * ck * z * z)
            out[i, j] = g[i, j] * (s + z * s * (f32(1.0) - s) * du2)


def warm_up() -> None:
    """Compile these kernels for the array types training and generation pass."""
    x, row = np.zeros((2, 4), f32), np.zeros(4, f32)
    for bias in (row, None):
        gelu_forward(x, bias, x)
        gelu_backward(x, x, bias, x)
