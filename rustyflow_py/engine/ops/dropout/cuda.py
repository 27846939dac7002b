"""Dropout on the GPU: CuPy ElementwiseKernels calling dropout.cu's device functions, the
bits of the shared Philox formulation drawn inline."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import cuda_build
from . import philox
from .reference import DropoutReference

_DROPOUT = cuda_build.source(__file__, "dropout.cu")


@functools.cache
def _kernels() -> dict[str, Any]:
    return {
        "dropout_mask": cuda_build.elementwise(
            _DROPOUT, "int32 step, uint32 seed, uint32 site, uint32 thresh, float64 scale",
            "T mask", "mask = rf_dropout_multiplier<T>(i, step, seed, site, thresh, scale)",
            "rf_dropout_mask"),
        "dropout_apply": cuda_build.elementwise(
            _DROPOUT, "T x, int32 step, uint32 seed, uint32 site, uint32 thresh, float64 scale",
            "T y", "y = rf_dropout_applied(x, i, step, seed, site, thresh, scale)",
            "rf_dropout_apply"),
    }


class CudaDropout(DropoutReference):
    def dropout_mask(self, shape: tuple[int, ...], dtype: Any, p: float, seed: int, site: int,
                     step: Any) -> Any:
        """One fused launch, the bits of the shared Philox formulation."""
        mask = self.xp.empty(shape, dtype)
        _kernels()["dropout_mask"](step, np.uint32(seed & 0xFFFFFFFF), np.uint32(site),
                                       np.uint32(philox.keep_threshold(p)),
                                       np.float64(1.0 / (1.0 - p)), mask)
        return mask

    def dropout_apply(self, x: Any, p: float, seed: int, site: int, step: Any) -> Any:
        """x times the mask above in one launch, the bits drawn inline."""
        return _kernels()["dropout_apply"](
            x, step, np.uint32(seed & 0xFFFFFFFF), np.uint32(site),
            np.uint32(philox.keep_threshold(p)), np.float64(1.0 / (1.0 - p)))
