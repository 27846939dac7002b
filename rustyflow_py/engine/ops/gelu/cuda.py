"""GELU on the GPU: CuPy ElementwiseKernels calling gelu.cu's device functions, and the
backward over 16-byte vectors (gelu_vec.cu) where the arrays allow it.

Why a kernel of its own for the backward: it is the MLP's one element-wise pass in backward
(at GPT-2's shape, three 100 MB arrays a layer), and CuPy's ElementwiseKernel loads one value
per thread; gelu_vec.cu loads 16 bytes a thread (benchmarks/results/mlp-dgelu-h100.md)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ...precision import accumulate_dtype
from .. import cuda_build
from .reference import GeluReference

_GELU = cuda_build.source(__file__, "gelu.cu")
_VEC = cuda_build.source(__file__, "gelu_vec.cu", cuda_build.dtype_defines(np.float32))
_SUM_THREADS = 128  # gelu_bwd_sums' block: vector columns, at most
_SUM_BLOCKS = 2048  # about how many blocks gelu_bwd_sums cuts the rows into


@functools.cache
def _kernels() -> dict[str, Any]:
    """GELU loads and stores T and computes in A = rf_acc<T>::type, as the RawKernels do."""
    return {
        "gelu_fwd": cuda_build.elementwise(_GELU, "T x, T b", "T y",
                                           "y = rf_gelu_forward(x, b)", "rf_gelu_fwd"),
        "gelu_bwd": cuda_build.elementwise(_GELU, "T g, T x, T b", "T dx",
                                           "dx = rf_gelu_backward(g, x, b)", "rf_gelu_bwd"),
    }


def _vectors(g: Any, x: Any, bias: Any | None) -> int:
    """cuda_build.vectors of g and x, and with a bias, rows of whole vectors (so that a
    vector never straddles two rows) and a bias that is whole vectors too."""
    if bias is None:
        return cuda_build.vectors(g, x)
    if bias.ndim != 1 or x.shape[-1] != bias.shape[0] or not cuda_build.vectors(bias):
        return 0
    return cuda_build.vectors(g, x) if bias.dtype == x.dtype else 0


class CudaGelu(GeluReference):
    def gelu_forward(self, x: Any, bias: Any | None) -> Any:
        b = bias if bias is not None else x.dtype.type(0)
        return _kernels()["gelu_fwd"](x, b)

    def gelu_backward(self, g: Any, x: Any, bias: Any | None, sums_into: Any = None) -> Any:
        """With `sums_into`, rows of whole vectors take gelu_bwd_sums: the column sums of dx
        come out of the pass that writes dx (partial sums a block, then sum_rows), not from
        a second pass over it."""
        c, per = x.shape[-1], cuda_build.per_vector(x.dtype)
        if (sums_into is not None and _vectors(g, x, bias) and c % per == 0
                and sums_into.dtype == accumulate_dtype(x.dtype)):
            return self._backward_with_sums(g, x, bias, sums_into, c // per)
        return super().gelu_backward(g, x, bias, sums_into)

    def _gelu_backward(self, g: Any, x: Any, bias: Any | None) -> Any:
        vecs = _vectors(g, x, bias)
        if not vecs:
            return _kernels()["gelu_bwd"](g, x, bias if bias is not None else x.dtype.type(0))
        dx = self.xp.empty_like(x)
        _VEC.typed("gelu_bwd_vec", x.dtype)(
            *cuda_build.vector_grid(vecs),
            (g, x, np.uint64(0) if bias is None else bias, dx, np.int64(vecs),
             np.int32(x.shape[-1])))
        return dx

    def _backward_with_sums(self, g: Any, x: Any, bias: Any | None, sums_into: Any,
                            vcols: int) -> Any:
        rows = x.size // x.shape[-1]
        threads = min(_SUM_THREADS, -(-vcols // 32) * 32)
        xblocks = -(-vcols // threads)
        chunk = -(-rows // max(1, min(rows, _SUM_BLOCKS // xblocks)))
        parts = -(-rows // chunk)
        dx = self.xp.empty_like(x)
        part = self.xp.empty((parts, x.shape[-1]), dtype=sums_into.dtype)  # (parts, C)
        _VEC.typed("gelu_bwd_sums", x.dtype)(
            (xblocks, parts), (threads,),
            (g, x, np.uint64(0) if bias is None else bias, dx, part, np.int32(rows),
             np.int32(vcols), np.int32(chunk)))
        self.sum_rows(part, sums_into)
        return dx
