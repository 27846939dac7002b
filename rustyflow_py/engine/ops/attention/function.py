"""Causal self-attention as ops: the training op on a fused QKV tensor (fused kernel or
materialised), and attention over a KV cache for generation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ...autograd import Function, Tensor
from ..dropout.function import Randomness, randomness


class CausalSelfAttention(Function):
    """Causal multi-head attention core on a fused QKV tensor: (B, T, 3E) -> (B, T, E).

    Where the backend has a fused kernel for the dtype and head size (the GPU's flash-style
    attention: tf32 and 16-bit runs), the whole op is that kernel and T x T is never formed;
    its matrix products are then timed inside "attention", not as matmuls. Otherwise it is
    materialised: scale, mask and softmax are one fused kernel, and the batched matmuls are
    timed as matmuls of their own. At long sequence lengths the (B, H, T, T) probabilities
    would dominate activation memory, so when they outweigh a quarter of a block's other
    activations (H*T > 6*E) only each row's log-sum-exp is kept and backward recomputes them
    with one more matmul; below that they are kept, which is faster.
    """

    name = "attention"
    n_head: int
    dropout: float = 0.0
    rng: Randomness | None = None
    site: int = 0

    def _heads(self, qkv: Any) -> tuple[Any, Any, Any]:
        """q, k, v as contiguous (B, H, T, D): each matmul is one strided-batched GEMM."""
        b, t, e3 = qkv.shape
        h = self.n_head
        split = qkv.reshape(b, t, 3, h, e3 // 3 // h).transpose(2, 0, 3, 1, 4)
        return tuple(self.xp.ascontiguousarray(z) for z in split)  # type: ignore[return-value]

    def _probs(self, q: Any, k: Any, phase: str) -> Any:
        att = self.matmul(q, self.xp.swapaxes(k, -1, -2), phase)  # (B, H, T, T)
        if phase == "forward":
            probs, self.lse = self.kernels.causal_softmax_forward(att, self.scale, True)
            return probs
        return self.kernels.causal_softmax_recompute(att, self.lse, self.scale)

    def _head_views(self, x: Any) -> list[Any]:
        """The (B, H, T, D) views of q, k, v inside a packed (B, T, 3E) array: no copies."""
        b, t, e3 = x.shape
        h = self.n_head
        split = x.reshape(b, t, 3, h, e3 // 3 // h)
        return [split[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]

    def _fused_forward(self, qkv: Any) -> Any:
        """The fused kernel reads the heads in place and writes y (B, T, H, D), the (B, T, E)
        output, through its head-major view: no split or merge copies."""
        b, t, e3 = qkv.shape
        q, k, v = self._head_views(qkv)
        y = self.xp.empty((b, t, self.n_head, e3 // 3 // self.n_head), dtype=qkv.dtype)
        _, self.lse = self.kernels.attention_forward(q, k, v, self.scale, self._mask(),
                                                     out=y.transpose(0, 2, 1, 3))
        self.qkv, self.y = qkv, y
        return y.reshape(b, t, e3 // 3)  # (B, T, E)

    def _fused_backward(self, grad: Any) -> Any:
        b, t, e = grad.shape
        y, h = self.y, self.n_head
        dqkv = self.xp.empty((b, t, 3 * e), dtype=grad.dtype)
        gy = self.xp.ascontiguousarray(grad).reshape(b, t, h, e // h).transpose(0, 2, 1, 3)
        self.kernels.attention_backward(*self._head_views(self.qkv), y.transpose(0, 2, 1, 3),
                                        gy, self.lse, self.scale, self._mask(),
                                        out=self._head_views(dqkv))
        return dqkv  # (B, T, 3E)

    def _mask(self) -> tuple[float, int, int, Any] | None:
        """The fused kernel's dropout: the (p, seed, stream, step) dropout_mask would take."""
        if not self.dropped:
            return None
        assert self.rng is not None
        return self.dropout, self.rng.seed, self.rng.stream(self.site), self.rng.step

    def _drop(self, x: Any) -> Any:
        """x (B, H, T, T) times the probabilities' dropout mask, drawn inline."""
        assert self.rng is not None
        return self.rng.apply(self.kernels, x, self.dropout, self.site)

    def _recompute(self, qkv: Any) -> bool:
        _, t, e3 = qkv.shape
        return self.n_head * t > 2 * e3  # H*T > 6*E

    def forward(self, qkv: Any) -> Any:
        b, t, e3 = qkv.shape
        d = e3 // 3 // self.n_head
        self.scale = 1.0 / math.sqrt(d)
        self.dropped = self.dropout > 0.0 and self.rng is not None
        self.fused = self.kernels.attention_path(qkv.dtype, d, t, self.dropped) != "materialized"
        if self.fused:  # one kernel, T x T never formed; backward recomputes from the lse
            return self._fused_forward(qkv)
        q, k, v = self._heads(qkv)
        probs = used = self._probs(q, k, "forward")
        if self.dropped:
            used = self._drop(probs)
        y = self.matmul(used, v, "forward")  # (B, H, T, D)
        self.qkv = qkv
        self.saved = None if self._recompute(qkv) else (q, k, v, probs, used)
        return y.transpose(0, 2, 1, 3).reshape(b, t, e3 // 3)  # (B, T, E)

    def backward(self, grad: Any) -> Sequence[Any]:
        xp, phase = self.xp, "backward"
        if self.fused:
            return (self._fused_backward(grad),)
        if self.saved is None:
            q, k, v = self._heads(self.qkv)
            probs = self._probs(q, k, phase)
            used = self._drop(probs) if self.dropped else probs
        else:
            q, k, v, probs, used = self.saved
        b, h, t, d = q.shape
        gy = xp.ascontiguousarray(grad.reshape(b, t, h, d).transpose(0, 2, 1, 3))  # (B,H,T,D)
        dqkv = xp.empty((b, t, 3, h, d), dtype=grad.dtype)
        dqkv[:, :, 2] = self.matmul(xp.swapaxes(used, -1, -2), gy, phase,
                                    gradient="b").transpose(0, 2, 1, 3)
        dused = self.matmul(gy, xp.swapaxes(v, -1, -2), phase, gradient="a")  # (B, H, T, T)
        if self.dropped:
            dused = self._drop(dused)
        datt = self.kernels.causal_softmax_backward(dused, probs, self.scale)
        dqkv[:, :, 0] = self.matmul(datt, k, phase, gradient="a").transpose(0, 2, 1, 3)
        dqkv[:, :, 1] = self.matmul(xp.swapaxes(datt, -1, -2), q, phase,
                                    gradient="a").transpose(0, 2, 1, 3)
        return (dqkv.reshape(b, t, 3 * h * d),)


class CachedAttention(Function):
    """Causal attention of T new positions over a KV cache: (B, T, 3E) -> (B, T, E).

    The new keys and values are written into `keys`/`values` (B, H, S_max, D) at positions
    start..start+T, and each query attends over every cached position up to its own. From an
    empty cache (a prefill) that is the training kernel's causal softmax; after cached
    positions the mask is offset by `start` (none is needed for a single query).

    Inference only: the cache is state written in place, which autograd cannot replay, so
    backward raises; run it under no_grad().
    """

    name = "cached_attention"
    keys: Any
    values: Any
    start: int
    n_head: int

    def forward(self, qkv: Any) -> Any:
        xp = self.xp
        b, t, e3 = qkv.shape
        start, end = self.start, self.start + t
        split = qkv.reshape(b, t, 3, self.n_head, e3 // 3 // self.n_head)
        q, k, v = split.transpose(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        scale = 1.0 / math.sqrt(q.shape[-1])
        att = self.matmul(q, xp.swapaxes(self.keys[:, :, :end], -1, -2), "forward")  # (B,H,T,S)
        if start == 0:
            probs = self.kernels.causal_softmax_forward(att, scale)
        else:
            att *= scale
            if t > 1:  # query i sits at position start + i
                xp.copyto(att, -xp.inf, where=xp.arange(end) > xp.arange(start, end)[:, None])
            att -= att.max(axis=-1, keepdims=True)
            probs = xp.exp(att, out=att)
            probs /= probs.sum(axis=-1, keepdims=True)
        y = self.matmul(probs, self.values[:, :, :end], "forward")  # (B, H, T, D)
        return y.transpose(0, 2, 1, 3).reshape(b, t, e3 // 3)  # (B, T, E)

    def backward(self, grad: Any) -> Sequence[Any]:
        raise NotImplementedError("attention over a KV cache is inference-only: no backward "
                                  "(run the model under no_grad() when passing a cache)")


def causal_self_attention(qkv: Tensor, n_head: int, dropout: float = 0.0,
                          rng: Randomness | None = None, site: int = 0) -> Tensor:
    """Attention with its probabilities dropped by the mask of (rng, site) when dropout > 0."""
    if dropout > 0.0 and rng is None:
        rng = randomness(qkv)
    return CausalSelfAttention.apply(qkv, n_head=n_head, dropout=dropout, rng=rng, site=site)



def cached_attention(qkv: Tensor, keys: Any, values: Any, start: int, n_head: int) -> Tensor:
    """Causal attention of qkv's T positions, appended at `start` to the (B, H, S_max, D)
    key/value arrays, over all start+T cached positions (inference only)."""
    return CachedAttention.apply(qkv, keys=keys, values=values, start=start, n_head=n_head)

