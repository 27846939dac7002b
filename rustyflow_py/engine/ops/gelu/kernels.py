"""The GELU kernels (tanh approximation, the preceding bias add fused in): their contract,
and their entries in the kernel table.

Every device's kernel for an op takes exactly these arguments and keeps these rules (and
table.py's common ones); tests/test_kernel_contract.py holds each to the reference.

    gelu_forward(x, bias) -> Any
        GELU(x + bias) (..., C) for x (..., C) and bias (C,) or None.

    gelu_backward(g, x, bias, sums_into=None) -> Any
        d(x + bias) (..., C) for upstream g (..., C), from the forward's inputs. With
        `sums_into` (a gradient buffer (C,), the bias's), the column sums of the result are
        added into it too.
"""

from __future__ import annotations

from ..table import ANY, F32, F64, FLOATS, SIXTEEN, declare
from .cpu import CpuGelu
from .cuda import CudaGelu
from .reference import GeluReference

declare(("gelu_forward", "gelu_backward"), reference={ANY: GeluReference},
        cpu={(F32, F64): CpuGelu, SIXTEEN: GeluReference}, gpu={FLOATS: CudaGelu})
