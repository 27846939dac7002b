"""The embedding gradient's numba kernel (CPU_JIT): the scatter-add NumPy's add.at runs as a
slow per-element loop."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..jit_compile import f32, kernel


@kernel
def scatter_add_rows(dst: Any, idx: Any, rows: Any) -> None:
    """dst[idx[i]] += rows[i] (NumPy's add.at is an unbuffered, slow per-element loop)."""
    for i in range(idx.size):
        dst[idx[i]] += rows[i]


def warm_up() -> None:
    """Compile these kernels for the array types training and generation pass."""
    x = np.zeros((2, 4), f32)
    for targets in (np.zeros(2, np.int32), np.zeros(2, np.int64)):
        scatter_add_rows(x, targets, x)
