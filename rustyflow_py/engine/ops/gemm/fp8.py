"""The GEMMs of a PRECISION=fp8 run: bfloat16 operands cast to FP8 just before each GEMM, the
GEMM on FP8 tensor cores through cuBLASLt (CublasLt.matmul_fp8), accumulating in fp32.

Formats follow Transformer Engine's hybrid recipe: e4m3 (more precision) for activations and
weights, e5m2 (more range) for gradients; the op says which operand is a gradient. Scaling is
per tensor and current: each cast first takes its tensor's amax on the device (fp8/cuda.py),
so a GEMM never sees a saturated value that a stale scale would clip, at the cost of one more
read of the tensor than a cast with a delayed (last steps') scale.

FP8 GEMMs take both operands with the reduced axis contiguous (the "TN" layout), so an operand
stored the other way round (a weight, or an activation or gradient whose rows are the reduced
axis in a weight gradient) is cast by a transposing kernel straight into that layout.
Anything cuBLASLt cannot take in FP8 (a shape off its 16-byte multiples, float32 operands, a
batched product) raises CublasLtUnsupported, and the caller runs its bf16 GEMM instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...precision import dtype_name
from ..fp8 import cuda as casts
from ..fp8.formats import E4M3, E5M2, Fp8Format, Fp8Tensor
from .cublaslt import CublasLt, CublasLtUnsupported


def codes(x: Any, fmt: Fp8Format) -> Fp8Tensor:
    """The 2-D x (R, C) in FP8 as C-contiguous codes (R, C), whichever way x is stored: a
    transposed view of a C-contiguous array is cast by the transposing kernel, not copied."""
    if x.flags.c_contiguous:
        return casts.quantize(x, fmt)
    if x.T.flags.c_contiguous:
        return casts.quantize_t(x.T, fmt)
    return casts.quantize(x.copy(), fmt)


def _rows(x: Any, what: str) -> Any:
    """x (..., K) as a 2-D (rows, K) operand without a copy, or CublasLtUnsupported."""
    if x.ndim == 2:
        return x
    if x.ndim < 2 or not x.flags.c_contiguous:
        raise CublasLtUnsupported(f"FP8 GEMM: {what} of shape {x.shape} is not (..., K) "
                                  "C-contiguous")
    return x.reshape(-1, x.shape[-1])


class Fp8Gemms:
    """matmul and the Linear layer's GEMM in FP8, on the kernel set's cuBLASLt handle (`lt`,
    the set's maker of it: cuBLASLt is made on first use). A problem cuBLASLt refused is
    remembered by its shapes, so later calls skip its casts and go to bf16 at once."""

    def __init__(self, lt: Callable[[], CublasLt]) -> None:
        self._lt = lt
        self._refused: set[tuple[Any, ...]] = set()

    def matmul(self, a: Any, b: Any, *, out: Any = None, accumulate: bool = False,
               gradient: str | None = None) -> Any:
        """a (..., M, K) @ b (K, N) in FP8, b 2-D (either may be a transposed view);
        `gradient` ("a" or "b"): the operand cast to e5m2. out: as GemmReference.matmul's
        (bfloat16, or float32 for a gradient buffer)."""
        self._check(a, b)
        a2 = _rows(a, "a")
        shape = (*a.shape[:-1], b.shape[1])
        key = ("matmul", a2.shape, b.shape, a2.strides, b.strides, gradient,
               None if out is None else dtype_name(out.dtype), accumulate)
        self._known(key)
        if out is not None and out.shape != shape:
            raise CublasLtUnsupported(f"FP8 GEMM: out {out.shape}, expected {shape}")
        qa = codes(a2, E5M2 if gradient == "a" else E4M3)  # (M, K)
        qb = codes(b.T, E5M2 if gradient == "b" else E4M3)  # (N, K)
        result = a.dtype if out is None else out.dtype
        target = (self._new(shape, result) if out is None else out).reshape(-1, shape[-1])
        self._run(key, lambda: self._lt().matmul_fp8(qa, qb, target, accumulate=accumulate))
        return target.reshape(shape)

    def linear(self, x: Any, w: Any, b: Any, *, gelu: bool = False, pre_gelu_out: Any = None,
               residual: Any = None) -> Any:
        """y = x @ w + b, or gelu of it (the pre-activation into `pre_gelu_out`), plus a
        `residual`: CublasLt.matmul_bias's contract with x and w cast to e4m3, the bias,
        GELU and residual in the FP8 GEMM's epilogue."""
        self._check(x, w)
        x2 = _rows(x, "x")
        shape = (*x.shape[:-1], w.shape[1])
        key = ("linear", x2.shape, w.shape, w.strides, gelu, pre_gelu_out is not None,
               residual is not None)
        self._known(key)
        qx, qw = codes(x2, E4M3), codes(w.T, E4M3)  # (M, K), (N, K)
        y = self._new(shape, x.dtype)
        n = shape[-1]

        def run() -> Any:
            return self._lt().matmul_fp8(
                qx, qw, y.reshape(-1, n), bias=b, gelu=gelu,
                pre_gelu_out=None if pre_gelu_out is None else pre_gelu_out.reshape(-1, n),
                residual=None if residual is None else residual.reshape(-1, n))

        self._run(key, run)
        return y

    # ---- internals ------------------------------------------------------------------------
    def _check(self, a: Any, b: Any) -> None:
        if dtype_name(a.dtype) != "bfloat16" or b.dtype != a.dtype or b.ndim != 2:
            raise CublasLtUnsupported(f"FP8 GEMMs take bfloat16 (..., K) x (K, N) operands, "
                                      f"not {a.dtype} {a.shape} x {b.dtype} {b.shape}")

    def _known(self, key: tuple[Any, ...]) -> None:
        if key in self._refused:
            raise CublasLtUnsupported(f"cuBLASLt refused this FP8 problem before: {key}")

    def _run(self, key: tuple[Any, ...], call: Callable[[], Any]) -> None:
        try:
            call()
        except CublasLtUnsupported:
            if not self._lt().stream.is_capturing():  # a capture's refusal is not the shape's
                self._refused.add(key)
            raise

    def _new(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._lt().xp.empty(shape, dtype=dtype)
