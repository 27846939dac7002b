"""The GEMM family on the GPU: matmul through cuBLAS (so products can be captured in a CUDA
graph) and through cuBLASLt where a product is added into a float32 gradient buffer, the
bias gradients' column sums (sum_rows.cu), and the Linear layers through cuBLASLt's epilogues
(bias, bias + GELU fused into the GEMM). The GELU's backward is the shared formulation (a GEMM,
then gelu_backward): see MLP's docstring for why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...precision import accumulate_dtype
from .. import cuda_build
from ..table import add_into
from .cublaslt import CublasLtUnsupported
from .reference import GemmReference

_SUM = cuda_build.source(__file__, "sum_rows.cu", cuda_build.dtype_defines(np.float32))
_SUM_THREADS = 128  # sum_rows_part's block: vector columns
_SUM_BLOCKS = 512  # about how many blocks sum_rows_part cuts a sum into


class CudaGemm(GemmReference):
    """The GEMM family on the GPU (the handles are the kernel set's: cuda_set.py)."""

    def matmul(self, a: Any, b: Any, *, transpose_b: bool = False, out: Any = None,
               accumulate: bool = False) -> Any:
        """cuBLAS takes the swapped view as op=T: no copy. A 2-D product added into `out`, or
        written into a float32 `out` from 16-bit inputs, is one cuBLASLt GEMM (beta = 1)."""
        b = self.xp.swapaxes(b, -1, -2) if transpose_b else b
        if not accumulate and (out is None or out.dtype == a.dtype):
            return self.cublas.matmul(a, b, out=out)
        if self.epilogues and a.ndim == b.ndim == 2:
            try:
                return self._lt().matmul_into(a, b, out, accumulate=accumulate)
            except CublasLtUnsupported:
                pass
        product = self.cublas.matmul(a, b)
        if accumulate:
            out += product
        else:
            out[...] = product
        return out

    def sum_rows(self, x: Any, into: Any = None) -> Any:
        """Column sums in two passes over 16-byte vectors (sum_rows.cu), the last one adding
        into `into` when given. Why not cuBLASLt's BGRADA epilogue on the weight gradient's
        GEMM, which sums the same g: on an H100 it ran as a kernel of its own
        (globalKernelBgradAB) over g, slower than these passes, and it cannot add into a
        buffer (benchmarks/results/bias-grads-h100.md). Other layouts: ones(1, N) @ x, one
        bandwidth-bound GEMM."""
        rows, cols = x.shape
        per = cuda_build.per_vector(x.dtype)
        acc = accumulate_dtype(x.dtype)
        if (rows and per and cols % per == 0 and cuda_build.vectors(x)
                and (into is None or into.dtype == acc)):
            xblocks = -(-cols // per // _SUM_THREADS)
            chunk = -(-rows // max(1, _SUM_BLOCKS // xblocks))
            parts = -(-rows // chunk)
            part = self.xp.empty((parts, cols), dtype=acc)
            _SUM.typed("sum_rows_part", x.dtype)(
                (xblocks, parts), (_SUM_THREADS,),
                (x, part, np.int32(rows), np.int32(cols // per), np.int32(chunk)))
            out = self.xp.empty(cols, dtype=acc) if into is None else into
            _SUM.typed("sum_rows_into", x.dtype)(
                (-(-cols // 32),), (32, 8),
                (part, out, np.int32(parts), np.int32(cols), np.int32(into is not None)))
            return None if into is not None else out.astype(x.dtype, copy=False)
        return add_into(into, self._sum_by_gemm(x))

    def _sum_by_gemm(self, x: Any) -> Any:
        n = x.shape[0]
        ones = self._ones.get((n, x.dtype))
        if ones is None:
            ones = self.xp.ones((1, n), dtype=x.dtype)
            if not self.backend.stream.is_capturing():
                # one made during a graph capture lives in that graph's private pool and is
                # filled only when the graph replays: it is this step's, not a cache entry
                self._ones[(n, x.dtype)] = ones
        return self.cublas.matmul(ones, x, strict=True)[0]

    # ---- Linear layers: bias, GELU and the bias gradient in the GEMM's epilogue --------------
    # cuBLASLt refuses (CublasLtUnsupported) float64, the odd layout, and a problem first seen
    # during graph capture (its plan must come from an eager call, which the trainer's warm-up
    # steps make); each refusal takes the shared formulation: GEMM, then a kernel.
    def linear(self, x: Any, w: Any, b: Any, gelu: bool,
               gemm: Callable[..., Any]) -> tuple[Any, Any]:
        """Epilogue BIAS, or GELU_AUX_BIAS writing the pre-activation x @ w + b (the state,
        bias included) for backward. cuBLASLt's GELU may use a fast tanh (relative errors
        near 1e-3): below tf32's and 16-bit's own rounding, but not exact float32, so a
        float32 run without TF32 keeps the GELU kernel."""
        exact = x.dtype == np.float32 and self.cublas.matmul_compute != "tf32"
        if self.epilogues and not (gelu and exact):
            try:
                if not gelu:
                    return gemm(self._lt().matmul_bias, x, w, b), None
                pre = self.xp.empty((*x.shape[:-1], w.shape[1]), dtype=x.dtype)  # (..., N)
                y = gemm(self._lt().matmul_bias, x, w, b, gelu=True, pre_gelu_out=pre)
                return y, (pre, None)
            except CublasLtUnsupported:
                pass
        return super().linear(x, w, b, gelu, gemm)

    def linear_grads(self, x: Any, g: Any, gemm: Callable[..., Any],
                     into: tuple[Any, Any] = (None, None)) -> tuple[Any, Any]:
        """dW by one GEMM: float32 from 16-bit inputs, added into its buffer when given (beta
        = 1); db by sum_rows, likewise. (The bias gradient is not the GEMM's BGRADA epilogue:
        see sum_rows.)"""
        g2 = g.reshape(-1, g.shape[-1])  # (rows, N)
        xt = x.reshape(-1, x.shape[-1]).T  # (K, rows)
        acc, (dw_into, db_into) = accumulate_dtype(g.dtype), into
        dw = self.xp.empty((xt.shape[0], g2.shape[1]), dtype=acc) if dw_into is None else dw_into
        gemm(self.matmul, xt, g2, out=dw, accumulate=dw_into is not None)
        db = self.xp.zeros(g2.shape[1], dtype=acc) if db_into is None else db_into
        self.sum_rows(g2, db)
        return (dw if dw_into is None else None), (db if db_into is None else None)
