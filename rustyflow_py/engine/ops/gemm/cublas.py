"""Matrix products through cuBLAS called directly (ctypes), so they can be graph-captured.

CuPy refuses any cuBLAS call while a stream is being captured. cuBLAS itself supports capture
when its workspace is preset (no allocation inside the graph), so RustyFlow keeps its own
handle bound to the backend's stream with a fixed workspace and calls
cublasGemmStridedBatchedEx for every matmul. Row-major arrays are handled by computing
C^T = B^T A^T in cuBLAS's column-major convention; transposed views are passed as op=T, so
`h @ W.T` (the tied LM head) needs no copy. A, B and C share one type, float32, float64,
float16 or bfloat16; 16-bit products accumulate in fp32.

Why not nvmath-python's Matmul for these plain products: on the H100 it chose a slower
algorithm for the tied LM head's GEMM in a replayed graph, and its eager calls cost the host
more than this binding's (benchmarks/results/gemm-bindings-h100.md; cublaslt.py says more).
"""

from __future__ import annotations

import copy
import ctypes
import functools
from typing import Any, TypeVar

import numpy as np

from ...precision import MatmulCompute, dtype_name

_OP_N, _OP_T = 0, 1
# The cudaDataType of each operand dtype (A, B and C share it): CUDA_R_32F, _64F, _16F,
# _16BF (bfloat16 is ml_dtypes', matched by name so this module imports without it).
_CUDA_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}
_COMPUTE_32F, _COMPUTE_64F, _COMPUTE_32F_FAST_TF32 = 68, 70, 77
_GEMM_DEFAULT = -1
_WORKSPACE_BYTES = 32 * 2**20


Handle = TypeVar("Handle")


def in_compute(handle: Handle, compute: MatmulCompute) -> Handle:
    """A cuBLAS or cuBLASLt handle with float32 GEMMs in `compute` (a run policy's): a view
    sharing the handle, its workspace and (cuBLASLt) its plans, whose keys hold their compute
    type, so no run's mode is ever set on a handle another run uses."""
    view = copy.copy(handle)
    view.matmul_compute = compute  # type: ignore[attr-defined]
    return view


class CublasError(RuntimeError):
    pass


@functools.cache
def _library() -> ctypes.CDLL:
    """The libcublas CuPy already loaded (same CUDA runtime), found in the process maps."""
    import cupy

    cupy.cuda.device.get_cublas_handle()  # makes CuPy load libcublas
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "libcublas.so" in line})
    if not paths:
        raise CublasError("libcublas is not loaded in this process; cannot call cuBLAS")
    lib = ctypes.CDLL(paths[0])
    lib.cublasGemmStridedBatchedEx.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
        ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ]
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasError(f"{what} failed with cuBLAS status {status}")


class Cublas:
    """A cuBLAS handle on one stream with a fixed workspace."""

    def __init__(self, xp: Any, stream: Any) -> None:
        self.xp = xp
        self.lib = _library()
        self.handle = ctypes.c_void_p()
        _check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        _check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream.ptr)),
               "cublasSetStream")
        self.workspace = xp.empty(_WORKSPACE_BYTES, dtype=np.uint8)
        _check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(self.workspace.data.ptr),
                                              ctypes.c_size_t(_WORKSPACE_BYTES)),
               "cublasSetWorkspace")
        self.matmul_compute: MatmulCompute = "fp32"  # Precision.matmul_compute: in_compute
        self._one32, self._zero32 = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._one64, self._zero64 = ctypes.c_double(1.0), ctypes.c_double(0.0)

    def _operand(self, x: Any) -> tuple[Any, int, int]:
        """(array, op, leading dimension) of the last two axes in column-major terms."""
        r, c = x.shape[-2:]
        sr, sc = (s // x.itemsize for s in x.strides[-2:])
        if sc == 1 and sr >= max(c, 1):
            return x, _OP_N, sr
        if sr == 1 and sc >= max(r, 1):
            return x, _OP_T, sc
        x = self.xp.ascontiguousarray(x)
        return x, _OP_N, c

    def _batch_stride(self, x: Any) -> tuple[Any, int]:
        """Collapse the leading axes into one uniform stride (copying when they don't merge)."""
        if x.ndim == 2:
            return x, 0
        lead = x.ndim - 2
        strides = [s // x.itemsize for s in x.strides]
        for i in range(lead - 1):
            if strides[i] != strides[i + 1] * x.shape[i + 1]:
                x = self.xp.ascontiguousarray(x)
                strides = [s // x.itemsize for s in x.strides]
                break
        return x, strides[lead - 1]

    def matmul(self, a: Any, b: Any, strict: bool = False, *, out: Any = None) -> Any:
        """a @ b for 2-D/batched operands of equal batch shape, or batched @ 2-D, written
        into `out` (C-contiguous, the result's shape and dtype) when given.

        strict=True keeps full fp32 even when TF32 is on (for reductions written as GEMMs)."""
        if a.dtype != b.dtype or dtype_name(a.dtype) not in _CUDA_TYPES:
            return self.xp.matmul(a, b, out=out)
        if a.ndim > 2 and b.ndim > 2 and a.shape[:-2] != b.shape[:-2]:
            return self.xp.matmul(a, b, out=out)
        m, k = a.shape[-2:]
        n = b.shape[-1]
        batch_shape = a.shape[:-2] if a.ndim > 2 else b.shape[:-2]
        shape = (*batch_shape, m, n)
        if out is None:
            out = self.xp.empty(shape, dtype=a.dtype)
        elif out.shape != shape or out.dtype != a.dtype or not out.flags.c_contiguous:
            raise ValueError(f"matmul: out must be C-contiguous {shape} {a.dtype}, not "
                             f"{out.shape} {out.dtype}")
        if out.size == 0:
            return out
        if b.ndim == 2 and a.ndim > 2 and a.flags.c_contiguous:
            a = a.reshape(-1, k)  # (B*M, K) @ (K, N): one plain GEMM
            m, batch_shape = a.shape[0], ()
        count = int(np.prod(batch_shape)) if batch_shape else 1
        a, stride_a = self._batch_stride(a)
        b, stride_b = self._batch_stride(b)
        a, op_a, lda = self._operand(a)
        b, op_b, ldb = self._operand(b)
        dtype = _CUDA_TYPES[dtype_name(a.dtype)]
        double = a.dtype == np.float64
        tf32 = self.matmul_compute == "tf32" and a.dtype == np.float32 and not strict
        # 16-bit operands accumulate in fp32 (COMPUTE_32F, fp32 alpha and beta)
        compute = _COMPUTE_64F if double else _COMPUTE_32F_FAST_TF32 if tf32 else _COMPUTE_32F
        one, zero = (self._one64, self._zero64) if double else (self._one32, self._zero32)
        _check(self.lib.cublasGemmStridedBatchedEx(
            self.handle, op_b, op_a, n, m, k, ctypes.byref(one),
            b.data.ptr, dtype, ldb, stride_b, a.data.ptr, dtype, lda, stride_a,
            ctypes.byref(zero), out.data.ptr, dtype, n, m * n, count, compute, _GEMM_DEFAULT,
        ), "cublasGemmStridedBatchedEx")
        return out
