"""The neural cache pointer (Grave et al., 2017, "Improving Neural Language Models with a
Continuous Cache"): the model's next-token distribution mixed with one that points at the
recent text of the same stream,

    p(w) = (1 - lambda) p_model(w) + lambda p_cache(w)
    p_cache(w) = sum over cached positions i whose next token is w of softmax_i(theta <h_t, h_i>)

h being the final hidden state (the final LayerNorm's output, what the tied LM head reads)
and the cache the last `window` positions before t. No weight changes; a position joins the
cache only once it has been scored, with the next token it predicted (known from then on).
The first position of a stream has an empty cache and keeps p_model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ....engine import ops
from ....engine.precision import accumulate_dtype
from ....engine.tensor import Tensor, no_grad
from ....model.gpt import GPT
from ..evaluate import exp, protocol, scored_tokens, windows, within_budget
from .ranges import check_range


@dataclasses.dataclass(frozen=True)
class CacheSettings:
    """The cache's hyperparameters (--cache-window, --cache-theta, --cache-lambda); one out
    of range is a ConfigError naming its option."""

    window: int = 2000  # positions kept per stream
    theta: float = 0.3  # the flatness of the cache distribution
    lam: float = 0.1  # the cache's weight in the mixture

    name = "cache"

    def __post_init__(self) -> None:
        check_range("--cache-window", self.window, 1)
        check_range("--cache-theta", self.theta, 0)
        check_range("--cache-lambda", self.lam, 0, 1)

    def check(self, seq_len: int) -> None:
        """Any window fits any model."""

    def words(self, seq_len: int) -> str:
        return f"neural cache: window {self.window}, theta {self.theta:g}, lambda {self.lam:g}"

    def stride(self, seq_len: int, eval_stride: int) -> int:
        """The windows are plain evaluation's (`eval_stride`: --eval-stride, else the
        checkpoint's EVAL_STRIDE)."""
        return eval_stride

    def evaluate(self, model: GPT, stream: Any, seq_len: int, stride: int, budget: int = 0,
                 advance: Callable[[int], None] | None = None) -> dict[str, Any]:
        return cache_perplexity(model, stream, seq_len, stride, self, budget, advance)


class NeuralCache:
    """The last `window` (hidden state, next token) pairs of each of B streams."""

    def __init__(self, settings: CacheSettings, rows: int, width: int, xp: Any,
                 dtype: Any) -> None:
        self.settings, self.xp, self.dtype = settings, xp, dtype
        self.keys = xp.zeros((rows, 0, width), dtype=dtype)  # (B, m, E)
        self.next = xp.zeros((rows, 0), dtype=np.int64)  # (B, m)

    def mix(self, hidden: Any, logp: Any, targets: Any) -> Any:
        """log p(target) (B, S) in float64 of S consecutive positions of each stream, from
        their hidden states (B, S, E) and the model's log p(target) (B, S); the positions
        then join the cache. Position j sees the cache and the positions before it."""
        xp, s = self.xp, self.settings
        m, n = self.next.shape[1], targets.shape[1]
        keys = xp.concatenate([self.keys, hidden.astype(self.dtype)], axis=1)  # (B, m+S, E)
        nxt = xp.concatenate([self.next, targets.astype(np.int64)], axis=1)  # (B, m+S)
        query = m + xp.arange(n)[:, None]  # each position's own index among the keys
        key = xp.arange(m + n)[None, :]
        seen = (key < query) & (key >= query - s.window)  # (S, m+S)
        scores = s.theta * xp.matmul(keys[:, m:], keys.transpose(0, 2, 1))  # (B, S, m+S)
        scores = xp.where(seen, scores, -xp.inf)
        top = scores.max(axis=2, keepdims=True)
        weights = xp.exp(scores - xp.where(xp.isfinite(top), top, 0))  # 0 where unseen
        hits = nxt[:, None, :] == targets[:, :, None]  # key i's next token is the target
        # a non-empty row sums to at least 1 (its top key's weight), an empty one to 0
        p_cache = (weights * hits).sum(axis=2) / xp.maximum(weights.sum(axis=2), 1)
        with np.errstate(divide="ignore"):  # p = 0 (lambda 1, a miss) is log p = -inf
            mixed = xp.log((1 - s.lam) * xp.exp(logp.astype(np.float64))
                           + s.lam * p_cache.astype(np.float64))
        self.keys, self.next = keys[:, -s.window:], nxt[:, -s.window:]
        return xp.where(seen.any(axis=1)[None, :], mixed, logp.astype(np.float64))


def target_logprob(logits: Any, targets: Any, xp: Any, dtype: Any) -> Any:
    """log softmax(logits)[target] (N,) of logits (N, V), computed in `dtype`."""
    z = logits.astype(dtype, copy=False)
    top = z.max(axis=1, keepdims=True)
    lse = top[:, 0] + xp.log(xp.exp(z - top).sum(axis=1))
    return z[xp.arange(z.shape[0]), targets] - lse


def cache_perplexity(model: GPT, stream: Any, seq_len: int, stride: int,
                     settings: CacheSettings, budget: int = 0,
                     advance: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Perplexity with the neural cache over an uploaded (B, N) split, each row a stream with
    a cache of its own, in evaluation's windows (evaluate.windows; the first `budget`
    tokens, 0 = all)."""
    backend, xp = model.buffer.backend, model.buffer.backend.xp
    rows, e = stream.shape[0], model.cfg.n_embd
    dtype = accumulate_dtype(model.buffer.compute_dtype)
    cache = NeuralCache(settings, rows, e, xp, dtype)
    total, scored = xp.zeros((), dtype=np.float64), 0
    was_training, model.training = model.training, False
    try:
        with no_grad():
            for start, first in within_budget(windows(stream.shape[1], seq_len, stride), rows,
                                              seq_len, budget):
                x = xp.ascontiguousarray(stream[:, start : start + seq_len])  # (B, T)
                y = xp.ascontiguousarray(stream[:, start + first + 1 : start + seq_len + 1])
                h = model(Tensor.wrap(x, backend), hidden=True).data[:, first:]  # (B, S, E)
                flat = Tensor.wrap(xp.ascontiguousarray(h).reshape(-1, e), backend)
                logits = ops.matmul(flat, model.p["wte"], transpose_b=True).data  # (B*S, V)
                logp = target_logprob(logits, y.reshape(-1), xp, dtype).reshape(y.shape)
                total += cache.mix(h, logp, y).sum()
                scored += seq_len - first
                if advance is not None:
                    advance(rows * (seq_len - first))
    finally:
        model.training = was_training
    nll = -float(backend.to_host(total)) / (scored * rows)
    return {"perplexity": exp(nll), "nll": nll, "tokens": scored * rows,
            "of": scored_tokens(stream.shape, seq_len, stride)[1],
            "protocol": protocol(seq_len, stride)}
