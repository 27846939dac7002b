"""Attention on the GPU: the materialised path's fused causal softmax (softmax.cu, one warp
per row), and the flash-style fused attention (flash.py) where it applies."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...precision import accumulate_dtype
from .. import cuda_build
from ..cuda_build import acc_scalar, warp_grid
from . import flash
from .reference import AttentionReference

_SOFTMAX = cuda_build.source(__file__, "softmax.cu", cuda_build.dtype_defines(np.float32))


def _drop(dropout: tuple[float, int, int, Any] | None) -> flash.Dropout | None:
    return None if dropout is None else flash.Dropout(*dropout)



class CudaAttention(AttentionReference):
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

    def fused_attention(self, dtype: Any, head_dim: int, seq_len: int) -> bool:
        """Its float32 products run on tf32 tensor cores, so an fp32 run keeps the
        materialised path; ATTENTION=materialized turns it off (set_attention)."""
        if self.attention == "materialized":
            return False
        if np.dtype(dtype) == np.float32 and self.cublas.matmul_compute != "tf32":
            return False
        return flash.supports(dtype, head_dim, seq_len)

    def attention_forward(self, q: Any, k: Any, v: Any, scale: float,
                          dropout: tuple[float, int, int, Any] | None,
                          out: Any = None) -> tuple[Any, Any]:
        return flash.flash_attention_forward(q, k, v, scale, _drop(dropout), out)

    def attention_backward(self, q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any,
                           scale: float, dropout: tuple[float, int, int, Any] | None,
                           out: tuple[Any, Any, Any] | None = None) -> tuple[Any, Any, Any]:
        return flash.flash_attention_backward(q, k, v, o, do, lse, scale,
                                                       _drop(dropout), out)
