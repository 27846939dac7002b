"""The weights' exponential moving average (model/ema.py), one pass over the flat buffer
after each optimizer step (ema.cu on the GPU)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import cuda_build
from ..table import Family

_SRC = cuda_build.source(__file__, "ema.cu")


@functools.cache
def _kernel() -> Any:
    return cuda_build.elementwise(_SRC, "T p, T c, int32 step, int64 start", "T ema",
                                  "rf_ema_update(p, c, step, start, ema)", "rf_ema")


class EmaReference(Family):
    def ema_update(self, ema: Any, p: Any, decay: float, step: Any, start: int) -> None:
        """(1 - decay) is rounded once, from double precision, to the buffers' dtype."""
        moved = p - ema
        moved *= ema.dtype.type(1.0 - decay)
        moved += ema
        self.xp.copyto(ema, self.xp.where(step > start, moved, p))


class CudaEma(EmaReference):
    def ema_update(self, ema: Any, p: Any, decay: float, step: Any, start: int) -> None:
        _kernel()(p, ema.dtype.type(1.0 - decay), step,
                                           np.int64(start), ema)
