"""The element-wise kernels: their contract, and their entries in the kernel table.

Every device's kernel for an op takes exactly these arguments and keeps these rules (and
table.py's common ones); tests/test_kernel_contract.py holds each to the reference.

    add(a, b) -> Any
        a + b with NumPy's broadcasting and type promotion, a fresh array.

    cast_into(dst, src) -> None
        dst[...] = src, converted to dst's dtype (the 16-bit compute copy of float32
        parameters, or a gradient summed in 16 bits widened back to float32); dst and src
        of one shape.
"""

from __future__ import annotations

from ..table import ANY, declare
from .cuda import CudaElementwise
from .reference import ElementwiseReference

declare(("add", "cast_into"), reference={ANY: ElementwiseReference},
        cpu={ANY: ElementwiseReference}, gpu={ANY: CudaElementwise})
