"""The attention family's reference kernels: the causal scale + mask + softmax over the
last axis of (B, H, T, T) scores, and no fused attention (a GPU kernel fuses it)."""

from __future__ import annotations

from typing import Any

from ...precision import is_16bit
from ..table import Family
from ..widen import wide


class AttentionReference(Family):
    def __init__(self, kernels: Any) -> None:
        super().__init__(kernels)
        self._masks: dict[int, Any] = {}


    def causal_mask(self, t: int) -> Any:
        if t not in self._masks:
            self._masks[t] = self.xp.tri(t, dtype=bool)
        return self._masks[t]

    def causal_softmax_forward(
        self, scores: Any, scale: float, with_lse: bool = False
    ) -> Any:
        if is_16bit(scores.dtype):
            out = AttentionReference.causal_softmax_forward(self, *wide(scores), scale, with_lse)
            return (out[0].astype(scores.dtype), out[1]) if with_lse else out.astype(scores.dtype)
        xp = self.xp
        s = scores
        s *= scale
        xp.copyto(s, -xp.inf, where=~self.causal_mask(s.shape[-1]))
        m = s.max(axis=-1, keepdims=True)
        s -= m
        xp.exp(s, out=s)
        z = s.sum(axis=-1, keepdims=True)
        s /= z
        if not with_lse:
            return s
        return s, xp.log(z) + m

    def causal_softmax_recompute(self, scores: Any, lse: Any, scale: float) -> Any:
        """exp(scale*scores - lse) with future positions zeroed."""
        if is_16bit(scores.dtype):
            return AttentionReference.causal_softmax_recompute(self, *wide(scores), lse,
                                                      scale).astype(scores.dtype)
        xp = self.xp
        s = scores
        s *= scale
        xp.copyto(s, -xp.inf, where=~self.causal_mask(s.shape[-1]))  # before exp: no overflow
        s -= lse
        xp.exp(s, out=s)
        return s

    def causal_softmax_backward(self, g: Any, probs: Any, scale: float) -> Any:
        """d(scores) from d(probs); masked entries have probs == 0 so get 0."""
        if is_16bit(probs.dtype):
            return AttentionReference.causal_softmax_backward(self, *wide(g, probs),
                                                     scale).astype(probs.dtype)
        ds = g * probs
        ds -= probs * ds.sum(axis=-1, keepdims=True)
        ds *= scale
        return ds

    def fused_attention(self, dtype: Any, head_dim: int, seq_len: int) -> bool:
        return False  # attention is materialised here (a GPU kernel fuses it)
