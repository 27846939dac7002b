"""Matrix products through cuBLAS called directly, so they can be graph-captured.

CuPy refuses any cuBLAS call while a stream is being captured. cuBLAS itself supports capture
when its workspace is preset (no allocation inside the graph), so RustyFlow keeps its own
handle bound to the backend's stream with a fixed workspace and calls
cublasGemmStridedBatchedEx for every matmul. Row-major arrays are handled by computing
C^T = B^T A^T in cuBLAS's column-major convention; transposed views are passed as op=T, so
`h @ W.T` (the tied LM head) needs no copy. A, B and C share one type, float32, float64,
float16 or bfloat16; 16-bit products accumulate in fp32.

The binding is NVIDIA's nvmath-python, its low-level `nvmath.bindings.cublas` (the C API one
to one, with the header's enums; it finds the library itself), imported on first use so the
package imports without it. Why not nvmath's high-level Matmul for these plain products: on
the H100 it chose a slower algorithm for the tied LM head's GEMM in a replayed graph, and its
eager calls cost the host more than the low-level binding's
(benchmarks/results/gemm-bindings-h100.md).
"""

from __future__ import annotations

import copy
import ctypes
import functools
import importlib
from types import ModuleType
from typing import Any, TypeVar

import numpy as np

from ....errors import install_command
from ...precision import MatmulCompute, dtype_name

WORKSPACE_BYTES = 32 * 2**20  # each handle's (cuBLAS's, cuBLASLt's): fixed, so graphs keep it
# nvmath.CudaDataType's name of each operand dtype (A, B and C share it; bfloat16 is
# ml_dtypes', matched by name so this module imports without it) and FP8 format
_CUDA_TYPES = {"float32": "CUDA_R_32F", "float64": "CUDA_R_64F", "float16": "CUDA_R_16F",
               "bfloat16": "CUDA_R_16BF", "e4m3": "CUDA_R_8F_E4M3", "e5m2": "CUDA_R_8F_E5M2"}


Handle = TypeVar("Handle")


def in_compute(handle: Handle, compute: MatmulCompute) -> Handle:
    """A cuBLAS or cuBLASLt handle with float32 GEMMs in `compute` (a run policy's): a view
    sharing the handle, its workspace and (cuBLASLt) its plans, whose keys hold their compute
    type, so no run's mode is ever set on a handle another run uses."""
    view = copy.copy(handle)
    view.matmul_compute = compute  # type: ignore[attr-defined]
    return view


@functools.cache
def binding(name: str) -> ModuleType:
    """nvmath.bindings.`name` (cublas or cublasLt); an error naming the extras without it."""
    try:
        return importlib.import_module(f"nvmath.bindings.{name}")
    except ImportError as exc:
        raise RuntimeError(
            f"the GPU's GEMMs call {name} through nvmath-python, which does not import "
            f"({exc}): {install_command('gpu')} for a CUDA 12 driver, "
            f"{install_command('cuda13')} for CUDA 13") from None


def cuda_types() -> dict[str, int]:
    """The cudaDataType_t of each supported dtype name, from nvmath's enum."""
    import nvmath

    return {k: int(getattr(nvmath.CudaDataType, v)) for k, v in _CUDA_TYPES.items()}


class Cublas:
    """A cuBLAS handle on one stream with a fixed workspace (a failing call raises
    nvmath's cuBLASError, naming its status)."""

    def __init__(self, xp: Any, stream: Any) -> None:
        self.xp = xp
        self.lib = lib = binding("cublas")
        self.handle = lib.create()
        lib.set_stream(self.handle, stream.ptr)
        self.workspace = xp.empty(WORKSPACE_BYTES, dtype=np.uint8)
        lib.set_workspace(self.handle, self.workspace.data.ptr, WORKSPACE_BYTES)
        self.matmul_compute: MatmulCompute = "fp32"  # Precision.matmul_compute: in_compute
        self._types = cuda_types()
        self._op_n, self._op_t = int(lib.Operation.N), int(lib.Operation.T)
        compute = lib.ComputeType
        self._compute_64f, self._compute_32f = int(compute.COMPUTE_64F), int(compute.COMPUTE_32F)
        self._compute_tf32 = int(compute.COMPUTE_32F_FAST_TF32)
        self._algo = int(lib.GemmAlgo.DEFAULT)
        # alpha and beta live on the host (the handle's default pointer mode), by address
        self._scalars = [ctypes.c_float(1.0), ctypes.c_float(0.0), ctypes.c_double(1.0),
                         ctypes.c_double(0.0)]
        self._one32, self._zero32, self._one64, self._zero64 = map(ctypes.addressof,
                                                                   self._scalars)

    def _operand(self, x: Any) -> tuple[Any, int, int]:
        """(array, op, leading dimension) of the last two axes in column-major terms."""
        r, c = x.shape[-2:]
        sr, sc = (s // x.itemsize for s in x.strides[-2:])
        if sc == 1 and sr >= max(c, 1):
            return x, self._op_n, sr
        if sr == 1 and sc >= max(r, 1):
            return x, self._op_t, sc
        x = self.xp.ascontiguousarray(x)
        return x, self._op_n, c

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
        if a.dtype != b.dtype or dtype_name(a.dtype) not in self._types:
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
        dtype = self._types[dtype_name(a.dtype)]
        double = a.dtype == np.float64
        tf32 = self.matmul_compute == "tf32" and a.dtype == np.float32 and not strict
        # 16-bit operands accumulate in fp32 (COMPUTE_32F, fp32 alpha and beta)
        compute = (self._compute_64f if double else self._compute_tf32 if tf32
                   else self._compute_32f)
        one, zero = (self._one64, self._zero64) if double else (self._one32, self._zero32)
        self.lib.gemm_strided_batched_ex(
            self.handle, op_b, op_a, n, m, k, one,
            b.data.ptr, dtype, ldb, stride_b, a.data.ptr, dtype, lda, stride_a,
            zero, out.data.ptr, dtype, n, m * n, count, compute, self._algo)
        return out
