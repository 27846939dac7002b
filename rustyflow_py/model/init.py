"""Initial weights made where they live: a parameter's starting value as a description
(`Init`) that the parameter buffer realises on its own device, chunk by chunk.

Why not draw on the host and upload: a model is then built twice, once in host memory, and
a GPU run of a large model spends its first minute (or its host RAM) on NumPy before the
device sees a byte. Why not the device's own generator (cuRAND, NumPy's PCG64): the CPU and
the GPU would start the same seed from different weights. So the normal draws come from the
counter-based Philox4x32-10 that dropout already uses (engine/ops/dropout/philox.py), whose
integer words are the same on every device, turned into N(0, 1) by the Box-Muller transform
in float64:

    block j of stream s is Philox((j as two words, 0, INIT_WORD), (seed, s)), four words
    that make elements 4j..4j+3: each Box-Muller pair (w_a, w_b) = words (0, 1), then
    (2, 3), gives r cos(2 pi u_b) and r sin(2 pi u_b), where r = sqrt(-2 ln u_a),
    u_a = (w_a + 1) / 2**32 in (0, 1] and u_b = w_b / 2**32 in [0, 1).

The only device-dependent step is the float64 logarithm and sine/cosine, which libm and
CUDA may round differently in the last float64 place; after the cast to float32 that could
move a value by one float32 ulp. tests/test_init.py compares the two devices over all of
GPT-2 124M's weights and allows at most that.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..engine.ops.dropout import philox

INIT_WORD = 1  # counter word 3: dropout masks draw with 0, initial weights with 1
CHUNK = 1 << 22  # elements made at once: bounds the float64 temporaries (a multiple of 4)
_TWO_POW_M32 = 2.0 ** -32


@dataclasses.dataclass(frozen=True)
class Init:
    """How one parameter starts: N(0, std**2) drawn from Philox stream `stream` of `seed`
    when std > 0, else every element `fill`."""

    shape: tuple[int, ...]
    std: float = 0.0
    fill: float = 0.0
    seed: int = 0
    stream: int = 0

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def fill_into(self, xp: Any, out: Any) -> None:
        """Write the initial values into `out`, a contiguous 1-D array of `size` elements
        on `xp`'s device, in chunks of CHUNK elements (no full-size temporary)."""
        if self.std <= 0:
            out.fill(self.fill)
            return
        for start in range(0, self.size, CHUNK):
            count = min(CHUNK, self.size - start)
            z = standard_normal(xp, start, count, self.seed, self.stream)  # (count,) float64
            out[start : start + count] = z * self.std

    def on_host(self, dtype: Any = np.float32) -> np.ndarray:
        """The initial values as a host array of `shape` (what tests and peers compare)."""
        out = np.empty(self.size, dtype=dtype)
        self.fill_into(np, out)
        return out.reshape(self.shape)


def standard_normal(xp: Any, start: int, count: int, seed: int, stream: int) -> Any:
    """N(0, 1) draws of elements start..start+count-1 of (seed, stream), float64 on `xp`'s
    device; `start` must begin a Philox block (a multiple of 4)."""
    if start % 4:
        raise ValueError(f"start {start} is not a multiple of 4 (a Philox block)")
    first = start // 4
    blocks = xp.arange(first, first + (count + 3) // 4, dtype=xp.uint64)
    lo, hi = blocks.astype(xp.uint32), (blocks >> xp.uint64(32)).astype(xp.uint32)
    w0, w1, w2, w3 = philox.philox4x32(xp, (lo, hi, 0, INIT_WORD), (seed & 0xFFFFFFFF, stream))
    z = xp.empty((blocks.size, 4), dtype=xp.float64)
    for a, b, col in ((w0, w1, 0), (w2, w3, 2)):
        r = xp.sqrt(-2.0 * xp.log((a.astype(xp.float64) + 1.0) * _TWO_POW_M32))
        theta = (2.0 * math.pi * _TWO_POW_M32) * b.astype(xp.float64)
        z[:, col] = r * xp.cos(theta)
        z[:, col + 1] = r * xp.sin(theta)
    return z.reshape(-1)[:count]
