"""The GEMM family on the GPU: matmul through cuBLAS (so products can be captured in a CUDA
graph) and through cuBLASLt where a product is added into a float32 gradient buffer, the
bias gradients' column sums as GEMMs, and the Linear layers through cuBLASLt's epilogues
(bias, bias + GELU fused into the GEMM). The GELU's backward is the shared formulation (a GEMM,
then gelu_backward): see MLP's docstring for why."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ...precision import accumulate_dtype
from .. import cuda_build
from ..table import add_into
from .cublaslt import CublasLtUnsupported
from .fp8 import Fp8Operand, dense
from .reference import GemmReference

_SUM = cuda_build.source(__file__, "sum_rows.cu", cuda_build.dtype_defines(np.float32))
_SUM_LANES = 32  # sum_rows.cu's SUM_LANES: rows summed side by side
_SUM_DIRECT_ROWS = 2048  # up to this many rows of acc, sum_rows.cu sums them


class CudaGemm(GemmReference):
    """The GEMM family on the GPU (the handles are the kernel set's: cuda_set.py)."""

    # _ones: sum_rows' vectors, by (n, dtype); fp8: the FP8 GEMMs of a PRECISION=fp8 run
    uses = ("cublas", "epilogues", "fp8", "_lt", "_ones")

    def matmul(self, a: Any, b: Any, *, transpose_b: bool = False, out: Any = None,
               accumulate: bool = False, gradient: str | None = None) -> Any:
        """cuBLAS takes the swapped view as op=T: no copy. A 2-D product added into `out`, or
        written into a float32 `out` from 16-bit inputs, is one cuBLASLt GEMM (beta = 1). In
        a PRECISION=fp8 run, a bfloat16 product whose b is 2-D runs in FP8 (gemm/fp8.py),
        and either operand may be what kept_for_backward gave (an Fp8Operand)."""
        if transpose_b:
            b = b.T if isinstance(b, Fp8Operand) else self.xp.swapaxes(b, -1, -2)
        if self.fp8 is not None:
            try:
                return self.fp8.matmul(a, b, out=out, accumulate=accumulate, gradient=gradient)
            except CublasLtUnsupported:  # bf16, from the values of operands kept in FP8
                a, b = dense(a, self.xp), dense(b, self.xp)
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

    def kept_for_backward(self, x: Any, w: Any) -> tuple[Any, Any]:
        """In a PRECISION=fp8 run, the FP8 codes the forward cast (Fp8Gemms.kept)."""
        return (x, w) if self.fp8 is None else self.fp8.kept(x, w)

    def shared_gradient(self, g: Any) -> contextlib.AbstractContextManager[None]:
        """In a PRECISION=fp8 run, g's two layouts come from one cast (Fp8Gemms.shared)."""
        return super().shared_gradient(g) if self.fp8 is None else self.fp8.shared(g)

    def fp8_tensors(self) -> list[dict[str, Any]] | None:
        """In a PRECISION=fp8 run, the captured step's casts (Fp8Sites.tensors)."""
        return None if self.fp8 is None else self.fp8.sites.tensors()

    def sum_rows(self, x: Any, into: Any = None) -> Any:
        """Column sums as ones(1, N) @ x, one bandwidth-bound GEMM: for 16-bit x a cuBLASLt
        GEMM with float32 output that adds into `into` (beta = 1). A few rows of acc
        (LayerNorm's partial sums) take sum_rows.cu's one small kernel instead.

        Why not cuBLASLt's BGRADA epilogue on the weight gradient's GEMM, which sums the same
        g: on an H100 it ran as a kernel of its own (globalKernelBgradAB) over g, slower than
        this GEMM, and it cannot add into a buffer (benchmarks/results/bias-grads-h100.md)."""
        rows, cols = x.shape
        acc = accumulate_dtype(x.dtype)
        fits = rows and (into is None or (into.dtype == acc and into.flags.c_contiguous))
        if fits and x.dtype == acc and rows <= _SUM_DIRECT_ROWS and x.flags.c_contiguous:
            out = self.xp.empty(cols, dtype=acc) if into is None else into
            _SUM.typed("sum_rows_into", x.dtype, defines=(f"-DSUM_LANES={_SUM_LANES}",))(
                (-(-cols // 32),), (32, _SUM_LANES),
                (x, out, np.int32(rows), np.int32(cols), np.int32(into is not None)))
            return out if into is None else None
        if fits and x.dtype != acc and self.epilogues:
            out = self.xp.empty(cols, dtype=acc) if into is None else into
            try:
                self._lt().matmul_into(self._ones_row(rows, x.dtype), x, out.reshape(1, cols),
                                       accumulate=into is not None)
                return out.astype(x.dtype) if into is None else None
            except CublasLtUnsupported:
                pass
        return add_into(into, self._sum_by_gemm(x))

    def _sum_by_gemm(self, x: Any) -> Any:
        return self.cublas.matmul(self._ones_row(x.shape[0], x.dtype), x, strict=True)[0]

    def _ones_row(self, n: int, dtype: Any) -> Any:
        ones = self._ones.get((n, dtype))
        if ones is None:
            ones = self.xp.ones((1, n), dtype=dtype)
            if not self.backend.stream.is_capturing():
                # one made during a graph capture lives in that graph's private pool and is
                # filled only when the graph replays: it is this step's, not a cache entry
                self._ones[(n, dtype)] = ones
        return ones

    # ---- Linear layers: bias, GELU and a residual in the GEMM's epilogue ---------------------
    # cuBLASLt refuses (CublasLtUnsupported) float64, the odd layout, and a problem first seen
    # during graph capture (its plan must come from an eager call, which the trainer's warm-up
    # steps make); each refusal takes the shared formulation: GEMM, then a kernel.
    def linear(self, x: Any, w: Any, b: Any, gelu: bool, gemm: Callable[..., Any],
               residual: Any = None) -> tuple[Any, Any]:
        """Epilogue BIAS (a residual added as the GEMM's C, beta = 1), or GELU_AUX_BIAS
        writing the pre-activation x @ w + b (the state, bias included) for backward.
        cuBLASLt's GELU may use a fast tanh (relative errors near 1e-3): below tf32's and
        16-bit's own rounding, but not exact float32, so a float32 run without TF32 keeps
        the GELU kernel."""
        exact = x.dtype == np.float32 and self.cublas.matmul_compute != "tf32"
        if self.epilogues and not (gelu and exact):
            for in_fp8 in (True, False) if self.fp8 is not None else (False,):
                try:  # FP8 first in a PRECISION=fp8 run
                    kernel = self.fp8.linear if in_fp8 else self._lt().matmul_bias
                    if not gelu:
                        return gemm(kernel, x, w, b, residual=residual), None
                    pre = self.xp.empty((*x.shape[:-1], w.shape[1]), dtype=x.dtype)  # (..., N)
                    y = gemm(kernel, x, w, b, gelu=True, pre_gelu_out=pre)
                    return y, (pre, None)
                except CublasLtUnsupported:
                    pass
        return super().linear(x, w, b, gelu, gemm, residual)

    def _dgelu(self, dh: Any, pre: Any, bias: Any, db_into: Any) -> Any:
        """In a PRECISION=fp8 run with delayed scaling, inside the captured step, dpre comes
        as e5m2 codes in both layouts from the GELU backward's own pass (Fp8Gemms.
        gelu_backward: no bf16 dpre, no cast of it), an Fp8Operand that matmul and
        linear_grads take in its place."""
        codes = (None if self.fp8 is None or db_into is None
                 else self.fp8.gelu_backward(dh, pre, bias, db_into, self.sum_rows))
        return super()._dgelu(dh, pre, bias, db_into) if codes is None else codes

    def linear_grads(self, x: Any, g: Any, gemm: Callable[..., Any],
                     into: tuple[Any, Any] = (None, None), bias: bool = True
                     ) -> tuple[Any, Any]:
        """dW by one GEMM: float32 from 16-bit inputs, added into its buffer when given (beta
        = 1); db by sum_rows, likewise. (The bias gradient is not the GEMM's BGRADA epilogue:
        see sum_rows.)"""
        g2 = g if isinstance(g, Fp8Operand) else g.reshape(-1, g.shape[-1])  # (rows, N)
        xt = x.T if isinstance(x, Fp8Operand) else x.reshape(-1, x.shape[-1]).T  # (K, rows)
        acc, (dw_into, db_into) = accumulate_dtype(g.dtype), into
        dw = self.xp.empty((xt.shape[0], g2.shape[1]), dtype=acc) if dw_into is None else dw_into
        gemm(self.matmul, xt, g2, out=dw, accumulate=dw_into is not None, gradient="b")
        if not bias:
            return (dw if dw_into is None else None), None
        db = self.xp.zeros(g2.shape[1], dtype=acc) if db_into is None else db_into
        self.sum_rows(g2, db)
        return (dw if dw_into is None else None), (db if db_into is None else None)
