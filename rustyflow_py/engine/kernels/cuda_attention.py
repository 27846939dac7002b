"""Fused causal attention on the GPU (FlashAttention-2 style) that never materialises T x T.

Why: the materialised attention (ops.CausalSelfAttention) writes the (B, H, T, T) scores,
rewrites them as probabilities, multiplies by a (B, H, T, T) dropout mask and reads them all
back in backward: traffic and activation memory that grow as T^2 while the matmuls' inputs
grow as T. Here each block keeps a 64 x 64 tile of scores in
registers and folds it into the output straight away with an online softmax, so the largest
buffer is an output; only the row log-sum-exps (B, H, T) are kept. Backward recomputes the
probabilities from them (exp(s - lse) needs no second pass over the row) instead of storing
them. The dropout mask is not stored either: every kernel redraws the bits of the element it
is at from Philox (kernels/philox.py) from (seed, call-site stream, step, flat index), the
very bits `dropout_mask` would have put in the (B, H, T, T) mask, and the step is read on the
device, so a replayed CUDA graph draws fresh masks and forward and backward agree.

Layout of the work (BM = BN = 64, 4 warps of 32 threads, warp w owning 16 rows):
  fa_fwd       grid (T/64 query tiles, B*H). Q tile resident in shared memory; loops over the
               key tiles at or left of the diagonal: S = Q K^T (tensor cores), mask only on
               the diagonal tile, online softmax in registers, O += P V. Writes O and lse.
  fa_bwd_pre   grid (T/4, B*H): D_i = rowsum(dO_i * O_i), one warp per row (float32).
  fa_bwd_dq    grid (query tiles, B*H): recomputes S and dP = dO V^T for each key tile,
               dS = P (dP - D) scale, dQ += dS K in registers. Deterministic (no atomics).
  fa_bwd_dkdv  grid (key tiles, B*H): K, V tile resident; loops over query tiles at or below
               the diagonal: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q.

Matrix products use `mma.sync.m16n8k16` (float16, bfloat16) and `mma.sync.m16n8k8` on tf32
(float32 inputs: a 10-bit mantissa, the precision cuBLAS's tf32 mode gives the model's
other matmuls), accumulating in float32. Fragments are loaded from shared memory with plain
32/64-bit loads; the register layouts are documented at `FRAGMENTS` below and mirrored by a
CPU test (tests/test_flash_attention.py) that checks them against the PTX ISA tables.

q, k, v, o, dO and the gradients are (B, H, T, D) views with any strides for batch, head and
time (unit stride along D, 16-byte aligned rows), in two groups that share strides: q, k, v,
dq, dk, dv (head-major views of the packed (B, T, 3E) projection and its gradient) and o, dO
(views of (B, T, E) arrays). The caller then splits and merges heads with no copies: each
would be a full read and write of an activation-sized array, and those kept for backward
would cost memory.

Everything is launched on CuPy's current stream, allocates through CuPy only, reads the
step from device memory and never synchronises, so forward and backward can be captured in a
CUDA graph.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from .philox import PHILOX_CUDA, keep_threshold

BLOCK = 64  # query rows per block (BM) and keys per tile (BN)
THREADS = 128  # 4 warps x 16 rows
HEAD_DIMS = (32, 64, 128)
MAX_BLOCKS_Y = 65535  # B * H rides on gridDim.y
MAX_SHARED_BYTES = 227 * 1024  # an sm_90 block's opt-in shared memory
_STATIC_SHARED_BYTES = 48 * 1024  # beyond this a kernel must opt in to dynamic shared memory
_OPTIONS = ("--std=c++17",)
# Storage dtype name -> (CUDA type, header, which mma); keyed by name so that this module
# imports without ml_dtypes (bfloat16's NumPy dtype) and without CuPy.
_REAL = {
    "float32": ("float", "", "TF32"),
    "float16": ("__half", "#include <cuda_fp16.h>", "F16"),
    "bfloat16": ("__nv_bfloat16", "#include <cuda_bf16.h>", "BF16"),
}
_KERNELS = ("fa_fwd", "fa_bwd_pre", "fa_bwd_dq", "fa_bwd_dkdv")


@dataclasses.dataclass(frozen=True)
class Dropout:
    """Dropout of the attention probabilities, drawn as `kernels.dropout_mask` draws it for
    the (B, H, T, T) probabilities: element n = ((b*H + h)*T + i)*T + j is kept when the top 24
    bits of word n % 4 of Philox(counter = (n // 4 as two words, step, 0), key = (seed mod
    2**32, stream)) reach keep_threshold(p); kept probabilities are scaled by 1/(1-p)."""

    p: float  # 0 < p < 1
    seed: int  # the run's seed; its low 32 bits are key word 0
    stream: int  # key word 1: the call site's stream id (shard already folded in by the caller)
    step: Any  # 0-d int32 CuPy array, read on the device (never copied to the host)

    def __post_init__(self) -> None:
        if not 0.0 < self.p < 1.0:
            raise ValueError(f"attention dropout needs 0 < p < 1, got {self.p}")


def supports(dtype: Any, head_dim: int, seq_len: int) -> bool:
    """Whether the kernels handle q, k, v of this dtype, head dim and sequence length."""
    return _dtype_name(dtype) is not None and head_dim in HEAD_DIMS and seq_len >= 1


def flash_attention_forward(q: Any, k: Any, v: Any, scale: float, dropout: Dropout | None = None,
                            out: Any | None = None) -> tuple[Any, Any]:
    """o = dropout(softmax_causal(scale q k^T)) v and the softmax's row log-sum-exps.

    q, k, v: CuPy (B, H, T, D) of one dtype (float32, float16 or bfloat16). Views that share
    their strides, such as the head-major views
    `qkv.reshape(B, T, 3, H, D)[:, :, i].transpose(0, 2, 1, 3)` of one packed projection, are
    read in place: a contiguous copy would be a full read and write of an activation-sized
    array, and the caller would keep the copies for backward. out: an optional (B, H, T, D)
    array of q's dtype, not overlapping q, k, v, that o is written into and returned as,
    e.g. `y.transpose(0, 2, 1, 3)` of a fresh (B, T, H, D) y, which then is the (B, T, E)
    output with no transpose copy. `_stage` says which layouts are used in place and what is
    copied otherwise. Returns o (B, H, T, D) and lse (B, H, T) float32,
    lse_i = log sum_{j<=i} exp(scale q_i.k_j) (of the un-dropped softmax), which backward
    takes back."""
    import cupy

    _check(q, k, v, out)
    b, h, t, d = q.shape
    (q, k, v), qkv_strides, _ = _stage([q, k, v], [], q)
    (o,), o_strides, pending = _stage([], [out], q)
    kernels = _kernels(_dtype_name(q.dtype), d, dropout is not None)
    lse = cupy.empty((b, h, t), dtype=cupy.float32)  # (B, H, T)
    _launch(kernels["fa_fwd"], _tiles(t), b * h, _shared_bytes("fa_fwd", q.dtype.itemsize, d),
            (q, k, v, o, lse, np.int32(t), np.int32(h), *qkv_strides, *o_strides,
             np.float32(scale), *_dropout_args(dropout)))
    return _finish(pending)[0], lse


def flash_attention_backward(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any, scale: float,
                             dropout: Dropout | None = None,
                             out: tuple[Any, Any, Any] | None = None) -> tuple[Any, Any, Any]:
    """dq, dk, dv (the shape and dtype of q) of o = dropout(softmax_causal(scale q k^T)) v,
    given forward's o and lse, the upstream gradient do and the same dropout (same step).

    q, k, v and o, do are read in place as forward reads q, k, v (o, do: e.g. the transposed
    views of the (B, T, E) output and its gradient). out: optional (dq, dk, dv), (B, H, T, D)
    arrays of q's dtype laid out like q, k, v (as the three head-major views of one
    (B, T, 3, H, D) dqkv are), overlapping no input, that the gradients are written into and
    returned as, so that the caller interleaves nothing. Without it the gradients are fresh
    C-contiguous arrays, and q, k, v are then copied unless they are C-contiguous too (see
    `_stage`)."""
    import cupy

    grads = (None, None, None) if out is None else tuple(out)
    if len(grads) != 3:
        raise ValueError(f"out takes (dq, dk, dv), got {len(grads)} arrays")
    _check(q, k, v, o, do, *grads)
    b, h, t, d = q.shape
    lse = cupy.ascontiguousarray(lse, dtype=cupy.float32)  # (B, H, T)
    if lse.shape != (b, h, t):
        raise ValueError(f"lse of shape {lse.shape}, expected {(b, h, t)}")
    (q, k, v, dq, dk, dv), qkv_strides, pending = _stage([q, k, v], grads, q)
    (o, do), o_strides, _ = _stage([o, do], [], q)
    kernels = _kernels(_dtype_name(q.dtype), d, dropout is not None)
    itemsize = q.dtype.itemsize
    layout = (np.int32(t), np.int32(h), *qkv_strides, *o_strides)
    dd = cupy.empty((b, h, t), dtype=cupy.float32)  # (B, H, T): D_i = rowsum(dO_i * O_i)
    warps = THREADS // 32  # fa_bwd_pre: a warp per row
    kernels["fa_bwd_pre"](((t + warps - 1) // warps, b * h), (THREADS,),
                          (o, do, dd, np.int32(t), np.int32(h), *o_strides))
    drop = _dropout_args(dropout)
    _launch(kernels["fa_bwd_dq"], _tiles(t), b * h, _shared_bytes("fa_bwd_dq", itemsize, d),
            (q, k, v, do, lse, dd, dq, *layout, np.float32(scale), *drop))
    _launch(kernels["fa_bwd_dkdv"], _tiles(t), b * h, _shared_bytes("fa_bwd_dkdv", itemsize, d),
            (q, k, v, do, lse, dd, dk, dv, *layout, np.float32(scale), *drop))
    dq, dk, dv = _finish(pending)
    return dq, dk, dv


# ---- launch plumbing ---------------------------------------------------------------------------
def _dtype_name(dtype: Any) -> str | None:
    try:
        name = np.dtype(dtype).name
    except TypeError:
        return None
    return name if name in _REAL else None


def _tiles(t: int) -> int:
    return (t + BLOCK - 1) // BLOCK


def _check(first: Any, *others: Any | None) -> None:
    """Arrays (None: an output not given) of one (B, H, T, D) shape and supported dtype."""
    if first.ndim != 4:
        raise ValueError(f"flash attention takes (B, H, T, D) arrays, got shape {first.shape}")
    for a in others:
        if a is not None and (a.shape != first.shape or a.dtype != first.dtype):
            raise ValueError(f"flash attention arrays differ: {a.shape} {a.dtype} vs "
                             f"{first.shape} {first.dtype}")
    b, h, t, d = first.shape
    if not supports(first.dtype, d, t):
        raise ValueError(f"flash attention does not support dtype {first.dtype}, head dim {d}, "
                         f"T={t} (head dims {HEAD_DIMS}; float32, float16, bfloat16)")
    if b * h > MAX_BLOCKS_Y:
        raise ValueError(f"flash attention takes B*H <= {MAX_BLOCKS_Y}, got {b * h}")


def _strides(a: Any) -> tuple[int, int, int] | None:
    """The element strides (batch, head, time) by which the kernels can address a
    (B, H, T, D) array in place, or None: they load rows as 16-byte vectors, so the last axis
    must have unit stride and every row must start 16-byte aligned (the base pointer and the
    three byte strides multiples of 16). An axis of length 1 is never stepped along; its
    stride is taken as 0, so that it does not tell two layouts apart."""
    item = a.dtype.itemsize
    if a.strides[3] != item or a.data.ptr % 16:
        return None
    strides = [0 if n == 1 else s for n, s in zip(a.shape[:3], a.strides[:3], strict=True)]
    if any(s % 16 for s in strides):
        return None
    sb, sh, st = (s // item for s in strides)
    return sb, sh, st


def _shared_strides(arrays: Sequence[Any]) -> tuple[int, int, int] | None:
    """The strides (`_strides`) that all of `arrays` share, or None."""
    found = {_strides(a) for a in arrays}
    return found.pop() if len(found) == 1 and None not in found else None


def _stage(inputs: Sequence[Any], outputs: Sequence[Any | None], like: Any
           ) -> tuple[list[Any], tuple[np.int64, ...], list[tuple[Any, Any]]]:
    """One stride group as its kernels take it: the arrays (inputs, then outputs; a None
    output is a fresh C-contiguous array shaped like `like`), the element strides
    (batch, head, time) they share, and the (output, computed) pairs for `_finish`.

    The kernels address row t of head (b, h) of every array of a group (q, k, v, dq, dk, dv;
    o, do) at b*sb + h*sh + t*st, so a group whose arrays all share strides the kernels can
    take (`_strides`) is used as it is. Otherwise the whole group falls back to C-contiguous
    arrays: inputs are copied (those already contiguous and aligned are not), and an output
    that is not contiguous is computed into a fresh array and copied into afterwards."""
    import cupy

    outs = [cupy.empty(like.shape, like.dtype) if a is None else a for a in outputs]
    strides = _shared_strides([*inputs, *outs])
    if strides is not None:
        return [*inputs, *outs], tuple(np.int64(s) for s in strides), [(a, a) for a in outs]
    arrays = [cupy.ascontiguousarray(a) for a in inputs]
    arrays = [a if a.data.ptr % 16 == 0 else a.copy() for a in arrays]  # a fresh copy aligns
    pending = [(a, a if a.flags.c_contiguous and a.data.ptr % 16 == 0
                else cupy.empty(like.shape, like.dtype)) for a in outs]
    arrays += [work for _, work in pending]
    strides = _strides(arrays[0])  # C-contiguous, aligned: (H*T*D, T*D, D) up to length-1 axes
    assert strides is not None
    return arrays, tuple(np.int64(s) for s in strides), pending


def _finish(pending: list[tuple[Any, Any]]) -> list[Any]:
    """The outputs of a group after its launches: those computed elsewhere copied in."""
    for given, work in pending:
        if work is not given:
            given[...] = work
    return [given for given, _ in pending]


def _dropout_args(dropout: Dropout | None) -> tuple[Any, ...]:
    """(step pointer, seed word, stream word, keep threshold, 1/(1-p)); inert without dropout
    (the kernel is then compiled without the Philox code and never reads them)."""
    if dropout is None:
        return (np.uint64(0), np.uint32(0), np.uint32(0), np.uint32(0), np.float32(1.0))
    step = dropout.step
    if step.dtype != np.int32 or step.size != 1:
        raise ValueError(f"dropout step must be a 0-d int32 device array, got {step.dtype} "
                         f"of shape {step.shape}")
    return (step, np.uint32(dropout.seed & 0xFFFFFFFF), np.uint32(dropout.stream & 0xFFFFFFFF),
            np.uint32(keep_threshold(dropout.p)), np.float32(1.0 / (1.0 - dropout.p)))


def _shared_bytes(kernel: str, itemsize: int, head_dim: int) -> int:
    """Dynamic shared memory of `kernel`: its tiles as laid out at the top of the kernel
    (row-major [64][D+8] tiles, transposed [D][64+8] tiles, then float32 extras)."""
    tile, tile_t = BLOCK * (head_dim + 8), head_dim * (BLOCK + 8)
    tiles, tiles_t, extra = {
        "fa_fwd": (2, 1, 0),  # Qs, Ks | Vt
        "fa_bwd_dq": (4, 1, 0),  # Qs, Gs, Ks, Vs | Kt
        "fa_bwd_dkdv": (4, 2, 2 * BLOCK * 4),  # Ks, Vs, Qs, Gs | Qt, Gt | Ls, Ds
    }[kernel]
    return (tiles * tile + tiles_t * tile_t) * itemsize + extra


_opted_in: set[tuple[int, int]] = set()


def _launch(kernel: Any, grid_x: int, grid_y: int, shared: int, args: tuple[Any, ...]) -> None:
    import cupy

    if shared > _STATIC_SHARED_BYTES:  # opt in once per kernel and device
        key = (id(kernel), cupy.cuda.Device().id)
        if key not in _opted_in:
            kernel.max_dynamic_shared_size_bytes = shared
            _opted_in.add(key)
    kernel((grid_x, grid_y), (THREADS,), args, shared_mem=shared)


@functools.cache
def _kernels(dtype_name: str, head_dim: int, dropout: bool) -> dict[str, Any]:
    """The four kernels of one variant (one source: CuPy compiles it once and caches it)."""
    import cupy

    code = source(dtype_name, head_dim, dropout)
    return {name: cupy.RawKernel(code, name, options=_OPTIONS) for name in _KERNELS}


def source(dtype_name: str, head_dim: int, dropout: bool) -> str:
    """The CUDA source of one variant (pure Python: tests read it without a GPU)."""
    real, header, mma = _REAL[dtype_name]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head dim {head_dim} not in {HEAD_DIMS}")
    config = (f"{header}\ntypedef {real} real;\n#define HEAD_DIM {head_dim}\n"
              f"#define FA_TF32 {int(mma == 'TF32')}\n#define FA_BF16 {int(mma == 'BF16')}\n"
              f"#define FA_DROPOUT {int(dropout)}\n")
    return (config + _COMMON + FRAGMENTS + PHILOX_CUDA + _DROPOUT + _TILES + _FORWARD
            + _BACKWARD)


# ---- CUDA source -------------------------------------------------------------------------------
_COMMON = r"""
#define BM 64                   // query rows per block: 4 warps x 16
#define BN 64                   // keys per tile (BM == BN: query tile i meets key tile i on
                                // the diagonal)
#define NTHREADS 128
#define LDK (HEAD_DIM + 8)      // row stride of a [64][HEAD_DIM] tile in shared memory; the
                                // +8 pad makes the fragment loads below bank-conflict free
#define LDT (BN + 8)            // row stride of a transposed [HEAD_DIM][64] tile
#define TILE (BN * LDK)
#define TILE_T (HEAD_DIM * LDT)
#define DCH (HEAD_DIM / 16)     // 16-wide k-chunks of the head dim
#define DNT (HEAD_DIM / 8)      // 8-wide n-tiles of the head dim
#define NNT (BN / 8)            // 8-wide n-tiles of a 64-wide key (or query) tile
#define KCH (BN / 16)           // 16-wide k-chunks of a 64-wide key (or query) tile
#define FULL 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

extern __shared__ __align__(16) unsigned char fa_smem[];
"""

# Register fragments. A warp multiplies a 16 x 16 chunk of A (rows m, contraction index k) by
# a 16 x 8 chunk of B (k, column n) into a 16 x 8 float32 C. Lane l has g = l >> 2 (groupID)
# and t = l & 3 (threadID_in_group). From the PTX ISA, "Matrix Fragments for mma.m16n8k16
# with floating point type" and "... mma.m16n8k8" (.tf32):
#
#   C/D (both shapes), 4 floats c0..c3:  row = g (c0, c1) or g + 8 (c2, c3),
#                                         col = 2t + (i & 1).
#   m16n8k16 .f16/.bf16, A: 4 registers of 2 halves, a0..a7 (a0 in the low half of reg 0):
#        row = g for a0, a1, a4, a5 and g + 8 for a2, a3, a6, a7;
#        col = 2t + (i & 1) for i < 4 and 2t + (i & 1) + 8 for i >= 4.
#     B: 2 registers, b0..b3:  k = 2t + (i & 1) for i < 2, 2t + (i & 1) + 8 for i >= 2;
#        n = g.
#   m16n8k8 .tf32, A: a0..a3, one per register:  row = g for a0, a2 and g + 8 for a1, a3;
#        col = t for a0, a1 and t + 4 for a2, a3.
#     B: b0, b1:  k = t for b0 and t + 4 for b1;  n = g.
#
# Operands live in shared memory with k contiguous: A element (m, k) at s[m * ld + k], B
# element (k, n) at s[n * ld + k] (a K tile [key][d] is already the B of Q K^T; for P V the
# V tile is stored transposed, [d][key]). Then for 16-bit types every register is one
# aligned 32-bit load of two consecutive k.
#
# tf32: a chunk of 16 is two m16n8k8 (k = 0..7 and 8..15). Within each, the mma's k index
# kappa is mapped to the stored k by kappa = t -> 2t and kappa = t + 4 -> 2t + 1, in A and in
# B alike. A sum over k does not care about its order, and with this order a lane's two k
# are adjacent (one 64-bit load), and, which is the point, they are the two columns a lane
# holds of a C fragment: C -> A below needs no shuffles.
#
# C -> A (FlashAttention-2's register reuse): the S (or dS) a warp computed as C tiles for
# columns 16c..16c+7 and 16c+8..16c+15 is, element for element, the A fragment of k-chunk c
# of the next product (P V, dS K, ...): for 16-bit, reg 0 = (c0, c1) of the first tile
# (row g, k 2t, 2t+1), reg 1 = (c2, c3) (row g+8), reg 2 and reg 3 the same of the second
# tile (k + 8). For tf32 sub-chunk h takes tile h as (a0, a1, a2, a3) = (c0, c2, c1, c3).
FRAGMENTS = r"""
#if FA_TF32
#define A_REGS 8
struct FragA { unsigned r[8]; };  // two m16n8k8 A fragments: k 0..7 (r[0..3]), 8..15 (r[4..7])
struct FragB { unsigned r[4]; };  // two m16n8k8 B fragments: r[0..1], r[2..3]

__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void mma_k8(float* c, unsigned a0, unsigned a1, unsigned a2,
                                       unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c (16 x 8, float32) += A (16 x 16) B (16 x 8)
__device__ __forceinline__ void mma16(float* c, const FragA& a, const FragB& b) {
    mma_k8(c, a.r[0], a.r[1], a.r[2], a.r[3], b.r[0], b.r[1]);
    mma_k8(c, a.r[4], a.r[5], a.r[6], a.r[7], b.r[2], b.r[3]);
}

// A rows 0..15, k 0..15 of s (element (m, k) at s[m * ld + k]).
__device__ __forceinline__ FragA load_a(const real* s, int ld) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    FragA a;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float2 x = *reinterpret_cast<const float2*>(s + g * ld + 8 * h + 2 * t);
        const float2 y = *reinterpret_cast<const float2*>(s + (g + 8) * ld + 8 * h + 2 * t);
        a.r[4 * h + 0] = to_tf32(x.x);  // a0: row g,     kappa t     = k 2t
        a.r[4 * h + 1] = to_tf32(y.x);  // a1: row g + 8, kappa t     = k 2t
        a.r[4 * h + 2] = to_tf32(x.y);  // a2: row g,     kappa t + 4 = k 2t + 1
        a.r[4 * h + 3] = to_tf32(y.y);  // a3: row g + 8, kappa t + 4 = k 2t + 1
    }
    return a;
}

// B k 0..15, n 0..7 of s (element (k, n) at s[n * ld + k]).
__device__ __forceinline__ FragB load_b(const real* s, int ld) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    FragB b;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float2 x = *reinterpret_cast<const float2*>(s + g * ld + 8 * h + 2 * t);
        b.r[2 * h + 0] = to_tf32(x.x);  // b0: n g, kappa t     = k 2t
        b.r[2 * h + 1] = to_tf32(x.y);  // b1: n g, kappa t + 4 = k 2t + 1
    }
    return b;
}

// The A fragment of C tiles c0 (columns 0..7 become k 0..7) and c1 (columns 8..15).
__device__ __forceinline__ FragA c_to_a(const float* c0, const float* c1) {
    FragA a;
    a.r[0] = to_tf32(c0[0]); a.r[1] = to_tf32(c0[2]); a.r[2] = to_tf32(c0[1]);
    a.r[3] = to_tf32(c0[3]);
    a.r[4] = to_tf32(c1[0]); a.r[5] = to_tf32(c1[2]); a.r[6] = to_tf32(c1[1]);
    a.r[7] = to_tf32(c1[3]);
    return a;
}

__device__ __forceinline__ void store2(real* p, float x, float y) {
    *reinterpret_cast<float2*>(p) = make_float2(x, y);
}

__device__ __forceinline__ float to_float(real x) { return x; }

#else  // float16 / bfloat16
#define A_REGS 4
struct FragA { unsigned r[4]; };
struct FragB { unsigned r[2]; };

#if FA_BF16
#define MMA_F16 "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#define CVT_X2 "cvt.rn.bf16x2.f32 %0, %1, %2;"
__device__ __forceinline__ float to_float(real x) { return __bfloat162float(x); }
#else
#define MMA_F16 "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#define CVT_X2 "cvt.rn.f16x2.f32 %0, %1, %2;"
__device__ __forceinline__ float to_float(real x) { return __half2float(x); }
#endif

// Two floats rounded to the 16-bit type and packed, lo in the low half (cvt's first source
// goes to the upper half, as in cuda_fp16.hpp's __floats2half2_rn).
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned r;
    asm(CVT_X2 : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// c (16 x 8, float32) += A (16 x 16) B (16 x 8)
__device__ __forceinline__ void mma16(float* c, const FragA& a, const FragB& b) {
    asm volatile(MMA_F16
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]),
                   "r"(b.r[1]));
}

__device__ __forceinline__ unsigned ld32(const real* p) {
    return *reinterpret_cast<const unsigned*>(p);
}

// A rows 0..15, k 0..15 of s (element (m, k) at s[m * ld + k]).
__device__ __forceinline__ FragA load_a(const real* s, int ld) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const real* p = s + g * ld + 2 * t;
    FragA a;
    a.r[0] = ld32(p);               // a0, a1: row g,     k 2t, 2t + 1
    a.r[1] = ld32(p + 8 * ld);      // a2, a3: row g + 8, k 2t, 2t + 1
    a.r[2] = ld32(p + 8);           // a4, a5: row g,     k 2t + 8, 2t + 9
    a.r[3] = ld32(p + 8 * ld + 8);  // a6, a7: row g + 8, k 2t + 8, 2t + 9
    return a;
}

// B k 0..15, n 0..7 of s (element (k, n) at s[n * ld + k]).
__device__ __forceinline__ FragB load_b(const real* s, int ld) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const real* p = s + g * ld + 2 * t;
    FragB b;
    b.r[0] = ld32(p);      // b0, b1: n g, k 2t, 2t + 1
    b.r[1] = ld32(p + 8);  // b2, b3: n g, k 2t + 8, 2t + 9
    return b;
}

// The A fragment of C tiles c0 (columns 0..7 become k 0..7) and c1 (columns 8..15).
__device__ __forceinline__ FragA c_to_a(const float* c0, const float* c1) {
    FragA a;
    a.r[0] = pack2(c0[0], c0[1]);  // row g,     k 2t, 2t + 1
    a.r[1] = pack2(c0[2], c0[3]);  // row g + 8, k 2t, 2t + 1
    a.r[2] = pack2(c1[0], c1[1]);  // row g,     k 2t + 8, 2t + 9
    a.r[3] = pack2(c1[2], c1[3]);  // row g + 8, k 2t + 8, 2t + 9
    return a;
}

__device__ __forceinline__ void store2(real* p, float x, float y) {
    *reinterpret_cast<unsigned*>(p) = pack2(x, y);
}
#endif

// A warp's 16 rows x HEAD_DIM of an A operand kept in shared memory (for the whole kernel).
// get(c) is the fragment of k-chunk c: from registers where they fit (16-bit, HEAD_DIM <= 64;
// tf32, HEAD_DIM <= 32), else loaded again at each use, to leave registers to accumulators.
#define A_IN_REGS (DCH * A_REGS <= 16)
struct RowsA {
    const real* s;
#if A_IN_REGS
    FragA f[DCH];
#endif
    __device__ __forceinline__ void init(const real* p) {
        s = p;
#if A_IN_REGS
#pragma unroll
        for (int c = 0; c < DCH; ++c) f[c] = load_a(p + 16 * c, LDK);
#endif
    }
    __device__ __forceinline__ FragA get(int c) const {
#if A_IN_REGS
        return f[c];
#else
        return load_a(s + 16 * c, LDK);
#endif
    }
};
"""

_DROPOUT = r"""
#if FA_DROPOUT
struct Drop { unsigned step, seed, stream, thresh; };

// Element n of the flat (B, H, T, T) probabilities is kept iff word n % 4 of the block n / 4
// (counter (n/4 low, n/4 high, step, 0), key (seed, stream)), shifted to its top 24 bits,
// reaches the threshold: kernels/philox.py's dropout_bits.
__device__ __forceinline__ rf_u32x4 fa_block(unsigned long long blk, const Drop& d) {
    return rf_philox4((unsigned)blk, (unsigned)(blk >> 32), d.step, 0u, d.seed, d.stream);
}

__device__ __forceinline__ bool keep1(long long n, const Drop& d) {
    return rf_dropout_bits((unsigned long long)n, d.step, d.seed, d.stream) >= d.thresh;
}

// Elements n and n + 1 (one Philox block unless n % 4 == 3).
__device__ __forceinline__ void keep2(long long n, const Drop& d, bool& k0, bool& k1) {
    const unsigned long long blk = (unsigned long long)n >> 2;
    const int w = (int)(n & 3);
    const rf_u32x4 r = fa_block(blk, d);
    k0 = (rf_word(r, w) >> 8) >= d.thresh;
    if (w < 3) k1 = (rf_word(r, w + 1) >> 8) >= d.thresh;
    else k1 = (fa_block(blk + 1, d).w[0] >> 8) >= d.thresh;
}
#endif
"""

_TILES = r"""
// Arrays are (B, H, T, HEAD_DIM) views with element strides (sb, sh, st, 1) (see the module
// docstring); the Python side guarantees that every row starts 16-byte aligned. Offsets are
// 64-bit: a view of a packed array spans more elements than it holds, and B*H*T*HEAD_DIM
// itself may pass 2^31.
// Element (b, h, 0, 0) of this block's head, blockIdx.y = b*H + h.
__device__ __forceinline__ long long head_offset(int H, long long sb, long long sh) {
    const int bh = blockIdx.y;  // < 65536: 32-bit division
    return (bh / H) * sb + (bh % H) * sh;
}

// Rows row0..row0+63 of a (T, HEAD_DIM) matrix of row stride st into dst [64][LDK], rows
// past T as zeros (so that padded keys and values are 0, never garbage times 0). 16-byte
// loads, coalesced within a row.
__device__ __forceinline__ void load_rows(real* dst, const real* src, int row0, int T,
                                          long long st) {
    constexpr int VEC = 16 / sizeof(real), VPR = HEAD_DIM / VEC;
    for (int idx = threadIdx.x; idx < BN * VPR; idx += NTHREADS) {
        const int r = idx / VPR, c = (idx % VPR) * VEC;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < T) val = *reinterpret_cast<const uint4*>(src + (row0 + r) * st + c);
        *reinterpret_cast<uint4*>(dst + r * LDK + c) = val;
    }
}

// The same rows transposed into dstT [HEAD_DIM][LDT] and, unless dst is null, as they are
// into dst [64][LDK]. Consecutive threads take consecutive rows, so that the transposed
// 2- or 4-byte stores of a warp land in consecutive words.
__device__ __forceinline__ void load_rows_t(real* dst, real* dstT, const real* src, int row0,
                                            int T, long long st) {
    constexpr int VEC = 16 / sizeof(real), VPR = HEAD_DIM / VEC;
    for (int idx = threadIdx.x; idx < BN * VPR; idx += NTHREADS) {
        const int r = idx % BN, c = (idx / BN) * VEC;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < T) val = *reinterpret_cast<const uint4*>(src + (row0 + r) * st + c);
        if (dst) *reinterpret_cast<uint4*>(dst + r * LDK + c) = val;
        const unsigned w[4] = {val.x, val.y, val.z, val.w};  // element u: word u / (4 / E)
#pragma unroll
        for (int u = 0; u < VEC; ++u) {
#if FA_TF32
            reinterpret_cast<unsigned*>(dstT)[(c + u) * LDT + r] = w[u];
#else
            reinterpret_cast<unsigned short*>(dstT)[(c + u) * LDT + r] =
                (unsigned short)(w[u >> 1] >> (16 * (u & 1)));  // little-endian: u even = low
#endif
        }
    }
}
"""

_FORWARD = r"""
// O and lse of query tile qt (blocks run the longest rows first) of head bh = blockIdx.y.
// A lane holds rows row_a = q0 + g (C elements 0, 1) and row_b = row_a + 8 (2, 3) of its
// warp's 16, and in each 8-wide n-tile the columns 2t, 2t + 1. q, k, v have element strides
// (qsb, qsh, qst, 1), o (osb, osh, ost, 1); lse is contiguous (B, H, T).
extern "C" __global__ void __launch_bounds__(NTHREADS)
fa_fwd(const real* __restrict__ q, const real* __restrict__ k, const real* __restrict__ v,
       real* __restrict__ o, float* __restrict__ lse, int T, int H, long long qsb,
       long long qsh, long long qst, long long osb, long long osh, long long ost, float scale,
       const int* __restrict__ step, unsigned seed, unsigned stream, unsigned thresh,
       float inv_keep) {
    real* Qs = reinterpret_cast<real*>(fa_smem);  // [BM][LDK]       this block's queries
    real* Ks = Qs + TILE;                          // [BN][LDK]       a tile of keys
    real* Vt = Ks + TILE;                          // [HEAD_DIM][LDT] its values, transposed
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int qt = gridDim.x - 1 - blockIdx.x;
    const long long bh = blockIdx.y;
    const long long qoff = head_offset(H, qsb, qsh), ooff = head_offset(H, osb, osh);
    const int row_a = qt * BM + warp * 16 + (lane >> 2), row_b = row_a + 8;
#if FA_DROPOUT
    const Drop dr = {(unsigned)step[0], seed, stream, thresh};
    const long long base_a = (bh * T + row_a) * (long long)T, base_b = base_a + 8LL * T;
#endif
    load_rows(Qs, q + qoff, qt * BM, T, qst);
    __syncthreads();
    RowsA qa;
    qa.init(Qs + warp * 16 * LDK);

    float acc[DNT][4] = {};  // O of rows a, b (unnormalised)
    float m_a = NEG_INF, m_b = NEG_INF, l_a = 0.f, l_b = 0.f;  // running max (log2), sum
    const float sl2 = scale * LOG2E;  // scores in log2 units: exp(x) = exp2(x log2 e)
    for (int kt = 0; kt <= qt; ++kt) {
        __syncthreads();  // the previous tile is consumed
        load_rows(Ks, k + qoff, kt * BN, T, qst);
        load_rows_t(nullptr, Vt, v + qoff, kt * BN, T, qst);
        __syncthreads();

        float s[NNT][4] = {};  // S = Q K^T: 16 rows x 64 keys per warp
#pragma unroll
        for (int c = 0; c < DCH; ++c) {
            const FragA a = qa.get(c);
#pragma unroll
            for (int nt = 0; nt < NNT; ++nt)
                mma16(s[nt], a, load_b(Ks + nt * 8 * LDK + 16 * c, LDK));
        }

        // Causal mask on the diagonal tile only (every row sees key kt * BN, so no row of a
        // tile is all -inf and the running max is finite from the first tile on).
        const int col0 = kt * BN + 2 * t;
        float mx_a = NEG_INF, mx_b = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < NNT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = e < 2 ? row_a : row_b, col = col0 + nt * 8 + (e & 1);
                const bool live = kt < qt || (col <= row && col < T);
                s[nt][e] = live ? s[nt][e] * sl2 : NEG_INF;
            }
            mx_a = fmaxf(mx_a, fmaxf(s[nt][0], s[nt][1]));
            mx_b = fmaxf(mx_b, fmaxf(s[nt][2], s[nt][3]));
        }
        // a row's 64 columns are spread over the 4 lanes of a group (t = 0..3)
        mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL, mx_a, 1));
        mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL, mx_a, 2));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL, mx_b, 1));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL, mx_b, 2));
        const float new_a = fmaxf(m_a, mx_a), new_b = fmaxf(m_b, mx_b);
        const float alpha_a = exp2f(m_a - new_a), alpha_b = exp2f(m_b - new_b);  // 0 at first
        m_a = new_a;
        m_b = new_b;
        float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
        for (int nt = 0; nt < NNT; ++nt) {
            s[nt][0] = exp2f(s[nt][0] - new_a);
            s[nt][1] = exp2f(s[nt][1] - new_a);
            s[nt][2] = exp2f(s[nt][2] - new_b);
            s[nt][3] = exp2f(s[nt][3] - new_b);
            sum_a += s[nt][0] + s[nt][1];
            sum_b += s[nt][2] + s[nt][3];
        }
        l_a = l_a * alpha_a + sum_a;  // this lane's columns; summed over the group at the end
        l_b = l_b * alpha_b + sum_b;
#pragma unroll
        for (int nt = 0; nt < DNT; ++nt) {
            acc[nt][0] *= alpha_a; acc[nt][1] *= alpha_a;
            acc[nt][2] *= alpha_b; acc[nt][3] *= alpha_b;
        }
#if FA_DROPOUT
        // the normaliser above is the un-dropped one; only P V sees the mask
#pragma unroll
        for (int nt = 0; nt < NNT; ++nt) {
            bool k0, k1, k2, k3;
            keep2(base_a + col0 + nt * 8, dr, k0, k1);
            keep2(base_b + col0 + nt * 8, dr, k2, k3);
            s[nt][0] = k0 ? s[nt][0] * inv_keep : 0.f;
            s[nt][1] = k1 ? s[nt][1] * inv_keep : 0.f;
            s[nt][2] = k2 ? s[nt][2] * inv_keep : 0.f;
            s[nt][3] = k3 ? s[nt][3] * inv_keep : 0.f;
        }
#endif
        // O += P V: the C fragments of P are the A fragments of this product
#pragma unroll
        for (int kk = 0; kk < KCH; ++kk) {
            const FragA p = c_to_a(s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int nt = 0; nt < DNT; ++nt)
                mma16(acc[nt], p, load_b(Vt + nt * 8 * LDT + 16 * kk, LDT));
        }
    }

    l_a += __shfl_xor_sync(FULL, l_a, 1);
    l_a += __shfl_xor_sync(FULL, l_a, 2);
    l_b += __shfl_xor_sync(FULL, l_b, 1);
    l_b += __shfl_xor_sync(FULL, l_b, 2);
    const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
#pragma unroll
    for (int nt = 0; nt < DNT; ++nt) {
        const int col = nt * 8 + 2 * t;
        if (row_a < T)
            store2(o + ooff + row_a * ost + col, acc[nt][0] * inv_a, acc[nt][1] * inv_a);
        if (row_b < T)
            store2(o + ooff + row_b * ost + col, acc[nt][2] * inv_b, acc[nt][3] * inv_b);
    }
    if (t == 0) {
        if (row_a < T) lse[bh * T + row_a] = (m_a + log2f(l_a)) * LN2;
        if (row_b < T) lse[bh * T + row_b] = (m_b + log2f(l_b)) * LN2;
    }
}
"""

_BACKWARD = r"""
// D_i = sum_d dO[i, d] O[i, d] (float32) of head bh = blockIdx.y, one warp per row; o and dO
// have element strides (osb, osh, ost, 1), dd is contiguous (B, H, T).
extern "C" __global__ void __launch_bounds__(NTHREADS)
fa_bwd_pre(const real* __restrict__ o, const real* __restrict__ dout, float* __restrict__ dd,
           int T, int H, long long osb, long long osh, long long ost) {
    const int row = blockIdx.x * (NTHREADS / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= T) return;  // whole warps leave together
    const long long off = head_offset(H, osb, osh) + row * ost;
    const real* a = o + off;
    const real* b = dout + off;
    float s = 0.f;
    for (int d = lane; d < HEAD_DIM; d += 32) s += to_float(a[d]) * to_float(b[d]);
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) s += __shfl_xor_sync(FULL, s, w);
    if (lane == 0) dd[(long long)blockIdx.y * T + row] = s;
}

// dQ of query tile qt: for each key tile at or left of the diagonal, S = Q K^T and
// dP = dO V^T again, P = exp(scale S - lse), dS = P (dP * mask - D) scale, dQ += dS K.
// Rows as in fa_fwd; q, k, v, dq have element strides (qsb, qsh, qst, 1), dO (osb, osh, ost, 1).
extern "C" __global__ void __launch_bounds__(NTHREADS)
fa_bwd_dq(const real* __restrict__ q, const real* __restrict__ k, const real* __restrict__ v,
          const real* __restrict__ dout, const float* __restrict__ lse,
          const float* __restrict__ dd, real* __restrict__ dq, int T, int H, long long qsb,
          long long qsh, long long qst, long long osb, long long osh, long long ost,
          float scale, const int* __restrict__ step, unsigned seed, unsigned stream,
          unsigned thresh, float inv_keep) {
    real* Qs = reinterpret_cast<real*>(fa_smem);  // [BM][LDK]       this block's queries
    real* Gs = Qs + TILE;                          // [BM][LDK]       their dO
    real* Ks = Gs + TILE;                          // [BN][LDK]       a tile of keys
    real* Vs = Ks + TILE;                          // [BN][LDK]       its values
    real* Kt = Vs + TILE;                          // [HEAD_DIM][LDT] the keys, transposed
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int qt = gridDim.x - 1 - blockIdx.x;
    const long long bh = blockIdx.y;
    const long long qoff = head_offset(H, qsb, qsh), ooff = head_offset(H, osb, osh);
    const int row_a = qt * BM + warp * 16 + (lane >> 2), row_b = row_a + 8;
#if FA_DROPOUT
    const Drop dr = {(unsigned)step[0], seed, stream, thresh};
    const long long base_a = (bh * T + row_a) * (long long)T, base_b = base_a + 8LL * T;
#endif
    load_rows(Qs, q + qoff, qt * BM, T, qst);
    load_rows(Gs, dout + ooff, qt * BM, T, ost);
    __syncthreads();
    RowsA qa, ga;
    qa.init(Qs + warp * 16 * LDK);
    ga.init(Gs + warp * 16 * LDK);
    // padded rows (>= T) have Q = dO = 0; their stats are set to 0 and their dQ not stored
    const float lse_a = row_a < T ? lse[bh * T + row_a] * LOG2E : 0.f;
    const float lse_b = row_b < T ? lse[bh * T + row_b] * LOG2E : 0.f;
    const float d_a = row_a < T ? dd[bh * T + row_a] : 0.f;
    const float d_b = row_b < T ? dd[bh * T + row_b] : 0.f;

    float acc[DNT][4] = {};  // dQ of rows a, b
    const float sl2 = scale * LOG2E;
    for (int kt = 0; kt <= qt; ++kt) {
        __syncthreads();
        load_rows_t(Ks, Kt, k + qoff, kt * BN, T, qst);
        load_rows(Vs, v + qoff, kt * BN, T, qst);
        __syncthreads();

        float s[NNT][4] = {}, dp[NNT][4] = {};  // S = Q K^T, dP = dO V^T (16 x 64 per warp)
#pragma unroll
        for (int c = 0; c < DCH; ++c) {
            const FragA a = qa.get(c), b = ga.get(c);
#pragma unroll
            for (int nt = 0; nt < NNT; ++nt) {
                mma16(s[nt], a, load_b(Ks + nt * 8 * LDK + 16 * c, LDK));
                mma16(dp[nt], b, load_b(Vs + nt * 8 * LDK + 16 * c, LDK));
            }
        }
        const int col0 = kt * BN + 2 * t;
#pragma unroll
        for (int nt = 0; nt < NNT; ++nt) {
            bool kp[4] = {true, true, true, true};
#if FA_DROPOUT
            keep2(base_a + col0 + nt * 8, dr, kp[0], kp[1]);
            keep2(base_b + col0 + nt * 8, dr, kp[2], kp[3]);
#endif
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = e < 2 ? row_a : row_b, col = col0 + nt * 8 + (e & 1);
                const bool live = kt < qt || (col <= row && col < T);
                const float p = live ? exp2f(s[nt][e] * sl2 - (e < 2 ? lse_a : lse_b)) : 0.f;
                const float dpm = kp[e] ? dp[nt][e] * inv_keep : 0.f;  // dropped: dP = 0
                s[nt][e] = p * (dpm - (e < 2 ? d_a : d_b)) * scale;   // dS (0 where masked)
            }
        }
        // dQ += dS K: B element (k = key, n = d) is Kt[d][key]
#pragma unroll
        for (int kk = 0; kk < KCH; ++kk) {
            const FragA a = c_to_a(s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int nt = 0; nt < DNT; ++nt)
                mma16(acc[nt], a, load_b(Kt + nt * 8 * LDT + 16 * kk, LDT));
        }
    }
#pragma unroll
    for (int nt = 0; nt < DNT; ++nt) {
        const int col = nt * 8 + 2 * t;
        if (row_a < T) store2(dq + qoff + row_a * qst + col, acc[nt][0], acc[nt][1]);
        if (row_b < T) store2(dq + qoff + row_b * qst + col, acc[nt][2], acc[nt][3]);
    }
}

// dK, dV of key tile kt = blockIdx.x (the first key tiles have the most query tiles, and
// start first): for each query tile at or below the diagonal, S^T = K Q^T and
// dP^T = V dO^T, then dV += (P * mask)^T dO and dK += dS^T Q. A lane holds keys
// key_a = k0 + g (C elements 0, 1) and key_b = key_a + 8 (2, 3); its columns are queries.
// Strides as in fa_bwd_dq (dk, dv those of q, k, v).
extern "C" __global__ void __launch_bounds__(NTHREADS)
fa_bwd_dkdv(const real* __restrict__ q, const real* __restrict__ k,
            const real* __restrict__ v, const real* __restrict__ dout,
            const float* __restrict__ lse, const float* __restrict__ dd,
            real* __restrict__ dk, real* __restrict__ dv, int T, int H, long long qsb,
            long long qsh, long long qst, long long osb, long long osh, long long ost,
            float scale, const int* __restrict__ step, unsigned seed, unsigned stream,
            unsigned thresh, float inv_keep) {
    real* Ks = reinterpret_cast<real*>(fa_smem);  // [BN][LDK]       this block's keys
    real* Vs = Ks + TILE;                          // [BN][LDK]       their values
    real* Qs = Vs + TILE;                          // [BM][LDK]       a tile of queries
    real* Gs = Qs + TILE;                          // [BM][LDK]       their dO
    real* Qt = Gs + TILE;                          // [HEAD_DIM][LDT] the queries, transposed
    real* Gt = Qt + TILE_T;                        // [HEAD_DIM][LDT] dO, transposed
    float* Ls = reinterpret_cast<float*>(Gt + TILE_T);  // [BM] the queries' lse * log2(e)
    float* Ds = Ls + BM;                                 // [BM] their D_i
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int kt = blockIdx.x, n_qt = gridDim.x;
    const long long bh = blockIdx.y;
    const long long qoff = head_offset(H, qsb, qsh), ooff = head_offset(H, osb, osh);
    const int key_a = kt * BN + warp * 16 + (lane >> 2), key_b = key_a + 8;
#if FA_DROPOUT
    const Drop dr = {(unsigned)step[0], seed, stream, thresh};
#endif
    load_rows(Ks, k + qoff, kt * BN, T, qst);
    load_rows(Vs, v + qoff, kt * BN, T, qst);
    __syncthreads();
    RowsA ka, va;
    ka.init(Ks + warp * 16 * LDK);
    va.init(Vs + warp * 16 * LDK);

    float dk_acc[DNT][4] = {}, dv_acc[DNT][4] = {};
    const float sl2 = scale * LOG2E;
    for (int qt = kt; qt < n_qt; ++qt) {
        __syncthreads();
        load_rows_t(Qs, Qt, q + qoff, qt * BM, T, qst);
        load_rows_t(Gs, Gt, dout + ooff, qt * BM, T, ost);
        if (threadIdx.x < BM) {
            const int i = qt * BM + threadIdx.x;
            Ls[threadIdx.x] = i < T ? lse[bh * T + i] * LOG2E : 0.f;
            Ds[threadIdx.x] = i < T ? dd[bh * T + i] : 0.f;
        }
        __syncthreads();

        float st[NNT][4] = {}, dpt[NNT][4] = {};  // S^T = K Q^T, dP^T = V dO^T (16 x 64)
#pragma unroll
        for (int c = 0; c < DCH; ++c) {
            const FragA a = ka.get(c), b = va.get(c);
#pragma unroll
            for (int nt = 0; nt < NNT; ++nt) {
                mma16(st[nt], a, load_b(Qs + nt * 8 * LDK + 16 * c, LDK));
                mma16(dpt[nt], b, load_b(Gs + nt * 8 * LDK + 16 * c, LDK));
            }
        }
#pragma unroll
        for (int nt = 0; nt < NNT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = e < 2 ? key_a : key_b, il = nt * 8 + 2 * t + (e & 1);
                const int i = qt * BM + il;  // the query
                const bool live = (qt > kt || key <= i) && i < T;
                const float p = live ? exp2f(st[nt][e] * sl2 - Ls[il]) : 0.f;
                bool kp = true;
#if FA_DROPOUT
                kp = keep1((bh * T + i) * (long long)T + key, dr);
#endif
                const float dpm = kp ? dpt[nt][e] * inv_keep : 0.f;
                st[nt][e] = kp ? p * inv_keep : 0.f;            // (P * mask)^T
                dpt[nt][e] = p * (dpm - Ds[il]) * scale;        // dS^T
            }
        }
        // dV += (P * mask)^T dO, dK += dS^T Q: B element (k = query, n = d) is Gt / Qt[d][query]
#pragma unroll
        for (int kk = 0; kk < KCH; ++kk) {
            const FragA pa = c_to_a(st[2 * kk], st[2 * kk + 1]);
            const FragA da = c_to_a(dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
            for (int nt = 0; nt < DNT; ++nt) {
                mma16(dv_acc[nt], pa, load_b(Gt + nt * 8 * LDT + 16 * kk, LDT));
                mma16(dk_acc[nt], da, load_b(Qt + nt * 8 * LDT + 16 * kk, LDT));
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < DNT; ++nt) {
        const int col = nt * 8 + 2 * t;
        if (key_a < T) {
            store2(dk + qoff + key_a * qst + col, dk_acc[nt][0], dk_acc[nt][1]);
            store2(dv + qoff + key_a * qst + col, dv_acc[nt][0], dv_acc[nt][1]);
        }
        if (key_b < T) {
            store2(dk + qoff + key_b * qst + col, dk_acc[nt][2], dk_acc[nt][3]);
            store2(dv + qoff + key_b * qst + col, dv_acc[nt][2], dv_acc[nt][3]);
        }
    }
}
"""
