"""Fused causal attention on the GPU (FlashAttention-2 style) that never materialises T x T.

Why: the materialised attention (ops.CausalSelfAttention) writes the (B, H, T, T) scores,
rewrites them as probabilities, multiplies by a (B, H, T, T) dropout mask and reads them all
back in backward: traffic and activation memory that grow as T^2 while the matmuls' inputs
grow as T. Here each block keeps a 64 x 64 tile of scores in
registers and folds it into the output straight away with an online softmax, so the largest
buffer is an output; only the row log-sum-exps (B, H, T) are kept. Backward recomputes the
probabilities from them (exp(s - lse) needs no second pass over the row) instead of storing
them. The dropout mask is not stored either: every kernel redraws the bits of the element it
is at from Philox (dropout/philox.py) from (seed, call-site stream, step, flat index), the
very bits `dropout_mask` would have put in the (B, H, T, T) mask, and the step is read on the
device, so a replayed CUDA graph draws fresh masks and forward and backward agree.

Layout of the work (BM = BN = 64, 4 warps of 32 threads, warp w owning 16 rows):
  fa_fwd       grid (T/64 query tiles, B*H). Q tile resident in shared memory; loops over the
               key tiles at or left of the diagonal: S = Q K^T (tensor cores), mask only on
               the diagonal tile, online softmax in registers, O += P V. Writes O and lse.
  fa_bwd_pre   grid (T/32, B*H): D_i = rowsum(dO_i * O_i), four lanes per row (float32).
  fa_bwd_dq    grid (query tiles, B*H): recomputes S and dP = dO V^T for each key tile,
               dS = P (dP - D) scale, dQ += dS K in registers. Deterministic (no atomics).
  fa_bwd_dkdv  grid (key tiles, B*H): K, V tile resident; loops over query tiles at or below
               the diagonal: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q.

Matrix products use `mma.sync.m16n8k16` (float16, bfloat16) and `mma.sync.m16n8k8` on tf32
(float32 inputs: a 10-bit mantissa, the precision cuBLAS's tf32 mode gives the model's
other matmuls), accumulating in float32. Tiles go from global to shared memory by
cp.async, which bypasses the registers; for 16-bit types the tiles a block loops over are
double-buffered, so the copy of the next one runs under the work on this one. Fragments are
read from the row-major tiles by ldmatrix (16-bit types; .trans where a tile is the k-major
operand, so nothing is transposed in memory) or by 64/32-bit loads from a swizzled layout
(float32). The register layouts are documented above `FRAGMENTS` in flash_attention.cu and
mirrored by a CPU test (tests/test_flash_attention.py) that checks them against the PTX ISA
tables.

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

from ...precision import dtype_name
from .. import cuda_build
from ..dropout.philox import keep_threshold

BLOCK = 64  # query rows per block (BM) and keys per tile (BN)
THREADS = 128  # 4 warps x 16 rows
HEAD_DIMS = (32, 64, 128)
MAX_BLOCKS_Y = 65535  # B * H rides on gridDim.y
_STATIC_SHARED_BYTES = 48 * 1024  # beyond this a kernel must opt in to dynamic shared memory
# Storage dtype name -> (CUDA type, the macro that includes its header, which mma); keyed by
# name so that this module imports without ml_dtypes (bfloat16's NumPy dtype) and without CuPy.
_REAL = {
    "float32": ("float", "", "TF32"),
    "float16": ("__half", "RF_FP16", "F16"),
    "bfloat16": ("__nv_bfloat16", "RF_BF16", "BF16"),
}
_KERNELS = ("fa_fwd", "fa_bwd_pre", "fa_bwd_dq", "fa_bwd_dkdv")
_FLASH = cuda_build.source(__file__, "flash_attention.cu", (
    "-DRF_REAL=float", "-DHEAD_DIM=64", "-DFA_TF32=1", "-DFA_BF16=0", "-DFA_DROPOUT=1",
    "-DSTAGES=1"))


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
    rows = THREADS // 4  # fa_bwd_pre: four lanes per row
    kernels["fa_bwd_pre"](((t + rows - 1) // rows, b * h), (THREADS,),
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
        name = dtype_name(dtype)
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


def _stages(itemsize: int) -> int:
    """Shared-memory stages of the looped-over tiles (STAGES in the kernels): two overlap the
    copy of the next tile with the work on this one; float32 tiles are twice the size, and
    one stage leaves room for more blocks per SM."""
    return 1 if itemsize == 4 else 2


def _shared_bytes(kernel: str, itemsize: int, head_dim: int) -> int:
    """Dynamic shared memory of `kernel`: its tiles as laid out at the top of the kernel
    ([64][LDK] tiles, LDK = D for float32 (swizzled), D + 8 for 16-bit types; the looped-over
    ones once per stage), then float32 extras."""
    ld, stages = (head_dim if itemsize == 4 else head_dim + 8), _stages(itemsize)
    tiles, extra = {
        "fa_fwd": (1 + 2 * stages, 0),  # Qs | stages x (Ks, Vs)
        "fa_bwd_dq": (2 + 2 * stages, 0),  # Qs, Gs | stages x (Ks, Vs)
        # Ks, Vs | stages x (Qs, Gs) | stages x (lse, D)
        "fa_bwd_dkdv": (2 + 2 * stages, stages * 2 * BLOCK * 4),
    }[kernel]
    return tiles * BLOCK * ld * itemsize + extra


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
    """The four kernels of one variant (one module: CuPy compiles it once and caches it)."""
    defines = options(dtype_name, head_dim, dropout)
    return {name: _FLASH.kernel(name, defines) for name in _KERNELS}


def options(dtype_name: str, head_dim: int, dropout: bool) -> tuple[str, ...]:
    """The -D options of one variant of flash_attention.cu (pure Python: tests read them
    without a GPU)."""
    real, header, mma = _REAL[dtype_name]
    real_size = 4 if mma == "TF32" else 2
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head dim {head_dim} not in {HEAD_DIMS}")
    return ((f"-DRF_REAL={real}",) + ((f"-D{header}=1",) if header else ())
            + (f"-DHEAD_DIM={head_dim}", f"-DFA_TF32={int(mma == 'TF32')}",
               f"-DFA_BF16={int(mma == 'BF16')}", f"-DFA_DROPOUT={int(dropout)}",
               f"-DSTAGES={_stages(real_size)}"))


def source() -> str:
    """The CUDA source of every variant, its shared headers inlined."""
    return _FLASH.text()
