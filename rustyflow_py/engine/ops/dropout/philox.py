"""Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the
counter-based generator behind dropout masks, as array code that NumPy and CuPy run alike.

A counter-based generator is a pure function of (key, counter): nothing is carried from one
call to the next, so a mask can be drawn inside a captured CUDA graph from a step counter
that lives on the device, a resumed run draws the masks the straight run drew, and the CPU
and the GPU draw the same bits (uint32 arithmetic is exact on both). cuda_include/philox.cuh
has the same function in CUDA C, fused into the mask kernel (dropout.cu) and the flash
attention; tests hold the two to each other and both to the published known-answer vectors.

How dropout uses it: key = (SEED mod 2**32, the call site's stream id), counter = (element
index // 4 as two words, the step, 0); element i takes word i % 4 of its block's output, and
is kept when that word's top 24 bits, read as a uniform u in [0, 1), satisfy u >= p.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

M0, M1 = 0xD2511F53, 0xCD9E8D57  # the round multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85  # the key schedule's Weyl increments
ROUNDS = 10



def philox4x32(xp: Any, counter: tuple[Any, Any, Any, Any],
               key: tuple[Any, Any]) -> tuple[Any, Any, Any, Any]:
    """Philox4x32-10 of uint32 counter words and key words (arrays or 0-d, broadcast
    together): the four uint32 output words."""
    u32, u64 = xp.uint32, xp.uint64
    c0, c1, c2, c3 = (_u32(xp, c) for c in counter)
    k0, k1 = (_u32(xp, k) for k in key)
    with np.errstate(over="ignore"):  # the key schedule wraps mod 2**32 by design
        for r in range(ROUNDS):
            if r:
                k0, k1 = k0 + u32(W0), k1 + u32(W1)
            p0 = c0.astype(u64) * u64(M0)  # 32 x 32 -> 64 bits: exact
            p1 = c2.astype(u64) * u64(M1)
            hi0, lo0 = (p0 >> u64(32)).astype(u32), p0.astype(u32)
            hi1, lo1 = (p1 >> u64(32)).astype(u32), p1.astype(u32)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def _u32(xp: Any, v: Any) -> Any:
    """A Python int as a host uint32 scalar (no device copy), an array as uint32."""
    return xp.uint32(v) if isinstance(v, int) else v.astype(xp.uint32)


def keep_threshold(p: float) -> int:
    """The smallest 24-bit draw that is kept: u >= p for u = draw / 2**24, decided on
    integers so that every device agrees exactly."""
    return math.ceil(p * (1 << 24))


def dropout_bits(xp: Any, n: int, seed: int, site: int, step: Any) -> Any:
    """The 24-bit draws (uint32, (n,)) of elements 0..n-1 at `site` and `step` (a 0-d integer
    array, read where it lives: no host round trip on the GPU)."""
    blocks = xp.arange((n + 3) // 4, dtype=xp.uint64)
    lo, hi = blocks.astype(xp.uint32), (blocks >> xp.uint64(32)).astype(xp.uint32)
    words = philox4x32(xp, (lo, hi, step, 0), (seed & 0xFFFFFFFF, site))
    return (xp.stack(words, axis=1).reshape(-1)[:n]) >> xp.uint32(8)


def dropout_mask(xp: Any, shape: tuple[int, ...], dtype: Any, p: float, seed: int, site: int,
                 step: Any) -> Any:
    """Inverted dropout's multiplier of `shape`: 1/(1-p) where kept, 0 where dropped."""
    n = math.prod(shape)
    keep = dropout_bits(xp, n, seed, site, step) >= keep_threshold(p)
    dtype = np.dtype(dtype)
    return (keep.astype(dtype) * dtype.type(1.0 / (1.0 - p))).reshape(shape)
