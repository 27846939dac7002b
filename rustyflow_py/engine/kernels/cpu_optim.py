"""CPU passes over the parameters and their gradients: the embedding's scatter-add into its
gradient, the global grad-norm and the AdamW update, each in cache blocks on the pool."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .cpu_pool import BLOCK, Blocks, CpuPool


class CpuOptimizer(CpuPool):
    def scatter_add_rows(self, dst: Any, idx: Any, rows: Any) -> None:
        jit = self._jit_for(dst, rows)
        if jit is None:
            super().scatter_add_rows(dst, idx, rows)
        else:
            jit.scatter_add_rows(dst, idx.ravel(), rows.reshape(-1, dst.shape[-1]))

    def l2_norm(self, g: Any) -> Any:
        """BLAS dots per cache block, summed in float64: as fast as one dot over the whole
        buffer, whose float32 accumulator drifts ~1e-5 over millions of squares."""

        def worker(blocks: Blocks) -> float:
            return sum(float(np.dot(g[i:j], g[i:j])) for i, j in blocks)

        return np.asarray(math.sqrt(sum(self._parallel(worker, g.size, BLOCK, g.size))),
                          g.dtype)

    def adamw(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        """The shared formulation's arithmetic, op for op (bit-identical), per cache block;
        numba's fused loop instead when loaded (equal to within float32 rounding)."""
        b1, b2 = betas
        t = step.astype(p.dtype)
        g_scale = None if scale is None else scale.astype(g.dtype)
        decay = 1.0 - lr * weight_decay
        bias2 = np.sqrt(1.0 - b2**t)
        step_size = (lr / (1.0 - b1**t)).astype(p.dtype)

        jit = self._jit_for(p, g, m, v)
        scalars = (float(decay), b1, b2, float(step_size), float(bias2), eps,
                   1.0 if g_scale is None else float(g_scale))  # the kernel's, read once

        def worker(blocks: Blocks) -> None:
            scratch = None if jit is not None else np.empty((2, BLOCK), p.dtype)
            for i, j in blocks:
                gb, mb, vb, pb = g[i:j], m[i:j], v[i:j], p[i:j]
                if jit is not None:
                    jit.adamw(pb, gb, mb, vb, decay_size - i if weight_decay else 0, *scalars)
                    continue
                t1, t2 = scratch[:, : j - i]
                if g_scale is not None:
                    gb = np.multiply(gb, g_scale, out=t1)
                if weight_decay and i < decay_size:
                    pb[: decay_size - i] *= decay
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
