"""The global gradient norm, sqrt(sum(g * g)) of the flat buffer (clipping reads it)."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..cpu_pool import BLOCK, Blocks
from .common import OptimizerFamily


@functools.cache
def sumsq() -> Any:
    """sqrt(sum(x * x)) as one CuPy ReductionKernel: the global grad norm, and the Frobenius
    norms in Muon's Newton-Schulz (a map, a sum and a post-map expression: no .cu file)."""
    import cupy

    return cupy.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "rf_l2norm")


class NormReference(OptimizerFamily):
    def l2_norm(self, g: Any) -> Any:
        return self.xp.sqrt(self.xp.dot(g, g))


class CpuNorm(NormReference):
    def l2_norm(self, g: Any) -> Any:
        """BLAS dots per cache block, summed in float64: as fast as one dot over the whole
        buffer, whose float32 accumulator drifts ~1e-5 over millions of squares."""

        def worker(blocks: Blocks) -> float:
            return sum(float(np.dot(g[i:j], g[i:j])) for i, j in blocks)

        return np.asarray(math.sqrt(sum(self._parallel(worker, g.size, BLOCK, g.size))),
                          g.dtype)


class CudaNorm(NormReference):
    def l2_norm(self, g: Any) -> Any:
        return sumsq()(g)
