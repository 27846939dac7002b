"""SGD (torch.optim.SGD: momentum without dampening, optionally Nesterov; weight decay as
an L2 term of the gradient)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import cuda_build
from .common import CpuOptimizerFamily, CudaOptimizerFamily, OptimizerFamily, blocked

_SRC = cuda_build.source(__file__, "sgd.cu")


@functools.cache
def _kernel() -> Any:
    """sgd.cu's update as an ElementwiseKernel."""
    return cuda_build.elementwise(
        _SRC, "T g, float32 lr, float32 scale, float32 mu, bool nesterov, float32 wd, int64 decay",
        "T p, T vel", "rf_sgd_update(i, g, lr, scale, mu, nesterov, wd, decay, p, vel)",
        "rf_sgd")


class SgdReference(OptimizerFamily):
    def sgd(
        self, p: Any, g: Any, velocity: Any, lr: Any, scale: Any, momentum: float,
        nesterov: bool, weight_decay: float, decay_size: int,
    ) -> None:
        d = g = self._l2_grad(p, g, scale, weight_decay, decay_size)
        if momentum:
            velocity *= momentum
            velocity += g
            d = g + momentum * velocity if nesterov else velocity
        p -= lr.astype(p.dtype) * d


class CpuSgd(SgdReference, CpuOptimizerFamily):
    sgd = blocked(SgdReference.sgd, 3)


class CudaSgd(SgdReference, CudaOptimizerFamily):
    def sgd(
        self, p: Any, g: Any, velocity: Any, lr: Any, scale: Any, momentum: float,
        nesterov: bool, weight_decay: float, decay_size: int,
    ) -> None:
        f32 = np.float32
        _kernel()(g, lr, self._scale(scale), f32(momentum), bool(nesterov),
                              f32(weight_decay), np.int64(decay_size), p, velocity)
