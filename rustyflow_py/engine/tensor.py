"""The Tensor users and models work with: autograd's Tensor, with Python's operators
(`+`, `*`, `@`, `.sum()`, ...) bound to the op library.

The binding happens here, above both, so that the ops (which need autograd) and autograd
(which must not need the ops) import only downwards.
"""

from __future__ import annotations

from . import ops
from .autograd import (
    Function,
    RowGrad,
    Tensor,
    count_gemm,
    grad_enabled,
    no_grad,
    run_op,
)

ops.bind_operators(Tensor)

__all__ = ["Function", "RowGrad", "Tensor", "count_gemm", "grad_enabled", "no_grad", "run_op"]
