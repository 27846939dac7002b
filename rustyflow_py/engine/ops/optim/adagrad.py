"""AdaGrad (torch.optim.Adagrad, no lr decay; weight decay as an L2 term)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import cuda_build
from .common import CpuOptimizerFamily, CudaOptimizerFamily, OptimizerFamily, blocked

_SRC = cuda_build.source(__file__, "adagrad.cu")


@functools.cache
def _kernel() -> Any:
    """adagrad.cu's update as an ElementwiseKernel."""
    return cuda_build.elementwise(
        _SRC, "T g, float32 lr, float32 scale, float32 eps, float32 wd, int64 decay",
        "T p, T ssum", "rf_adagrad_update(i, g, lr, scale, eps, wd, decay, p, ssum)",
        "rf_adagrad")


class AdagradReference(OptimizerFamily):
    def adagrad(
        self, p: Any, g: Any, state_sum: Any, lr: Any, scale: Any, eps: float,
        weight_decay: float, decay_size: int,
    ) -> None:
        g = self._l2_grad(p, g, scale, weight_decay, decay_size)
        state_sum += g * g
        p -= lr.astype(p.dtype) * (g / (self.xp.sqrt(state_sum) + eps))


class CpuAdagrad(AdagradReference, CpuOptimizerFamily):
    adagrad = blocked(AdagradReference.adagrad, 3)


class CudaAdagrad(AdagradReference, CudaOptimizerFamily):
    def adagrad(
        self, p: Any, g: Any, state_sum: Any, lr: Any, scale: Any, eps: float,
        weight_decay: float, decay_size: int,
    ) -> None:
        f32 = np.float32
        _kernel()(g, lr, self._scale(scale), f32(eps), f32(weight_decay),
                                  np.int64(decay_size), p, state_sum)
