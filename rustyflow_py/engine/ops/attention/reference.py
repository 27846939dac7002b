"""The attention family's reference kernels: the causal scale + mask + softmax over the
last axis of (B, H, T, T) scores, generation's one-position attention over the KV cache, and
no fused attention (a GPU kernel fuses it)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...precision import is_16bit
from ..table import Family
from ..widen import wide


class AttentionReference(Family):
    calls = ("matmul",)  # decode_attention's two products

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

    def attention_path(self, dtype: Any, head_dim: int, seq_len: int, dropout: bool) -> str:
        return "materialized"  # here; a GPU kernel fuses it

    def decode_attention(self, qkv: Any, keys: Any, values: Any, pos: Any, scale: float,
                         n: int) -> Any:
        """Generation's attention for one new position per sequence: the key and value in
        qkv (B, 3E) are written at `pos` ((1,) int64, on the device) into one layer's cache
        keys/values (B, H, S, D), then the query attends over cache positions 0..n-1, those
        after pos masked; returns y (B, E). n = pos + 1 reads only the filled positions,
        n = S keeps every shape fixed (a captured graph serves every position)."""
        xp = self.xp
        b, heads, s_len, d = keys.shape
        q, key, value = qkv.reshape(b, 3, heads, 1, d).transpose(1, 0, 2, 3, 4)
        keys[:, :, pos] = key  # (B, H, 1, D) written at pos: in place
        values[:, :, pos] = value
        att = self.matmul(q, keys[:, :, :n], transpose_b=True)  # (B, H, 1, n)
        att = att.astype(np.promote_types(att.dtype, np.float32)) * scale  # 16-bit: f32
        att = xp.where(xp.arange(n) > pos, -xp.inf, att)  # no keys after pos
        att = xp.exp(att - att.max(axis=-1, keepdims=True))
        probs = (att / att.sum(axis=-1, keepdims=True)).astype(qkv.dtype)
        return self.matmul(probs, values[:, :, :n]).reshape(b, heads * d)  # (B, E)
