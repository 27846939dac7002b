"""The next token of B sequences, chosen on the logits' device by array ops.

The rules are those of `transformers`' warpers, in their order: logits / temperature, top-k
(keep the logits at or above the k-th largest), softmax, top-p (keep the most likely tokens
until the mass before a token reaches p; the first is always kept), renormalise. They equal
rustyflow's earlier host sampler except on exact ties at a cut, where both tied tokens stay
(the host kept exactly k, or cut the nucleus inside a tie). Probabilities are float64, so tiny
ones survive, and the draw is the inverse CDF in vocabulary order: the token whose CDF step
holds u * total (a zero-probability token, a flat step, is never drawn).

The uniforms come from seeded numpy Generators, one per sequence, drawn a chunk at a time and
uploaded once per chunk: a seed gives the same draws on either device, the first sequence's
are exactly `np.random.default_rng(seed)`'s, and only the chosen ids are read back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

CHUNK = 256  # uniforms drawn (and uploaded) at once per sequence


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the next token is drawn: temperature 0 is greedy, top_k 0 and top_p 1 are off."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0


def token_probs(xp: Any, logits: Any, s: Sampling) -> Any:
    """The distributions sampled from (B, V) float64, for logits (B, V) and temperature > 0.

    Top-k finds the k largest logits by a partition, not a sort, and zeroes the rest after the
    exp (the exp of a finite number is cheaper than of -inf). With top-k on, top-p then orders
    only the k largest probabilities: every other one is 0 or tied with the k-th, and the cut
    keeps or drops those alike, so the nucleus is the one a full sort gives."""
    z = logits.astype(np.float64) / s.temperature  # (B, V)
    v = z.shape[-1]
    top = z.max(axis=-1, keepdims=True)  # (B, 1)
    largest = None
    if 0 < s.top_k < v:
        largest = xp.partition(z, v - s.top_k, axis=-1)[:, v - s.top_k :]  # (B, k) unordered
        kth = largest.min(axis=-1, keepdims=True)  # (B, 1)
        probs = xp.where(z < kth, 0.0, xp.exp(z - top))
    else:
        probs = xp.exp(z - top)
    total = probs.sum(axis=-1, keepdims=True)
    probs /= total
    if s.top_p < 1.0:
        head = probs if largest is None else xp.exp(largest - top) / total  # the same values
        ordered = xp.sort(head, axis=-1)[:, ::-1]  # (B, k or V) most likely first
        before = xp.cumsum(ordered, axis=-1)[:, :-1]  # mass of the tokens before the next
        kept = 1 + (before < s.top_p).sum(axis=-1, keepdims=True)  # (B, 1)
        smallest = xp.take_along_axis(ordered, kept - 1, axis=-1)  # (B, 1)
        probs = xp.where(probs < smallest, 0.0, probs)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def draw(xp: Any, probs: Any, u: Any) -> Any:
    """Token ids (B,) by inverse CDF of probs (B, V) at uniforms u (B,) in [0, 1)."""
    cdf = xp.cumsum(probs, axis=-1)  # (B, V)
    ids = (cdf <= (u * cdf[:, -1])[:, None]).sum(axis=-1)  # searchsorted, side="right"
    return xp.minimum(ids, probs.shape[-1] - 1)


class Sampler:
    """Chooses the next tokens (B,) on the device from logits (B, V); seeded per sequence."""

    def __init__(self, backend: Any, sampling: Sampling, seed: int, batch: int = 1) -> None:
        self.backend, self.sampling, self.xp = backend, sampling, backend.xp
        # sequence 0 draws np.random.default_rng(seed)'s stream; sequence i, (seed, i)'s
        self.rngs = [np.random.default_rng(seed if i == 0 else (seed, i)) for i in range(batch)]
        self.uniforms: Any = None  # (CHUNK, B) on the device
        self.used = CHUNK

    def __call__(self, logits: Any) -> Any:
        """The chosen ids (B,), int64 on the device."""
        s, xp = self.sampling, self.xp
        if s.temperature == 0:
            return xp.argmax(logits, axis=-1)
        return draw(xp, token_probs(xp, logits, s), self._next_uniforms())

    def _next_uniforms(self) -> Any:
        if self.used == CHUNK:
            block = np.stack([rng.random(CHUNK) for rng in self.rngs], axis=1)  # (CHUNK, B)
            self.uniforms, self.used = self.backend.from_host(block), 0
        self.used += 1
        return self.uniforms[self.used - 1]
