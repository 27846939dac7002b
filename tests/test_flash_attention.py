"""Fused flash attention (ops/attention/flash.py) against materialised attention in float64:
forward o and lse, backward dq, dk, dv, with and without dropout, the dropout bits against
ops/dropout/philox.py's mask, strided (B, H, T, D) views read and written in place (and the
fallback to copies where a group's layouts disagree), and that no T x T buffer is allocated.
The GPU tests skip cleanly without CUDA; the register-layout check and the source/limit
checks run on the CPU."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.ops.attention import flash as fa
from rustyflow_py.engine.ops.dropout import philox

_GPU_REASON = gpu_unavailable_reason()
needs_gpu = pytest.mark.skipif(_GPU_REASON is not None, reason=str(_GPU_REASON))

DTYPES = ("float32", "float16", "bfloat16")
# max |got - want| / max |want|. float32 runs on tf32 tensor cores (10-bit mantissa); 16-bit
# inputs are compared with a reference computed from the same rounded inputs.
TOL = {"float32": 3e-3, "float16": 5e-3, "bfloat16": 3e-2}
# absolute, on log-sum-exps of order log(T); 16-bit inputs are exact in the reference
LSE_TOL = {"float32": 5e-3, "float16": 1e-4, "bfloat16": 1e-4}
SM90_SHARED_BYTES = 227 * 1024  # an sm_90 (H100) block's opt-in shared memory
SEED, STREAM = 1234, 5


@pytest.fixture(scope="module")
def cp() -> Any:
    return pytest.importorskip("cupy")


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


def _inputs(cp: Any, dtype: str, shape: tuple[int, ...], seed: int) -> tuple[list, list]:
    """q, k, v, do on the device in `dtype`, and the same (rounded) values in float64."""
    rng = np.random.default_rng(seed)
    host = [rng.standard_normal(shape).astype(np.float32).astype(_np_dtype(dtype))
            for _ in range(4)]
    return ([cp.asarray(x) for x in host],
            [cp.asarray(x.astype(np.float64)) for x in host])


def _host64(a: Any) -> np.ndarray:
    return a.get().astype(np.float64)


def _reference(cp: Any, q: Any, k: Any, v: Any, do: Any, scale: float,
               mask: Any | None) -> tuple:
    """o, lse, dq, dk, dv of o = (softmax_causal(scale q k^T) * mask) v, all materialised."""
    t = q.shape[2]
    s = scale * (q @ k.swapaxes(-1, -2))  # (B, H, T, T)
    causal = cp.tril(cp.ones((t, t), dtype=bool))
    s = cp.where(causal, s, -cp.inf)
    m = s.max(axis=-1, keepdims=True)
    e = cp.exp(s - m)
    z = e.sum(axis=-1, keepdims=True)
    p = e / z  # (B, H, T, T)
    lse = (m + cp.log(z))[..., 0]  # (B, H, T)
    used = p if mask is None else p * mask
    o = used @ v  # (B, H, T, D)
    dp = do @ v.swapaxes(-1, -2)  # (B, H, T, T)
    if mask is not None:
        dp = dp * mask
    di = (do * o).sum(axis=-1, keepdims=True)  # (B, H, T, 1)
    ds = p * (dp - di) * scale
    return o, lse, ds @ k, ds.swapaxes(-1, -2) @ q, used.swapaxes(-1, -2) @ do


def _rel_err(got: Any, want: Any) -> float:
    g, w = _host64(got), _host64(want)
    return float(np.abs(g - w).max() / np.abs(w).max())


CASES = [(t, d) for t in (64, 256, 100) for d in (64, 32)] + [(512, 64), (130, 128)]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("t,d", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_materialised_attention(cp: Any, dtype: str, t: int, d: int,
                                        p: float) -> None:
    b, h = 2, 3
    (q, k, v, do), ref_in = _inputs(cp, dtype, (b, h, t, d), seed=t * 1000 + d)
    scale = 1.0 / math.sqrt(d)
    step = cp.asarray(7, dtype=np.int32)
    drop = fa.Dropout(p, SEED, STREAM, step) if p else None
    mask = (philox.dropout_mask(cp, (b, h, t, t), np.float64, p, SEED, STREAM, step)
            if p else None)
    o, lse = fa.flash_attention_forward(q, k, v, scale, drop)
    dq, dk, dv = fa.flash_attention_backward(q, k, v, o, do, lse, scale, drop)
    assert_matches(dtype, q, (o, lse, dq, dk, dv), _reference(cp, *ref_in, scale, mask))


def assert_matches(dtype: str, q: Any, got: tuple, want: tuple) -> None:
    """o, lse, dq, dk, dv of a fused attention against _reference's, within TOL / LSE_TOL."""
    o, lse, *grads = got
    b, h, t, _ = q.shape
    assert lse.shape == (b, h, t) and lse.dtype == np.float32
    lse_err = float(np.abs(_host64(lse) - _host64(want[1])).max())
    assert lse_err < LSE_TOL[dtype], f"lse: {lse_err:.2e}"
    for name, a, ref in zip(("o", "dq", "dk", "dv"), (o, *grads), (want[0], *want[2:]),
                            strict=True):
        assert a.shape == q.shape and a.dtype == q.dtype, name
        err = _rel_err(a, ref)
        assert err < TOL[dtype], f"{name}: {err:.2e} (tolerance {TOL[dtype]:.0e})"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("t", [61, 64])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_dropout_bits_match_philox_mask(cp: Any, dtype: str, t: int) -> None:
    """With q = k = 0 every visible key has probability 1/(i+1), and with v_j the unit vector
    e_j the output reads the mask off: o[i, j] = keep(i, j) / ((i+1)(1-p)) for j <= i."""
    b, h, d, p = 2, 3, 64, 0.25
    q = cp.zeros((b, h, t, d), dtype=dtype)
    v = cp.zeros((b, h, t, d), dtype=dtype)
    v[..., cp.arange(t), cp.arange(t)] = 1
    step = cp.asarray(11, dtype=np.int32)
    o, lse = fa.flash_attention_forward(q, q, v, 0.125, fa.Dropout(p, SEED, STREAM, step))
    rows = np.arange(1, t + 1, dtype=np.float64)[:, None]
    kept = np.rint(_host64(o)[..., :t] * rows * (1 - p))  # (B, H, T, T)
    want = philox.dropout_mask(np, (b, h, t, t), np.float64, p, SEED, STREAM,
                               np.asarray(11, dtype=np.int32)) * (1 - p)
    want = np.rint(want) * np.tril(np.ones((t, t)))
    np.testing.assert_array_equal(kept, want)
    np.testing.assert_allclose(_host64(lse), np.broadcast_to(np.log(rows[:, 0]), (b, h, t)),
                               atol=1e-5)


@pytest.mark.gpu
@needs_gpu
def test_dropout_follows_the_device_step(cp: Any) -> None:
    """The same step redraws the same mask bit for bit (forward and the deterministic
    backward); a new step value, written on the device, draws another."""
    b, h, t, d = 2, 3, 130, 64
    (q, k, v, do), _ = _inputs(cp, "float16", (b, h, t, d), seed=3)
    step = cp.asarray(3, dtype=np.int32)
    drop = fa.Dropout(0.3, SEED, STREAM, step)

    def run() -> tuple:
        o, lse = fa.flash_attention_forward(q, k, v, 0.125, drop)
        return (o, *fa.flash_attention_backward(q, k, v, o, do, lse, 0.125, drop))

    first, again = run(), run()
    for a, b_ in zip(first, again, strict=True):
        assert bool(cp.array_equal(a, b_))
    step.fill(4)
    other = run()
    assert not bool(cp.array_equal(first[0], other[0]))
    assert not bool(cp.array_equal(first[1], other[1]))
    step.fill(3)
    assert bool(cp.array_equal(first[0], run()[0]))
    no_drop, _ = fa.flash_attention_forward(q, k, v, 0.125)
    assert not bool(cp.array_equal(first[0], no_drop))


@pytest.mark.gpu
@needs_gpu
def test_no_t_by_t_buffer(cp: Any) -> None:
    """Every byte forward and backward request from CuPy's pool, summed (an upper bound on
    their peak), stays far below one T x T float32 buffer."""
    b, h, t, d = 1, 1, 2048, 64
    (q, k, v, do), _ = _inputs(cp, "float16", (b, h, t, d), seed=9)
    step = cp.asarray(1, dtype=np.int32)
    drop = fa.Dropout(0.1, SEED, STREAM, step)
    o, lse = fa.flash_attention_forward(q, k, v, 0.125, drop)  # compile outside the count
    fa.flash_attention_backward(q, k, v, o, do, lse, 0.125, drop)
    pool = cp.get_default_memory_pool()
    requested: list[int] = []

    def counting(size: int) -> Any:
        requested.append(size)
        return pool.malloc(size)

    cp.cuda.set_allocator(counting)
    try:
        o, lse = fa.flash_attention_forward(q, k, v, 0.125, drop)
        grads = fa.flash_attention_backward(q, k, v, o, do, lse, 0.125, drop)
        cp.cuda.get_current_stream().synchronize()
    finally:
        cp.cuda.set_allocator(pool.malloc)
    assert requested, "the allocator hook saw nothing"
    assert sum(requested) < t * t * 4 // 8, requested
    assert max(requested) <= t * d * 4, requested
    for a in (o, lse, *grads):
        assert bool(cp.isfinite(a.astype(np.float32)).all())


def _heads(x5: Any) -> list:
    """The (B, H, T, D) head-major views of a (B, T, n, H, D) array, one per index of axis 2."""
    return [x5[:, :, i].transpose(0, 2, 1, 3) for i in range(x5.shape[2])]


def _packed(cp: Any, dtype: str, shape: tuple[int, int, int, int], seed: int) -> list:
    """q, k, v as the views of a packed (B, T, 3E) qkv and do as the view of a (B, T, E)
    gradient, as the model's attention op holds them (shape: B, H, T, D), in `dtype`."""
    b, h, t, d = shape
    rng = np.random.default_rng(seed)

    def draw(n: int) -> Any:  # (B, T, n, H, D)
        x = rng.standard_normal((b, t, n, h, d)).astype(np.float32)
        return cp.asarray(x.astype(_np_dtype(dtype)))

    return [*_heads(draw(3)), *_heads(draw(1))]


def _contiguous_run(cp: Any, q: Any, k: Any, v: Any, do: Any, scale: float,
                    drop: Any) -> tuple:
    """o, lse, dq, dk, dv of C-contiguous copies of the inputs (the kernels' original use)."""
    q, k, v, do = (cp.ascontiguousarray(x) for x in (q, k, v, do))
    o, lse = fa.flash_attention_forward(q, k, v, scale, drop)
    return o, lse, *fa.flash_attention_backward(q, k, v, o, do, lse, scale, drop)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("t", [64, 130])
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_views_in_place(cp: Any, dtype: str, t: int, p: float) -> None:
    """q, k, v read in place from a packed qkv, do from a (B, T, E) gradient, o and the
    gradients written into views: bit for bit what contiguous copies give (the same
    arithmetic; only the addresses differ)."""
    b, h, d = 2, 3, 64
    e = h * d
    q, k, v, do = _packed(cp, dtype, (b, h, t, d), seed=t)
    o_view = cp.empty((b, t, h, d), dtype=q.dtype).transpose(0, 2, 1, 3)  # y (B, T, E)
    views = _heads(cp.empty((b, t, 3, h, d), dtype=q.dtype))  # dqkv (B, T, 3E)
    # both groups share strides the kernels take: no fallback copies
    assert fa._shared_strides([q, k, v, *views]) == (t * 3 * e, d, 3 * e)
    assert fa._shared_strides([o_view, do]) == (t * e, d, e)
    drop = fa.Dropout(p, SEED, STREAM, cp.asarray(7, dtype=np.int32)) if p else None
    o, lse = fa.flash_attention_forward(q, k, v, 0.125, drop, out=o_view)
    grads = fa.flash_attention_backward(q, k, v, o, do, lse, 0.125, drop, out=tuple(views))
    for got, view in zip((o, *grads), (o_view, *views), strict=True):
        assert got.data.ptr == view.data.ptr and got.strides == view.strides
    want = _contiguous_run(cp, q, k, v, do, 0.125, drop)
    for name, g, w in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, *grads), want, strict=True):
        np.testing.assert_array_equal(_host64(g), _host64(w), err_msg=name)


@pytest.mark.gpu
@needs_gpu
def test_mixed_layouts_fall_back_to_copies(cp: Any) -> None:
    """q a strided view but k, v contiguous; o contiguous but do strided; out for forward
    misaligned by one element: every group falls back to contiguous arrays, and the results
    still land in the given views."""
    b, h, t, d = 2, 3, 130, 64
    q, k, v, do = _packed(cp, "float16", (b, h, t, d), seed=5)
    k, v = cp.ascontiguousarray(k), cp.ascontiguousarray(v)
    assert fa._shared_strides([q, k, v]) is None
    drop = fa.Dropout(0.1, SEED, STREAM, cp.asarray(3, dtype=np.int32))
    want = _contiguous_run(cp, q, k, v, do, 0.125, drop)
    o_view = cp.empty(b * t * h * d + 1, dtype=q.dtype)[1:].reshape(b, h, t, d)
    assert fa._strides(o_view) is None  # 2 bytes past an aligned allocation
    o, lse = fa.flash_attention_forward(q, k, v, 0.125, drop, out=o_view)
    assert o.data.ptr == o_view.data.ptr
    np.testing.assert_array_equal(_host64(o), _host64(want[0]))
    np.testing.assert_array_equal(_host64(lse), _host64(want[1]))
    views = _heads(cp.empty((b, t, 3, h, d), dtype=q.dtype))
    grads = fa.flash_attention_backward(q, k, v, want[0], do, lse, 0.125, drop,
                                        out=tuple(views))
    for name, g, view, w in zip(("dq", "dk", "dv"), grads, views, want[2:], strict=True):
        assert g.data.ptr == view.data.ptr, name
        np.testing.assert_array_equal(_host64(g), _host64(w), err_msg=name)


# ---- CPU: the register layouts of flash_attention.cu against the PTX ISA tables -------------
# _ptx_* transcribe the PTX ISA's "Matrix Fragments for mma.m16n8k16 with floating point
# type" and "... mma.m16n8k8" (.tf32): lane l, g = l >> 2, t = l % 4; _ldmatrix_x4 its
# "ldmatrix" (16-bit types load their fragments with it). _load_a, _load_b2, _load_bt2 and
# _c_to_a mirror the CUDA functions of the same names. The simulated mma places each lane's
# register elements where the tables say the hardware reads them, so a loader that fed an
# element to the wrong place would change the product.
def _ptx_a(kind: str, lane: int, i: int) -> tuple[int, int]:
    """(row, k) of A element a_i of `lane`: f16 = m16n8k16 (a0..a7), tf32 = m16n8k8."""
    g, t = lane >> 2, lane % 4
    if kind == "f16":
        return (g if i in (0, 1, 4, 5) else g + 8), 2 * t + (i & 1) + (8 if i >= 4 else 0)
    return (g if i in (0, 2) else g + 8), (t if i < 2 else t + 4)


def _ptx_b(kind: str, lane: int, i: int) -> tuple[int, int]:
    """(k, n) of B element b_i of `lane`."""
    g, t = lane >> 2, lane % 4
    if kind == "f16":
        return 2 * t + (i & 1) + (8 if i >= 2 else 0), g
    return (t if i == 0 else t + 4), g


def _ptx_c(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of C/D element c_i of `lane` (both shapes)."""
    g, t = lane >> 2, lane % 4
    return (g if i < 2 else g + 8), 2 * t + (i & 1)


def _hw_mma(kind: str, a: list, b: list, c: list) -> list:
    """One warp-wide mma from per-lane register elements a[lane][i], b[lane][i], c[lane][i]."""
    kdim = 16 if kind == "f16" else 8
    am, bm, cm = np.full((16, kdim), np.nan), np.full((kdim, 8), np.nan), np.zeros((16, 8))
    for lane in range(32):
        for i, x in enumerate(a[lane]):
            am[_ptx_a(kind, lane, i)] = x
        for i, x in enumerate(b[lane]):
            bm[_ptx_b(kind, lane, i)] = x
        for i, x in enumerate(c[lane]):
            cm[_ptx_c(lane, i)] = x
    assert not np.isnan(am).any() and not np.isnan(bm).any()  # the tables cover A and B
    dm = cm + am @ bm
    return [[dm[_ptx_c(lane, i)] for i in range(4)] for lane in range(32)]


def _ldmatrix_x4(s: np.ndarray, rows: list, trans: bool) -> list:
    """ldmatrix.sync.aligned.m8n8.x4(.trans).b16: lanes 8j..8j+7 give the (row, column) of s
    where rows 0..7 of matrix j start (8 consecutive elements each); register j of lane l
    receives elements (l >> 2, 2 (l % 4)) and (l >> 2, 2 (l % 4) + 1) of matrix j, or of its
    transpose with .trans. Returns each lane's 4 registers as pairs."""
    regs: list = [[] for _ in range(32)]
    for j in range(4):
        m = np.array([s[r, c:c + 8] for r, c in rows[8 * j:8 * j + 8]])
        if trans:
            m = m.T
        for lane in range(32):
            g, t = lane >> 2, lane % 4
            regs[lane].append((m[g, 2 * t], m[g, 2 * t + 1]))
    return regs


def _ldsm_x4(s: np.ndarray, lane: int, rs: int, cs: int, trans: bool) -> list:
    """ldsm_x4 at (r0, c0) = (0, 0): lane l points at row l % 8 of matrix j = l >> 3, at
    row ((j >> rs) & 1) * 8 + l % 8 and column ((j >> cs) & 1) * 8."""
    rows = [(((i >> 3 >> rs) & 1) * 8 + i % 8, ((i >> 3 >> cs) & 1) * 8) for i in range(32)]
    return _ldmatrix_x4(s, rows, trans)[lane]


def _load_a(kind: str, s: np.ndarray, lane: int) -> list:
    """load_a: lane's elements of A = s (16 x 16, [m][k]), per mma (one m16n8k16 or two
    m16n8k8)."""
    g, t = lane >> 2, lane % 4
    if kind == "f16":  # one ldmatrix: four registers, two consecutive k each
        return [[x for reg in _ldsm_x4(s, lane, 0, 1, False) for x in reg]]
    return [[s[g, 8 * h + 2 * t], s[g + 8, 8 * h + 2 * t], s[g, 8 * h + 2 * t + 1],
             s[g + 8, 8 * h + 2 * t + 1]] for h in (0, 1)]


def _load_b2(kind: str, s: np.ndarray, lane: int) -> tuple:
    """load_b2: lane's elements of the B of n-tiles 0 and 1 (k 0..15), s stored n-major:
    element (k, n) at s[n, k] (16 x 16)."""
    g, t = lane >> 2, lane % 4
    if kind == "f16":
        regs = _ldsm_x4(s, lane, 1, 0, False)
        return [[*regs[0], *regs[1]]], [[*regs[2], *regs[3]]]
    return tuple([[s[8 * j + g, 8 * h + 2 * t], s[8 * j + g, 8 * h + 2 * t + 1]]
                  for h in (0, 1)] for j in (0, 1))


def _load_bt2(kind: str, s: np.ndarray, lane: int) -> tuple:
    """load_bt2: the same B from s stored k-major: element (k, n) at s[k, n]."""
    g, t = lane >> 2, lane % 4
    if kind == "f16":
        regs = _ldsm_x4(s, lane, 0, 1, True)
        return [[*regs[0], *regs[1]]], [[*regs[2], *regs[3]]]
    return tuple([[s[8 * h + 2 * t, 8 * j + g], s[8 * h + 2 * t + 1, 8 * j + g]]
                  for h in (0, 1)] for j in (0, 1))


def _c_to_a(kind: str, c0: list, c1: list) -> list:
    """c_to_a: the A elements made of this lane's C values of tiles c0 (k 0..7), c1 (8..15)."""
    if kind == "f16":
        return [[c0[0], c0[1], c0[2], c0[3], c1[0], c1[1], c1[2], c1[3]]]
    return [[c[0], c[2], c[1], c[3]] for c in (c0, c1)]


def _warp_product(kind: str, a: list, b: list) -> np.ndarray:
    """mma16: the 16 x 8 product the kernel gets from per-lane fragments (sub-mmas chained)."""
    c: list = [[0.0] * 4 for _ in range(32)]
    for part in range(len(a[0])):
        c = _hw_mma(kind, [a[lane][part] for lane in range(32)],
                    [b[lane][part] for lane in range(32)], c)
    out = np.zeros((16, 8))
    for lane in range(32):
        for i in range(4):
            out[_ptx_c(lane, i)] = c[lane][i]
    return out


@pytest.mark.parametrize("kind", ["f16", "tf32"])
def test_fragment_layouts_match_ptx_tables(kind: str) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 16))  # (m, k)
    bn = rng.standard_normal((16, 16))  # B of two n-tiles, n-major: a K tile [key][d] for Q K^T
    a_frags = [_load_a(kind, a, lane) for lane in range(32)]
    # shared memory -> A, B; B read from an n-major tile, and from a k-major one (a V tile
    # [key][d] for P V)
    for load, stored in ((_load_b2, bn), (_load_bt2, np.ascontiguousarray(bn.T))):
        b_frags = [load(kind, stored, lane) for lane in range(32)]
        for j in (0, 1):
            got = _warp_product(kind, a_frags, [b_frags[lane][j] for lane in range(32)])
            np.testing.assert_allclose(got, a @ bn[8 * j:8 * j + 8].T, rtol=1e-12, atol=1e-12)
    # C -> A: a 16 x 16 block held as two C tiles (columns 0..7 and 8..15), fed on as A
    c_tiles = [[[a[_ptx_c(lane, i)[0], _ptx_c(lane, i)[1] + 8 * h] for i in range(4)]
                for h in (0, 1)] for lane in range(32)]
    b_frags = [_load_b2(kind, bn, lane)[0] for lane in range(32)]
    got = _warp_product(kind, [_c_to_a(kind, *c_tiles[lane]) for lane in range(32)], b_frags)
    np.testing.assert_allclose(got, a @ bn[:8].T, rtol=1e-12, atol=1e-12)


def _tile_at(r: int, c: int, d: int, itemsize: int) -> int:
    """tile_at: the element offset of (r, c) in a [64][d] shared-memory tile."""
    if itemsize == 2:
        return r * (d + 8) + c
    return r * d + (c ^ ((((r ^ (r >> 2)) & 1) | (r & 2)) << 3))


@pytest.mark.parametrize("itemsize", [2, 4])
def test_tile_layouts_are_bank_conflict_free(itemsize: int) -> None:
    """Each tile row is a permutation of its columns that keeps cp.async's 16-byte chunks
    whole, and the fragment loads of a warp touch every 4-byte bank once per shared-memory
    wavefront: an ldmatrix phase (8 rows x 16 bytes; 16-bit types), a half-warp's 64-bit loads
    of 4 consecutive rows (load_a, load_b2) and a warp's 32-bit loads of rows 2t + p
    (load_bt2; float32)."""
    vec = 16 // itemsize
    for d in fa.HEAD_DIMS:
        off = np.array([[_tile_at(r, c, d, itemsize) for c in range(d)] for r in range(64)])
        row0 = np.arange(64)[:, None] * (d + 8 if itemsize == 2 else d)
        assert all(sorted(row) == list(range(d)) for row in off - row0)
        chunks = off.reshape(64, d // vec, vec)
        assert (chunks[..., 0] % vec == 0).all() and (np.diff(chunks, axis=2) == 1).all()
        bank = off * itemsize // 4 % 32
        for r0 in range(0, 64, 8):
            for c0 in range(0, d, 8):
                if itemsize == 2:
                    assert len({bank[r0 + i, c0] // 4 for i in range(8)}) == 8
                    continue
                for rows in (range(4), range(4, 8)):
                    words = [bank[r0 + g, c0 + 2 * t + x] for g in rows for t in range(4)
                             for x in (0, 1)]
                    assert len(set(words)) == 32, (d, r0, c0)
                for p in (0, 1):
                    words = [bank[r0 + 2 * t + p, c0 + g] for g in range(8) for t in range(4)]
                    assert len(set(words)) == 32, (d, r0, c0, p)


# ---- CPU: sources and limits ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_sources_and_shared_memory_fit(dtype: str) -> None:
    for d in fa.HEAD_DIMS:
        for dropout in (False, True):
            code = fa.source()
            for name in fa._KERNELS:
                assert re.search(rf"void __launch_bounds__\(NTHREADS(, \w+)?\)\n{name}\(", code)
            assert f"-DFA_DROPOUT={int(dropout)}" in fa.options(dtype, d, dropout)
        itemsize = 4 if dtype == "float32" else 2
        for kernel in ("fa_fwd", "fa_bwd_dq", "fa_bwd_dkdv"):
            assert fa._shared_bytes(kernel, itemsize, d) <= SM90_SHARED_BYTES


def test_supports_and_dropout_checks() -> None:
    assert fa.supports(np.float16, 64, 1) and fa.supports(np.float32, 32, 1000)
    assert fa.supports("float16", 128, 7)
    assert not fa.supports(np.float64, 64, 64)
    assert not fa.supports(np.float16, 48, 64)
    assert not fa.supports(np.float16, 64, 0)
    for p in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError):
            fa.Dropout(p, 0, 0, None)
    assert fa._dropout_args(None)[-1] == np.float32(1.0)


def test_stride_groups() -> None:
    """The layouts the kernels address in place, on stand-ins for CuPy arrays: unit stride
    along D, 16-byte aligned rows, one set of strides per group; length-1 axes do not count."""
    def view(shape: tuple, strides: tuple, ptr: int = 256) -> SimpleNamespace:
        return SimpleNamespace(shape=shape, strides=tuple(2 * s for s in strides),
                               dtype=np.dtype(np.float16), data=SimpleNamespace(ptr=ptr))

    h, t, d = 3, 5, 64
    e = h * d
    packed = view((2, h, t, d), (t * 3 * e, d, 3 * e, 1))  # a head-major view of (B, T, 3E)
    contiguous = view((2, h, t, d), (h * t * d, t * d, d, 1))
    assert fa._strides(packed) == (t * 3 * e, d, 3 * e)
    assert fa._shared_strides([packed, packed]) == (t * 3 * e, d, 3 * e)
    assert fa._shared_strides([packed, contiguous]) is None
    assert fa._strides(view((2, h, t, d), (t * 3 * e, d, 3 * e, 1), ptr=258)) is None
    assert fa._strides(view((2, h, t, d), (h * t * d, t * d, d + 4, 1))) is None  # 136 B rows
    assert fa._strides(view((2, h, t, d), (h * t * d * 2, t * d * 2, d * 2, 2))) is None
    one = view((1, h, t, d), (7 * h * t * d, t * d, d, 1))
    assert fa._shared_strides([one, view((1, h, t, d), (h * t * d, t * d, d, 1))]) is not None
