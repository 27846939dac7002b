"""AdaDelta (torch.optim.Adadelta; weight decay as an L2 term)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import cuda_build
from .common import CpuOptimizerFamily, CudaOptimizerFamily, OptimizerFamily, blocked

_SRC = cuda_build.source(__file__, "adadelta.cu")


@functools.cache
def _kernel() -> Any:
    """adadelta.cu's update as an ElementwiseKernel."""
    return cuda_build.elementwise(
        _SRC, "T g, float32 lr, float32 scale, float32 rho, float32 crho, float32 eps, "
        "float32 wd, int64 decay", "T p, T sq, T dacc",
        "rf_adadelta_update(i, g, lr, scale, rho, crho, eps, wd, decay, p, sq, dacc)",
        "rf_adadelta")


class AdadeltaReference(OptimizerFamily):
    def adadelta(
        self, p: Any, g: Any, square_avg: Any, acc_delta: Any, lr: Any, scale: Any,
        rho: float, eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        xp = self.xp
        g = self._l2_grad(p, g, scale, weight_decay, decay_size)
        square_avg *= rho
        square_avg += (1.0 - rho) * (g * g)
        delta = xp.sqrt(acc_delta + eps) / xp.sqrt(square_avg + eps) * g
        acc_delta *= rho
        acc_delta += (1.0 - rho) * (delta * delta)
        p -= lr.astype(p.dtype) * delta


class CpuAdadelta(AdadeltaReference, CpuOptimizerFamily):
    adadelta = blocked(AdadeltaReference.adadelta, 4)


class CudaAdadelta(AdadeltaReference, CudaOptimizerFamily):
    def adadelta(
        self, p: Any, g: Any, square_avg: Any, acc_delta: Any, lr: Any, scale: Any,
        rho: float, eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        f32 = np.float32
        _kernel()(g, lr, self._scale(scale), f32(rho), f32(1.0 - rho),
                                   f32(eps), f32(weight_decay), np.int64(decay_size), p,
                                   square_avg, acc_delta)
