"""cuBLASLt epilogue GEMMs (ops/gemm/cublaslt.py): bias, bias + GELU (with the pre-activation),
and products added into a float32 buffer.

GPU checks compare against float64 references computed on the host from the same (16-bit
rounded) inputs, holding max|ours - ref| / max|ref| to a per-dtype tolerance, and replay the
calls from a captured CUDA graph. They skip cleanly without CUDA.

CPU checks run everywhere: the module imports without CuPy or nvmath-python, and the whole
binding runs against a NumPy emulation of nvmath's cuBLASLt binding (FakeLt, written from
cublasLt.h's documented semantics, enum values and struct layout) on host memory, which checks
every layout, op, leading dimension, pointer, attribute size and epilogue it passes.
"""

from __future__ import annotations

import ctypes
import dataclasses
import subprocess
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rustyflow_py.engine.ops.fp8.formats import E4M3, E5M2, FORMATS, Fp8Tensor, decode, quantize
from rustyflow_py.engine.ops.gelu.reference import GELU_C, GELU_K
from rustyflow_py.engine.ops.gemm import cublaslt as lt_mod
from rustyflow_py.engine.ops.gemm.cublas import in_compute
from rustyflow_py.engine.ops.gemm.cublaslt import CublasLt, CublasLtUnsupported

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


# ==== CPU: import, layouts =================================================================
def test_imports_without_cupy_or_nvmath() -> None:
    code = ("import sys; sys.modules['cupy'] = None; sys.modules['ml_dtypes'] = None\n"
            "sys.modules['nvmath'] = None\n"
            "import rustyflow_py.engine.ops.gemm.cublaslt as m\n"
            "loaded = [k for k, v in sys.modules.items() if v is not None]\n"
            "assert 'cupy' not in loaded and 'nvmath' not in loaded\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_nvmath_the_error_names_the_extras() -> None:
    code = ("import sys; sys.modules['nvmath'] = None\n"
            "from rustyflow_py.engine.ops.gemm.cublas import binding\n"
            "try:\n    binding('cublasLt')\nexcept RuntimeError as e:\n    print(e)\n")
    said = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True).stdout
    assert "nvmath-python" in said and "[gpu]" in said and "[cuda13]" in said, said


def test_lt_layout_of_row_major_views() -> None:
    x = np.zeros((5, 7), np.float32)
    assert lt_mod.lt_layout(x.shape, x.strides, 4) == (False, 7, 5, 7)
    assert lt_mod.lt_layout(x.T.shape, x.T.strides, 4) == (True, 7, 5, 7)
    assert lt_mod.lt_layout(x[:, :3].shape, x[:, :3].strides, 4) == (False, 3, 5, 7)
    assert lt_mod.lt_layout(x[::2].shape, x[::2].strides, 4) == (False, 7, 3, 14)
    assert lt_mod.lt_layout(x[:, ::2].shape, x[:, ::2].strides, 4) is None
    assert lt_mod.alignment(0) == 256 and lt_mod.alignment(4096 + 8) == 8
    assert lt_mod.alignment(1 << 20) == 256


# ==== CPU: the binding against a NumPy emulation of nvmath's cuBLASLt binding =================
class HostDev(np.ndarray):
    """A host array posing as a CuPy one (`.data.ptr`)."""

    @property
    def data(self) -> Any:  # type: ignore[override]
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])


def at(address: int, dtype: Any, count: int = 1) -> np.ndarray:
    """`count` values of `dtype` at a host address, as a writable view."""
    dtype = np.dtype(dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(address)
    return np.frombuffer(raw, dtype=dtype)


# cublasLtMatmulHeuristicResult_t: algo (uint64[8]), size_t, cublasStatus_t, float, int[4]
HEURISTIC = np.dtype([("algo", "<u8", (8,)), ("workspace_size", "<u8"), ("state", "<i4"),
                      ("waves_count", "<f4"), ("reserved", "<i4", (4,))])


class HeuristicResults:
    """nvmath's MatmulHeuristicResult(size): host structs by address; an item, one of them."""

    def __init__(self, size: int = 1, data: np.ndarray | None = None) -> None:
        self.data = np.zeros(size, HEURISTIC) if data is None else data
        self.ptr = self.data.ctypes.data

    def __getitem__(self, i: int) -> SimpleNamespace:
        item = self.data[i : i + 1]
        return SimpleNamespace(ptr=item.ctypes.data, state=int(item["state"][0]),
                               workspace_size=int(item["workspace_size"][0]))


class FakeLt:
    """nvmath.bindings.cublasLt in NumPy on host memory, from cublasLt.h: column-major layouts
    (element (i, j) at i + j * ld), D = epilogue(alpha op(A) op(B) + beta C), bias of D's rows
    broadcast over its columns, GELU input matrix with its own ld; every handle an int, every
    host value passed by address, as nvmath's binding takes them."""

    TYPES = {0: np.float32, 2: np.float16, 28: np.uint8, 29: np.uint8}
    FP8 = {28: E4M3, 29: E5M2}  # CUDA_R_8F_E4M3, CUDA_R_8F_E5M2: codes read with their scale
    # cublasLtMatmulDescAttributes_t / cublasLtMatmulPreferenceAttributes_t and their C types
    MatmulDescAttribute = SimpleNamespace(TRANSA=3, TRANSB=4, EPILOGUE=7, BIAS_POINTER=8,
                                          EPILOGUE_AUX_POINTER=11, EPILOGUE_AUX_LD=12,
                                          A_SCALE_POINTER=17, B_SCALE_POINTER=18,
                                          FAST_ACCUM=25)
    MatmulPreferenceAttribute = SimpleNamespace(
        MAX_WORKSPACE_BYTES=1, MIN_ALIGNMENT_A_BYTES=5, MIN_ALIGNMENT_B_BYTES=6,
        MIN_ALIGNMENT_C_BYTES=7, MIN_ALIGNMENT_D_BYTES=8)
    DESC_TYPES = {3: np.int32, 4: np.int32, 7: np.uint32, 8: np.int64, 11: np.int64,
                  12: np.int64, 17: np.int64, 18: np.int64, 25: np.int8}
    PREF_TYPES = {1: np.uint64, 5: np.uint32, 6: np.uint32, 7: np.uint32, 8: np.uint32}
    # cublasLtEpilogue_t as cublasLt.h composes it from bit flags: GELU 32, AUX 128, BIAS 4
    Epilogue = SimpleNamespace(DEFAULT=1, BIAS=4, GELU_BIAS=32 | 4, GELU_AUX_BIAS=32 | 128 | 4)
    MatmulHeuristicResult = HeuristicResults
    API = lt_mod.Api(None, compute_32f=68, compute_tf32=77, ops=(0, 1), not_supported=15,
                     types={"float32": 0, "float16": 2, "e4m3": 28, "e5m2": 29})

    def __init__(self) -> None:
        self.objects: dict[int, dict[str, Any]] = {}
        self.allocations: list[tuple[int, int]] = []
        self.heuristic_calls = 0
        self.candidates = 1  # the algorithms the heuristic offers
        self.epilogues: list[int] = []
        self.algos: list[int] = []  # the algorithm of each matmul call

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
        return np.lib.stride_tricks.as_strided(at(ptr, dtype, count), (rows, cols),
                                               (dtype.itemsize, ld * dtype.itemsize))

    def operand(self, ptr: int, layout: dict[str, Any], scale_ptr: int | None) -> np.ndarray:
        """A or B as values: FP8 codes decoded and times the float32 at their scale pointer."""
        m = self.matrix(ptr, layout["type"], layout["rows"], layout["cols"], layout["ld"])
        if layout["type"] not in self.FP8:
            return m
        return decode(m, self.FP8[layout["type"]]) * float(at(scale_ptr, np.float32)[0])

    # -- the API --
    def _new(self, **fields: Any) -> int:
        handle = 0x1000 + 16 * len(self.objects)
        self.objects[handle] = fields
        return handle

    def get_version(self) -> int:
        return 130000

    def get_status_name(self, status: int) -> str:
        return f"status {status}"

    def create(self) -> int:
        return self._new(kind="handle")

    def matmul_desc_create(self, compute: int, scale: int) -> int:
        assert compute in (68, 77) and scale == 0
        return self._new(kind="desc", compute=compute, attrs={})

    def matmul_preference_create(self) -> int:
        return self._new(kind="pref", attrs={})

    def matrix_layout_create(self, type_: int, rows: int, cols: int, ld: int) -> int:
        assert type_ in self.TYPES and rows > 0 and cols > 0 and ld >= rows
        return self._new(kind="layout", type=type_, rows=rows, cols=cols, ld=ld)

    def get_matmul_desc_attribute_dtype(self, attr: int) -> Any:
        return self.DESC_TYPES[attr]

    def get_matmul_preference_attribute_dtype(self, attr: int) -> Any:
        return self.PREF_TYPES[attr]

    def _set(self, kind: str, types: dict[int, Any], obj: int, attr: int, buf: int,
             size: int) -> None:
        assert size == np.dtype(types[attr]).itemsize
        target = self.objects[obj]
        assert target["kind"] == kind
        target["attrs"][attr] = int(at(buf, types[attr])[0])

    def matmul_desc_set_attribute(self, desc: int, attr: int, buf: int, size: int) -> None:
        self._set("desc", self.DESC_TYPES, desc, attr, buf, size)

    def matmul_preference_set_attribute(self, pref: int, attr: int, buf: int,
                                        size: int) -> None:
        self._set("pref", self.PREF_TYPES, pref, attr, buf, size)

    def _destroy(self, obj: int) -> None:
        del self.objects[obj]

    matmul_desc_destroy = matrix_layout_destroy = matmul_preference_destroy = destroy = _destroy

    def _shapes(self, desc: int, a: int, b: int, c: int, d: int) -> tuple[int, int, int]:
        attrs = self.objects[desc]["attrs"]
        la, lb, lc, ld = (self.objects[x] for x in (a, b, c, d))
        ta, tb = attrs.get(3, 0), attrs.get(4, 0)
        m, k = (la["rows"], la["cols"]) if ta == 0 else (la["cols"], la["rows"])
        k2, n = (lb["rows"], lb["cols"]) if tb == 0 else (lb["cols"], lb["rows"])
        assert k == k2, f"op(A) is {m}x{k} but op(B) is {k2}x{n}"
        assert (ld["rows"], ld["cols"]) == (m, n) and lc == ld
        if la["type"] in self.FP8 or lb["type"] in self.FP8:  # FP8 takes "TN" alone, fp32 D
            assert {la["type"], lb["type"]} <= set(self.FP8) and (ta, tb) == (1, 0)
            assert ld["type"] == 0 and 25 in attrs
        else:
            assert la["type"] == lb["type"]
        return m, n, k

    def matmul_algo_get_heuristic(self, handle: int, desc: int, a: int, b: int, c: int,
                                  d: int, pref: int, requested: int, results: int,
                                  count: int) -> None:
        self._shapes(desc, a, b, c, d)
        prefs = self.objects[pref]["attrs"]
        assert prefs[1] == lt_mod.WORKSPACE_BYTES
        assert all(prefs[i] in (1, 2, 4, 8, 16, 32, 64, 128, 256) for i in (5, 6, 7, 8))
        self.heuristic_calls += 1
        found = at(results, HEURISTIC, self.candidates)  # algorithms 42, 43, ...
        found["state"], found["workspace_size"] = 0, 1024
        found["algo"][:, 0] = 42 + np.arange(self.candidates)
        at(count, np.int32)[0] = self.candidates

    def matmul(self, handle: int, desc: int, alpha: int, a_ptr: int, a: int, b_ptr: int,
               b: int, beta: int, c_ptr: int, c: int, d_ptr: int, d: int, algo: int,
               workspace: int, workspace_size: int, stream: int) -> None:
        m, n, k = self._shapes(desc, a, b, c, d)
        self.algos.append(int(at(algo, np.uint64)[0]))
        assert 42 <= self.algos[-1] < 42 + self.candidates
        assert workspace and workspace_size >= 1024
        assert at(beta, np.float32)[0] == 0.0 and c_ptr == d_ptr
        attrs = self.objects[desc]["attrs"]
        la, lb, ld = (self.objects[x] for x in (a, b, d))
        am, bm = (self.operand(ptr, lay, attrs.get(scale))
                  for ptr, lay, scale in ((a_ptr, la, 17), (b_ptr, lb, 18)))
        op_a = am if attrs.get(3, 0) == 0 else am.T
        op_b = bm if attrs.get(4, 0) == 0 else bm.T
        acc = at(alpha, np.float32)[0] * (op_a.astype(np.float64) @ op_b.astype(np.float64))
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
        assert epilogue in (1, 4, 36, 164)
        self.matrix(d_ptr, ld["type"], m, n, ld["ld"])[...] = acc


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeLt, CublasLt]]:
    lib = FakeLt()
    monkeypatch.setattr(lt_mod, "_api", lambda: dataclasses.replace(FakeLt.API, lt=lib))
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
    b = host(rng, np.dtype(dtype), n)
    dx, dw, db = (lib.register(a) for a in (x, w, b))
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
    # a product into a given buffer, x.T as a view (op T)
    out = lib.empty((k, n), dtype)
    assert lt.matmul_into(dx.T, lib.register(ref_pre.astype(dtype)), out) is out
    assert rel_max(out, f64(x).T @ f64(ref_pre.astype(dtype))) < tol
    assert set(lib.epilogues) == {1, 4, 164, 36}


@pytest.mark.parametrize(("fa", "fb"), [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2")])
def test_fp8_binding_against_emulation(fake: tuple[FakeLt, CublasLt], fa: str, fb: str) -> None:
    """out = a @ b^T from FP8 codes: cuBLASLt's A is b's codes with op T and its B a's with
    op N (the TN layout, checked by FakeLt), each read with its own format and scale."""
    lib, lt = fake
    rng = np.random.default_rng(4)
    m, k, n = 12, 32, 16
    x, w = rng.standard_normal((m, k)), 0.01 * rng.standard_normal((n, k))
    (qa, sa), (qb, sb) = quantize(x, FORMATS[fa]), quantize(w, FORMATS[fb])
    a, b = (Fp8Tensor(lib.register(q), lib.register(np.array([s], np.float32)), FORMATS[f])
            for q, s, f in ((qa, sa, fa), (qb, sb, fb)))
    out = lib.empty((m, n), "float32")
    assert lt.matmul_fp8(a, b, out) is out
    exact = (decode(qa, FORMATS[fa]) * sa) @ (decode(qb, FORMATS[fb]) * sb).T
    assert rel_max(out, exact) < 1e-6
    assert rel_max(out, x @ w.T) < 0.15  # what FP8's 2-3 mantissa bits leave of the product
    with pytest.raises(CublasLtUnsupported, match="not bfloat16 or float32"):
        lt.matmul_fp8(a, b, lib.empty((m, n), "float16"))
    not_codes = Fp8Tensor(lib.register(x.astype(np.float32)), a.scale_inv, E4M3)
    with pytest.raises(CublasLtUnsupported, match="are not"):
        lt.matmul_fp8(not_codes, b, out)


def test_fp8_problems_keep_the_fastest_candidate_and_others_the_heuristic_s_first(
        fake: tuple[FakeLt, CublasLt]) -> None:
    """An FP8 problem's first call times each algorithm on offer (lt.clock) and its plan
    keeps the fastest; a float32 one runs the heuristic's first untimed."""
    lib, lt = fake
    lib.candidates = 3
    speed = {42: 3.0, 43: 1.0, 44: 2.0}  # milliseconds a call, by algorithm

    def clock(call: Callable[[], None]) -> float:
        call()
        return speed[lib.algos[-1]]

    lt.clock = clock
    rng = np.random.default_rng(5)
    a, b = (Fp8Tensor(lib.register(q), lib.register(np.array([s], np.float32)), E4M3)
            for q, s in (quantize(rng.standard_normal((8, 16)), E4M3),
                         quantize(rng.standard_normal((4, 16)), E4M3)))
    out = lib.empty((8, 4), "float32")
    lt.matmul_fp8(a, b, out)
    assert lib.algos == [42, 43, 44, 43]  # timed each, then ran the fastest
    lt.matmul_fp8(a, b, out)
    assert lib.algos[4:] == [43]  # planned once: no more timing
    x, w = (lib.register(host(rng, np.dtype("float32"), *shape)) for shape in ((8, 16), (16, 4)))
    lt.matmul_into(x, w, out)
    assert lib.algos[5:] == [42]


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
        lt.matmul_into(x32.T, x32, lib.empty((16, 16), "float16"))


# ==== GPU ====================================================================================
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
def test_matmul_bias(cublaslt: SimpleNamespace, mode: str, shape: tuple[int, int, int]) -> None:
    dtype, tol, act_tol = setup_mode(cublaslt, mode)
    m, k, n = shape
    rng = np.random.default_rng(10)
    x, w, b = linear_operands(rng, dtype, m, k, n)
    ref = f64(x) @ f64(w) + f64(b)
    dx, dw, db = up(cublaslt, x), up(cublaslt, w), up(cublaslt, b)
    y = cublaslt.lt.matmul_bias(dx, dw, db)
    assert y.dtype == dtype and y.shape == (m, n)
    assert rel_max(down(cublaslt, y), ref) < tol
    out = cublaslt.cupy.empty((m, n), dtype=dtype)
    assert cublaslt.lt.matmul_bias(dx, dw, db, out=out) is out
    assert rel_max(down(cublaslt, out), ref) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", list(MODES))
def test_matmul_bias_gelu(cublaslt: SimpleNamespace, mode: str,
                          shape: tuple[int, int, int]) -> None:
    dtype, tol, act_tol = setup_mode(cublaslt, mode)
    m, k, n = shape
    rng = np.random.default_rng(11)
    x, w, b = linear_operands(rng, dtype, m, k, n)
    ref_pre = f64(x) @ f64(w) + f64(b)
    dx, dw, db = up(cublaslt, x), up(cublaslt, w), up(cublaslt, b)
    pre = cublaslt.cupy.empty((m, n), dtype=dtype)
    y = cublaslt.lt.matmul_bias(dx, dw, db, gelu=True, pre_gelu_out=pre)  # GELU_AUX_BIAS
    assert rel_max(down(cublaslt, pre), ref_pre) < tol
    assert rel_max(down(cublaslt, y), gelu(ref_pre)) < act_tol
    y2 = cublaslt.lt.matmul_bias(dx, dw, db, gelu=True)  # GELU_BIAS
    assert rel_max(down(cublaslt, y2), gelu(ref_pre)) < act_tol


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(MODES))
def test_transposed_weight_view_and_batch_axes(cublaslt: SimpleNamespace, mode: str) -> None:
    dtype, tol, act_tol = setup_mode(cublaslt, mode)
    m, k, n = SHAPES[2]
    rng = np.random.default_rng(15)
    x, wt, b = host(rng, dtype, m, k), host(rng, dtype, n, k, scale=k**-0.5), \
        host(rng, dtype, n, scale=0.5)
    ref_pre = f64(x) @ f64(wt).T + f64(b)
    dx, dwt, db = up(cublaslt, x), up(cublaslt, wt), up(cublaslt, b)
    y = cublaslt.lt.matmul_bias(dx, dwt.T, db)  # w (K, N) as the view of a (N, K) array: op T
    assert rel_max(down(cublaslt, y), ref_pre) < tol
    pre = cublaslt.cupy.empty((m, n), dtype=dtype)
    y = cublaslt.lt.matmul_bias(dx, dwt.T, db, gelu=True, pre_gelu_out=pre)
    assert rel_max(down(cublaslt, pre), ref_pre) < tol
    assert rel_max(down(cublaslt, y), gelu(ref_pre)) < act_tol
    x3 = dx[: 2 * (m // 2)].reshape(2, m // 2, k)  # (B, T, K) @ (K, N)
    y3 = cublaslt.lt.matmul_bias(x3, dwt.T, db)
    assert y3.shape == (2, m // 2, n)
    assert rel_max(down(cublaslt, y3).reshape(-1, n), ref_pre[: 2 * (m // 2)]) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fp32", "fp16"])
def test_misaligned_parameter_views(cublaslt: SimpleNamespace, mode: str) -> None:
    """Parameters and gradients are views into one flat buffer, at any element offset."""
    dtype, tol, _ = setup_mode(cublaslt, mode)
    m, k, n = 256, 96, 160
    rng = np.random.default_rng(16)
    flat = host(rng, dtype, 3 + k * n + n, scale=k**-0.5)
    x, g = host(rng, dtype, m, k), host(rng, dtype, m, n)
    dflat = up(cublaslt, flat)
    w, b = dflat[1 : 1 + k * n].reshape(k, n), dflat[1 + k * n : 1 + k * n + n]
    grads = cublaslt.cupy.empty(5 + k * n, dtype=dtype)
    dw_out = grads[3 : 3 + k * n].reshape(k, n)
    wf, bf = f64(flat[1 : 1 + k * n]).reshape(k, n), f64(flat[1 + k * n : 1 + k * n + n])
    try:
        y = cublaslt.lt.matmul_bias(up(cublaslt, x), w, b)
        cublaslt.lt.matmul_into(up(cublaslt, x).T, up(cublaslt, g), dw_out)
    except CublasLtUnsupported as exc:
        pytest.xfail(f"no cuBLASLt algorithm for misaligned operands (callers fall back): {exc}")
    assert rel_max(down(cublaslt, y), f64(x) @ wf + bf) < tol
    assert rel_max(down(cublaslt, dw_out), f64(x).T @ f64(g)) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_graph_capture_and_replay(cublaslt: SimpleNamespace, mode: str) -> None:
    """Eager warm-up plans the problems; a capture on the (non-default) stream records them;
    a replay on new inputs matches the references."""
    dtype, tol, act_tol = setup_mode(cublaslt, mode)
    m, k, n = SHAPES[1]
    rng = np.random.default_rng(17)
    x, w, b = linear_operands(rng, dtype, m, k, n)
    g = host(rng, dtype, m, n)
    dx, dw, db, dg = up(cublaslt, x), up(cublaslt, w), up(cublaslt, b), up(cublaslt, g)
    cp = cublaslt.cupy
    y, y2, pre = (cp.empty((m, n), dtype=dtype) for _ in range(3))
    gw = cp.empty((k, n), dtype=dtype)

    def body() -> None:
        cublaslt.lt.matmul_bias(dx, dw, db, out=y)
        cublaslt.lt.matmul_bias(dx, dw, db, gelu=True, out=y2, pre_gelu_out=pre)
        cublaslt.lt.matmul_into(dx.T, dg, gw)

    body()  # eager warm-up: plans every problem
    cublaslt.stream.synchronize()
    cublaslt.stream.begin_capture()
    try:
        body()
    finally:
        graph = cublaslt.stream.end_capture()
    # new inputs in the same buffers: the outputs still hold the warm-up's results, so only
    # a replay that really ran can match the new references
    x, g = host(rng, dtype, m, k), host(rng, dtype, m, n)
    dx.set(x, stream=cublaslt.stream)
    dg.set(g, stream=cublaslt.stream)
    graph.launch(cublaslt.stream)
    ref_pre = f64(x) @ f64(w) + f64(b)
    assert rel_max(down(cublaslt, y), ref_pre) < tol
    assert rel_max(down(cublaslt, pre), ref_pre) < tol
    assert rel_max(down(cublaslt, y2), gelu(ref_pre)) < act_tol
    assert rel_max(down(cublaslt, gw), f64(x).T @ f64(g)) < tol


@pytest.mark.gpu
def test_first_call_during_capture_is_refused(cublaslt: SimpleNamespace) -> None:
    """An unplanned problem inside a capture raises CublasLtUnsupported (a ValueError, so the
    caller falls back) without invalidating the capture."""
    setup_mode(cublaslt, "fp32")
    rng = np.random.default_rng(18)
    m, k, n = 40, 72, 88  # a shape no other test plans
    dtype = np.dtype(np.float32)
    dx, dw, db = up(cublaslt, host(rng, dtype, m, k)), up(cublaslt, host(rng, dtype, k, n)), \
        up(cublaslt, host(rng, dtype, n))
    out = cublaslt.cupy.empty((m, n), dtype=dtype)
    cublaslt.stream.synchronize()
    cublaslt.stream.begin_capture()
    try:
        with pytest.raises(CublasLtUnsupported, match="capture"):
            cublaslt.lt.matmul_bias(dx, dw, db, out=out)
    finally:
        cublaslt.stream.end_capture()
    cublaslt.lt.matmul_bias(dx, dw, db, out=out)  # eager: fine


@pytest.mark.gpu
def test_gpu_rejects_unsupported(cublaslt: SimpleNamespace) -> None:
    rng = np.random.default_rng(19)
    d64 = np.dtype(np.float64)
    x, w, b = (up(cublaslt, host(rng, d64, *s)) for s in ((8, 16), (16, 8), (8,)))
    with pytest.raises(ValueError):
        cublaslt.lt.matmul_bias(x, w, b)


def test_the_bias_epilogues_are_chosen_once_for_bf16_and_fp8_gemms() -> None:
    """matmul_bias and matmul_fp8 pick their epilogue by one rule (_bias_epilogue): BIAS (a
    residual added as C), GELU_BIAS, GELU_AUX_BIAS with a pre-activation; FP8 adds that a
    bias takes bfloat16 out, not added into."""
    lt = SimpleNamespace(epilogue_default=1, epilogue_bias=4, epilogue_gelu_bias=36,
                         epilogue_gelu_aux_bias=164)
    pre, res = object(), object()
    pick = lt_mod._bias_epilogue
    assert pick(lt, "f", 64, False, None, None) == 4
    assert pick(lt, "f", 64, False, None, res) == 4
    assert pick(lt, "f", 64, True, None, None) == 36
    assert pick(lt, "f", 64, True, pre, None) == 164
    for gelu, aux, residual, message in ((False, pre, None, "needs gelu"),
                                         (True, pre, None, "N % 8"),
                                         (True, None, res, "not under a GELU")):
        with pytest.raises(CublasLtUnsupported, match=message):
            pick(lt, "f", 60 if message == "N % 8" else 64, gelu, aux, residual)
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    out = np.empty((2, 64), bf16)
    bias = np.zeros(64, bf16)
    fp8 = lt_mod._fp8_epilogue
    assert fp8(lt, out, None, False, None, None, True) == 1  # a weight gradient, added
    assert fp8(lt, out, bias, True, pre, None, False) == 164
    with pytest.raises(CublasLtUnsupported, match="come with a bias"):
        fp8(lt, out, None, True, None, None, False)
    with pytest.raises(CublasLtUnsupported, match="not added"):
        fp8(lt, np.empty((2, 64), np.float32), bias, False, None, None, False)
