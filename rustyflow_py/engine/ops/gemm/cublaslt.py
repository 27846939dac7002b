"""GEMMs with fused epilogues through cuBLASLt called directly, graph-capturable.

Why: a Linear layer's bias add and the MLP's bias + GELU are each a full extra pass over an
activation-sized array when done after the GEMM (read it, write it back). cuBLASLt's
epilogues do them in the GEMM's own epilogue while the tile is still in registers:

- BIAS:           y = x @ w + b
- GELU_AUX_BIAS:  y = gelu_tanh(x @ w + b), the pre-activation x @ w + b also written (for
                  backward); GELU_BIAS when no pre-activation is wanted (no grad)

CuPy refuses cuBLAS calls while a stream is being captured, and has no cuBLASLt epilogue API,
so RustyFlow calls the library itself, through NVIDIA's nvmath-python low-level binding
`nvmath.bindings.cublasLt` (the C API one to one, its enums and structs from the header; it
finds the library itself): a fixed workspace handed to every call, every call on the
backend's stream, no host synchronisation and no allocation outside CuPy's `xp.empty`.

Why not nvmath's high-level `nvmath.linalg.advanced.Matmul`: it computes the same epilogue
GEMMs to the bit and replays them in the same device time, but each eager call costs the host
well over a direct call (its per-call operand checks, result and auxiliary allocation, even
with `reset_operands_unchecked`), and an eager step calls a GEMM dozens of times
(benchmarks/gemm_bindings.py; benchmarks/results/gemm-bindings-h100.md).

Each distinct problem (shapes, strides, dtypes, compute mode, epilogue, pointer alignments) gets
a plan once: a matmul descriptor, the matrix layouts and the algorithm that
cublasLtMatmulAlgoGetHeuristic picks. Planning must not happen inside a CUDA graph capture, so
the first call of each problem must be eager; RustyFlow's trainer runs eager warm-up steps
before it captures, which satisfies that. An FP8 problem's plan also times the candidates
then, and keeps the fastest (`matmul_fp8`). A first call during capture raises
`CublasLtUnsupported` (a ValueError) before touching the stream, so callers fall back to the
plain path and the capture stays valid.

Row-major arrays use the same trick as cublas.py: cuBLASLt is column-major, and a row-major
(r, c) array is the column-major (c x r) matrix of the same memory. So for row-major
out (M, N) = a (M, K) @ b (K, N) we ask cuBLASLt for D = out^T (N x M) = b^T (N x K) @ a^T
(K x M): its A is our b, its B is our a, and its (m, n, k) = (N, M, K). A transposed view is
passed with op=T instead of being copied.

Unsupported dtypes, shapes or layouts raise `CublasLtUnsupported` (a ValueError): callers fall
back to the plain GEMM + elementwise path. A failing cuBLASLt call raises nvmath's
`cuBLASLtError`, naming the status.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ...devices import device_time
from ...precision import MatmulCompute, dtype_name
from ..fp8.formats import Fp8Tensor
from .cublas import WORKSPACE_BYTES, binding, cuda_types

MAX_ALIGNMENT = 256  # bytes; cuBLASLt's default (and largest) alignment assumption
_HEURISTIC_RESULTS = 8
AUX_LD_MULTIPLE = 8  # EPILOGUE_AUX_LD: "must be divisible by 8" for the GELU input


@dataclasses.dataclass(frozen=True)
class Fp8Operands:
    """What an FP8 GEMM adds to a problem: the cudaDataType_t of each operand's codes, the
    device addresses of their float32 read-back factors, and whether the tensor cores may
    accumulate without their periodic promotion to full fp32 (FAST_ACCUM)."""

    type_a: int
    type_b: int
    scale_a: int
    scale_b: int
    fast_accum: bool


class CublasLtUnsupported(ValueError):
    """This problem cannot go through a cuBLASLt epilogue (dtype, shape, layout, no algorithm,
    first call during capture): use the plain path instead."""


def lt_layout(shape: tuple[int, ...], strides: tuple[int, ...],
              itemsize: int) -> tuple[bool, int, int, int] | None:
    """How cuBLASLt sees a row-major 2-D array X (r, c) as the column-major operand X^T (c x r):
    (transposed, rows, cols, ld) of the stored column-major matrix (transposed: op T), or None
    when X needs a copy.

    Unit column stride: the memory is the column-major (c x r) matrix X^T, ld = the row stride,
    op N. Unit row stride (a transposed view): the memory is the column-major (r x c) matrix X,
    ld = the column stride, op T."""
    r, c = shape
    if any(s % itemsize for s in strides):
        return None
    sr, sc = (s // itemsize for s in strides)
    if sc == 1 and sr >= max(c, 1):
        return False, c, r, sr
    if sr == 1 and sc >= max(r, 1):
        return True, r, c, sc
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

    desc: int
    layout_a: int
    layout_b: int
    layout_d: int
    results: Any  # the heuristic's results (MatmulHeuristicResult), kept: the algorithm's home
    algo: int  # the chosen algorithm's address in them
    usable: tuple[int, ...]  # the results this problem can run, the heuristic's order (its first)


# ---- operand checks (pure: they raise CublasLtUnsupported for what cuBLASLt cannot take) --
def _rows(x: Any, name: str) -> Any:
    """x as a 2-D (rows, last axis) operand."""
    if x.ndim < 2:
        raise CublasLtUnsupported(f"{name} must have 2 or more axes, not shape {x.shape}")
    return x if x.ndim == 2 else x.reshape(-1, x.shape[-1])


def _out_dtype(what: str, in_dtype: Any, out: Any) -> Any:
    """The output dtype: the inputs', or float32 for 16-bit inputs when `out` is float32."""
    dtype = out.dtype
    if dtype != in_dtype and not (dtype_name(dtype) == "float32" and in_dtype.itemsize == 2):
        raise CublasLtUnsupported(f"{what}: {in_dtype} inputs cannot give {dtype} outputs")
    return dtype


def _check_out(out: Any, shape: tuple[int, ...], dtype: Any, what: str, name: str) -> None:
    if out is None:
        return
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise CublasLtUnsupported(f"{what}: {name} must be C-contiguous {shape} {dtype}, "
                                  f"not {out.shape} {out.dtype}")


def _layout(x: Any) -> tuple[tuple[bool, int, int, int], int, bool]:
    """(cuBLASLt layout, pointer alignment, needs a copy) of operand x. When its strides
    fit no layout these describe the C-contiguous copy that replaces it, made only once the
    problem has a plan."""
    layout = lt_layout(x.shape, x.strides, x.itemsize)
    if layout is None:
        r, c = x.shape
        return (False, c, r, c), MAX_ALIGNMENT, True
    return layout, alignment(x.data.ptr), False


@dataclasses.dataclass(frozen=True)
class Api:
    """What CublasLt calls: nvmath's cublasLt binding, and the enums it shares with cuBLAS
    (nvmath's cublas binding) and nvmath.CudaDataType."""

    lt: Any
    compute_32f: int
    compute_tf32: int
    ops: tuple[int, int]  # cublasOperation_t N and T
    not_supported: int  # the heuristic's status when it has nothing for a problem
    types: dict[str, int]  # the cudaDataType_t of each dtype name


def _api() -> Api:
    cublas = binding("cublas")
    compute = cublas.ComputeType
    return Api(binding("cublasLt"), int(compute.COMPUTE_32F),
               int(compute.COMPUTE_32F_FAST_TF32),
               (int(cublas.Operation.N), int(cublas.Operation.T)),
               int(cublas.Status.NOT_SUPPORTED), cuda_types())


class _Attributes:
    """Host buffers for one kind of attribute (descriptor or preference), each of the C type
    the binding names for it, reused: a set writes the value in and hands over its address."""

    def __init__(self, setter: Callable[[int, int, int, int], None],
                 dtype_of: Callable[[int], Any]) -> None:
        self.setter, self.dtype_of = setter, dtype_of
        self.buffers: dict[int, tuple[np.ndarray, int]] = {}

    def set(self, obj: int, attr: int, value: int) -> None:
        found = self.buffers.get(attr)
        if found is None:
            buf = np.zeros(1, self.dtype_of(attr))
            found = self.buffers[attr] = (buf, buf.ctypes.data)
        buf, address = found
        buf[0] = value
        self.setter(obj, attr, address, buf.itemsize)


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
        self.api = api = _api()
        self.lib = lib = api.lt
        self.version = int(lib.get_version())
        desc, pref, epilogue = lib.MatmulDescAttribute, lib.MatmulPreferenceAttribute, lib.Epilogue
        self._desc = _Attributes(lib.matmul_desc_set_attribute,
                                 lib.get_matmul_desc_attribute_dtype)
        self._pref = _Attributes(lib.matmul_preference_set_attribute,
                                 lib.get_matmul_preference_attribute_dtype)
        self._transa, self._transb = int(desc.TRANSA), int(desc.TRANSB)
        self._epilogue, self._aux_ld = int(desc.EPILOGUE), int(desc.EPILOGUE_AUX_LD)
        self._bias_ptr, self._aux_ptr = int(desc.BIAS_POINTER), int(desc.EPILOGUE_AUX_POINTER)
        self._scale_ptr = int(desc.A_SCALE_POINTER), int(desc.B_SCALE_POINTER)
        self._fast_accum = int(desc.FAST_ACCUM)
        self._align = [int(getattr(pref, f"MIN_ALIGNMENT_{m}_BYTES")) for m in "ABCD"]
        self.epilogue_default, self.epilogue_bias = int(epilogue.DEFAULT), int(epilogue.BIAS)
        self.epilogue_gelu_bias = int(epilogue.GELU_BIAS)
        self.epilogue_gelu_aux_bias = int(epilogue.GELU_AUX_BIAS)
        self.handle = lib.create()
        self.workspace = xp.empty(WORKSPACE_BYTES, dtype="uint8")  # kept alive with us
        self.pref = lib.matmul_preference_create()
        self._pref.set(self.pref, int(pref.MAX_WORKSPACE_BYTES), WORKSPACE_BYTES)
        self.matmul_compute: MatmulCompute = "fp32"  # Precision.matmul_compute: in_compute
        # alpha and beta (scale type 32F) and the heuristic's count live on the host, by address
        self._host = [ctypes.c_float(1.0), ctypes.c_float(0.0), ctypes.c_int32(0)]
        self._one, self._zero, self._count = map(ctypes.addressof, self._host)
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        self._refused: dict[tuple[Any, ...], str] = {}
        self.clock: Callable[[Callable[[], None]], float] = functools.partial(
            device_time, xp, stream)

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
        dtype = self._dtype("matmul_bias", x, w, bias)
        if bias.shape != (n,):
            raise CublasLtUnsupported(f"matmul_bias: bias {bias.shape}, expected ({n},)")
        epilogue = _bias_epilogue(self, "matmul_bias", n, gelu, pre_gelu_out, residual)
        shape = (*x.shape[:-1], n)
        _check_out(out, shape, dtype, "matmul_bias", "out")
        _check_out(residual, shape, dtype, "matmul_bias", "residual")
        _check_out(pre_gelu_out, shape, dtype, "matmul_bias", "pre_gelu_out")
        aux = None if pre_gelu_out is None else pre_gelu_out.reshape(-1, n)
        y = self._gemm(x2, w, _Alloc((x2.shape[0], n), dtype) if out is None
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
        in_dtype = self._dtype("matmul_into", a, b)
        dtype = _out_dtype("matmul_into", in_dtype, out)
        _check_out(out, (a.shape[0], b.shape[1]), dtype, "matmul_into", "out")
        return self._gemm(a, b, out, self.epilogue_default, accumulate=accumulate)

    def matmul_fp8(self, a: Fp8Tensor, b: Fp8Tensor, out: Any, *, fast_accum: bool = False,
                   accumulate: bool = False, bias: Any = None, gelu: bool = False,
                   pre_gelu_out: Any = None, residual: Any = None) -> Any:
        """out (M, N) = a (M, K) @ b (N, K)^T on FP8 tensor cores (compute capability 8.9+):
        each operand is read back as codes * scale_inv, products accumulate in fp32 (with
        `fast_accum`, without the periodic promotion that keeps them exact: faster, looser).
        Both operands' codes are row-major with K contiguous, the "TN" layout FP8 GEMMs
        take; out is C-contiguous bfloat16 or float32. `accumulate` adds the product into
        out (beta = 1: a float32 weight gradient). With bfloat16 out, the epilogues of
        matmul_bias: a `bias` (N,), gelu (with `pre_gelu_out`) or a `residual` (M, N), all
        bfloat16. A problem's first call times each algorithm the heuristic offers (`clock`)
        and its plan keeps the fastest: for FP8 the heuristic's first is often not it, for
        the other problems it nearly always is (benchmarks/results/gemm-algos-h100.md)."""
        if (a.codes.ndim != 2 or b.codes.ndim != 2 or a.codes.shape[1] != b.codes.shape[1]
                or a.codes.dtype != np.uint8 or b.codes.dtype != np.uint8):
            raise CublasLtUnsupported(f"matmul_fp8: codes a {a.codes.shape} {a.codes.dtype} "
                                      f"and b {b.codes.shape} {b.codes.dtype} are not (M, K) "
                                      f"and (N, K) uint8")
        if dtype_name(out.dtype) not in ("bfloat16", "float32"):
            raise CublasLtUnsupported(f"matmul_fp8: out is {out.dtype}, not bfloat16 or "
                                      f"float32")
        shape = (a.codes.shape[0], b.codes.shape[0])
        _check_out(out, shape, out.dtype, "matmul_fp8", "out")
        epilogue = _fp8_epilogue(self, out, bias, gelu, pre_gelu_out, residual, accumulate)
        for name, extra in (("pre_gelu_out", pre_gelu_out), ("residual", residual)):
            _check_out(extra, shape, out.dtype, "matmul_fp8", name)
        types = self.api.types
        fp8 = Fp8Operands(types[a.fmt.name], types[b.fmt.name], a.scale_inv.data.ptr,
                          b.scale_inv.data.ptr, fast_accum)
        return self._gemm(a.codes, b.codes.T, out, epilogue, bias=bias, aux=pre_gelu_out,
                          accumulate=accumulate, c=residual, fp8=fp8)

    def close(self) -> None:
        """Destroy the plans, the preference and the handle (the object is unusable after)."""
        for plan in self._plans.values():
            self._destroy_plan(plan)
        self._plans.clear()
        if self.pref:
            self.lib.matmul_preference_destroy(self.pref)
            self.pref = 0
        if self.handle:
            self.lib.destroy(self.handle)
            self.handle = 0

    # ---- internals ------------------------------------------------------------------------
    def _dtype(self, what: str, *arrays: Any) -> Any:
        dtype = arrays[0].dtype
        if any(a.dtype != dtype for a in arrays):
            raise CublasLtUnsupported(f"{what}: mixed dtypes {[str(a.dtype) for a in arrays]}")
        if dtype_name(dtype) not in self.api.types:
            raise CublasLtUnsupported(f"{what}: dtype {dtype} is not float32, float16 or "
                                      "bfloat16")
        return dtype

    def _gemm(self, a: Any, b: Any, out: Any, epilogue: int, *, bias: Any = None,
              aux: Any = None, accumulate: bool = False, c: Any = None,
              fp8: Fp8Operands | None = None) -> Any:
        """out (M, N) = a (M, K) @ b (K, N) with `epilogue`, row-major. beta = 1 adds C: out
        itself with `accumulate` (C = D), or `c` (out's shape, dtype and layout) when given.

        In cuBLASLt's column-major terms D = out^T = b^T @ a^T: its A is our b, its B is our
        a, and (m, n, k) = (N, M, K). `bias` is the BIAS_POINTER vector read by the BIAS
        epilogues, `aux` the GELU input matrix (out's shape, C-contiguous). `fp8`: a and b
        are FP8 codes (uint8) of those types, read back with those scales. `out` may be an
        `_Alloc`: it, and any operand copies, are allocated only after the plan exists, so a
        refused call (e.g. one first seen during a capture) has touched neither the stream nor
        the memory pool."""
        m_rows, k = a.shape
        n = b.shape[1]
        if m_rows == 0 or n == 0 or k == 0:
            raise CublasLtUnsupported(f"empty GEMM ({m_rows}, {k}) @ ({k}, {n})")
        layout_a, align_a, copy_a = _layout(b)
        layout_b, align_b, copy_b = _layout(a)
        bias_copy = bias is not None and not bias.flags.c_contiguous
        bias_ptr = _PLACEHOLDER_PTR if bias_copy else _ptr(bias)
        aux_ptr = _ptr(aux)
        types = self.api.types
        out_type = types[dtype_name(out.dtype)]
        # cuBLASLt's (A, B) types: (ours of b, ours of a)
        in_types = ((fp8.type_b, fp8.type_a) if fp8 else (types[dtype_name(a.dtype)],) * 2)
        compute = (self.api.compute_tf32 if self.matmul_compute == "tf32"
                   and dtype_name(a.dtype) == "float32" else self.api.compute_32f)
        align_c = alignment(_ptr(out if c is None else c))
        key = (epilogue, n, m_rows, k, in_types, out_type, compute, layout_a, layout_b,
               n if aux is not None else 0, fp8.fast_accum if fp8 else None, align_a, align_b,
               alignment(_ptr(out)), alignment(bias_ptr), alignment(aux_ptr), align_c)
        plan = self._plans.get(key)
        fresh = plan is None
        if fresh:
            plan = self._plan(key, bias_ptr, aux_ptr)
        # the plan exists: now copy and allocate
        lt_a = self.xp.ascontiguousarray(b) if copy_a else b
        lt_b = self.xp.ascontiguousarray(a) if copy_b else a
        if isinstance(out, _Alloc):
            out = self.xp.empty(out.shape, dtype=out.dtype)
        if bias_copy:
            bias = self.xp.ascontiguousarray(bias)
        if bias is not None:
            self._desc.set(plan.desc, self._bias_ptr, bias.data.ptr)
        if aux is not None:
            self._desc.set(plan.desc, self._aux_ptr, aux.data.ptr)
        if fp8 is not None:  # cuBLASLt's A is our b
            self._desc.set(plan.desc, self._scale_ptr[0], fp8.scale_b)
            self._desc.set(plan.desc, self._scale_ptr[1], fp8.scale_a)
        # beta = 0: C (= D) is not read; beta = 1: the product is added to C, out or `c`
        beta = self._one if accumulate or c is not None else self._zero

        def run(algo: int, d: Any = out) -> None:
            self.lib.matmul(
                self.handle, plan.desc, self._one, lt_a.data.ptr, plan.layout_a,
                lt_b.data.ptr, plan.layout_b, beta, (d if c is None else c).data.ptr,
                plan.layout_d, d.data.ptr, plan.layout_d, algo, self.workspace.data.ptr,
                WORKSPACE_BYTES, self.stream.ptr)

        if fresh and fp8 is not None and len(plan.usable) > 1:
            # the candidates run several times each: an added product (C = D) goes to scratch
            d = self.xp.empty_like(out) if accumulate else out
            plan.algo = min((plan.results[i].ptr for i in plan.usable),
                            key=_timed(self.clock, functools.partial(run, d=d)))
        run(plan.algo)
        return out

    def _plan(self, key: tuple[Any, ...], bias_ptr: int, aux_ptr: int) -> _Plan:
        """The plan of `key`, made once (a refusal is remembered too)."""
        if key in self._refused:
            raise CublasLtUnsupported(self._refused[key])
        if self.stream.is_capturing():
            raise CublasLtUnsupported(
                "cuBLASLt problem first seen during CUDA graph capture: its plan (heuristic "
                "query) must be made by an eager call of the same shapes before capturing")
        try:
            plan = self._plans[key] = _make_plan(self, key, bias_ptr, aux_ptr)
        except CublasLtUnsupported as exc:
            self._refused[key] = str(exc)
            raise
        return plan

    def _destroy_plan(self, plan: _Plan) -> None:
        self.lib.matmul_desc_destroy(plan.desc)
        for layout in (plan.layout_a, plan.layout_b, plan.layout_d):
            self.lib.matrix_layout_destroy(layout)


def _timed(clock: Callable[[Callable[[], None]], float],
           run: Callable[[int], None]) -> Callable[[int], float]:
    """An algorithm's time per call of `run` by `clock`, infinite for one that fails to run
    (nvmath's cuBLASLtError: it is never chosen; if none runs, the real call raises)."""
    def time(algo: int) -> float:
        try:
            return clock(lambda: run(algo))
        except Exception:  # noqa: BLE001 - any failure rules the candidate out
            return math.inf
    return time


def _bias_epilogue(lt: CublasLt, what: str, n: int, gelu: bool, pre_gelu_out: Any,
                   residual: Any) -> int:
    """The epilogue of a GEMM with a bias over N columns: BIAS (a residual added as C),
    GELU_BIAS, or GELU_AUX_BIAS writing `pre_gelu_out`; CublasLtUnsupported for a combination
    cuBLASLt cannot take."""
    if pre_gelu_out is not None and not gelu:
        raise CublasLtUnsupported(f"{what}: pre_gelu_out needs gelu=True")
    if pre_gelu_out is not None and n % AUX_LD_MULTIPLE:
        raise CublasLtUnsupported(f"{what}: GELU_AUX_BIAS needs N % {AUX_LD_MULTIPLE} == 0, "
                                  f"N = {n}")
    if residual is not None and gelu:
        raise CublasLtUnsupported(f"{what}: a residual is added after the bias, not under a "
                                  "GELU")
    if pre_gelu_out is not None:
        return lt.epilogue_gelu_aux_bias
    return lt.epilogue_gelu_bias if gelu else lt.epilogue_bias


def _fp8_epilogue(lt: CublasLt, out: Any, bias: Any, gelu: bool, pre_gelu_out: Any,
                  residual: Any, accumulate: bool) -> int:
    """matmul_fp8's epilogue (_bias_epilogue's with a bias, into bfloat16, not added), or
    CublasLtUnsupported for a combination it cannot take."""
    if bias is None:
        if gelu or pre_gelu_out is not None or residual is not None:
            raise CublasLtUnsupported("matmul_fp8: GELU and a residual come with a bias")
        return lt.epilogue_default
    n = out.shape[1]
    if (dtype_name(out.dtype) != "bfloat16" or bias.dtype != out.dtype
            or bias.shape != (n,) or accumulate):
        raise CublasLtUnsupported(f"matmul_fp8: a bias ({bias.shape} {bias.dtype}) takes "
                                  f"bfloat16 out ({out.dtype}) of its columns, not added")
    return _bias_epilogue(lt, "matmul_fp8", n, gelu, pre_gelu_out, residual)


def _make_plan(lt: CublasLt, key: tuple[Any, ...], bias_ptr: int, aux_ptr: int) -> _Plan:
    """Create the descriptor and layouts of `key` and ask the heuristic for an algorithm; a
    CublasLtUnsupported naming the problem when it has none."""
    (epilogue, m, n, k, in_types, out_type, compute, layout_a, layout_b, aux_ld, fast_accum,
     *alignments) = key
    lib, attrs = lt.lib, lt._desc
    created: list[tuple[Callable[[int], None], int]] = []

    def made(obj: int, destroy: Callable[[int], None]) -> int:
        created.append((destroy, obj))  # destroyed again if planning fails later
        return obj

    try:
        desc = made(lib.matmul_desc_create(compute, lt.api.types["float32"]),
                    lib.matmul_desc_destroy)
        attrs.set(desc, lt._transa, lt.api.ops[layout_a[0]])
        attrs.set(desc, lt._transb, lt.api.ops[layout_b[0]])
        attrs.set(desc, lt._epilogue, epilogue)
        if fast_accum is not None:  # an FP8 problem
            attrs.set(desc, lt._fast_accum, int(fast_accum))
        # The heuristic reads these pointers' values for their alignment, so it sees the
        # real ones (later calls with the same alignments, which the key holds, swap in
        # their own pointers).
        if bias_ptr:
            attrs.set(desc, lt._bias_ptr, bias_ptr)
        if aux_ld:
            attrs.set(desc, lt._aux_ld, aux_ld)
            attrs.set(desc, lt._aux_ptr, aux_ptr)
        layout_a_desc, layout_b_desc, layout_d_desc = (
            made(lib.matrix_layout_create(dtype, rows, cols, ld), lib.matrix_layout_destroy)
            for dtype, (_op, rows, cols, ld) in ((in_types[0], layout_a),
                                                 (in_types[1], layout_b),
                                                 (out_type, (False, m, n, m))))
        align_a, align_b, align_d, _align_bias, _align_aux, align_c = alignments
        for attr, value in zip(lt._align, (align_a, align_b, align_c, align_d), strict=True):
            lt._pref.set(lt.pref, attr, value)
        results = lib.MatmulHeuristicResult(_HEURISTIC_RESULTS)
        try:
            lib.matmul_algo_get_heuristic(
                lt.handle, desc, layout_a_desc, layout_b_desc, layout_d_desc, layout_d_desc,
                lt.pref, _HEURISTIC_RESULTS, results.ptr, lt._count)
            status, count = 0, lt._host[2].value
        except Exception as exc:  # nvmath's cuBLASLtError, with the status
            if getattr(exc, "status", None) != lt.api.not_supported:
                raise
            status, count = lt.api.not_supported, 0
        usable = [i for i in range(count)
                  if results[i].state == 0 and results[i].workspace_size <= WORKSPACE_BYTES]
        if not usable:
            raise CublasLtUnsupported(
                f"cuBLASLt has no algorithm for epilogue {epilogue}, (m, n, k) = ({m}, {n}, "
                f"{k}), types {in_types}->{out_type}, compute {compute}, transposed "
                f"{layout_a[0]}/{layout_b[0]}, alignments {alignments} (heuristic: "
                f"{lib.get_status_name(status)}, {count} results)")
        best = results[usable[0]]
    except BaseException:
        for destroy, obj in reversed(created):
            destroy(obj)
        raise
    return _Plan(desc, layout_a_desc, layout_b_desc, layout_d_desc, results, best.ptr,
                 tuple(usable))
