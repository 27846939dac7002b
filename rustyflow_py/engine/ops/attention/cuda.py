"""Attention on the GPU: the materialised path's fused causal softmax (softmax.cu, one warp
per row), the flash-style fused attention (flash.py) where it applies, and generation's
one-position attention over the KV cache in one kernel (decode_attention.cu).

Why kernels of their own for decoding: the reference formulation is about fourteen launches
per layer (two cache writes, two batched GEMMs, the masked softmax's elementwise passes),
each over all SEQ_LEN cached positions when the step is a captured graph; at batch 1 those
launches, not arithmetic, are the time of a token. decode_attention.cu is two launches per
layer that read the position from device memory and touch only the positions filled so far,
split over chunks of positions so that batch 1 still fills the GPU (a block per sequence and
head alone took more GPU time than the reference formulation)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...precision import accumulate_dtype
from .. import cuda_build
from ..cuda_build import acc_scalar, warp_grid
from . import cudnn, flash
from .reference import AttentionReference

_SOFTMAX = cuda_build.source(__file__, "softmax.cu", cuda_build.dtype_defines(np.float32))
DECODE_CHUNK = 16  # positions per decode_chunk block: the fastest of 16, 32, 64 on the H100
_DECODE_DEFINES = (f"-DCHUNK={DECODE_CHUNK}",)
_DECODE = cuda_build.source(__file__, "decode_attention.cu",
                            cuda_build.dtype_defines(np.float32) + _DECODE_DEFINES)
DECODE_THREADS = 128  # a block per (sequence, head, chunk); head_dim <= this (else the reference)
DECODE_COMBINE_THREADS = 256  # a block per (sequence, head)
DECODE_SHARED_LIMIT = 48 * 1024  # the default dynamic shared memory of a block


def _drop(dropout: tuple[float, int, int, Any] | None) -> flash.Dropout | None:
    return None if dropout is None else flash.Dropout(*dropout)



class CudaAttention(AttentionReference):
    uses = ("attention", "policy", "cublas")  # ATTENTION, GRAPH, the GEMM compute mode

    def causal_softmax_forward(
        self, scores: Any, scale: float, with_lse: bool = False
    ) -> Any:
        s = self.xp.ascontiguousarray(scores)
        t = s.shape[-1]
        rows = s.size // t
        acc = accumulate_dtype(s.dtype)
        lse = self.xp.empty(s.shape[:-1] + (1,), dtype=acc) if with_lse else None
        _SOFTMAX.typed("softmax_fwd", s.dtype)(*warp_grid(rows), (s, lse if with_lse else 0,
                                                       np.int32(rows), np.int32(t),
                                                       acc.type(scale)))
        return (s, lse) if with_lse else s

    def causal_softmax_recompute(self, scores: Any, lse: Any, scale: float) -> Any:
        s = self.xp.ascontiguousarray(scores)
        t = s.shape[-1]
        rows = s.size // t
        _SOFTMAX.typed("softmax_recompute", s.dtype)(*warp_grid(rows), (s, lse, np.int32(rows),
                                                             np.int32(t),
                                                             acc_scalar(scale, s.dtype)))
        return s

    def causal_softmax_backward(self, g: Any, probs: Any, scale: float) -> Any:
        g = self.xp.ascontiguousarray(g)
        t = probs.shape[-1]
        rows = probs.size // t
        ds = self.xp.empty_like(probs)
        _SOFTMAX.typed("softmax_bwd", g.dtype, probs)(
            *warp_grid(rows), (g, probs, ds, np.int32(rows), np.int32(t),
                               acc_scalar(scale, g.dtype)))
        return ds

    def attention_path(self, dtype: Any, head_dim: int, seq_len: int, dropout: bool) -> str:
        """Its float32 products run on tf32 tensor cores, so an fp32 run keeps the
        materialised path; the run policy's ATTENTION=materialized turns it off."""
        if (self.attention == "materialized"
                or (np.dtype(dtype) == np.float32 and self.cublas.matmul_compute != "tf32")
                or not flash.supports(dtype, head_dim, seq_len)):
            return "materialized"
        return "cudnn" if self._on_cudnn(dtype, head_dim, dropout) else "flash"

    def _on_cudnn(self, dtype: Any, head_dim: int, dropout: bool) -> bool:
        """cuDNN's SDPA (cudnn.py) for 16-bit q, k, v without dropout under ATTENTION=cudnn,
        or under auto where it is installed and the step is replayed as a CUDA graph (GRAPH
        not off); flash.py otherwise (the config refuses ATTENTION=cudnn for runs it cannot
        serve). Why not eagerly: a cuDNN call costs the host about twice a flash launch
        through the frontend, and an eager step of a small model is the host's time."""
        if self.attention not in ("auto", "cudnn") or dropout:
            return False
        if self.attention == "auto" and (self.policy.graph == "off" or not cudnn.available()):
            return False
        return cudnn.supports(dtype, head_dim)

    def attention_forward(self, q: Any, k: Any, v: Any, scale: float,
                          dropout: tuple[float, int, int, Any] | None,
                          out: Any = None) -> tuple[Any, Any]:
        if self._on_cudnn(q.dtype, q.shape[-1], dropout is not None):
            return cudnn.cudnn_attention_forward(q, k, v, scale, out)
        return flash.flash_attention_forward(q, k, v, scale, _drop(dropout), out)

    def attention_backward(self, q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any,
                           scale: float, dropout: tuple[float, int, int, Any] | None,
                           out: tuple[Any, Any, Any] | None = None) -> tuple[Any, Any, Any]:
        if self._on_cudnn(q.dtype, q.shape[-1], dropout is not None):
            return cudnn.cudnn_attention_backward(q, k, v, o, do, lse, scale, out)
        return flash.flash_attention_backward(q, k, v, o, do, lse, scale,
                                                       _drop(dropout), out)

    def decode_attention(self, qkv: Any, keys: Any, values: Any, pos: Any, scale: float,
                         n: int) -> Any:
        """decode_attention.cu: a block per (sequence, head, chunk of DECODE_CHUNK positions)
        attends over its share of positions 0..pos (read on the device; `n` is the
        reference's window and is not needed), then one block per (sequence, head) combines
        the chunks. Falls back to the reference where the kernels do not apply."""
        b, heads, s_len, d = keys.shape
        acc = accumulate_dtype(qkv.dtype)
        slices = DECODE_THREADS // d if d else 0
        chunks = -(-s_len // DECODE_CHUNK)
        combine_shared = (chunks + DECODE_COMBINE_THREADS // max(d, 1) * d) * acc.itemsize
        if (not slices or combine_shared > DECODE_SHARED_LIMIT or not qkv.flags.c_contiguous
                or not keys.flags.c_contiguous or not values.flags.c_contiguous):
            return super().decode_attention(qkv, keys, values, pos, scale, n)
        ws = self.xp.empty((b * heads, chunks, d + 2), dtype=acc)  # outputs, maxima, sums
        y = self.xp.empty((b, heads * d), dtype=qkv.dtype)  # (B, E)
        _DECODE.typed("decode_chunk", qkv.dtype, keys, values, defines=_DECODE_DEFINES)(
            (b * heads, chunks), (DECODE_THREADS,),
            (qkv, keys, values, ws, pos, np.int32(heads), np.int32(s_len), np.int32(d),
             acc.type(scale)), shared_mem=(d + DECODE_CHUNK + slices * d) * acc.itemsize)
        _DECODE.typed("decode_combine", qkv.dtype, y, defines=_DECODE_DEFINES)(
            (b * heads,), (DECODE_COMBINE_THREADS,),
            (ws, y, np.int32(heads), np.int32(d), np.int32(chunks)),
            shared_mem=combine_shared)
        return y
