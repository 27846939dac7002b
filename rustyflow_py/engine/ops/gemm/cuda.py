"""The GEMM family on the GPU: matmul through cuBLAS (so products can be captured in a CUDA
graph), the bias gradients' column sums as a GEMM, and the Linear layers through cuBLASLt's
epilogues (bias, bias + GELU and bias gradients fused into the GEMM). The GELU's backward is
the shared formulation (a GEMM, then gelu_backward): see MLP's docstring for why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...precision import accumulate_dtype
from .cublaslt import CublasLtUnsupported
from .reference import GemmReference


class CudaGemm(GemmReference):
    """The GEMM family on the GPU (the handles are the kernel set's: cuda_set.py)."""

    def matmul(self, a: Any, b: Any, *, transpose_b: bool = False, out: Any = None) -> Any:
        """cuBLAS takes the swapped view as op=T: no copy."""
        return self.cublas.matmul(a, self.xp.swapaxes(b, -1, -2) if transpose_b else b, out=out)

    def sum_rows(self, x: Any) -> Any:
        """Column sums of (N, C) as ones(1, N) @ x: one bandwidth-bound GEMM, several times
        faster than a strided column reduction (bias gradients)."""
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

    def linear_grads(self, x: Any, g: Any, gemm: Callable[..., Any]) -> tuple[Any, Any]:
        """Epilogue BGRADA: db from the dW GEMM's own pass over g; 16-bit inputs give float32
        dW and db straight from it."""
        if self.epilogues:
            try:
                return gemm(self._lt().matmul_bgrad, x.reshape(-1, x.shape[-1]).T, g,
                            out_dtype=accumulate_dtype(g.dtype))
            except CublasLtUnsupported:
                pass
        return super().linear_grads(x, g, gemm)
