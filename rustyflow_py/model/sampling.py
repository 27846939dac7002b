"""The next token of B sequences, chosen on the logits' device by the kernel table's
`argmax_rows` and `sample_rows` (engine/ops/sampling: their rules in reference.py, one kernel
launch per token on the GPU).

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


class Sampler:
    """Chooses the next tokens (B,) on the device from logits (B, V); seeded per sequence."""

    def __init__(self, backend: Any, sampling: Sampling, seed: int, batch: int = 1) -> None:
        self.backend, self.sampling = backend, sampling
        # sequence 0 draws np.random.default_rng(seed)'s stream; sequence i, (seed, i)'s
        self.rngs = [np.random.default_rng(seed if i == 0 else (seed, i)) for i in range(batch)]
        self.uniforms: Any = None  # (CHUNK, B) on the device
        self.used = CHUNK

    def __call__(self, logits: Any) -> Any:
        """The chosen ids (B,), int64 on the device."""
        s, kernels = self.sampling, self.backend.kernels
        if s.temperature == 0:
            return kernels.argmax_rows(logits)
        return kernels.sample_rows(logits, self._next_uniforms(), s.temperature, s.top_k,
                                   s.top_p)

    def _next_uniforms(self) -> Any:
        if self.used == CHUNK:
            block = np.stack([rng.random(CHUNK) for rng in self.rngs], axis=1)  # (CHUNK, B)
            self.uniforms, self.used = self.backend.from_host(block), 0
        self.used += 1
        return self.uniforms[self.used - 1]
