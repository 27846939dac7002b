"""Element-wise kernels on the GPU: a + b (add.cu) and the float32 -> 16-bit cast (cast.cu)
over 16-byte vectors when the arrays are contiguous and aligned, else CuPy's operators.

Why kernels of their own for so plain ops: the residual stream's adds and the gradients'
joins are a GPT step's largest element-wise passes (at GPT-2's shape in bf16, 49 a step over
25 MB arrays), and the compute copy casts every parameter once a step; CuPy's kernels load
one value a thread, these 16 bytes (benchmarks/results/vector-add-h100.md,
benchmarks/results/gpt2-fusions-h100.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import cuda_build
from .reference import ElementwiseReference

_ADD = cuda_build.source(__file__, "add.cu", cuda_build.dtype_defines(np.float32))
_CAST = cuda_build.source(__file__, "cast.cu", cuda_build.dtype_defines(np.float32))


class CudaElementwise(ElementwiseReference):
    def add(self, a: Any, b: Any) -> Any:
        vecs = cuda_build.vectors(a, b)
        if not vecs:
            return a + b
        out = self.xp.empty_like(a)
        _ADD.typed("add_vec", a.dtype)(*cuda_build.vector_grid(vecs), (a, b, out, np.int64(vecs)))
        return out

    def cast_into(self, dst: Any, src: Any) -> None:
        vecs = cuda_build.vectors(dst)
        if not (vecs and src.dtype == np.float32 and dst.itemsize == 2 and src.flags.c_contiguous
                and src.shape == dst.shape and src.data.ptr % cuda_build.VEC_BYTES == 0):
            dst[...] = src
            return
        _CAST.typed("cast_vec", dst.dtype)(*cuda_build.vector_grid(vecs),
                                           (src, dst, np.int64(vecs)))
