"""cuBLASLt epilogue GEMMs (ops/gemm/cublaslt.py): bias, bias + GELU (with the pre-activation),
and the weight gradient with the bias gradient (BGRADA).

GPU checks compare against float64 references computed on the host from the same (16-bit
rounded) inputs, holding max|ours - ref| / max|ref| to a per-dtype tolerance, and replay the
calls from a captured CUDA graph. They skip cleanly without CUDA.

CPU checks run everywhere: the module imports without CuPy, its enum/attribute table agrees
with the header's bit-flag definitions and struct layout, and the whole binding runs against a
NumPy emulation of cuBLASLt (FakeLt, written from cublasLt.h's documented semantics) on host
memory, which checks every layout, op, leading dimension, pointer and epilogue it passes.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rustyflow_py.engine.backend import get_backend, gpu_unavailable_reason
from rustyflow_py.engine.ops.gelu.reference import GELU_C, GELU_K
from rustyflow_py.engine.ops.gemm import cublaslt as lt_mod
from rustyflow_py.engine.ops.gemm.cublas import in_compute
from rustyflow_py.engine.ops.gemm.cublaslt import CublasLt, CublasLtUnsupported

_GPU_REASON = gpu_unavailable_reason()
SHAPES = [(64, 96, 160), (1000, 384, 1536), (517, 768, 2304)]  # (M, K, N)
# mode: (dtype name, matmul_compute, tolerance on max|err| / max|ref|)
MODES = {
    "fp32": ("float32", "fp32", 1e-5),
    "tf32": ("float32", "tf32", 1e-2),
    "fp16": ("float16", "fp32", 1e-2),
    "bf16": ("bfloat16", "fp32", 4e-2),
}
# The GELU values in fp32: cuBLASLt may evaluate tanh with a fast approximation, so
# the activation outputs are held to this (the GEMM part, e.g. pre_gelu_out, to 1e-5).
ACT_TOL_FP32 = 2e-3


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + GELU_K * x**3)))


def rel_max(ours: Any, ref: np.ndarray) -> float:
    a, b = np.asarray(ours).astype(np.float64), np.asarray(ref, np.float64)
    assert a.shape == b.shape, f"shape {a.shape} != reference {b.shape}"
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


def host(rng: np.random.Generator, dtype: np.dtype, *shape: int,
         scale: float = 1.0) -> np.ndarray:
    """Random values rounded to `dtype` (the reference uses these exact values)."""
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype)


def linear_operands(rng: np.random.Generator, dtype: np.dtype, m: int, k: int,
                    n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (M, K), w (K, N) and b (N,) of a Linear layer, scaled so y = x w + b is O(1)."""
    return host(rng, dtype, m, k), host(rng, dtype, k, n, scale=k**-0.5), \
        host(rng, dtype, n, scale=0.5)


def f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float32).astype(np.float64)


# ==== CPU: import, tables, layouts ===========================================================
def test_imports_without_cupy() -> None:
    code = ("import sys; sys.modules['cupy'] = None; sys.modules['ml_dtypes'] = None\n"
            "import rustyflow_py.engine.ops.gemm.cublaslt as m\n"
            "assert m.CUDA_TYPES['bfloat16'] == 14\n"
            "assert 'cupy' not in [k for k, v in sys.modules.items() if v is not None]\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_enum_table_matches_header_definitions() -> None:
    m = lt_mod
    # cublasLtEpilogue_t as cublasLt.h composes it from bit flags
    relu, aux, bias, gelu_ = 2, 128, 4, 32
    assert m.EPILOGUE_DEFAULT == 1 and m.EPILOGUE_BIAS == bias
    assert m.EPILOGUE_GELU_BIAS == (gelu_ | bias) == 36
    assert m.EPILOGUE_GELU_AUX_BIAS == ((gelu_ | aux) | bias) == 164
    assert (m.EPILOGUE_BGRADA, m.EPILOGUE_BGRADB) == (256, 512)
    assert relu not in (m.EPILOGUE_BIAS, m.EPILOGUE_GELU)
    # cublasLtMatmulDescAttributes_t / cublasLtMatmulPreferenceAttributes_t values and types
    assert (m.DESC_TRANSA, m.DESC_TRANSB, m.DESC_EPILOGUE, m.DESC_BIAS_POINTER,
            m.DESC_EPILOGUE_AUX_POINTER, m.DESC_EPILOGUE_AUX_LD) == (3, 4, 7, 8, 11, 12)
    sizes = {m.DESC_TRANSA: 4, m.DESC_TRANSB: 4, m.DESC_EPILOGUE: 4,
             m.DESC_BIAS_POINTER: ctypes.sizeof(ctypes.c_void_p),
             m.DESC_EPILOGUE_AUX_POINTER: ctypes.sizeof(ctypes.c_void_p),
             m.DESC_EPILOGUE_AUX_LD: 8}
    assert {a: ctypes.sizeof(t) for a, t in m.DESC_ATTR_CTYPES.items()} == sizes
    assert (m.PREF_MAX_WORKSPACE_BYTES, m.PREF_MIN_ALIGNMENT_A_BYTES,
            m.PREF_MIN_ALIGNMENT_D_BYTES) == (1, 5, 8)
    assert {a: ctypes.sizeof(t) for a, t in m.PREF_ATTR_CTYPES.items()} == {1: 8, 5: 4, 6: 4,
                                                                          7: 4, 8: 4}
    # cudaDataType_t, cublasComputeType_t, cublasOperation_t
    assert m.CUDA_TYPES == {"float32": 0, "float16": 2, "bfloat16": 14}
    assert (m.COMPUTE_32F, m.COMPUTE_32F_FAST_TF32, m.OP_N, m.OP_T) == (68, 77, 0, 1)
    # cublasLtMatmulHeuristicResult_t: algo (uint64[8]), size_t, cublasStatus_t, float, int[4]
    h = m.HeuristicResult
    assert ctypes.sizeof(m.MatmulAlgo) == 64 and ctypes.sizeof(h) == 96
    assert (h.workspaceSize.offset, h.state.offset, h.wavesCount.offset,
            h.reserved.offset) == (64, 72, 76, 80)


def test_lt_layout_of_row_major_views() -> None:
    x = np.zeros((5, 7), np.float32)
    assert lt_mod.lt_layout(x.shape, x.strides, 4) == (lt_mod.OP_N, 7, 5, 7)
    assert lt_mod.lt_layout(x.T.shape, x.T.strides, 4) == (lt_mod.OP_T, 7, 5, 7)
    assert lt_mod.lt_layout(x[:, :3].shape, x[:, :3].strides, 4) == (lt_mod.OP_N, 3, 5, 7)
    assert lt_mod.lt_layout(x[::2].shape, x[::2].strides, 4) == (lt_mod.OP_N, 7, 3, 14)
    assert lt_mod.lt_layout(x[:, ::2].shape, x[:, ::2].strides, 4) is None
    assert lt_mod.alignment(0) == 256 and lt_mod.alignment(4096 + 8) == 8
    assert lt_mod.alignment(1 << 20) == 256


# ==== CPU: the binding against a NumPy emulation of cuBLASLt =================================
class HostDev(np.ndarray):
    """A host array posing as a CuPy one (`.data.ptr`)."""

    @property
    def data(self) -> Any:  # type: ignore[override]
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])


class FakeLt:
    """cuBLASLt in NumPy on host memory, from cublasLt.h: column-major layouts (element (i, j)
    at i + j * ld), D = epilogue(alpha op(A) op(B) + beta C), bias of D's rows broadcast over
    its columns, GELU input matrix with its own ld, BGRADA = op(A) summed over k."""

    TYPES = {0: np.float32, 2: np.float16}
    DESC_TYPES = {3: ctypes.c_int32, 4: ctypes.c_int32, 7: ctypes.c_uint32, 8: ctypes.c_void_p,
                  11: ctypes.c_void_p, 12: ctypes.c_int64}
    PREF_TYPES = {1: ctypes.c_uint64, 5: ctypes.c_uint32, 6: ctypes.c_uint32,
                  7: ctypes.c_uint32, 8: ctypes.c_uint32}

    def __init__(self) -> None:
        self.objects: dict[int, dict[str, Any]] = {}
        self.allocations: list[tuple[int, int]] = []
        self.heuristic_calls = 0
        self.epilogues: list[int] = []

    # -- fake device memory (bounds-checked) --
    def register(self, a: np.ndarray) -> HostDev:
        a = a.view(HostDev)
        start = a.__array_interface__["data"][0]
        self.allocations.append((start, start + a.nbytes))
        return a

    def empty(self, shape: Any, dtype: Any = np.float32) -> HostDev:
        return self.register(np.empty(shape, dtype=dtype))

    def ascontiguousarray(self, a: np.ndarray) -> HostDev:
        return self.register(np.ascontiguousarray(a))

    def matrix(self, ptr: int, type_: int, rows: int, cols: int, ld: int) -> np.ndarray:
        dtype = np.dtype(self.TYPES[type_])
        count = ld * (cols - 1) + rows
        end = ptr + count * dtype.itemsize
        assert any(s <= ptr and end <= e for s, e in self.allocations), "out of bounds"
        assert ptr % dtype.itemsize == 0
        flat = np.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(ptr),
                             dtype=dtype)
        return np.lib.stride_tricks.as_strided(flat, (rows, cols),
                                               (dtype.itemsize, ld * dtype.itemsize))

    # -- the API --
    def _new(self, ref: Any, **fields: Any) -> int:
        handle = 0x1000 + 16 * len(self.objects)
        self.objects[handle] = fields
        ref._obj.value = handle
        return 0

    def cublasLtGetVersion(self) -> int:
        return 130000

    def cublasLtCreate(self, ref: Any) -> int:
        return self._new(ref, kind="handle")

    def cublasLtMatmulDescCreate(self, ref: Any, compute: int, scale: int) -> int:
        assert compute in (68, 77) and scale == 0
        return self._new(ref, kind="desc", compute=compute, attrs={})

    def cublasLtMatmulPreferenceCreate(self, ref: Any) -> int:
        return self._new(ref, kind="pref", attrs={})

    def cublasLtMatrixLayoutCreate(self, ref: Any, type_: int, rows: int, cols: int,
                                   ld: int) -> int:
        assert type_ in self.TYPES and rows > 0 and cols > 0 and ld >= rows
        return self._new(ref, kind="layout", type=type_, rows=rows, cols=cols, ld=ld)

    def _set(self, kind: str, types: dict[int, Any], obj: Any, attr: int, buf: Any,
             size: int) -> int:
        value = buf._obj
        assert type(value) is types[attr] and size == ctypes.sizeof(value)
        target = self.objects[obj.value]
        assert target["kind"] == kind
        target["attrs"][attr] = value.value
        return 0

    def cublasLtMatmulDescSetAttribute(self, desc: Any, attr: int, buf: Any, size: int) -> int:
        return self._set("desc", self.DESC_TYPES, desc, attr, buf, size)

    def cublasLtMatmulPreferenceSetAttribute(self, pref: Any, attr: int, buf: Any,
                                             size: int) -> int:
        return self._set("pref", self.PREF_TYPES, pref, attr, buf, size)

    def _destroy(self, obj: Any) -> int:
        del self.objects[obj.value]
        return 0

    cublasLtMatmulDescDestroy = cublasLtMatrixLayoutDestroy = _destroy
    cublasLtMatmulPreferenceDestroy = cublasLtDestroy = _destroy

    def _shapes(self, desc: Any, a: Any, b: Any, c: Any, d: Any) -> tuple[int, int, int]:
        attrs = self.objects[desc.value]["attrs"]
        la, lb, lc, ld = (self.objects[x.value] for x in (a, b, c, d))
        ta, tb = attrs.get(3, 0), attrs.get(4, 0)
        m, k = (la["rows"], la["cols"]) if ta == 0 else (la["cols"], la["rows"])
        k2, n = (lb["rows"], lb["cols"]) if tb == 0 else (lb["cols"], lb["rows"])
        assert k == k2, f"op(A) is {m}x{k} but op(B) is {k2}x{n}"
        assert (ld["rows"], ld["cols"]) == (m, n) and lc == ld
        assert la["type"] == lb["type"]
        return m, n, k

    def cublasLtMatmulAlgoGetHeuristic(self, handle: Any, desc: Any, a: Any, b: Any, c: Any,
                                       d: Any, pref: Any, requested: int, results: Any,
                                       count: Any) -> int:
        self._shapes(desc, a, b, c, d)
        prefs = self.objects[pref.value]["attrs"]
        assert prefs[1] == lt_mod.WORKSPACE_BYTES
        assert all(prefs[i] in (1, 2, 4, 8, 16, 32, 64, 128, 256) for i in (5, 6, 7, 8))
        self.heuristic_calls += 1
        results[0].state, results[0].workspaceSize = 0, 1024
        results[0].algo.data[0] = 42
        count._obj.value = 1
        return 0

    def cublasLtMatmul(self, handle: Any, desc: Any, alpha: Any, a_ptr: int, a: Any,
                       b_ptr: int, b: Any, beta: Any, c_ptr: int, c: Any, d_ptr: int, d: Any,
                       algo: Any, workspace: int, workspace_size: int, stream: int) -> int:
        m, n, k = self._shapes(desc, a, b, c, d)
        assert algo._obj.data[0] == 42 and workspace and workspace_size >= 1024
        assert beta._obj.value == 0.0 and c_ptr == d_ptr
        attrs = self.objects[desc.value]["attrs"]
        la, lb, ld = (self.objects[x.value] for x in (a, b, d))
        am = self.matrix(a_ptr, la["type"], la["rows"], la["cols"], la["ld"])
        bm = self.matrix(b_ptr, lb["type"], lb["rows"], lb["cols"], lb["ld"])
        op_a = am if attrs.get(3, 0) == 0 else am.T
        op_b = bm if attrs.get(4, 0) == 0 else bm.T
        acc = alpha._obj.value * (op_a.astype(np.float64) @ op_b.astype(np.float64))
        epilogue = attrs.get(7, 1)
        self.epilogues.append(epilogue)
        vec = lambda length: self.matrix(attrs[8], ld["type"], length, 1, length)[:, 0]  # noqa: E731
        aux = lambda: self.matrix(attrs[11], ld["type"], m, n, attrs[12])  # noqa: E731
        if epilogue & 128:  # GELU input matrix: ld a multiple of 8, at least D's rows
            assert attrs[12] % 8 == 0 and attrs[12] >= m
        if epilogue in (4, 36, 164):
            acc = acc + vec(m).astype(np.float64)[:, None]
        if epilogue == 164:
            aux()[...] = acc
        if epilogue in (36, 164):
            acc = gelu(acc)
        if epilogue == 256:
            assert attrs.get(3, 0) == 0, "BGRADA needs A untransposed"
            vec(m)[...] = op_a.astype(np.float64).sum(axis=1)
        assert epilogue in (1, 4, 36, 164, 256)
        self.matrix(d_ptr, ld["type"], m, n, ld["ld"])[...] = acc
        return 0


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeLt, CublasLt]]:
    lib = FakeLt()
    monkeypatch.setattr(lt_mod, "_library", lambda: lib)
    stream = SimpleNamespace(ptr=0, capturing=False)
    stream.is_capturing = lambda: stream.capturing
    lt = CublasLt(lib, stream)
    yield lib, lt
    lt.close()
    assert lib.objects == {}, "close() leaked descriptors, layouts or handles"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_binding_against_emulation(fake: tuple[FakeLt, CublasLt], dtype: str) -> None:
    lib, lt = fake
    tol = 1e-5 if dtype == "float32" else 1e-2
    rng = np.random.default_rng(1)
    m, k, n = 12, 24, 40
    x, w = host(rng, np.dtype(dtype), m, k), host(rng, np.dtype(dtype), k, n, scale=0.3)
    b, g = host(rng, np.dtype(dtype), n), host(rng, np.dtype(dtype), m, n)
    dx, dw, db, dg = (lib.register(a) for a in (x, w, b, g))
    ref_pre = f64(x) @ f64(w) + f64(b)

    assert rel_max(lt.matmul_bias(dx, dw, db), ref_pre) < tol
    pre = lib.empty((m, n), dtype)
    y = lt.matmul_bias(dx, dw, db, gelu=True, pre_gelu_out=pre)
    assert rel_max(pre, ref_pre) < tol and rel_max(y, gelu(ref_pre)) < tol
    assert rel_max(lt.matmul_bias(dx, dw, db, gelu=True), gelu(ref_pre)) < tol
    # w as a transposed view, x with a batch axis
    wt = lib.register(np.ascontiguousarray(w.T))
    y3 = lt.matmul_bias(dx.reshape(3, 4, k), wt.T, db)
    assert y3.shape == (3, 4, n) and rel_max(y3.reshape(m, n), ref_pre) < tol
    # weight and bias gradients: x.T as a view
    dW, dB = lt.matmul_bgrad(dx.T, dg)
    assert rel_max(dW, f64(x).T @ f64(g)) < tol and rel_max(dB, f64(g).sum(axis=0)) < tol
    dW, dB = lt.matmul_bgrad(lib.register(np.ascontiguousarray(x.T)), dg.T.copy().T)
    assert rel_max(dW, f64(x).T @ f64(g)) < tol and rel_max(dB, f64(g).sum(axis=0)) < tol
    assert set(lib.epilogues) == {4, 164, 36, 256}


def test_plans_are_cached_and_refusals_remembered(fake: tuple[FakeLt, CublasLt]) -> None:
    lib, lt = fake
    rng = np.random.default_rng(2)
    x, w, b = (lib.register(host(rng, np.dtype("float32"), *s)) for s in ((8, 16), (16, 8),
                                                                            (8,)))
    out = lib.empty((8, 8), "float32")
    for _ in range(3):
        lt.matmul_bias(x, w, b, out=out)
    assert lib.heuristic_calls == 1
    in_compute(lt, "tf32").matmul_bias(x, w, b, out=out)  # another compute type: a plan
    assert lt.matmul_compute == "fp32"  # the handle's own mode is untouched
    assert lib.heuristic_calls == 2
    lt.stream.capturing = True  # a new problem during capture: refused before any call
    with pytest.raises(CublasLtUnsupported, match="capture"):
        lt.matmul_bias(x[:4], w, b)
    lt.matmul_bias(x, w, b, out=out)  # a planned one still runs
    assert lib.heuristic_calls == 2


def test_unsupported_inputs_raise_value_error(fake: tuple[FakeLt, CublasLt]) -> None:
    lib, lt = fake
    rng = np.random.default_rng(3)
    x = lib.register(host(rng, np.dtype("float64"), 8, 16))
    w = lib.register(host(rng, np.dtype("float64"), 16, 8))
    b = lib.register(host(rng, np.dtype("float64"), 8))
    with pytest.raises(ValueError, match="float64"):
        lt.matmul_bias(x, w, b)
    x32, w32 = (lib.register(a.astype(np.float32)) for a in (x, w))
    with pytest.raises(ValueError, match="mixed dtypes"):
        lt.matmul_bias(x32, w32, b)
    w12 = lib.register(host(rng, np.dtype("float32"), 16, 12))
    b12 = lib.register(host(rng, np.dtype("float32"), 12))
    with pytest.raises(ValueError, match="N % 8"):
        lt.matmul_bias(x32, w12, b12, gelu=True, pre_gelu_out=lib.empty((8, 12), "float32"))
    with pytest.raises(ValueError, match="out must be"):
        lt.matmul_bias(x32, w12, b12, out=lib.empty((12, 8), "float32"))
    with pytest.raises(ValueError, match="cannot give"):
        lt.matmul_bgrad(x32.T, x32, out_dtype=np.float16)


# ==== GPU ====================================================================================
@pytest.fixture(scope="module")
def gpu() -> Iterator[SimpleNamespace]:
    """A CublasLt on the GPU backend's own (non-blocking, current) stream, as the trainer
    has it: CuPy's allocations and copies and the cuBLASLt calls are ordered on it."""
    cupy = pytest.importorskip("cupy")
    if _GPU_REASON is not None:
        pytest.skip(_GPU_REASON)
    backend = get_backend("gpu")
    backend.stream.use()
    lt = CublasLt(cupy, backend.stream)
    yield SimpleNamespace(cupy=cupy, stream=backend.stream, lt=lt)
    backend.stream.synchronize()
    lt.close()


def up(env: SimpleNamespace, a: np.ndarray) -> Any:
    """A device copy made on the test stream (everything here is ordered on it)."""
    d = env.cupy.empty(a.shape, dtype=a.dtype)
    d.set(np.ascontiguousarray(a), stream=env.stream)
    return d


def down(env: SimpleNamespace, d: Any) -> np.ndarray:
    return d.get(stream=env.stream)


def setup_mode(env: SimpleNamespace, mode: str) -> tuple[np.dtype, float, float]:
    name, compute, tol = MODES[mode]
    env.lt = in_compute(env.lt, compute)
    act_tol = max(tol, ACT_TOL_FP32) if name == "float32" else tol
    return np_dtype(name), tol, act_tol


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", list(MODES))
def test_matmul_bias(gpu: SimpleNamespace, mode: str, shape: tuple[int, int, int]) -> None:
    dtype, tol, act_tol = setup_mode(gpu, mode)
    m, k, n = shape
    rng = np.random.default_rng(10)
    x, w, b = linear_operands(rng, dtype, m, k, n)
    ref = f64(x) @ f64(w) + f64(b)
    dx, dw, db = up(gpu, x), up(gpu, w), up(gpu, b)
    y = gpu.lt.matmul_bias(dx, dw, db)
    assert y.dtype == dtype and y.shape == (m, n)
    assert rel_max(down(gpu, y), ref) < tol
    out = gpu.cupy.empty((m, n), dtype=dtype)
    assert gpu.lt.matmul_bias(dx, dw, db, out=out) is out
    assert rel_max(down(gpu, out), ref) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", list(MODES))
def test_matmul_bias_gelu(gpu: SimpleNamespace, mode: str, shape: tuple[int, int, int]) -> None:
    dtype, tol, act_tol = setup_mode(gpu, mode)
    m, k, n = shape
    rng = np.random.default_rng(11)
    x, w, b = linear_operands(rng, dtype, m, k, n)
    ref_pre = f64(x) @ f64(w) + f64(b)
    dx, dw, db = up(gpu, x), up(gpu, w), up(gpu, b)
    pre = gpu.cupy.empty((m, n), dtype=dtype)
    y = gpu.lt.matmul_bias(dx, dw, db, gelu=True, pre_gelu_out=pre)  # GELU_AUX_BIAS
    assert rel_max(down(gpu, pre), ref_pre) < tol
    assert rel_max(down(gpu, y), gelu(ref_pre)) < act_tol
    y2 = gpu.lt.matmul_bias(dx, dw, db, gelu=True)  # GELU_BIAS
    assert rel_max(down(gpu, y2), gelu(ref_pre)) < act_tol


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", list(MODES))
def test_matmul_bgrad(gpu: SimpleNamespace, mode: str, shape: tuple[int, int, int]) -> None:
    dtype, tol, _ = setup_mode(gpu, mode)
    m, k, n = shape
    rng = np.random.default_rng(12)
    x, g = host(rng, dtype, m, k), host(rng, dtype, m, n)
    dx, dg = up(gpu, x), up(gpu, g)
    dw, db = gpu.lt.matmul_bgrad(dx.T, dg)  # x.T: a view, op T
    assert dw.shape == (k, n) and db.shape == (n,) and dw.dtype == db.dtype == dtype
    assert rel_max(down(gpu, dw), f64(x).T @ f64(g)) < tol
    assert rel_max(down(gpu, db), f64(g).sum(axis=0)) < tol
    if shape == SHAPES[0]:  # a contiguous (K, M) operand, op N, into given buffers
        out, dbo = gpu.cupy.empty((k, n), dtype=dtype), gpu.cupy.empty((n,), dtype=dtype)
        gpu.lt.matmul_bgrad(up(gpu, np.ascontiguousarray(x.T)), dg, out=out, bias_grad_out=dbo)
        assert rel_max(down(gpu, out), f64(x).T @ f64(g)) < tol
        assert rel_max(down(gpu, dbo), f64(g).sum(axis=0)) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fp16", "bf16"])
def test_matmul_bgrad_float32_outputs(gpu: SimpleNamespace, mode: str) -> None:
    """16-bit inputs, float32 dW and db (mixed precision's fp32 gradients)."""
    dtype, _, _ = setup_mode(gpu, mode)
    m, k, n = SHAPES[1]
    rng = np.random.default_rng(13)
    x, g = host(rng, dtype, m, k), host(rng, dtype, m, n)
    dw, db = gpu.lt.matmul_bgrad(up(gpu, x).T, up(gpu, g), out_dtype=np.float32)
    assert dw.dtype == db.dtype == np.float32
    assert rel_max(down(gpu, dw), f64(x).T @ f64(g)) < 1e-4
    assert rel_max(down(gpu, db), f64(g).sum(axis=0)) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(MODES))
def test_transposed_weight_view_and_batch_axes(gpu: SimpleNamespace, mode: str) -> None:
    dtype, tol, act_tol = setup_mode(gpu, mode)
    m, k, n = SHAPES[2]
    rng = np.random.default_rng(15)
    x, wt, b = host(rng, dtype, m, k), host(rng, dtype, n, k, scale=k**-0.5), \
        host(rng, dtype, n, scale=0.5)
    ref_pre = f64(x) @ f64(wt).T + f64(b)
    dx, dwt, db = up(gpu, x), up(gpu, wt), up(gpu, b)
    y = gpu.lt.matmul_bias(dx, dwt.T, db)  # w (K, N) as the view of a (N, K) array: op T
    assert rel_max(down(gpu, y), ref_pre) < tol
    pre = gpu.cupy.empty((m, n), dtype=dtype)
    y = gpu.lt.matmul_bias(dx, dwt.T, db, gelu=True, pre_gelu_out=pre)
    assert rel_max(down(gpu, pre), ref_pre) < tol
    assert rel_max(down(gpu, y), gelu(ref_pre)) < act_tol
    x3 = dx[: 2 * (m // 2)].reshape(2, m // 2, k)  # (B, T, K) @ (K, N)
    y3 = gpu.lt.matmul_bias(x3, dwt.T, db)
    assert y3.shape == (2, m // 2, n)
    assert rel_max(down(gpu, y3).reshape(-1, n), ref_pre[: 2 * (m // 2)]) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fp32", "fp16"])
def test_misaligned_parameter_views(gpu: SimpleNamespace, mode: str) -> None:
    """Parameters and gradients are views into one flat buffer, at any element offset."""
    dtype, tol, _ = setup_mode(gpu, mode)
    m, k, n = 256, 96, 160
    rng = np.random.default_rng(16)
    flat = host(rng, dtype, 3 + k * n + n, scale=k**-0.5)
    x, g = host(rng, dtype, m, k), host(rng, dtype, m, n)
    dflat = up(gpu, flat)
    w, b = dflat[1 : 1 + k * n].reshape(k, n), dflat[1 + k * n : 1 + k * n + n]
    grads = gpu.cupy.empty(5 + k * n + n, dtype=dtype)
    dw_out, db_out = grads[3 : 3 + k * n].reshape(k, n), grads[3 + k * n : 3 + k * n + n]
    wf, bf = f64(flat[1 : 1 + k * n]).reshape(k, n), f64(flat[1 + k * n : 1 + k * n + n])
    try:
        y = gpu.lt.matmul_bias(up(gpu, x), w, b)
        gpu.lt.matmul_bgrad(up(gpu, x).T, up(gpu, g), out=dw_out, bias_grad_out=db_out)
    except CublasLtUnsupported as exc:
        pytest.xfail(f"no cuBLASLt algorithm for misaligned operands (callers fall back): {exc}")
    assert rel_max(down(gpu, y), f64(x) @ wf + bf) < tol
    assert rel_max(down(gpu, dw_out), f64(x).T @ f64(g)) < tol
    assert rel_max(down(gpu, db_out), f64(g).sum(axis=0)) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_graph_capture_and_replay(gpu: SimpleNamespace, mode: str) -> None:
    """Eager warm-up plans the problems; a capture on the (non-default) stream records them;
    a replay on new inputs matches the references."""
    dtype, tol, act_tol = setup_mode(gpu, mode)
    m, k, n = SHAPES[1]
    rng = np.random.default_rng(17)
    x, w, b = linear_operands(rng, dtype, m, k, n)
    g = host(rng, dtype, m, n)
    dx, dw, db, dg = up(gpu, x), up(gpu, w), up(gpu, b), up(gpu, g)
    cp = gpu.cupy
    y, y2, pre = (cp.empty((m, n), dtype=dtype) for _ in range(3))
    gw, gb = cp.empty((k, n), dtype=dtype), cp.empty((n,), dtype=dtype)

    def body() -> None:
        gpu.lt.matmul_bias(dx, dw, db, out=y)
        gpu.lt.matmul_bias(dx, dw, db, gelu=True, out=y2, pre_gelu_out=pre)
        gpu.lt.matmul_bgrad(dx.T, dg, out=gw, bias_grad_out=gb)

    body()  # eager warm-up: plans every problem
    gpu.stream.synchronize()
    gpu.stream.begin_capture()
    try:
        body()
    finally:
        graph = gpu.stream.end_capture()
    # new inputs in the same buffers: the outputs still hold the warm-up's results, so only
    # a replay that really ran can match the new references
    x, g = host(rng, dtype, m, k), host(rng, dtype, m, n)
    dx.set(x, stream=gpu.stream)
    dg.set(g, stream=gpu.stream)
    graph.launch(gpu.stream)
    ref_pre = f64(x) @ f64(w) + f64(b)
    assert rel_max(down(gpu, y), ref_pre) < tol
    assert rel_max(down(gpu, pre), ref_pre) < tol
    assert rel_max(down(gpu, y2), gelu(ref_pre)) < act_tol
    assert rel_max(down(gpu, gw), f64(x).T @ f64(g)) < tol
    assert rel_max(down(gpu, gb), f64(g).sum(axis=0)) < tol


@pytest.mark.gpu
def test_first_call_during_capture_is_refused(gpu: SimpleNamespace) -> None:
    """An unplanned problem inside a capture raises CublasLtUnsupported (a ValueError, so the
    caller falls back) without invalidating the capture."""
    setup_mode(gpu, "fp32")
    rng = np.random.default_rng(18)
    m, k, n = 40, 72, 88  # a shape no other test plans
    dtype = np.dtype(np.float32)
    dx, dw, db = up(gpu, host(rng, dtype, m, k)), up(gpu, host(rng, dtype, k, n)), \
        up(gpu, host(rng, dtype, n))
    out = gpu.cupy.empty((m, n), dtype=dtype)
    gpu.stream.synchronize()
    gpu.stream.begin_capture()
    try:
        with pytest.raises(CublasLtUnsupported, match="capture"):
            gpu.lt.matmul_bias(dx, dw, db, out=out)
    finally:
        gpu.stream.end_capture()
    gpu.lt.matmul_bias(dx, dw, db, out=out)  # eager: fine


@pytest.mark.gpu
def test_gpu_rejects_unsupported(gpu: SimpleNamespace) -> None:
    rng = np.random.default_rng(19)
    d64 = np.dtype(np.float64)
    x, w, b = (up(gpu, host(rng, d64, *s)) for s in ((8, 16), (16, 8), (8,)))
    with pytest.raises(ValueError):
        gpu.lt.matmul_bias(x, w, b)
