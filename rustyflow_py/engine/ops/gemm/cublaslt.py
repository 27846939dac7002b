"""GEMMs with fused epilogues through cuBLASLt called directly (ctypes), graph-capturable.

Why: a Linear layer's bias add, the MLP's bias + GELU and the bias gradient are each a full
extra pass over an activation-sized array when done after the GEMM (read it, write it back,
or read it once more for the column sums). cuBLASLt's epilogues do them in the GEMM's own
epilogue while the tile is still in registers:

- BIAS:           y = x @ w + b
- GELU_AUX_BIAS:  y = gelu_tanh(x @ w + b), the pre-activation x @ w + b also written (for
                  backward); GELU_BIAS when no pre-activation is wanted (no grad)
- BGRADA:         dW = x.T @ g together with db = the column sums of g (measured, not used:
                  see matmul_bgrad)

CuPy refuses cuBLAS calls while a stream is being captured, and has no cuBLASLt epilogue API,
so, like cublas.py, RustyFlow binds the library itself: the libcublasLt that CuPy's libcublas
already loaded (found in /proc/self/maps), a fixed workspace handed to every call, every call on
the backend's stream, no host synchronisation and no allocation outside CuPy's `xp.empty`.

Why not NVIDIA's nvmath-python (`nvmath.linalg.advanced.Matmul`), the maintained binding:
it was measured against this one on an H100 (benchmarks/gemm_bindings.py, results in
benchmarks/results/gemm-bindings-h100.md). It computes the same epilogue GEMMs to the bit,
captures into a CUDA graph, and replays them in the same device time, but each eager call
costs the host well over this binding's time (its per-call operand checks, result and
auxiliary allocation, even with `reset_operands_unchecked`), and an eager step calls a GEMM
dozens of times. So this hand-written binding stays until nvmath's per-call cost does not.

Each distinct problem (shapes, strides, dtypes, compute mode, epilogue, pointer alignments) gets
a plan once: a matmul descriptor, the matrix layouts and the algorithm that
cublasLtMatmulAlgoGetHeuristic picks. Planning must not happen inside a CUDA graph capture, so
the first call of each problem must be eager; RustyFlow's trainer runs eager warm-up steps
before it captures, which satisfies that. A first call during capture raises
`CublasLtUnsupported` (a ValueError) before touching the stream, so callers fall back to the
plain path and the capture stays valid.

Row-major arrays use the same trick as cublas.py: cuBLASLt is column-major, and a row-major
(r, c) array is the column-major (c x r) matrix of the same memory. So for row-major
out (M, N) = a (M, K) @ b (K, N) we ask cuBLASLt for D = out^T (N x M) = b^T (N x K) @ a^T
(K x M): its A is our b, its B is our a, and its (m, n, k) = (N, M, K). A transposed view is
passed with op=T instead of being copied.

Unsupported dtypes, shapes or layouts raise `CublasLtUnsupported` (a ValueError): callers fall
back to the plain GEMM + elementwise path. A failing cuBLASLt call raises `CublasLtError`
naming the call and the status.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
from typing import Any

import numpy as np

from ...precision import MatmulCompute, dtype_name

# ---- C enum values (cublasLt.h, cublas_api.h, library_types.h; CUDA 12.x and 13.x agree) ----
# cublasOperation_t
OP_N, OP_T = 0, 1
# cudaDataType_t of each supported storage dtype, matched by name so this module imports
# without ml_dtypes (bfloat16): CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF.
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUDA_TYPES = {"float32": CUDA_R_32F, "float16": CUDA_R_16F, "bfloat16": CUDA_R_16BF}
# cublasComputeType_t
COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 68, 77

# cublasLtMatmulDescAttributes_t (CUBLASLT_MATMUL_DESC_*)
DESC_TRANSA = 3  # int32_t (cublasOperation_t)
DESC_TRANSB = 4  # int32_t (cublasOperation_t)
DESC_EPILOGUE = 7  # uint32_t (cublasLtEpilogue_t)
DESC_BIAS_POINTER = 8  # void*: the bias (BIAS*) or where the bias gradient goes (*BGRAD*)
DESC_EPILOGUE_AUX_POINTER = 11  # void*: the GELU input, written (GELU_AUX*)
DESC_EPILOGUE_AUX_LD = 12  # int64_t: its leading dimension, a multiple of 8, >= D's rows
# CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE (26) and _EPILOGUE_AUX_DATA_TYPE (22) are left at their
# default (-1), which means "the type of D" for non-fp8 GEMMs: bias, bias gradient and GELU
# input all have the output's dtype here.

# cublasLtEpilogue_t (CUBLASLT_EPILOGUE_*), built from the header's bit flags
EPILOGUE_DEFAULT = 1
EPILOGUE_BIAS = 4
EPILOGUE_GELU = 32
EPILOGUE_AUX = 128  # "also write/read the auxiliary matrix" bit
EPILOGUE_GELU_BIAS = EPILOGUE_GELU | EPILOGUE_BIAS  # 36
EPILOGUE_GELU_AUX_BIAS = EPILOGUE_GELU | EPILOGUE_AUX | EPILOGUE_BIAS  # 164
EPILOGUE_BGRADA = 256  # bias gradient of cuBLASLt's A: its rows summed over k
EPILOGUE_BGRADB = 512  # bias gradient of cuBLASLt's B: its columns summed over k (unused)

# cublasLtMatmulPreferenceAttributes_t (CUBLASLT_MATMUL_PREF_*)
PREF_MAX_WORKSPACE_BYTES = 1  # uint64_t
PREF_MIN_ALIGNMENT_A_BYTES = 5  # uint32_t, default 256
PREF_MIN_ALIGNMENT_B_BYTES = 6
PREF_MIN_ALIGNMENT_C_BYTES = 7
PREF_MIN_ALIGNMENT_D_BYTES = 8

# The C type of each attribute we set (SetAttribute checks the size it is handed).
DESC_ATTR_CTYPES: dict[int, Any] = {
    DESC_TRANSA: ctypes.c_int32,
    DESC_TRANSB: ctypes.c_int32,
    DESC_EPILOGUE: ctypes.c_uint32,
    DESC_BIAS_POINTER: ctypes.c_void_p,
    DESC_EPILOGUE_AUX_POINTER: ctypes.c_void_p,
    DESC_EPILOGUE_AUX_LD: ctypes.c_int64,
}
PREF_ATTR_CTYPES: dict[int, Any] = {
    PREF_MAX_WORKSPACE_BYTES: ctypes.c_uint64,
    PREF_MIN_ALIGNMENT_A_BYTES: ctypes.c_uint32,
    PREF_MIN_ALIGNMENT_B_BYTES: ctypes.c_uint32,
    PREF_MIN_ALIGNMENT_C_BYTES: ctypes.c_uint32,
    PREF_MIN_ALIGNMENT_D_BYTES: ctypes.c_uint32,
}

# cublasStatus_t names, for error messages
STATUS_NOT_SUPPORTED = 15
STATUS_NAMES = {
    0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED",
    3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
    8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
    15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR",
}

WORKSPACE_BYTES = 32 * 2**20
MAX_ALIGNMENT = 256  # bytes; cuBLASLt's default (and largest) alignment assumption
_HEURISTIC_RESULTS = 8
AUX_LD_MULTIPLE = 8  # EPILOGUE_AUX_LD: "must be divisible by 8" for the GELU input


class CublasLtError(RuntimeError):
    """A cuBLASLt call returned a status other than CUBLAS_STATUS_SUCCESS."""


class CublasLtUnsupported(ValueError):
    """This problem cannot go through a cuBLASLt epilogue (dtype, shape, layout, no algorithm,
    first call during capture): use the plain path instead."""


class MatmulAlgo(ctypes.Structure):
    """cublasLtMatmulAlgo_t: `uint64_t data[8]`, opaque."""

    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t (96 bytes)."""

    _fields_ = [
        ("algo", MatmulAlgo),
        ("workspaceSize", ctypes.c_size_t),
        ("state", ctypes.c_int),  # cublasStatus_t
        ("wavesCount", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def status_name(status: int) -> str:
    return STATUS_NAMES.get(status, f"unknown status {status}")


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} failed with {status_name(status)} ({status})")


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the signatures we call (64-bit pointers must not be truncated to int)."""
    vp, i32, u64, i64, sz = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64,
                             ctypes.c_size_t)
    pvp = ctypes.POINTER(ctypes.c_void_p)
    signatures: dict[str, list[Any]] = {
        "cublasLtCreate": [pvp],
        "cublasLtDestroy": [vp],
        # (desc*, cublasComputeType_t, cudaDataType_t scaleType)
        "cublasLtMatmulDescCreate": [pvp, i32, i32],
        "cublasLtMatmulDescDestroy": [vp],
        # (desc, attr, const void* buf, size_t sizeInBytes)
        "cublasLtMatmulDescSetAttribute": [vp, i32, vp, sz],
        # (layout*, cudaDataType, uint64 rows, uint64 cols, int64 ld)
        "cublasLtMatrixLayoutCreate": [pvp, i32, u64, u64, i64],
        "cublasLtMatrixLayoutDestroy": [vp],
        "cublasLtMatmulPreferenceCreate": [pvp],
        "cublasLtMatmulPreferenceDestroy": [vp],
        "cublasLtMatmulPreferenceSetAttribute": [vp, i32, vp, sz],
        # (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, pref, requestedAlgoCount, results[],
        #  int* returnAlgoCount)
        "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, i32,
                                           ctypes.POINTER(HeuristicResult),
                                           ctypes.POINTER(ctypes.c_int)],
        # (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo*,
        #  workspace, workspaceSizeInBytes, stream)
        "cublasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp,
                           ctypes.POINTER(MatmulAlgo), vp, sz, vp],
    }
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int  # cublasStatus_t
    lib.cublasLtGetVersion.argtypes = []
    lib.cublasLtGetVersion.restype = ctypes.c_size_t
    return lib


@functools.cache
def _library() -> ctypes.CDLL:
    """The libcublasLt that CuPy's libcublas loaded (same CUDA runtime), found in the process
    maps; failing that, the system's."""
    try:
        import cupy
    except ImportError as exc:
        raise CublasLtError("cuBLASLt epilogues need CuPy") from exc
    cupy.cuda.device.get_cublas_handle()  # makes CuPy load libcublas, which loads libcublasLt
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "libcublasLt.so" in line})
    if paths:
        return _bind(ctypes.CDLL(paths[0]))
    tried = [name for name in (ctypes.util.find_library("cublasLt"), "libcublasLt.so.13",
                               "libcublasLt.so.12", "libcublasLt.so") if name]
    for name in tried:
        try:
            return _bind(ctypes.CDLL(name))
        except OSError:
            continue
    raise CublasLtError("libcublasLt is not loaded in this process (CuPy's libcublas should "
                        f"have loaded it) and none of {tried} could be loaded")


def lt_layout(shape: tuple[int, ...], strides: tuple[int, ...],
              itemsize: int) -> tuple[int, int, int, int] | None:
    """How cuBLASLt sees a row-major 2-D array X (r, c) as the column-major operand X^T (c x r):
    (op, rows, cols, ld) of the stored column-major matrix, or None when X needs a copy.

    Unit column stride: the memory is the column-major (c x r) matrix X^T, ld = the row stride,
    op N. Unit row stride (a transposed view): the memory is the column-major (r x c) matrix X,
    ld = the column stride, op T."""
    r, c = shape
    if any(s % itemsize for s in strides):
        return None
    sr, sc = (s // itemsize for s in strides)
    if sc == 1 and sr >= max(c, 1):
        return OP_N, c, r, sr
    if sr == 1 and sc >= max(r, 1):
        return OP_T, r, c, sc
    return None


def alignment(ptr: int) -> int:
    """The largest power of two (at most 256) that divides a device address: cuBLASLt picks
    vectorised algorithms by it, so plans are keyed on it."""
    if ptr == 0:
        return MAX_ALIGNMENT
    return min(MAX_ALIGNMENT, ptr & -ptr)


# The address the heuristic is shown for an array allocated or copied only after planning (it
# reads pointers for their alignment, never dereferences them, and refuses NULL for some
# epilogues): fresh CuPy allocations are aligned to at least 256 bytes. Every call sets the
# real pointers before cublasLtMatmul.
_PLACEHOLDER_PTR = MAX_ALIGNMENT


@dataclasses.dataclass(frozen=True)
class _Alloc:
    """An output to allocate (xp.empty) once the problem has a plan."""

    shape: tuple[int, ...]
    dtype: Any


def _ptr(x: Any) -> int:
    """x's device address: 0 for None, _PLACEHOLDER_PTR for an array not allocated yet."""
    if x is None:
        return 0
    return _PLACEHOLDER_PTR if isinstance(x, _Alloc) else int(x.data.ptr)


@dataclasses.dataclass
class _Plan:
    """The descriptor, layouts (cuBLASLt's A, B, D; C shares D's) and algorithm of a problem."""

    desc: ctypes.c_void_p
    layout_a: ctypes.c_void_p
    layout_b: ctypes.c_void_p
    layout_d: ctypes.c_void_p
    algo: MatmulAlgo
    workspace_size: int


# ---- operand checks (pure: they raise CublasLtUnsupported for what cuBLASLt cannot take) --
def _rows(x: Any, name: str) -> Any:
    """x as a 2-D (rows, last axis) operand."""
    if x.ndim < 2:
        raise CublasLtUnsupported(f"{name} must have 2 or more axes, not shape {x.shape}")
    return x if x.ndim == 2 else x.reshape(-1, x.shape[-1])


def _dtype(what: str, *arrays: Any) -> Any:
    dtype = arrays[0].dtype
    if any(a.dtype != dtype for a in arrays):
        raise CublasLtUnsupported(f"{what}: mixed dtypes {[str(a.dtype) for a in arrays]}")
    if dtype_name(dtype) not in CUDA_TYPES:
        raise CublasLtUnsupported(f"{what}: dtype {dtype} is not float32, float16 or "
                                  "bfloat16")
    return dtype


def _out_dtype(what: str, in_dtype: Any, out_dtype: Any, *outs: Any) -> Any:
    """The output dtype: the inputs', or float32 for 16-bit inputs if asked (by
    `out_dtype` or by the given output buffers)."""
    given = {o.dtype for o in outs if o is not None}
    if out_dtype is not None:
        given.add(np.dtype(out_dtype))
    if len(given) > 1:
        raise CublasLtUnsupported(f"{what}: output dtypes disagree: {sorted(map(str, given))}")
    dtype = given.pop() if given else in_dtype
    if dtype != in_dtype and not (dtype_name(dtype) == "float32" and in_dtype.itemsize == 2):
        raise CublasLtUnsupported(f"{what}: {in_dtype} inputs cannot give {dtype} outputs")
    return dtype


def _check_out(out: Any, shape: tuple[int, ...], dtype: Any, what: str, name: str) -> None:
    if out is None:
        return
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise CublasLtUnsupported(f"{what}: {name} must be C-contiguous {shape} {dtype}, "
                                  f"not {out.shape} {out.dtype}")


def _layout(x: Any, *, untransposed: bool = False) -> tuple[tuple[int, int, int, int],
                                                            int, bool]:
    """(cuBLASLt layout, pointer alignment, needs a copy) of operand x. When its strides
    fit no layout (or `untransposed` asks for op N and it would be op T) these describe
    the C-contiguous copy that replaces it, made only once the problem has a plan."""
    layout = lt_layout(x.shape, x.strides, x.itemsize)
    if layout is None or (untransposed and layout[0] != OP_N):
        r, c = x.shape
        return (OP_N, c, r, c), MAX_ALIGNMENT, True
    return layout, alignment(x.data.ptr), False


def _destroy_plan(lib: ctypes.CDLL, plan: _Plan) -> None:
    lib.cublasLtMatmulDescDestroy(plan.desc)
    for layout in (plan.layout_a, plan.layout_b, plan.layout_d):
        lib.cublasLtMatrixLayoutDestroy(layout)


def _set_desc(lib: ctypes.CDLL, desc: ctypes.c_void_p, attr: int, value: int) -> None:
    buf = DESC_ATTR_CTYPES[attr](value)
    _check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(buf),
                                              ctypes.sizeof(buf)),
           f"cublasLtMatmulDescSetAttribute({attr})")


def _layout_desc(lib: ctypes.CDLL, created: list[tuple[str, ctypes.c_void_p]], dtype: int,
                 rows: int, cols: int, ld: int) -> ctypes.c_void_p:
    """A cuBLASLt matrix layout, listed in `created` so that a failure later destroys it."""
    layout = ctypes.c_void_p()
    _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), dtype, rows, cols, ld),
           "cublasLtMatrixLayoutCreate")
    created.append(("cublasLtMatrixLayoutDestroy", layout))
    return layout


def _compute(dtype: Any, matmul_compute: MatmulCompute) -> int:
    """The cuBLASLt compute type of operands of `dtype`."""
    if dtype_name(dtype) == "float32" and matmul_compute == "tf32":
        return COMPUTE_32F_FAST_TF32
    return COMPUTE_32F


class CublasLt:
    """A cuBLASLt handle whose GEMMs run on `stream` with a fixed 32 MiB workspace.

    Methods take row-major CuPy arrays and return (or fill `out=`, C-contiguous) the results.
    `matmul_compute` ("fp32" or "tf32", like Cublas.matmul_compute) picks CUBLAS_COMPUTE_32F or
    CUBLAS_COMPUTE_32F_FAST_TF32 for float32 operands; float16 and bfloat16 operands always
    accumulate in fp32 (CUBLAS_COMPUTE_32F, fp32 alpha and beta).
    """

    def __init__(self, xp: Any, stream: Any) -> None:
        self.xp = xp
        self.stream = stream
        self.lib = _library()
        self.version = int(self.lib.cublasLtGetVersion())
        self.handle = ctypes.c_void_p()
        _check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.workspace = xp.empty(WORKSPACE_BYTES, dtype="uint8")  # kept alive with us
        self.pref = ctypes.c_void_p()
        _check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(self.pref)),
               "cublasLtMatmulPreferenceCreate")
        self._set_pref(PREF_MAX_WORKSPACE_BYTES, WORKSPACE_BYTES)
        self.matmul_compute: MatmulCompute = "fp32"  # Precision.matmul_compute: in_compute
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)  # scale type 32F
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        self._refused: dict[tuple[Any, ...], str] = {}

    # ---- public GEMMs ---------------------------------------------------------------------
    def matmul_bias(self, x: Any, w: Any, bias: Any, *, gelu: bool = False, out: Any = None,
                    pre_gelu_out: Any = None, residual: Any = None) -> Any:
        """y = x @ w + bias (epilogue BIAS), or y = gelu_tanh(x @ w + bias) (GELU_BIAS), with
        the pre-activation x @ w + bias also written to `pre_gelu_out` when given
        (GELU_AUX_BIAS) for backward. x (..., K) row-major, w (K, N) (a transposed view is
        fine), bias (N,); y and pre_gelu_out (..., N), all of one dtype. Without GELU, a
        C-contiguous `residual` (..., N) is added too, as the GEMM's C with beta = 1: a
        residual block's projection and its add in one pass."""
        x2 = _rows(x, "x")
        k = x2.shape[1]
        if w.ndim != 2 or w.shape[0] != k:
            raise CublasLtUnsupported(f"matmul_bias: w {w.shape} does not fit x {x.shape}")
        n = w.shape[1]
        dtype = _dtype("matmul_bias", x, w, bias)
        if bias.shape != (n,):
            raise CublasLtUnsupported(f"matmul_bias: bias {bias.shape}, expected ({n},)")
        if pre_gelu_out is not None and not gelu:
            raise CublasLtUnsupported("matmul_bias: pre_gelu_out needs gelu=True")
        if pre_gelu_out is not None and n % AUX_LD_MULTIPLE:
            raise CublasLtUnsupported(f"matmul_bias: GELU_AUX_BIAS needs N % 8 == 0, N = {n}")
        if residual is not None and gelu:
            raise CublasLtUnsupported("matmul_bias: a residual is added after the bias, not "
                                      "under a GELU")
        shape = (*x.shape[:-1], n)
        _check_out(out, shape, dtype, "matmul_bias", "out")
        _check_out(residual, shape, dtype, "matmul_bias", "residual")
        _check_out(pre_gelu_out, shape, dtype, "matmul_bias", "pre_gelu_out")
        if pre_gelu_out is not None:
            epilogue = EPILOGUE_GELU_AUX_BIAS
        else:
            epilogue = EPILOGUE_GELU_BIAS if gelu else EPILOGUE_BIAS
        aux = None if pre_gelu_out is None else pre_gelu_out.reshape(-1, n)
        y, _ = self._gemm(x2, w, _Alloc((x2.shape[0], n), dtype) if out is None
                          else out.reshape(-1, n), epilogue, bias=bias, aux=aux,
                          c=None if residual is None else residual.reshape(-1, n))
        return y.reshape(shape) if out is None else out

    def matmul_into(self, a: Any, b: Any, out: Any, *, accumulate: bool = False) -> Any:
        """out (M, N) = a (M, K) @ b (K, N), or out += a @ b with `accumulate` (beta = 1: a
        gradient added into its float32 buffer inside the GEMM, not by a pass of its own).
        a and b of one dtype (either may be a transposed view); out C-contiguous, of their
        dtype or float32 for 16-bit inputs."""
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise CublasLtUnsupported(f"matmul_into: a {a.shape} does not fit b {b.shape}")
        in_dtype = _dtype("matmul_into", a, b)
        dtype = _out_dtype("matmul_into", in_dtype, None, out)
        _check_out(out, (a.shape[0], b.shape[1]), dtype, "matmul_into", "out")
        return self._gemm(a, b, out, EPILOGUE_DEFAULT, accumulate=accumulate)[0]

    def matmul_bgrad(self, a_t: Any, g: Any, *, out: Any = None, bias_grad_out: Any = None,
                     out_dtype: Any = None) -> tuple[Any, Any]:
        """(dW, db) = (a_t @ g, column sums of g): a Linear layer's weight and bias gradients in
        one GEMM (epilogue BGRADA). The Linear layers no longer use it (cuBLASLt ran the
        column sums as a pass of its own, slower than a ones-GEMM, and cannot add db into a
        buffer); benchmarks/bias_grads.py measures it against what they use. a_t (K, M) is
        the layer input transposed (pass x.T, a view: no copy), g (..., N) the output gradient
        with M rows in all; dW (K, N), db (N,).

        dW and db have g's dtype, or `out_dtype` (float32 for 16-bit inputs: fp32 gradients
        straight from the GEMM); `out` and `bias_grad_out` must agree with it.

        Which epilogue: cuBLASLt computes D = dW^T (N x K) = g^T (N x M) @ a_t^T (M x K), so
        its A is g^T (op N on g's row-major memory) and the reduction dimension k is M.
        BGRADA sums A over k, giving a vector of D's rows count N: sum over rows of g, the
        column sums we want. (BGRADB would sum B = a_t^T over k: the row sums of a_t.) BGRADA
        needs A untransposed, so g must have unit column stride (it is copied otherwise).
        """
        g2 = _rows(g, "g")
        m, n = g2.shape
        if a_t.ndim != 2 or a_t.shape[1] != m:
            raise CublasLtUnsupported(f"matmul_bgrad: a_t {a_t.shape} does not fit g {g.shape}")
        k = a_t.shape[0]
        in_dtype = _dtype("matmul_bgrad", a_t, g)
        dtype = _out_dtype("matmul_bgrad", in_dtype, out_dtype, out, bias_grad_out)
        _check_out(out, (k, n), dtype, "matmul_bgrad", "out")
        _check_out(bias_grad_out, (n,), dtype, "matmul_bgrad", "bias_grad_out")
        return self._gemm(a_t, g2, _Alloc((k, n), dtype) if out is None else out,
                          EPILOGUE_BGRADA,
                          bias=_Alloc((n,), dtype) if bias_grad_out is None else bias_grad_out,
                          lt_a_untransposed=True)

    def close(self) -> None:
        """Destroy the plans, the preference and the handle (the object is unusable after)."""
        for plan in self._plans.values():
            _destroy_plan(self.lib, plan)
        self._plans.clear()
        if self.pref:
            self.lib.cublasLtMatmulPreferenceDestroy(self.pref)
            self.pref = ctypes.c_void_p()
        if self.handle:
            self.lib.cublasLtDestroy(self.handle)
            self.handle = ctypes.c_void_p()

    # ---- internals ------------------------------------------------------------------------
    def _gemm(self, a: Any, b: Any, out: Any, epilogue: int, *, bias: Any = None,
              aux: Any = None, lt_a_untransposed: bool = False,
              accumulate: bool = False, c: Any = None) -> tuple[Any, Any]:
        """out (M, N) = a (M, K) @ b (K, N) with `epilogue`, row-major; returns (out, bias).
        beta = 1 adds C: out itself with `accumulate` (C = D), or `c` (out's shape, dtype and
        layout) when given.

        In cuBLASLt's column-major terms D = out^T = b^T @ a^T: its A is our b, its B is our
        a, and (m, n, k) = (N, M, K). `bias` is the BIAS_POINTER vector (read by the BIAS
        epilogues, written by the BGRAD ones), `aux` the GELU input matrix (out's shape,
        C-contiguous). `out` and a written `bias` may be `_Alloc`s: they, and any operand
        copies, are allocated only after the plan exists, so a refused call (e.g. one first
        seen during a capture) has touched neither the stream nor the memory pool."""
        m_rows, k = a.shape
        n = b.shape[1]
        if m_rows == 0 or n == 0 or k == 0:
            raise CublasLtUnsupported(f"empty GEMM ({m_rows}, {k}) @ ({k}, {n})")
        layout_a, align_a, copy_a = _layout(b, untransposed=lt_a_untransposed)
        layout_b, align_b, copy_b = _layout(a)
        bias_copy = (bias is not None and not isinstance(bias, _Alloc)
                     and not bias.flags.c_contiguous)
        bias_ptr = _PLACEHOLDER_PTR if bias_copy else _ptr(bias)
        aux_ptr = _ptr(aux)
        in_type, out_type = CUDA_TYPES[dtype_name(a.dtype)], CUDA_TYPES[dtype_name(out.dtype)]
        align_c = alignment(_ptr(out if c is None else c))
        key = (epilogue, n, m_rows, k, in_type, out_type, _compute(a.dtype, self.matmul_compute),
               layout_a, layout_b, n if aux is not None else 0,
               align_a, align_b, alignment(_ptr(out)), alignment(bias_ptr), alignment(aux_ptr),
               align_c)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(key, bias_ptr, aux_ptr)
        # the plan exists: now copy and allocate
        lt_a = self.xp.ascontiguousarray(b) if copy_a else b
        lt_b = self.xp.ascontiguousarray(a) if copy_b else a
        if isinstance(out, _Alloc):
            out = self.xp.empty(out.shape, dtype=out.dtype)
        if isinstance(bias, _Alloc):
            bias = self.xp.empty(bias.shape, dtype=bias.dtype)
        elif bias_copy:
            bias = self.xp.ascontiguousarray(bias)
        if bias is not None:
            _set_desc(self.lib, plan.desc, DESC_BIAS_POINTER, bias.data.ptr)
        if aux is not None:
            _set_desc(self.lib, plan.desc, DESC_EPILOGUE_AUX_POINTER, aux.data.ptr)
        # beta = 0: C (= D) is not read; beta = 1: the product is added to C, out or `c`
        _check(self.lib.cublasLtMatmul(
            self.handle, plan.desc, ctypes.byref(self._one),
            lt_a.data.ptr, plan.layout_a, lt_b.data.ptr, plan.layout_b,
            ctypes.byref(self._one if accumulate or c is not None else self._zero),
            (out if c is None else c).data.ptr, plan.layout_d, out.data.ptr, plan.layout_d,
            ctypes.byref(plan.algo), self.workspace.data.ptr, WORKSPACE_BYTES, self.stream.ptr,
        ), f"cublasLtMatmul (epilogue {epilogue}, m={n} n={m_rows} k={k})")
        return out, bias

    def _plan(self, key: tuple[Any, ...], bias_ptr: int, aux_ptr: int) -> _Plan:
        """Create the descriptor and layouts of `key` and ask the heuristic for an algorithm
        (once: a refusal is remembered too)."""
        if key in self._refused:
            raise CublasLtUnsupported(self._refused[key])
        if self.stream.is_capturing():
            raise CublasLtUnsupported(
                "cuBLASLt problem first seen during CUDA graph capture: its plan (heuristic "
                "query) must be made by an eager call of the same shapes before capturing")
        (epilogue, m, n, k, in_type, out_type, compute, layout_a, layout_b, aux_ld,
         align_a, align_b, align_d, _align_bias, _align_aux, align_c) = key
        created: list[tuple[str, ctypes.c_void_p]] = []
        try:
            desc = ctypes.c_void_p()
            _check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), compute, CUDA_R_32F),
                   "cublasLtMatmulDescCreate")
            created.append(("cublasLtMatmulDescDestroy", desc))
            _set_desc(self.lib, desc, DESC_TRANSA, layout_a[0])
            _set_desc(self.lib, desc, DESC_TRANSB, layout_b[0])
            _set_desc(self.lib, desc, DESC_EPILOGUE, epilogue)
            # The heuristic reads these pointers' values for their alignment, so it sees the
            # real ones (later calls with the same alignments, which the key holds, swap in
            # their own pointers).
            if bias_ptr:
                _set_desc(self.lib, desc, DESC_BIAS_POINTER, bias_ptr)
            if aux_ld:
                _set_desc(self.lib, desc, DESC_EPILOGUE_AUX_LD, aux_ld)
                _set_desc(self.lib, desc, DESC_EPILOGUE_AUX_POINTER, aux_ptr)
            layout_a_desc, layout_b_desc, layout_d_desc = (
                _layout_desc(self.lib, created, dtype, rows, cols, ld)
                for dtype, (_op, rows, cols, ld) in ((in_type, layout_a), (in_type, layout_b),
                                                     (out_type, (OP_N, m, n, m))))
            self._set_pref(PREF_MIN_ALIGNMENT_A_BYTES, align_a)
            self._set_pref(PREF_MIN_ALIGNMENT_B_BYTES, align_b)
            self._set_pref(PREF_MIN_ALIGNMENT_C_BYTES, align_c)
            self._set_pref(PREF_MIN_ALIGNMENT_D_BYTES, align_d)
            results = (HeuristicResult * _HEURISTIC_RESULTS)()
            count = ctypes.c_int(0)
            status = self.lib.cublasLtMatmulAlgoGetHeuristic(
                self.handle, desc, layout_a_desc, layout_b_desc, layout_d_desc, layout_d_desc,
                self.pref, _HEURISTIC_RESULTS, results, ctypes.byref(count))
            if status not in (0, STATUS_NOT_SUPPORTED):
                _check(status, "cublasLtMatmulAlgoGetHeuristic")
            usable = [r for r in results[: count.value]
                      if r.state == 0 and r.workspaceSize <= WORKSPACE_BYTES]
            if status == STATUS_NOT_SUPPORTED or not usable:
                message = (f"cuBLASLt has no algorithm for epilogue {epilogue}, (m, n, k) = "
                           f"({m}, {n}, {k}), types {in_type}->{out_type}, compute {compute}, "
                           f"ops {layout_a[0]}/{layout_b[0]}, alignments {key[-6:]} "
                           f"(heuristic: {status_name(status)}, {count.value} results)")
                self._refused[key] = message
                raise CublasLtUnsupported(message)
            best = usable[0]
        except BaseException:
            for destroy, obj in reversed(created):
                getattr(self.lib, destroy)(obj)
            raise
        plan = _Plan(desc, layout_a_desc, layout_b_desc, layout_d_desc,
                     MatmulAlgo.from_buffer_copy(best.algo), int(best.workspaceSize))
        self._plans[key] = plan
        return plan

    def _set_pref(self, attr: int, value: int) -> None:
        buf = PREF_ATTR_CTYPES[attr](value)
        _check(self.lib.cublasLtMatmulPreferenceSetAttribute(self.pref, attr, ctypes.byref(buf),
                                                             ctypes.sizeof(buf)),
               f"cublasLtMatmulPreferenceSetAttribute({attr})")
