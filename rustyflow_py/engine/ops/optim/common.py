"""What the optimizer files share: the bias correction computed from double-precision
pieces, and each device's helpers (the reference's Adam moments and L2 term, the CPU's runner
of a reference update over cache blocks, the GPU's scalar arguments).

Every update runs over the flat parameter buffer and reads lr, step and the clip factor from
device memory, so the step stays inside a CUDA graph. A negative clip factor means "skip this
step" (a float16 run whose gradients overflowed, model/loss_scale.py): the GPU kernels then
leave parameters and state untouched.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..cpu_pool import BLOCK, Blocks
from ..table import Family


def log_beta(beta: float) -> float:
    """log(beta) in double precision (-inf for 0), for bias_correction."""
    return math.log(beta) if beta > 0 else -math.inf


def bias_correction(xp: Any, t: Any, beta: float) -> Any:
    """Adam's 1 - beta**t for a 0-d step t, as -expm1(t * log(beta)): float32's 1 - beta**t
    loses the low digits (1 - float32(0.999) is 1.3e-5 off 0.001); this keeps t's dtype and
    is accurate to a few ulp, as torch's double-precision correction is."""
    return -xp.expm1(t * log_beta(beta))


class OptimizerFamily(Family):
    """An optimizer's kernels on one device, with the reference's shared helpers."""

    def _moments(self, g: Any, m: Any, v: Any, t: Any, betas: tuple[float, float],
                 eps: float) -> Any:
        """Adam's moments updated in place with g; the denominator sqrt(v / (1 - b2^t)) + eps."""
        b1, b2 = betas
        m *= b1
        m += (1.0 - b1) * g
        v *= b2
        v += (1.0 - b2) * (g * g)
        denom = self.xp.sqrt(v)
        denom /= self.xp.sqrt(bias_correction(self.xp, t, b2))
        denom += eps
        return denom

    def _l2_grad(self, p: Any, g: Any, scale: Any, weight_decay: float,
                 decay_size: int) -> Any:
        """A fresh g * scale, with the L2 term weight_decay * p added on p[:decay_size]."""
        g = g * scale.astype(g.dtype) if scale is not None else g.copy()
        if weight_decay:
            g[:decay_size] += weight_decay * p[:decay_size]
        return g


class CpuOptimizerFamily(OptimizerFamily):
    """The CPU's: a reference update run over cache blocks on the pool."""

    def _by_blocks(self, kernel: Any, arrays: tuple[Any, ...], *args: Any) -> None:
        """kernel(*blocks of `arrays` (None stays None), *args[:-1], decay) over cache blocks
        on the pool; args[-1] is decay_size, made relative to each block."""
        *scalars, decay_size = args
        n = arrays[0].size

        def worker(blocks: Blocks) -> None:
            for i, j in blocks:
                kernel(self, *(None if a is None else a[i:j] for a in arrays), *scalars,
                       max(0, min(decay_size - i, j - i)))

        self._parallel(worker, n, BLOCK, n)


def blocked(reference: Callable[..., None], arrays: int) -> Callable[..., None]:
    """A CPU family's update: `reference`, the reference class's method of the same
    arguments, run by `_by_blocks` over cache blocks of its first `arrays` arguments (the
    flat buffers; None stays None). The signature and docs are the reference's."""

    @functools.wraps(reference)
    def update(self: CpuOptimizerFamily, *args: Any) -> None:
        self._by_blocks(reference, args[:arrays], *args[arrays:])

    return update


class CudaOptimizerFamily(OptimizerFamily):
    """The GPU's: the scalar arguments of the update kernels."""

    @staticmethod
    def _betas(betas: tuple[float, float], dtype: Any = np.float32) -> tuple[Any, ...]:
        """(1 - b1, 1 - b2, log b1, log b2), each computed in double, then rounded."""
        b1, b2 = betas
        return tuple(np.dtype(dtype).type(x) for x in (1.0 - b1, 1.0 - b2, log_beta(b1),
                                                        log_beta(b2)))

    def _scale(self, scale: Any) -> Any:
        """The clip factor, or a device 1 without clipping."""
        return self._one if scale is None else scale
