"""LayerNorm's reference kernels over the last axis."""

from __future__ import annotations

from typing import Any

from ...precision import is_16bit
from ..table import Family, add_into
from ..widen import wide


class LayerNormReference(Family):
    calls = ("add",)  # the residual gradient joined after backward

    def layernorm_forward(self, x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
        if is_16bit(x.dtype):
            y, mean, rstd = LayerNormReference.layernorm_forward(self, *wide(x, w, b), eps)
            return y.astype(x.dtype), mean, rstd
        xp = self.xp
        mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
        xc = x - mean
        var = (xc * xc).mean(axis=-1, keepdims=True)
        rstd = 1.0 / xp.sqrt(var + eps)  # (..., 1)
        xc *= rstd  # x-hat
        y = xc * w
        y += b
        return y, mean, rstd

    def layernorm_forward_for_linear(self, x: Any, w: Any, b: Any, eps: float
                                     ) -> tuple[Any, Any, Any]:
        return self.layernorm_forward(x, w, b, eps)

    def layernorm_backward(
        self, g: Any, x: Any, w: Any, mean: Any, rstd: Any,
        into: tuple[Any, Any] = (None, None), residual: Any = None,
    ) -> tuple[Any, Any, Any]:
        if residual is not None:
            dx, dw, db = self.layernorm_backward(g, x, w, mean, rstd, into)
            return self.add(dx, residual), dw, db
        if is_16bit(x.dtype):
            dx, dw, db = LayerNormReference.layernorm_backward(self, *wide(g, x, w), mean, rstd)
            dw, db = (add_into(dst, v) for dst, v in zip(into, (dw, db), strict=True))
            return (dx.astype(x.dtype), None if dw is None else dw.astype(w.dtype),
                    None if db is None else db.astype(w.dtype))
        lead = tuple(range(x.ndim - 1))
        xhat = (x - mean) * rstd
        db = g.sum(axis=lead)
        dw = (g * xhat).sum(axis=lead)
        gw = g * w
        dx = gw - gw.mean(axis=-1, keepdims=True)
        dx -= xhat * (gw * xhat).mean(axis=-1, keepdims=True)
        dx *= rstd
        return dx, add_into(into[0], dw), add_into(into[1], db)

    def layernorm_backward_for_linear(
        self, g: Any, x: Any, w: Any, mean: Any, rstd: Any,
        into: tuple[Any, Any] = (None, None), residual: Any = None,
    ) -> tuple[Any, Any, Any]:
        return self.layernorm_backward(g, x, w, mean, rstd, into, residual)
