"""The optimizers on the CPU: each update over cache blocks of the flat buffers on the pool
(most of them the reference's arithmetic per block), the norms as BLAS dots summed in
float64, and AdamW/Adam as numba's fused loop where CPU_JIT loaded it."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..cpu_pool import BLOCK, Blocks
from .reference import (
    AdadeltaReference,
    AdagradReference,
    AdamReference,
    LambReference,
    NormReference,
    OptimizerFamily,
    RmspropReference,
    SgdReference,
    bias_correction,
    kernel_of,
)


class CpuOptimizerFamily(OptimizerFamily):
    """The CPU's: a reference update run over cache blocks on the pool."""

    uses = ("_parallel",)

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


class CpuNorm(NormReference, CpuOptimizerFamily):
    def l2_norm(self, g: Any) -> Any:
        """BLAS dots per cache block, summed in float64: as fast as one dot over the whole
        buffer, whose float32 accumulator drifts ~1e-5 over millions of squares."""

        def worker(blocks: Blocks) -> float:
            return sum(float(np.dot(g[i:j], g[i:j])) for i, j in blocks)

        return np.asarray(math.sqrt(sum(self._parallel(worker, g.size, BLOCK, g.size))),
                          g.dtype)


class CpuSgd(SgdReference, CpuOptimizerFamily):
    sgd = blocked(SgdReference.sgd, 3)


class CpuRmsprop(RmspropReference, CpuOptimizerFamily):
    rmsprop = blocked(RmspropReference.rmsprop, 5)


class CpuAdagrad(AdagradReference, CpuOptimizerFamily):
    adagrad = blocked(AdagradReference.adagrad, 3)


class CpuAdadelta(AdadeltaReference, CpuOptimizerFamily):
    adadelta = blocked(AdadeltaReference.adadelta, 4)


class CpuAdam(AdamReference, CpuOptimizerFamily):
    """The shared formulation's arithmetic, op for op (bit-identical), per cache block;
    numba's fused loop instead when loaded (equal to within float32 rounding). Adam's passes
    are AdamW's with the weight decay as an L2 term of the gradient."""

    uses = ("_jit_for",)

    def _adam(
        self, l2: bool, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        copy_to: Any = None,
    ) -> None:
        b1, b2 = betas
        t = step.astype(p.dtype)
        g_scale = None if scale is None else scale.astype(g.dtype)
        decay = 1.0 if l2 else 1.0 - lr * weight_decay  # decoupled: p *= decay first
        bias2 = np.sqrt(bias_correction(np, t, b2))
        step_size = (lr / bias_correction(np, t, b1)).astype(p.dtype)

        jit = self._jit_for(p, g, m, v)
        scalars = (1.0 - b1, 1.0 - b2, float(step_size), float(bias2), eps,
                   1.0 if g_scale is None else float(g_scale))  # the kernel's, read once

        def worker(blocks: Blocks) -> None:
            scratch = None if jit is not None else np.empty((2, BLOCK), p.dtype)
            for i, j in blocks:
                gb, mb, vb, pb = g[i:j], m[i:j], v[i:j], p[i:j]
                until = decay_size - i if weight_decay else 0
                if jit is not None:
                    if l2:
                        jit.optim.adam_l2(pb, gb, mb, vb, until, weight_decay, *scalars)
                    else:
                        jit.optim.adamw(pb, gb, mb, vb, until, float(decay), *scalars)
                    continue
                t1, t2 = scratch[:, : j - i]
                if g_scale is not None:
                    gb = np.multiply(gb, g_scale, out=t1)
                if until > 0:
                    if l2:  # gb + weight_decay * p, as the reference adds it
                        if gb is not t1:
                            t1[...] = gb
                            gb = t1
                        k = min(until, j - i)
                        np.multiply(pb[:k], weight_decay, out=t2[:k])
                        gb[:k] += t2[:k]
                    else:
                        pb[:until] *= decay
                mb *= b1
                np.multiply(gb, 1.0 - b1, out=t2)
                mb += t2
                vb *= b2
                np.multiply(gb, gb, out=t2)
                t2 *= 1.0 - b2
                vb += t2
                np.sqrt(vb, out=t2)
                t2 /= bias2
                t2 += eps  # the denominator
                np.multiply(mb, step_size, out=t1)
                t1 /= t2
                pb -= t1

        self._parallel(worker, p.size, BLOCK, p.size)
        if copy_to is not None:
            copy_to[...] = p

    adamw = kernel_of(AdamReference.adamw, _adam, False)
    adam = kernel_of(AdamReference.adam, _adam, True)


class CpuLamb(LambReference, CpuOptimizerFamily):
    calls = ("l2_norm",)  # the per-tensor norms

    def lamb(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        segments: Any,
    ) -> None:
        """The direction per cache block, the per-tensor norms as BLAS dots summed in
        float64 (as l2_norm), then each tensor's scaled update per block."""
        u = np.empty_like(p)

        def direction(blocks: Blocks) -> None:
            for i, j in blocks:
                u[i:j] = LambReference._lamb_direction(
                    self, p[i:j], g[i:j], m[i:j], v[i:j], step, scale, betas, eps,
                    weight_decay, max(0, min(decay_size - i, j - i)))

        self._parallel(direction, p.size, BLOCK, p.size)
        lr_ = float(lr)
        pieces = []  # (start, stop, -lr * ratio): every tensor cut into cache blocks
        for start, stop in segments:
            wn, un = float(self.l2_norm(p[start:stop])), float(self.l2_norm(u[start:stop]))
            ratio = wn / un if wn > 0 and un > 0 else 1.0
            step_size = p.dtype.type(lr_ * ratio)
            pieces += [(i, min(i + BLOCK, stop), step_size) for i in range(start, stop, BLOCK)]

        def apply(blocks: Blocks) -> None:
            for k, _ in blocks:
                i, j, step_size = pieces[k]
                ub = u[i:j]
                ub *= step_size
                p[i:j] -= ub

        self._parallel(apply, len(pieces), 1, p.size)
