"""The next-token rules as array ops (the reference kernels; any xp).

The rules are those of `transformers`' warpers, in their order: logits / temperature, top-k
(keep the logits at or above the k-th largest), softmax, top-p (keep the most likely tokens
until the mass before a token reaches p; the first is always kept), renormalise. Ties at a cut
are all kept. Probabilities are float64, so tiny ones survive, and the draw is the inverse CDF
in vocabulary order: the token whose CDF step holds u * total (a zero-probability token, a
flat step, is never drawn).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..table import Family


def token_probs(xp: Any, logits: Any, temperature: float, top_k: int, top_p: float) -> Any:
    """The distributions sampled from (B, V) float64, for logits (B, V) and temperature > 0.

    Top-k finds the k largest logits by a partition, not a sort, and zeroes the rest after the
    exp (the exp of a finite number is cheaper than of -inf). With top-k on, top-p then orders
    only the k largest probabilities: every other one is 0 or tied with the k-th, and the cut
    keeps or drops those alike, so the nucleus is the one a full sort gives."""
    z = logits.astype(np.float64) / temperature  # (B, V)
    v = z.shape[-1]
    top = z.max(axis=-1, keepdims=True)  # (B, 1)
    largest = None
    if 0 < top_k < v:
        largest = xp.partition(z, v - top_k, axis=-1)[:, v - top_k :]  # (B, k) unordered
        kth = largest.min(axis=-1, keepdims=True)  # (B, 1)
        probs = xp.where(z < kth, 0.0, xp.exp(z - top))
    else:
        probs = xp.exp(z - top)
    total = probs.sum(axis=-1, keepdims=True)
    probs /= total
    if top_p < 1.0:
        head = probs if largest is None else xp.exp(largest - top) / total  # the same values
        ordered = xp.sort(head, axis=-1)[:, ::-1]  # (B, k or V) most likely first
        before = xp.cumsum(ordered, axis=-1)[:, :-1]  # mass of the tokens before the next
        kept = 1 + (before < top_p).sum(axis=-1, keepdims=True)  # (B, 1)
        smallest = xp.take_along_axis(ordered, kept - 1, axis=-1)  # (B, 1)
        probs = xp.where(probs < smallest, 0.0, probs)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def draw(xp: Any, probs: Any, u: Any) -> Any:
    """Token ids (B,) by inverse CDF of probs (B, V) at uniforms u (B,) in [0, 1)."""
    cdf = xp.cumsum(probs, axis=-1)  # (B, V)
    ids = (cdf <= (u * cdf[:, -1])[:, None]).sum(axis=-1)  # searchsorted, side="right"
    return xp.minimum(ids, probs.shape[-1] - 1)


class SamplingReference(Family):

    def argmax_rows(self, logits: Any) -> Any:
        return self.xp.argmax(logits, axis=-1)

    def sample_rows(self, logits: Any, u: Any, temperature: float, top_k: int,
                    top_p: float) -> Any:
        return draw(self.xp, token_probs(self.xp, logits, temperature, top_k, top_p), u)

    def next_tokens(self, logits: Any, uniforms: Any, count: Any, tokens: Any, ring: Any,
                    pos: Any, temperature: float, top_k: int, top_p: float) -> None:
        slot = count % uniforms.shape[0]  # (1,), on the device
        ids = (self.argmax_rows(logits) if temperature == 0 else
               self.sample_rows(logits, uniforms[slot][0], temperature, top_k, top_p))
        tokens[...] = ids
        ring[slot] = ids
        count += 1
        pos += 1
