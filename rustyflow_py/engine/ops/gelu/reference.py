"""GELU's reference kernels (tanh approximation), the preceding bias add fused in."""

from __future__ import annotations

import math
from typing import Any

from ...precision import is_16bit
from ..table import Family
from ..widen import wide

GELU_C = math.sqrt(2.0 / math.pi)
GELU_K = 0.044715


class GeluReference(Family):
    calls = ("sum_rows",)  # the bias gradient gelu_backward adds into `sums_into`

    def gelu_forward(self, x: Any, bias: Any | None) -> Any:
        if is_16bit(x.dtype):
            return GeluReference.gelu_forward(self, *wide(x, bias)).astype(x.dtype)
        xp = self.xp
        if bias is not None:
            x = x + bias
        inner = x * x
        inner *= GELU_K
        inner += 1.0
        inner *= x
        inner *= GELU_C
        t = xp.tanh(inner, out=inner)
        t += 1.0
        t *= x
        t *= 0.5
        return t

    def gelu_backward(self, g: Any, x: Any, bias: Any | None, sums_into: Any = None) -> Any:
        dx = self._gelu_backward(g, x, bias)
        if sums_into is not None:
            self.sum_rows(dx.reshape(-1, dx.shape[-1]), sums_into)
        return dx

    def _gelu_backward(self, g: Any, x: Any, bias: Any | None) -> Any:
        if is_16bit(x.dtype):
            return GeluReference._gelu_backward(self, *wide(g, x, bias)).astype(x.dtype)
        xp = self.xp
        if bias is not None:
            x = x + bias
        x2 = x * x
        t = xp.tanh(GELU_C * x * (1.0 + GELU_K * x2))
        # d/dx 0.5 x (1 + t) = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2)
        dt = (1.0 - t * t) * (GELU_C * (1.0 + 3.0 * GELU_K * x2))
        dt *= x
        dt += 1.0 + t
        dt *= 0.5
        dt *= g
        return dt
