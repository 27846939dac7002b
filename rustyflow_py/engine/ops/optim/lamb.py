"""LAMB (You et al. 2019, Algorithm 2): Adam's direction plus decoupled weight decay, each
tensor's step scaled by its trust ratio ||p|| / ||u||. On the GPU three launches over chunks of
the flat buffer (lamb.cu), the per-tensor sums in order (deterministic), no host loop."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ...precision import accumulate_dtype
from .. import cuda_build
from ..cpu_pool import BLOCK, Blocks
from .common import CudaOptimizerFamily, OptimizerFamily, bias_correction

_LAMB = cuda_build.source(__file__, "lamb.cu", cuda_build.dtype_defines(np.float32))


@dataclasses.dataclass(frozen=True)
class _Segments:
    """The tensors of a flat buffer cut into chunks of at most _CHUNK elements, each inside
    one tensor: the launch grid of the LAMB kernels (one block per chunk)."""

    count: int  # segments (tensors)
    chunks: int
    lo: Any  # (chunks,) int64: each chunk's first element
    hi: Any  # (chunks,) int64: one past its last
    seg: Any  # (chunks,) int32: its segment
    first: Any  # (count + 1,) int32: segment s's chunks are first[s] .. first[s + 1] - 1


_CHUNK = 8192


class LambReference(OptimizerFamily):
    def segments(self, bounds: tuple[int, ...]) -> Any:
        return tuple(zip(bounds[:-1], bounds[1:], strict=True))

    def lamb(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        segments: Any,
    ) -> None:
        u = self._lamb_direction(p, g, m, v, step, scale, betas, eps, weight_decay,
                                 decay_size)
        lr = lr.astype(p.dtype)
        for start, stop in segments:
            ratio = self._trust_ratio(p[start:stop], u[start:stop])
            p[start:stop] -= (lr * ratio).astype(p.dtype) * u[start:stop]

    def _lamb_direction(
        self, p: Any, g: Any, m: Any, v: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
    ) -> Any:
        """Update m and v in place; the fresh direction r + weight_decay * p (LAMB's u)."""
        if scale is not None:
            g = g * scale.astype(g.dtype)
        t = step.astype(p.dtype)
        denom = self._moments(g, m, v, t, betas, eps)
        u = m / bias_correction(self.xp, t, betas[0])
        u /= denom
        if weight_decay:
            u[:decay_size] += weight_decay * p[:decay_size]
        return u

    def _trust_ratio(self, w: Any, u: Any) -> Any:
        """||w|| / ||u|| as a 0-d array, 1 where either is 0 (nothing read back)."""
        xp = self.xp
        wn, un = xp.sqrt(xp.dot(w, w)), xp.sqrt(xp.dot(u, u))
        ok = (wn > 0) & (un > 0)
        return xp.where(ok, wn / xp.where(ok, un, 1.0), 1.0)


class CpuLamb(LambReference):
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


class CudaLamb(LambReference, CudaOptimizerFamily):
    def segments(self, bounds: tuple[int, ...]) -> Any:
        lo, hi, seg, first = [], [], [], [0]
        for s, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            for i in range(start, stop, _CHUNK):
                lo.append(i)
                hi.append(min(i + _CHUNK, stop))
                seg.append(s)
            first.append(len(lo))
        dev = self.backend.from_host
        return _Segments(len(bounds) - 1, len(lo), dev(np.asarray(lo, np.int64)),
                         dev(np.asarray(hi, np.int64)), dev(np.asarray(seg, np.int32)),
                         dev(np.asarray(first, np.int32)))

    def lamb(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        segments: Any,
    ) -> None:
        xp, t = self.xp, segments
        acc = accumulate_dtype(p.dtype)
        u = xp.empty_like(p)
        pw, pu = xp.empty(t.chunks, acc), xp.empty(t.chunks, acc)
        trust = xp.empty(t.count, acc)
        _LAMB.typed("lamb_moments", p.dtype, g, m, v)(
            (t.chunks,), (256,),
            (g, p, m, v, u, pw, pu, t.lo, t.hi, step, self._scale(scale),
             *self._betas(betas, acc), acc.type(eps), acc.type(weight_decay),
             np.int64(decay_size)))
        _LAMB.typed("lamb_trust", p.dtype)(((t.count + 127) // 128,), (128,),
                                       (pw, pu, t.first, trust, np.int32(t.count)))
        _LAMB.typed("lamb_apply", p.dtype, u)((t.chunks,), (256,),
                                          (p, u, trust, t.seg, t.lo, t.hi, lr,
                                           self._scale(scale)))
