"""The kernel table (engine/ops/table.py) and each op's contract (its folder's kernels.py):
every class the table names for an op has the reference's exact signature, every op the
engine calls is in the table with a kernel for every device and float dtype, a missing entry
names (op, device kind, dtype), and every device's kernels give the reference's results.

The table checks run everywhere (ops/cuda_set.py imports without CuPy); the behavioural
checks compare a device's kernels with XpKernels on the same device, float32 and float64, and
skip cleanly on a machine without a GPU."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rustyflow_py import data
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.ops import table
from rustyflow_py.engine.ops.batch.reference import epoch_offsets
from rustyflow_py.engine.ops.cpu_set import CpuKernels
from rustyflow_py.engine.ops.cuda_set import CudaKernels
from rustyflow_py.engine.ops.reference_set import XpKernels
from rustyflow_py.engine.ops.table import ANY, KernelNotFound
from rustyflow_py.engine.policy import RunPolicy

DTYPES = [np.float32, np.float64]
PACKAGE = Path(__file__).resolve().parents[1] / "rustyflow_py"
# `kernels.<name>` uses that are kernel-set state or settings, not kernels
NOT_KERNELS = {"xp", "backend", "jit", "threads", "cublas", "bound", "py", "blas_threaded"}
GPU_ONLY = {"attention_forward", "attention_backward"}  # the fused attention


# ---- the table ----------------------------------------------------------------------------------
def parameters(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def mismatches(entries: dict[tuple[str, str, str], type]) -> list[str]:
    """Every entry whose method's parameters (names, kinds, defaults) differ from the op's
    contract: its reference entry, or for a GPU-only op its GPU entry."""
    found = []
    for (op, kind, dtype), cls in sorted(entries.items(), key=lambda e: e[0]):
        ref = entries.get((op, "reference", ANY)) or entries[(op, "gpu", "float32")]
        if parameters(getattr(cls, op)) != parameters(getattr(ref, op)):
            found.append(f"{cls.__name__}.{op} ({kind}, {dtype}) is not {ref.__name__}.{op}")
    return found


def test_every_entry_has_the_contract_signature() -> None:
    entries = table.entries()
    assert len(entries) > 100 and mismatches(entries) == []


def test_a_kernel_with_another_signature_is_caught() -> None:
    (cpu_gemm,) = {cls for (op, kind, _), cls in table.entries().items()
                   if op == "matmul" and kind == "cpu"}

    class Drifted(cpu_gemm):  # type: ignore[misc, valid-type]
        def matmul(self, a: Any, b: Any, out: Any = None) -> Any:  # out= not keyword-only
            return super().matmul(a, b, out=out)

    entries = table.entries()
    entries[("matmul", "cpu", "float32")] = Drifted
    assert mismatches(entries) == ["Drifted.matmul (cpu, float32) is not GemmReference.matmul"]


def test_every_op_the_engine_calls_is_in_the_table() -> None:
    used = set()
    for path in PACKAGE.rglob("*.py"):
        used |= set(re.findall(r"\bkernels\.(\w+)", path.read_text()))
    assert used - NOT_KERNELS <= set(table.ops()), used - NOT_KERNELS - set(table.ops())


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_every_op_has_a_reference_and_a_kernel_per_float_dtype(kind: str) -> None:
    missing = []
    for op in table.ops():
        kinds = ["gpu"] if op in GPU_ONLY else ["reference", kind]
        for k in kinds:
            for dtype in ("float32", "float64", "float16"):
                try:
                    table.lookup(op, k, dtype)
                except KernelNotFound as exc:
                    missing.append(str(exc))
    assert missing == []


def test_a_missing_entry_names_op_device_kind_and_dtype() -> None:
    with pytest.raises(KernelNotFound, match="'layernorm_forward' on device kind 'cpu' for "
                                             "dtype int64"):
        get_backend("cpu").kernels.layernorm_forward(np.ones((2, 4), np.int64), None, None, 1e-5)
    with pytest.raises(KernelNotFound, match="'attention_forward' on device kind 'cpu' for "
                                             "dtype float32 \\(none declared"):
        table.lookup("attention_forward", "cpu", "float32")


def test_an_entry_is_declared_once() -> None:
    (cls,) = {c for (op, kind, _), c in table.entries().items()
              if op == "sum_rows" and kind == "reference"}
    with pytest.raises(ValueError, match="declared twice"):
        table.declare("sum_rows", reference={ANY: cls})
    with pytest.raises(ValueError, match="unknown device kind"):
        table.declare("sum_rows", tpu={ANY: cls})


def test_each_kernel_set_has_every_op() -> None:
    for cls in (XpKernels, CpuKernels, CudaKernels):
        assert {"reference": XpKernels, "cpu": CpuKernels, "gpu": CudaKernels}[cls.kind] is cls
    kernels = XpKernels(get_backend("cpu"))
    assert all(callable(getattr(kernels, op)) for op in table.ops())


def test_cuda_kernels_import_without_cupy() -> None:
    """CuPy is imported lazily, on first use, so the table can be checked anywhere."""
    code = ("import sys; sys.modules['cupy'] = None; "  # any `import cupy` now fails
            "import rustyflow_py.engine.ops.cuda_set")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


# ---- behaviour against the reference, per device ------------------------------------------------
class Pair:
    """A device's kernels and the reference formulation on the same device."""

    def __init__(self, device: str) -> None:
        self.backend = get_backend(device)
        self.mine, self.ref = self.backend.kernels, XpKernels(self.backend)
        self.rng = np.random.default_rng(0)

    def randn(self, *shape: int, dtype: Any, scale: float = 1.0) -> Any:
        return self.dev((self.rng.standard_normal(shape) * scale).astype(dtype))

    def ints(self, high: int, *shape: int) -> Any:
        return self.dev(self.rng.integers(0, high, shape).astype(np.int32))

    def dev(self, host: Any) -> Any:
        return self.backend.from_host(np.asarray(host))

    def close(self, mine: Any, ref: Any, dtype: Any, tol: float = 1e-4) -> None:
        """float32 within `tol` (NumPy, numba and CUDA round differently); float64 tight."""
        rtol, atol = (tol, tol / 10) if dtype == np.float32 else (1e-9, 1e-11)
        got, want = self.backend.to_host(mine), self.backend.to_host(ref)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.fixture
def pair(device: str) -> Pair:
    return Pair(device)


MATMUL_CASES = {  # a shape, b shape, transpose_b
    "2d": ((13, 17), (17, 11), False),
    "transpose_b": ((13, 17), (11, 17), True),
    "batched": ((2, 3, 9, 8), (2, 3, 8, 7), False),
    "batched_transpose_b": ((2, 3, 9, 8), (2, 3, 7, 8), True),
    "rows_at_a_matrix": ((4, 9, 8), (8, 7), False),
    "split_rows": ((2048, 64), (64, 128), False),  # large enough for the CPU to split them
    "split_cols": ((64, 64), (64, 4096), False),
    "split_reduction": ((64, 4096), (4096, 64), False),
    "split_few_rows": ((1, 256), (256, 4096), False),  # a decode step's product: b streamed
    "split_few_rows_transpose_b": ((3, 256), (4096, 256), True),  # the tied LM head's
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", MATMUL_CASES)
@pytest.mark.parametrize("into_out", ["fresh", "out", "accumulate"])
def test_matmul(pair: Pair, dtype: Any, case: str, into_out: str) -> None:
    sa, sb, transpose_b = MATMUL_CASES[case]
    a, b = pair.randn(*sa, dtype=dtype), pair.randn(*sb, dtype=dtype)
    shape = (*np.broadcast_shapes(sa[:-2], sb[:-2]), sa[-2], sb[-2 if transpose_b else -1])
    start = pair.randn(*shape, dtype=dtype)
    results = []
    for k in (pair.mine, pair.ref):
        out = None if into_out == "fresh" else start.copy()
        y = k.matmul(a, b, transpose_b=transpose_b, out=out, accumulate=into_out == "accumulate")
        assert out is None or y is out
        results.append(y)
    pair.close(*results, dtype, tol=1e-3)  # float32: up to 4096 products summed in any order
    if into_out == "accumulate":  # and it did add: the product alone differs
        product = pair.ref.matmul(a, b, transpose_b=transpose_b)
        pair.close(results[0] - start, product, dtype, tol=1e-3)


def test_a_few_rows_product_threads_blas_for_its_call_only() -> None:
    """On the CPU a decode step's product (few rows) runs on BLAS's own threads, which the
    kernel set otherwise pins to one (the pool splits the larger GEMMs): after the call BLAS
    is single-threaded again, and the product is right."""
    from rustyflow_py.engine.devices import numpy_blas

    found = numpy_blas()
    kernels = get_backend("cpu", RunPolicy(threads=2)).kernels
    if found is None or not kernels.split_gemms:
        pytest.skip("this NumPy's BLAS cannot be pinned: the pool does not split GEMMs")
    threads = found.get_num_threads
    seen: list[int] = []
    real = np.matmul

    def matmul(*args: Any, **kwargs: Any) -> Any:
        seen.append(threads())
        return real(*args, **kwargs)

    a = np.random.default_rng(0).standard_normal((1, 256), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((4096, 256), dtype=np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(np, "matmul", matmul)
        y = kernels.matmul(a, b, transpose_b=True)
    assert seen == [min(2, len(os.sched_getaffinity(0)))] and threads() == 1
    np.testing.assert_allclose(y, a @ b.T, rtol=1e-4, atol=1e-4)


SAMPLINGS = {  # temperature, top_k, top_p
    "softmax": (1.0, 0, 1.0), "top_k": (0.7, 50, 1.0), "top_k_and_top_p": (1.0, 50, 0.95),
    "top_k_one": (2.0, 1, 1.0), "top_k_all_but_one": (1.0, -1, 0.5),
    "top_k_at_the_sorting_limit": (1.5, 1024, 0.3), "top_p_alone": (1.3, 0, 0.9),
    "top_k_one_and_top_p": (1.0, 1, 0.5), "top_k_two_and_top_p": (0.9, 2, 0.6),
}


def next_token_logits(pair: Pair, vocab: int, dtype: Any) -> Any:
    """Rows (4, vocab): continuous; rounded to integers (ties everywhere, at every cut);
    one peaked row; and one with a run of -inf."""
    host = pair.rng.standard_normal((4, vocab)) * 3
    host[1] = np.round(host[1])
    host[2, 7] = 40.0
    host[3, : vocab // 2] = -np.inf
    return pair.dev(host.astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [300, 50257])
def test_argmax_rows(pair: Pair, dtype: Any, vocab: int) -> None:
    logits = next_token_logits(pair, vocab, dtype)
    got = pair.backend.to_host(pair.mine.argmax_rows(logits))
    assert got.dtype == np.int64
    assert got.tolist() == pair.backend.to_host(pair.ref.argmax_rows(logits)).tolist()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [300, 50257])
@pytest.mark.parametrize("setting", SAMPLINGS)
def test_sample_rows(pair: Pair, dtype: Any, vocab: int, setting: str) -> None:
    """The same tokens as the reference for 40 uniforms per row (0 among them): the kernel's
    float64 sums differ from the reference's only in rounding."""
    temperature, top_k, top_p = SAMPLINGS[setting]
    top_k = vocab - 1 if top_k == -1 else top_k
    logits = next_token_logits(pair, vocab, dtype)
    for i, u in enumerate(np.concatenate([np.zeros((1, 4)), pair.rng.random((39, 4))])):
        ids = [k.sample_rows(logits, pair.dev(u), temperature, top_k, top_p)
               for k in (pair.mine, pair.ref)]
        got, want = (pair.backend.to_host(x) for x in ids)
        assert got.dtype == np.int64
        assert got.tolist() == want.tolist(), (i, u)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 24), (2100, 200), (5000, 3), (1, 8)],
                         ids=["small", "many-rows", "odd-width", "one-row"])
@pytest.mark.parametrize("into", [False, True])
def test_sum_rows(pair: Pair, dtype: Any, shape: tuple[int, int], into: bool) -> None:
    """A few rows of the accumulation dtype (float32, float64) take the GPU's one small kernel
    (sum_rows.cu: small, odd-width, one-row), more rows its ones-GEMM (many-rows); with
    `into`, both add into the given buffer and return None."""
    x, start = pair.randn(*shape, dtype=dtype), pair.randn(shape[1], dtype=dtype)
    got = []
    for k in (pair.mine, pair.ref):
        if into:
            buffer = start.copy()
            assert k.sum_rows(x, buffer) is None
            got.append(buffer)
        else:
            got.append(k.sum_rows(x))
    pair.close(*got, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("into", [(False, False), (True, True), (True, False), (False, True)],
                         ids=["fresh", "both-into", "dw-into", "db-into"])
def test_linear_grads(pair: Pair, dtype: Any, into: tuple[bool, bool]) -> None:
    """dW and db, each fresh or added into a gradient buffer (then None in its place)."""
    x, g = pair.randn(3, 50, 16, dtype=dtype), pair.randn(3, 50, 24, dtype=dtype)
    starts = (pair.randn(16, 24, dtype=dtype), pair.randn(24, dtype=dtype))
    runs = []
    for k in (pair.mine, pair.ref):
        buffers = tuple(s.copy() if want else None for s, want in zip(starts, into, strict=True))
        grads = k.linear_grads(x, g, lambda fn, *a, **kw: fn(*a, **kw), buffers)
        assert [d is None for d in grads] == list(into)
        runs.append([b if b is not None else d for b, d in zip(buffers, grads, strict=True)])
    for mine, ref in zip(*runs, strict=True):
        pair.close(mine, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kept_operands_and_a_shared_gradient_give_the_same_values(pair: Pair,
                                                                   dtype: Any) -> None:
    """A Linear's backward GEMMs from what kept_for_backward gave after its forward, with g
    inside shared_gradient(g), and from x, w and g as they are: the same values."""
    x, g = pair.randn(3, 50, 16, dtype=dtype), pair.randn(3, 50, 24, dtype=dtype)
    w, b = pair.randn(16, 24, dtype=dtype), pair.randn(24, dtype=dtype)
    k, run = pair.mine, (lambda fn, *a, **kw: fn(*a, **kw))

    def grads(x: Any, w: Any) -> list[Any]:
        dx = k.matmul(g, w, transpose_b=True, gradient="a")
        return [dx, *k.linear_grads(x, g, run)]

    alone = grads(x, w)
    k.linear(x, w, b, False, run)
    kept = k.kept_for_backward(x, w)
    with k.shared_gradient(g):
        shared = grads(*kept)
    for got, want in zip(shared, alone, strict=True):
        pair.close(got, want, dtype, tol=0.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "width"), [(15, 48), (2100, 200), (33, 41), (37, 1100)],
                         ids=["small", "many-rows", "odd-width", "wide"])
def test_layernorm(pair: Pair, dtype: Any, rows: int, width: int) -> None:
    """Widths up to 1024 run the GPU's register-row kernels (many rows: several rows per warp
    in backward), over 16-byte vectors when the rows are whole vectors and a value at a time
    otherwise (odd width); wider rows the multi-pass ones."""
    x = pair.randn(rows, width, dtype=dtype, scale=3.0)
    w, b = pair.randn(width, dtype=dtype), pair.randn(width, dtype=dtype)
    g = pair.randn(rows, width, dtype=dtype)
    fwd = [k.layernorm_forward(x, w, b, 1e-5) for k in (pair.mine, pair.ref)]
    for mine, ref in zip(*fwd, strict=True):
        pair.close(mine, ref, dtype)
    # for a Linear's input (no FP8 run here: the same LayerNorm)
    for mine, ref in zip(pair.mine.layernorm_forward_for_linear(x, w, b, 1e-5), fwd[1],
                         strict=True):
        pair.close(mine, ref, dtype)
    bwd = [k.layernorm_backward(g, x, w, f[1], f[2])
           for k, f in zip((pair.mine, pair.ref), fwd, strict=True)]
    for mine, ref in zip(*bwd, strict=True):
        pair.close(mine, ref, dtype)
    # dw and db added into gradient buffers: None in their place, the same sums added
    start = pair.randn(2, width, dtype=dtype)
    added = []
    for k, f in zip((pair.mine, pair.ref), fwd, strict=True):
        buffers = start.copy()
        dx, *none = k.layernorm_backward(g, x, w, f[1], f[2], tuple(buffers))
        assert none == [None, None]
        added.append((dx, buffers))
    for mine, ref in zip(*added, strict=True):
        pair.close(mine, ref, dtype)
    # the residual stream's gradient joined into dx in the same pass (each warp's next row
    # loaded, residual included, while it sums the current one)
    residual = pair.randn(rows, width, dtype=dtype)
    joined = [k.layernorm_backward(g, x, w, f[1], f[2], residual=residual)[0]
              for k, f in zip((pair.mine, pair.ref), fwd, strict=True)]
    pair.close(*joined, dtype)
    # for a Linear's output (no FP8 run here: the same backward)
    for_linear = pair.mine.layernorm_backward_for_linear(g, x, w, fwd[0][1], fwd[0][2],
                                                         residual=residual)
    for mine, ref in zip(for_linear, pair.mine.layernorm_backward(
            g, x, w, fwd[0][1], fwd[0][2], residual=residual), strict=True):
        pair.close(mine, ref, dtype, tol=0.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", [((3, 7, 40), (3, 7, 40)), ((3, 7, 41), (3, 7, 41)),
                                    ((3, 7, 40), (7, 40)), ((5, 8), (5, 8))],
                         ids=["vectors", "odd", "broadcast", "small"])
def test_add(pair: Pair, dtype: Any, shapes: tuple[tuple[int, ...], ...]) -> None:
    """Equal arrays of whole 16-byte vectors take the GPU's vector kernel ("vectors",
    "small"); the rest CuPy's add."""
    a, b = pair.randn(*shapes[0], dtype=dtype), pair.randn(*shapes[1], dtype=dtype)
    mine = pair.mine.add(a, b)
    assert mine.shape == shapes[0] and mine.dtype == a.dtype
    pair.close(mine, pair.ref.add(a, b), dtype)


def sixteen_bit(device: str, name: str) -> tuple[Pair, np.dtype]:
    """The GPU's kernels and the 16-bit dtype `name` (skips elsewhere, and bfloat16 without
    ml_dtypes)."""
    if device != "gpu":
        pytest.skip("16-bit kernels run on the GPU only")
    dtype = (np.dtype(pytest.importorskip("ml_dtypes").bfloat16) if name == "bfloat16"
             else np.dtype(np.float16))
    return Pair(device), dtype


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_16_bit_vector_kernels_on_the_gpu(device: str, name: str) -> None:
    """add.cu and gelu_vec.cu load 16-bit vectors and compute in float32: each result is the
    float64 one on the same 16-bit inputs, rounded once to 16 bits (half a unit in the last
    place, relative), give or take float32's own error. That is 1e-5 absolute at most here:
    GELU's slope cancels where it nears 0 (u below about -4), and a NumPy float32 emulation of
    these formulas, over 20 seeds of these inputs, was off by up to 3.2e-6 there."""
    pair, dtype = sixteen_bit(device, name)
    a, b, g = ((pair.rng.standard_normal((6, 7, 64)) * s).astype(dtype) for s in (3, 1, 1))
    bias = pair.rng.standard_normal(64).astype(dtype)
    a64, b64, g64, bias64 = (x.astype(np.float64) for x in (a, b, g, bias))
    kernels, dev, ref = pair.mine, pair.dev, XpKernels(get_backend("cpu"))  # ref: float64
    cases = [(kernels.add(dev(a), dev(b)), ref.add(a64, b64)),
             (kernels.gelu_backward(dev(g), dev(a), dev(bias)),
              ref.gelu_backward(g64, a64, bias64)),
             (kernels.gelu_backward(dev(g), dev(a), None), ref.gelu_backward(g64, a64, None))]
    ulp = 2.0 ** -(8 if name == "bfloat16" else 11)  # relative
    for got, want in cases:
        host = pair.backend.to_host(got)
        assert host.dtype == dtype
        err = np.abs(host.astype(np.float64) - want)
        assert (err <= ulp * np.abs(want) + 1e-5).all(), float(err.max())


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("size", [8 * 1000, 8 * 1000 + 3], ids=["vectors", "odd"])
def test_cast_into(device: str, name: str, size: int) -> None:
    """The compute copy: float32 rounded to the nearest 16-bit value (ties to even), the same
    bits as the host's conversion, on every device and for any length."""
    dtype = (np.dtype(pytest.importorskip("ml_dtypes").bfloat16) if name == "bfloat16"
             else np.dtype(name))
    pair = Pair(device)
    src = (pair.rng.standard_normal(size) * 100).astype(np.float32)
    src[:4] = [1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 65504.0, -0.0]  # ties, float16's largest
    dst = pair.dev(np.zeros(size, dtype))
    assert pair.mine.cast_into(dst, pair.dev(src)) is None
    assert pair.backend.to_host(dst).tobytes() == src.astype(dtype).tobytes()
    back = pair.dev(np.full(size, np.nan, np.float32))  # and widened back: exact
    assert pair.mine.cast_into(back, dst) is None
    assert pair.backend.to_host(back).tobytes() == src.astype(dtype).astype(np.float32).tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_16_bit_gradients_add_into_float32_buffers_on_the_gpu(device: str, name: str) -> None:
    """Mixed precision's weight, bias, MLP and LayerNorm gradients: 16-bit inputs, each gradient
    summed in float32 and added into its float32 buffer, never rounded to 16 bits. So each
    is the float64 sum over the same 16-bit inputs to float32's summation error (1e-5 of the
    largest value here, over 1,200 terms), not to a 16-bit unit."""
    pair, dtype = sixteen_bit(device, name)
    k, dev = pair.mine, pair.dev
    x, g = (pair.rng.standard_normal((4, 300, n)).astype(dtype) for n in (64, 96))
    x64, g64 = (a.astype(np.float64).reshape(1200, -1) for a in (x, g))
    starts = [pair.rng.standard_normal(shape).astype(np.float32)
              for shape in ((64, 96), (96,), (64,), (64,))]
    dw, db, lw, lb = (dev(s) for s in starts)
    assert k.linear_grads(dev(x), dev(g), lambda fn, *a, **kw: fn(*a, **kw), (dw, db)) == (
        None, None)
    w = pair.rng.standard_normal(64).astype(dtype)
    _, mean, rstd = k.layernorm_forward(dev(x), dev(w), dev(w), 1e-5)
    gx = dev(g[..., :64].copy())
    assert k.layernorm_backward(gx, dev(x), dev(w), mean, rstd, (lw, lb))[1:] == (None, None)
    gelu_sums = dev(starts[1])  # the MLP's b1: column sums of the GELU backward's result
    dpre = pair.backend.to_host(k.gelu_backward(dev(g), dev(g), None, gelu_sums))
    xhat = (x64 - pair.backend.to_host(mean).reshape(-1, 1)) * pair.backend.to_host(
        rstd).reshape(-1, 1)
    wants = [x64.T @ g64, g64.sum(axis=0), (g64[:, :64] * xhat).sum(axis=0),
             g64[:, :64].sum(axis=0)]
    wants.append(dpre.astype(np.float64).reshape(1200, -1).sum(axis=0))  # of the values stored
    for got, start, want in zip((dw, db, lw, lb, gelu_sums), (*starts, starts[1]), wants,
                                strict=True):
        host = pair.backend.to_host(got)
        assert host.dtype == np.float32
        err = np.abs(host - start - want).max() / np.abs(want).max()
        assert err < 1e-5, err


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("width", [1001, 1040], ids=["rows", "padded-rows"])
def test_16_bit_cross_entropy_on_the_gpu(device: str, name: str, width: int) -> None:
    """xent.cu on 16-bit logits, read as vectors where the rows are aligned (padded: 1040
    columns, the first 1001 used, so the last values are the scalar tail) and one value at a
    time otherwise: the loss is the float64 one on the same inputs to float32's accuracy, and
    each gradient value is the float64 one rounded once to 16 bits (half a unit in the last
    place, or of float16's subnormal spacing) give or take float32's error in exp."""
    pair, dtype = sixteen_bit(device, name)
    logits = (pair.rng.standard_normal((37, width)) * 4).astype(dtype)
    targets = pair.rng.integers(0, 1001, 37).astype(np.int32)
    ref = XpKernels(get_backend("cpu"))  # float64
    seed = np.asarray(0.7)
    want_loss, state = ref.cross_entropy(logits.astype(np.float64)[:, :1001], targets, True,
                                         False)
    want = ref.cross_entropy_backward(state, seed)
    loss, state = pair.mine.cross_entropy(pair.dev(logits)[:, :1001], pair.dev(targets), True,
                                          False)
    got = pair.backend.to_host(pair.mine.cross_entropy_backward(state, pair.dev(seed)))
    assert abs(float(pair.backend.to_host(loss)) - float(want_loss)) < 1e-5 * float(want_loss)
    assert got.dtype == dtype and got.shape == want.shape
    ulp = 2.0 ** -(8 if name == "bfloat16" else 11)
    err = np.abs(got.astype(np.float64) - want)
    # 2^-25: half float16's subnormal spacing, where rounding is absolute, not relative
    assert (err <= ulp * np.abs(want) + 2.0**-25).all(), float(err.max())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("rows", [0, 16, 20])  # LM_HEAD_CHUNK: all 64 rows; 4 chunks; 20 x 3 + 4
def test_16_bit_lm_head_on_the_gpu(device: str, name: str, rows: int) -> None:
    """The tied LM head on 16-bit inputs. bfloat16's forward writes (softmax - onehot) / N
    in its own pass over the logits and the backward scales by the upstream gradient on the
    (N, E) side; float16 keeps the backward's pass (its loss scaling needs the scaled
    values). Either way, whole or in chunks of rows, the loss, dh, and dw added into a
    float32 buffer are the float64 ones on the same inputs to within 16-bit rounding of the
    logits and their gradient."""
    pair, dtype = sixteen_bit(device, name)
    k, dev = get_backend(pair.backend.name, RunPolicy(head_chunk=rows)).kernels, pair.dev
    h, w = ((pair.rng.standard_normal(shape) * s).astype(dtype)
            for shape, s in (((64, 32), 0.3), ((300, 32), 1.0)))  # logits of std 1.7
    targets = pair.rng.integers(0, 300, 64).astype(np.int32)
    ref = XpKernels(get_backend("cpu"))  # float64
    want_loss, state = ref.lm_head_xent(h.astype(np.float64), w.astype(np.float64), targets,
                                        True, ref.matmul)
    want_dh, want_dw = ref.lm_head_xent_backward(state, np.asarray(0.7), True, True, ref.matmul)
    loss, state = k.lm_head_xent(dev(h), dev(w), dev(targets), True, k.matmul)
    start = pair.rng.standard_normal((300, 32)).astype(np.float32)
    buffer = dev(start)
    dh, dw = k.lm_head_xent_backward(state, dev(np.asarray(0.7, np.float32)), True, True,
                                     k.matmul, buffer)
    assert dw is None and dh.dtype == dtype
    got = [float(pair.backend.to_host(loss)), pair.backend.to_host(dh).astype(np.float64),
           pair.backend.to_host(buffer) - start]
    for g, want in zip(got, (float(want_loss), want_dh, want_dw), strict=True):
        assert np.abs(g - want).max() <= 1e-2 * np.abs(want).max()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("width", [40, 41])
def test_gelu(pair: Pair, dtype: Any, with_bias: bool, width: int) -> None:
    """Width 40 takes the GPU's 16-byte vector backward kernel at every dtype; 41 the
    element-wise one (rows of whole vectors only). With `sums_into` the column sums of the
    backward's result are added into a buffer too (on the GPU, from the same pass for rows
    of whole vectors: 300 rows, cut into chunks)."""
    x, g = pair.randn(3, 7, width, dtype=dtype, scale=3.0), pair.randn(3, 7, width, dtype=dtype)
    bias = pair.randn(width, dtype=dtype) if with_bias else None
    pair.close(pair.mine.gelu_forward(x, bias), pair.ref.gelu_forward(x, bias), dtype)
    pair.close(pair.mine.gelu_backward(g, x, bias), pair.ref.gelu_backward(g, x, bias), dtype)
    x, g = pair.randn(300, width, dtype=dtype, scale=3.0), pair.randn(300, width, dtype=dtype)
    start = pair.randn(width, dtype=dtype)
    runs = []
    for k in (pair.mine, pair.ref):
        sums = start.copy()
        runs.append((k.gelu_backward(g, x, bias, sums), sums))
    for mine, ref in zip(*runs, strict=True):
        pair.close(mine, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_softmax(pair: Pair, dtype: Any) -> None:
    """T = 70 crosses the CPU's 64-row query blocks; masked entries must be exactly 0."""
    scores = pair.randn(2, 3, 70, 70, dtype=dtype, scale=4.0)
    g = pair.randn(2, 3, 70, 70, dtype=dtype)
    above = ~np.tri(70, dtype=bool)
    runs = []
    for k in (pair.mine, pair.ref):
        plain = k.causal_softmax_forward(scores.copy(), 0.3)
        probs, lse = k.causal_softmax_forward(scores.copy(), 0.3, True)
        again = k.causal_softmax_recompute(scores.copy(), lse, 0.3)
        runs.append((plain, probs, lse, again, k.causal_softmax_backward(g, probs, 0.3)))
    for i, (mine, ref) in enumerate(zip(*runs, strict=True)):
        pair.close(mine, ref, dtype)
        if i != 2:  # all but the lse are (B, H, T, T)
            assert not pair.backend.to_host(mine)[..., above].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("padded", [False, True], ids=["rows", "padded-rows"])
def test_cross_entropy(pair: Pair, dtype: Any, inplace: bool, padded: bool) -> None:
    """`padded`: the logits are the (N, V) view of wider rows, as the GPU's LM head makes."""
    logits = pair.randn(37, 1040 if padded else 1001, dtype=dtype, scale=4.0)
    logits[3] += 500.0  # a row only the max shift keeps finite
    targets = pair.ints(1001, 37)
    seed = pair.dev(np.asarray(0.7, dtype))

    def fresh() -> Any:
        return logits.copy()[:, :1001]

    for k in (pair.mine, pair.ref):
        loss, state = k.cross_entropy(fresh(), targets, False, inplace)
        assert state is None
    runs = []
    for k in (pair.mine, pair.ref):
        loss, state = k.cross_entropy(fresh(), targets, True, inplace)
        runs.append((loss, k.cross_entropy_backward(state, seed)))
    for mine, ref in zip(*runs, strict=True):
        pair.close(mine, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("vocab", [300, 320])  # the GPU pads 300 to 320 columns, uses 320 as is
def test_lm_head_xent(pair: Pair, dtype: Any, need: tuple[bool, bool], vocab: int) -> None:
    """Rows 1 and 2 overflow / underflow an unshifted softmax (the CPU redoes them)."""
    h, w = pair.randn(24, 16, dtype=dtype), pair.randn(vocab, 16, dtype=dtype)
    h[1] *= 40.0
    h[2] = -h[1]
    targets = pair.ints(vocab, 24)
    seed = pair.dev(np.asarray(0.7, dtype))
    start = pair.randn(vocab, 16, dtype=dtype)
    runs = []
    for k in (pair.mine, pair.ref):
        loss, state = k.lm_head_xent(h, w, targets, False, k.matmul)
        assert state is None
        loss, state = k.lm_head_xent(h, w, targets, True, k.matmul)
        dh, dw = k.lm_head_xent_backward(state, seed, *need, k.matmul)
        assert (dh is not None, dw is not None) == need
        runs.append((loss, *(d for d in (dh, dw) if d is not None)))
        if need[1]:  # dw added into w's gradient buffer instead
            buffer = start.copy()
            _, state = k.lm_head_xent(h, w, targets, True, k.matmul)
            _, dw = k.lm_head_xent_backward(state, seed, *need, k.matmul, buffer)
            assert dw is None
            runs[-1] += (buffer,)
    for mine, ref in zip(*runs, strict=True):
        pair.close(mine, ref, dtype)


def head_in_chunks(k: Any, h: Any, w: Any, targets: Any, seed: Any, buffer: Any = None
                   ) -> tuple[Any, ...]:
    """The loss without and with a gradient, dh, and dw (returned, or added into `buffer`)."""
    plain, _ = k.lm_head_xent(h, w, targets, False, k.matmul)
    loss, state = k.lm_head_xent(h, w, targets, True, k.matmul)
    dh, dw = k.lm_head_xent_backward(state, seed, True, True, k.matmul, buffer)
    return plain, loss, dh, (dw if buffer is None else buffer)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 7, 24, 100])  # 7: a last chunk of 3; 24 and 100: one
@pytest.mark.parametrize("into", [False, True])
def test_lm_head_xent_in_chunks(pair: Pair, dtype: Any, rows: int, into: bool) -> None:
    """LM_HEAD_CHUNK: the head made `rows` rows at a time gives the loss and both gradients
    of all 24 rows at once (the reference's), dw returned or added into w's buffer."""
    h, w = pair.randn(24, 16, dtype=dtype), pair.randn(300, 16, dtype=dtype)
    targets, seed = pair.ints(300, 24), pair.dev(np.asarray(0.7, dtype))
    start = pair.randn(300, 16, dtype=dtype)
    chunked = get_backend(pair.backend.name, RunPolicy(head_chunk=rows)).kernels
    runs = [head_in_chunks(k, h, w, targets, seed, start.copy() if into else None)
            for k in (chunked, pair.ref)]
    for mine, ref in zip(*runs, strict=True):
        assert mine.dtype == ref.dtype
        pair.close(mine, ref, dtype)


@pytest.mark.gpu
def test_a_chunked_head_keeps_no_logits_for_backward(device: str) -> None:
    """What LM_HEAD_CHUNK is for: after the forward the whole head keeps its (N, Vp) bf16
    logits (their gradient) for backward; a chunked one keeps dh (N, E) and dW's sum (V, E)."""
    pair, dtype = sixteen_bit(device, "bfloat16")
    n, e, v = 2048, 64, 4000
    h, w = (pair.randn(*shape, dtype=dtype, scale=0.3) for shape in ((n, e), (v, e)))
    targets = pair.ints(v, n)
    pool = pair.backend.xp.get_default_memory_pool()
    held = {}
    for rows in (0, 256):
        k = get_backend(pair.backend.name, RunPolicy(head_chunk=rows)).kernels
        before = pool.used_bytes()
        _, state = k.lm_head_xent(h, w, targets, True, k.matmul)
        held[rows] = pool.used_bytes() - before
        del state
    assert held[0] >= n * v * 2 > 4 * held[256]


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_add_rows(pair: Pair, dtype: Any) -> None:
    idx = pair.ints(9, 6, 5)  # 30 rows into 9: many repeats
    rows, start = pair.randn(6, 5, 4, dtype=dtype), pair.randn(9, 4, dtype=dtype)
    grads = [start.copy(), start.copy()]
    for k, grad in zip((pair.mine, pair.ref), grads, strict=True):
        k.scatter_add_rows(grad, idx, rows)
    pair.close(*grads, dtype, tol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_16_bit_rows_into_a_float32_table_on_the_gpu(device: str, name: str) -> None:
    """Mixed precision's embedding rows: 16-bit, added into the float32 gradient as they are,
    as the reference adds them widened first."""
    pair, dtype = sixteen_bit(device, name)
    idx = pair.ints(9, 64, 3)
    rows = pair.dev(pair.rng.standard_normal((64, 3, 96)).astype(dtype))
    start = pair.randn(9, 96, dtype=np.float32)
    grads = [start.copy(), start.copy()]
    pair.mine.scatter_add_rows(grads[0], idx, rows)
    pair.ref.scatter_add_rows(grads[1], idx, rows.astype(np.float32))
    pair.close(*grads, np.float32, tol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_l2_norm(pair: Pair, dtype: Any) -> None:
    g = pair.randn(300_001, dtype=dtype)  # several blocks on the CPU
    mine, ref = pair.mine.l2_norm(g), pair.ref.l2_norm(g)
    assert mine.shape == () and mine.dtype == dtype
    pair.close(mine, ref, dtype)


def optimizer_scalars(pair: Pair, clip: float | None) -> tuple[Any, Any, Any]:
    lr = pair.dev(np.asarray(1e-2, np.float32))
    step = pair.dev(np.asarray(3, np.int32))
    return lr, step, None if clip is None else pair.dev(np.asarray(clip, np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("clip", [None, 0.25])
@pytest.mark.parametrize("n", [300_001, 300_000], ids=["odd", "vectors"])
@pytest.mark.parametrize("name", ["adamw", "adam"])
def test_adamw(pair: Pair, dtype: Any, clip: float | None, n: int, name: str) -> None:
    """AdamW and Adam; float32 buffers of whole 16-byte vectors take the GPU's vector
    kernels, others its one-element-a-thread ones. The decay boundary falls inside a CPU
    block and inside a GPU vector."""
    decay_size = 200_003
    p, g, m = (pair.randn(n, dtype=dtype) for _ in range(3))
    v = abs(pair.randn(n, dtype=dtype)) * 0.1
    lr, step, scale = optimizer_scalars(pair, clip)
    states = []
    for k in (pair.mine, pair.ref):
        state = [p.copy(), m.copy(), v.copy()]
        getattr(k, name)(state[0], g, state[1], state[2], lr, step, scale, (0.9, 0.95), 1e-8,
                         0.1, decay_size)
        states.append(state)
    for mine, ref in zip(*states, strict=True):
        pair.close(mine, ref, np.float32, tol=1e-5)  # CUDA takes betas etc. as float32
    # and with the 16-bit compute copy written by the same update: the new p, rounded once
    copy = pair.dev(np.zeros(n, np.float16))
    again = p.copy()
    getattr(pair.mine, name)(again, g, m.copy(), v.copy(), lr, step, scale, (0.9, 0.95), 1e-8,
                             0.1, decay_size, copy)
    host = pair.backend.to_host(again)
    assert pair.backend.to_host(copy).tobytes() == host.astype(np.float16).tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd(pair: Pair, dtype: Any, nesterov: bool) -> None:
    p, g, velocity = (pair.randn(5000, dtype=dtype) for _ in range(3))
    lr, _, scale = optimizer_scalars(pair, 0.5)
    states = []
    for k in (pair.mine, pair.ref):
        state = [p.copy(), velocity.copy()]
        k.sgd(state[0], g, state[1], lr, scale, 0.9, nesterov, 0.1, 3000)
        states.append(state)
    for mine, ref in zip(*states, strict=True):
        pair.close(mine, ref, np.float32, tol=1e-5)  # CUDA takes the momentum as float32


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_at_step(pair: Pair, dtype: Any) -> None:
    xp = pair.backend.xp
    rings = [xp.zeros(5, dtype), xp.zeros(5, dtype)]
    step, value = pair.dev(np.asarray(7, np.int32)), pair.dev(np.asarray(2.5, dtype))
    for k, ring in zip((pair.mine, pair.ref), rings, strict=True):
        k.store_at_step(ring, step, value)
    pair.close(*rings, dtype)
    assert pair.backend.to_host(rings[0]).tolist() == [0, 2.5, 0, 0, 0]  # (7 - 1) mod 5


def test_gather_batch_shards_partition_the_stream(pair: Pair) -> None:
    """Ranks 0..3 of 4, over a whole epoch: every window of every row of the stream is
    gathered exactly once, by the rank that owns the row, and y is x shifted by one."""
    world, b, n, t = 4, 3, 41, 6  # 6 batches an epoch; the last 4 tokens are never a window
    host = np.arange(world * b * n, dtype=np.int32).reshape(world * b, n)
    stream, xp = pair.dev(host), pair.backend.xp
    seen = np.zeros(host.shape, int)
    batches = (n - 1) // t
    for rank in range(world):
        for step in range(batches + 1):  # one past the epoch: wraps to batch 0
            x, y = xp.zeros((b, t), np.int32), xp.zeros((b, t), np.int32)
            pair.mine.gather_batch(stream, pair.dev(np.asarray(step, np.int32)), t, x, y,
                                   rank=rank, world_size=world)
            x, y = pair.backend.to_host(x), pair.backend.to_host(y)
            np.testing.assert_array_equal(y, x + 1)
            rows, cols = np.divmod(x, n)  # token k sits at row k // n, column k % n
            assert (rows // b == rank).all()  # only this rank's rows
            if step < batches:
                np.add.at(seen, (rows, cols), 1)
            else:
                np.testing.assert_array_equal(x, host[rank * b:(rank + 1) * b, :t])
    assert (seen[:, : batches * t] == 1).all() and not seen[:, batches * t:].any()


def test_gather_batch_rejects_a_stream_that_is_not_world_size_shards(pair: Pair) -> None:
    stream = pair.dev(np.zeros((7, 20), np.int32))
    x = pair.backend.xp.zeros((2, 4), np.int32)
    with pytest.raises(ValueError, match="rank 1 of 4"):
        pair.mine.gather_batch(stream, pair.dev(np.asarray(0, np.int32)), 4, x, x.copy(),
                               rank=1, world_size=4)


def _lowbias32(shift: int, epoch: int, row: int) -> int:
    """The offset hash in plain Python integers: the bits epoch_offsets and batch.cu share."""
    m = 0xFFFFFFFF
    h = (shift * 0x9E3779B1 & m) ^ (epoch * 0x85EBCA77 & m) ^ (row * 0xC2B2AE3D & m)
    h ^= h >> 16
    h = h * 0x7FEB352D & m
    h ^= h >> 15
    h = h * 0x846CA68B & m
    return h ^ (h >> 16)


def test_epoch_offsets_are_the_documented_hash() -> None:
    for shift, epoch, t in ((1337, 0, 256), (0, 7, 13), (2**32 + 5, 3, 1), (99, 2**20, 64)):
        want = [_lowbias32(shift & 0xFFFFFFFF, epoch, r) % t for r in range(40)]
        assert epoch_offsets(shift, epoch, np.arange(40), t).tolist() == want


@pytest.mark.parametrize("world", [1, 4])
def test_gather_batch_with_random_offsets_moves_every_row_each_epoch(pair: Pair,
                                                                     world: int) -> None:
    """RANDOM_OFFSETS: within an epoch each row is read in consecutive windows from its own
    offset in [0, T) (epoch_offsets of its global row number, whatever the world size); the
    epoch has one window fewer; offsets differ between rows and epochs; y is x shifted by one;
    and the device's kernel gathers exactly what the reference does."""
    b, n, t, shift = 12 // world, 57, 8, 1337
    host = np.arange(12 * n, dtype=np.int32).reshape(12, n)
    stream, xp = pair.dev(host), pair.backend.xp
    batches = data.num_batches(host, t, shifted=True)
    assert batches == (n - 1) // t - 1 == 6
    starts = {}
    for epoch in range(3):
        for i in range(batches):
            step = pair.dev(np.asarray(epoch * batches + i, np.int32))
            for rank in range(world):
                got = []
                for k in (pair.mine, pair.ref):
                    x, y = xp.zeros((b, t), np.int32), xp.zeros((b, t), np.int32)
                    k.gather_batch(stream, step, t, x, y, rank=rank, world_size=world,
                                   shift=shift)
                    got.append((pair.backend.to_host(x), pair.backend.to_host(y)))
                (x, y), (rx, ry) = got
                np.testing.assert_array_equal(x, rx)
                np.testing.assert_array_equal(y, ry)
                np.testing.assert_array_equal(y, x + 1)
                rows = np.arange(rank * b, (rank + 1) * b)
                offsets = epoch_offsets(shift, epoch, rows, t)
                np.testing.assert_array_equal(x, host[rows[:, None], i * t + offsets[:, None]
                                                      + np.arange(t)])
                starts.update({(epoch, int(r)): int(o) for r, o in zip(rows, offsets,
                                                                      strict=True)})
    assert all(0 <= o < t for o in starts.values())
    assert len({starts[0, r] for r in range(12)}) > 1  # rows differ within an epoch
    assert any(starts[0, r] != starts[1, r] for r in range(12))  # and move between epochs
