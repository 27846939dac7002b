"""RMSprop (torch.optim.RMSprop: optionally centered, optionally with momentum; weight
decay as an L2 term of the gradient)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import cuda_build
from .common import CpuOptimizerFamily, CudaOptimizerFamily, OptimizerFamily, blocked

_SRC = cuda_build.source(__file__, "rmsprop.cu")


@functools.cache
def _rmsprop(centered: bool, with_momentum: bool) -> Any:
    """RMSprop's kernel for one variant: the centered average and the momentum buffer are
    outputs only when in use (the square average stands in for the others: a variant never
    touches what it does not use)."""
    outs = "T p, T sq" + (", T ga" if centered else "") + (", T buf" if with_momentum else "")
    ga, buf = ("ga" if centered else "sq"), ("buf" if with_momentum else "sq")
    flags = f"{str(centered).lower()}, {str(with_momentum).lower()}"
    return cuda_build.elementwise(
        _SRC, "T g, float32 lr, float32 scale, float32 alpha, float32 calpha, "
        "float32 eps, float32 mu, float32 wd, int64 decay", outs,
        f"rf_rmsprop_update<{flags}>(i, g, lr, scale, alpha, calpha, eps, mu, wd, decay, p, "
        f"sq, {ga}, {buf})",
        f"rf_rmsprop_{int(centered)}{int(with_momentum)}")


class RmspropReference(OptimizerFamily):
    def rmsprop(
        self, p: Any, g: Any, square_avg: Any, grad_avg: Any, momentum_buffer: Any, lr: Any,
        scale: Any, alpha: float, eps: float, momentum: float, weight_decay: float,
        decay_size: int,
    ) -> None:
        xp = self.xp
        g = self._l2_grad(p, g, scale, weight_decay, decay_size)
        square_avg *= alpha
        square_avg += (1.0 - alpha) * (g * g)
        if grad_avg is not None:  # centered: the variance estimate
            grad_avg += (1.0 - alpha) * (g - grad_avg)
            avg = xp.sqrt(square_avg - grad_avg * grad_avg)
        else:
            avg = xp.sqrt(square_avg)
        avg += eps
        step = g / avg
        if momentum_buffer is not None:
            momentum_buffer *= momentum
            momentum_buffer += step
            step = momentum_buffer
        p -= lr.astype(p.dtype) * step


class CpuRmsprop(RmspropReference, CpuOptimizerFamily):
    rmsprop = blocked(RmspropReference.rmsprop, 5)


class CudaRmsprop(RmspropReference, CudaOptimizerFamily):
    def rmsprop(
        self, p: Any, g: Any, square_avg: Any, grad_avg: Any, momentum_buffer: Any, lr: Any,
        scale: Any, alpha: float, eps: float, momentum: float, weight_decay: float,
        decay_size: int,
    ) -> None:
        f32 = np.float32
        state = [a for a in (grad_avg, momentum_buffer) if a is not None]
        _rmsprop(grad_avg is not None, momentum_buffer is not None)(
            g, lr, self._scale(scale), f32(alpha), f32(1.0 - alpha), f32(eps), f32(momentum),
            f32(weight_decay), np.int64(decay_size), p, square_avg, *state)
