"""AdamW (decoupled weight decay, PyTorch's order) and Adam (weight decay as an L2 term of
the gradient): one formulation with two ways of decaying (cuda_include/adam.cuh's one
template on the GPU)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import cuda_build
from ..cpu_pool import BLOCK, Blocks
from .common import CudaOptimizerFamily, OptimizerFamily, bias_correction

_SRC = cuda_build.source(__file__, "adam.cu")
_VEC = cuda_build.source(__file__, "adam_vec.cu", cuda_build.dtype_defines(np.float32))
_PARAMS = ("T g, float32 lr, int32 step, float32 scale, float32 c1, float32 c2, "
           "float32 lb1, float32 lb2, float32 eps, float32 wd, int64 decay")
_ARGS = "i, g, lr, step, scale, c1, c2, lb1, lb2, eps, wd, decay, p, m, v"


@functools.cache
def _kernels() -> dict[str, Any]:
    """One ElementwiseKernel per update, each calling adam.cu's device function with its
    way of decaying (L2 = true for Adam)."""
    return {name: cuda_build.elementwise(_SRC, _PARAMS, "T p, T m, T v",
                                         f"rf_adam_update<{l2}>({_ARGS})", f"rf_{name}")
            for name, l2 in (("adamw", "false"), ("adam", "true"))}


class AdamReference(OptimizerFamily):
    def adamw(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        copy_to: Any = None,
    ) -> None:
        if scale is not None:
            g = g * scale.astype(g.dtype)
        t = step.astype(p.dtype)
        if weight_decay:
            p[:decay_size] *= 1.0 - lr * weight_decay
        denom = self._moments(g, m, v, t, betas, eps)
        p -= (lr / bias_correction(self.xp, t, betas[0])).astype(p.dtype) * m / denom
        if copy_to is not None:
            copy_to[...] = p

    def adam(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        copy_to: Any = None,
    ) -> None:
        g = self._l2_grad(p, g, scale, weight_decay, decay_size)
        AdamReference.adamw(self, p, g, m, v, lr, step, None, betas, eps, 0.0, decay_size,
                            copy_to)


class CpuAdam(AdamReference):
    def adamw(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        copy_to: Any = None,
    ) -> None:
        """The shared formulation's arithmetic, op for op (bit-identical), per cache block;
        numba's fused loop instead when loaded (equal to within float32 rounding)."""
        self._adam(p, g, m, v, lr, step, scale, betas, eps, weight_decay, decay_size, False,
                   copy_to)

    def adam(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        copy_to: Any = None,
    ) -> None:
        """adamw's passes with the weight decay as an L2 term of the gradient."""
        self._adam(p, g, m, v, lr, step, scale, betas, eps, weight_decay, decay_size, True,
                   copy_to)

    def _adam(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        l2: bool, copy_to: Any,
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
                        jit.adam_l2(pb, gb, mb, vb, until, weight_decay, *scalars)
                    else:
                        jit.adamw(pb, gb, mb, vb, until, float(decay), *scalars)
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


class CudaAdam(AdamReference, CudaOptimizerFamily):
    def adamw(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        copy_to: Any = None,
    ) -> None:
        self._update("adamw", p, g, m, v, lr, step, scale, betas, eps, weight_decay, decay_size,
                     copy_to)

    def adam(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        copy_to: Any = None,
    ) -> None:
        self._update("adam", p, g, m, v, lr, step, scale, betas, eps, weight_decay, decay_size,
                     copy_to)

    def _update(self, name: str, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any,
                scale: Any, betas: tuple[float, float], eps: float, weight_decay: float,
                decay_size: int, copy_to: Any) -> None:
        """One launch of AdamW's or Adam's kernel (they take the same arguments): over
        16-byte vectors where the buffers allow (float32, aligned, a multiple of 4 long,
        adam_vec.cu), writing the compute copy in the same pass; otherwise adam.cu's
        one-element-a-thread ElementwiseKernel, then the copy. At GPT-2's 124M parameters
        the vector kernel reads and writes memory markedly faster
        (benchmarks/results/gpt2-fusions-h100.md)."""
        f32 = np.float32
        scale = self._scale(scale)
        scalars = (*self._betas(betas), f32(eps), f32(weight_decay), np.int64(decay_size))
        vecs = cuda_build.vectors(p, g, m, v)
        fits = copy_to is None or (copy_to.shape == p.shape and copy_to.flags.c_contiguous
                                   and copy_to.itemsize == 2)
        if vecs and fits and p.dtype == f32 and (lr.dtype, step.dtype, scale.dtype) == (
                f32, np.int32, f32):
            _VEC.typed(f"rf_{name}_vec", f32 if copy_to is None else copy_to.dtype)(
                *cuda_build.vector_grid(vecs),
                (g, lr, step, scale, *scalars, p, m, v,
                 np.uint64(0) if copy_to is None else copy_to, np.int64(vecs)))
            return
        _kernels()[name](g, lr, step, scale, *scalars, p, m, v)
        if copy_to is not None:
            copy_to[...] = p
