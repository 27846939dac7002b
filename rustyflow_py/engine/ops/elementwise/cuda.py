"""Element-wise kernels on the GPU: a + b (add.cu) and the casts between float32 and 16 bits
(cast.cu) over 16-byte vectors when the arrays are contiguous and aligned, else CuPy's operators.

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
        narrow = dst.itemsize == 2 and src.dtype == np.float32  # float32 -> 16-bit
        wide = src.itemsize == 2 and dst.dtype == np.float32  # 16-bit -> float32
        half, full = (dst, src) if narrow else (src, dst)
        vecs = cuda_build.vectors(half) if narrow or wide else 0
        if not (vecs and full.flags.c_contiguous and full.shape == half.shape
                and full.data.ptr % cuda_build.VEC_BYTES == 0):
            dst[...] = src
            return
        kernel = _CAST.typed("cast_vec" if narrow else "widen_vec", half.dtype)
        kernel(*cuda_build.vector_grid(vecs), (src, dst, np.int64(vecs)))
