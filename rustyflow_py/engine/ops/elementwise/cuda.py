"""Element-wise kernels on the GPU: a + b over 16-byte vectors (add.cu) when both are equal,
contiguous and aligned, else CuPy's operator.

Why a kernel of its own for so plain an op: the residual stream's adds and the gradients'
joins are a GPT step's largest element-wise passes (at GPT-2's shape in bf16, 49 a step over
25 MB arrays), and CuPy's add loads one value a thread; add.cu loads 16 bytes a thread
(benchmarks/results/vector-add-h100.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import cuda_build
from .reference import ElementwiseReference

_ADD = cuda_build.source(__file__, "add.cu", cuda_build.dtype_defines(np.float32))


class CudaElementwise(ElementwiseReference):
    def add(self, a: Any, b: Any) -> Any:
        vecs = cuda_build.vectors(a, b)
        if not vecs:
            return a + b
        out = self.xp.empty_like(a)
        _ADD.typed("add_vec", a.dtype)(*cuda_build.vector_grid(vecs), (a, b, out, np.int64(vecs)))
        return out
