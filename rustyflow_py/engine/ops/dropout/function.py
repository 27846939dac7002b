"""Dropout: the run's Randomness (seed, device step counter, call-site streams), inverted
dropout as an op, and whole-word dropout of looked-up embeddings."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ...autograd import Function, Tensor
from ..elementwise.function import mul


@dataclasses.dataclass(frozen=True)
class Randomness:
    """Where a model's dropout masks come from: the run's seed and the step counter, a 0-d
    int32 device array read by the mask kernel itself (a replayed graph draws fresh masks).
    Each call site adds its own stream id, so no two sites share a mask; so does each `shard`
    of a step's batch (a data-parallel rank, an accumulation micro-step), unless the mask is
    one for the whole step (whole-word dropout drops the same words everywhere)."""

    seed: int
    step: Any
    shard: int = 0

    def stream(self, site: int, per_shard: bool = True) -> int:
        """The Philox key word of a call site (and of this shard, unless one mask serves
        the whole step)."""
        return site + (self.shard << 20 if per_shard else 0)

    def mask(self, kernels: Any, shape: tuple[int, ...], dtype: Any, p: float,
             site: int, per_shard: bool = True) -> Any:
        """1/(1-p) where kept, 0 where dropped (kernels.dropout_mask)."""
        return kernels.dropout_mask(shape, dtype, p, self.seed, self.stream(site, per_shard),
                                    self.step)

    def apply(self, kernels: Any, x: Any, p: float, site: int) -> Any:
        """x times this step's mask of `site` (kernels.dropout_apply: no mask array)."""
        return kernels.dropout_apply(x, p, self.seed, self.stream(site), self.step)


class Dropout(Function):
    """Inverted dropout: zero with probability p, scale survivors by 1/(1-p)."""

    name = "dropout"
    p: float
    rng: Randomness
    site: int

    def forward(self, x: Any) -> Any:
        return self.rng.apply(self.kernels, x, self.p, self.site)

    def backward(self, grad: Any) -> Sequence[Any]:
        """The same mask again (same seed, site, step and element order): none is kept."""
        return (self.rng.apply(self.kernels, grad, self.p, self.site),)


def randomness(x: Tensor, seed: int = 0) -> Randomness:
    """Randomness at step 0 on x's device (for calls outside a training step)."""
    return Randomness(seed, x.backend.xp.zeros((), dtype="int32"))


def dropout(x: Tensor, p: float, rng: Randomness | None = None, site: int = 0) -> Tensor:
    """Inverted dropout of x with the mask of (rng, site); p = 0 returns x itself."""
    if p == 0.0:
        return x
    return Dropout.apply(x, p=p, rng=rng or randomness(x), site=site)


def word_dropout(emb: Tensor, idx: Tensor, vocab_size: int, p: float, rng: Randomness,
                 site: int) -> Tensor:
    """Whole-word dropout of looked-up embeddings emb (B, T, E) of tokens idx (B, T): one
    mask over the vocabulary, so every occurrence of a word in the step is dropped (or kept
    and scaled by 1/(1-p)) together."""
    if p == 0.0:
        return emb
    rows = rng.mask(emb.backend.kernels, (vocab_size,), emb.dtype, p, site,
                    per_shard=False)  # (V,)
    return mul(emb, Tensor.wrap(rows[idx.data][..., None], emb.backend))  # (B, T, 1)

