"""AdamW's and Adam's numba loops (CPU_JIT): one read and write of each flat buffer per
block, where NumPy makes about twelve passes."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..jit_compile import f32, kernel


@kernel
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


@kernel
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


def warm_up() -> None:
    """Compile these kernels for the array types training and generation pass."""
    row = np.zeros(4, f32)
    adamw(row, row, row, row, 0, 1.0, 0.1, 0.05, 1e-3, 1.0, 1e-8, 1.0)
    adam_l2(row, row, row, row, 0, 0.1, 0.1, 0.05, 1e-3, 1.0, 1e-8, 1.0)
