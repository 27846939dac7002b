"""CPU LayerNorm over the last axis, in cache blocks of rows; the row and column reductions
are BLAS GEMVs against a ones vector, several times faster than NumPy's sum()."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cpu_pool import BLOCK, Blocks
from ..table import add_into
from .reference import LayerNormReference


class CpuLayerNorm(LayerNormReference):
    uses = ("_parallel", "_jit_for", "_ones_vector")

    def layernorm_forward(self, x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
        c = x.shape[-1]
        x2 = x.reshape(-1, c)
        n = x2.shape[0]
        y = np.empty_like(x2)
        mean = np.empty((n, 1), x.dtype)
        rstd = np.empty_like(mean)
        ones = self._ones_vector(c, x.dtype)
        jit = self._jit_for(x2, w, b)

        def worker(blocks: Blocks) -> None:
            for i, j in blocks:
                xb, yb, mb, rb = x2[i:j], y[i:j], mean[i:j], rstd[i:j]
                if jit is not None:
                    jit.layernorm.layernorm_forward(xb, w, b, eps, yb, mb, rb)
                    continue
                np.multiply(xb @ ones, 1.0 / c, out=mb[:, 0])
                np.subtract(xb, mb, out=yb)
                var = np.einsum("ij,ij->i", yb, yb) * (1.0 / c)
                np.divide(1.0, np.sqrt(var + eps), out=rb[:, 0])
                yb *= rb
                yb *= w
                yb += b

        self._parallel(worker, n, BLOCK // c, x2.size)
        lead = (*x.shape[:-1], 1)
        return y.reshape(x.shape), mean.reshape(lead), rstd.reshape(lead)

    def layernorm_backward(
        self, g: Any, x: Any, w: Any, mean: Any, rstd: Any,
        into: tuple[Any, Any] = (None, None), residual: Any = None,
    ) -> tuple[Any, Any, Any]:
        """Each thread sums its blocks' dw, db; the per-thread partials are added at the end."""
        c = x.shape[-1]
        x2, g2 = x.reshape(-1, c), g.reshape(-1, c)
        m2, r2 = mean.reshape(-1, 1), rstd.reshape(-1, 1)
        n = x2.shape[0]
        dx = np.empty(g2.shape, np.result_type(g, x))
        rows = max(1, BLOCK // c)
        ones_c, ones_r = self._ones_vector(c, dx.dtype), self._ones_vector(rows, dx.dtype)
        jit = self._jit_for(g2, x2, w)

        def worker(blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
            dw, db = np.zeros(c, dx.dtype), np.zeros(c, dx.dtype)
            scratch = None if jit is not None else np.empty((rows, c), dx.dtype)
            for i, j in blocks:
                if jit is not None:
                    jit.layernorm.layernorm_backward(g2[i:j], x2[i:j], w, m2[i:j], r2[i:j],
                                                     dx[i:j], dw, db)
                    continue
                gb, d, xhat, ones = g2[i:j], dx[i:j], scratch[: j - i], ones_r[: j - i]
                np.subtract(x2[i:j], m2[i:j], out=xhat)
                xhat *= r2[i:j]
                db += ones @ gb
                dw += ones @ np.multiply(gb, xhat, out=d)
                np.multiply(gb, w, out=d)  # g w
                mean_gw = (d @ ones_c) * (1.0 / c)
                mean_gwx = np.einsum("ij,ij->i", d, xhat) * (1.0 / c)
                d -= mean_gw[:, None]
                xhat *= mean_gwx[:, None]
                d -= xhat
                d *= r2[i:j]  # rstd (g w - mean(g w) - xhat mean(g w xhat))
            return dw, db

        partials = self._parallel(worker, n, rows, x2.size)
        dw, db = (np.sum([p[k] for p in partials], axis=0) for k in (0, 1))
        if residual is not None:
            dx += residual.reshape(dx.shape)
        return dx.reshape(g.shape), add_into(into[0], dw), add_into(into[1], db)
