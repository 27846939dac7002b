"""LayerNorm on the GPU: one warp per row (layernorm.cu), or for rows of up to 32 * MAX_CPL
columns the row held in registers and read once (layernorm_rows.cu)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...precision import accumulate_dtype
from .. import cuda_build
from ..cuda_build import acc_scalar, warp_grid
from .reference import LayerNormReference

_WIDE = cuda_build.source(__file__, "layernorm.cu", cuda_build.dtype_defines(np.float32))
_ROWS = cuda_build.source(__file__, "layernorm_rows.cu",
                          cuda_build.dtype_defines(np.float32) + ("-DCPL=4",))
# LayerNorm rows of up to 32 * MAX_CPL columns are held in registers (the *_rows kernels);
# wider ones take the kernels that read the row from memory again for each pass.
MAX_CPL = 32
LN_BWD_WARPS = 1024  # ln_bwd_rows' warps (and rows of partial sums), about


def _rows_kernel(name: str, dtype: Any, *same: Any, cpl: int) -> Any:
    """A *_rows kernel for `cpl` columns per lane."""
    return _ROWS.typed(name, dtype, *same, defines=(f"-DCPL={cpl}",))


class CudaLayerNorm(LayerNormReference):
    def layernorm_forward(self, x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
        xp = self.xp
        x = xp.ascontiguousarray(x)
        c = x.shape[-1]
        n = x.size // c
        y = xp.empty_like(x)
        mean = xp.empty(x.shape[:-1] + (1,), dtype=accumulate_dtype(x.dtype))
        rstd = xp.empty_like(mean)
        cpl = -(-c // 32)
        kernel = (_rows_kernel("ln_fwd_rows", x.dtype, w, b, cpl=cpl) if cpl <= MAX_CPL
                  else _WIDE.typed("ln_fwd", x.dtype, w, b))
        kernel(*warp_grid(n), (x, w, b, y, mean, rstd, np.int32(n), np.int32(c),
                               acc_scalar(eps, x.dtype)))
        return y, mean, rstd

    def layernorm_backward(
        self, g: Any, x: Any, w: Any, mean: Any, rstd: Any,
        into: tuple[Any, Any] = (None, None),
    ) -> tuple[Any, Any, Any]:
        """dx, and the partial sums of dw and db (rows of acc) that sum_rows then sums,
        straight into the gradient buffers when given."""
        xp = self.xp
        g, x = xp.ascontiguousarray(g), xp.ascontiguousarray(x)
        c = x.shape[-1]
        n = x.size // c
        dx = xp.empty_like(x)
        acc = accumulate_dtype(x.dtype)
        cpl = -(-c // 32)
        if cpl <= MAX_CPL:  # one pass; about LN_BWD_WARPS warps, each a row of partial sums
            rows = -(-n // LN_BWD_WARPS)
            warps = -(-n // rows)
            pdw = xp.empty((warps, c), dtype=acc)
            pdb = xp.empty_like(pdw)
            _rows_kernel("ln_bwd_rows", x.dtype, g, w, cpl=cpl)(
                *warp_grid(warps), (g, x, w, mean, rstd, dx, pdw, pdb, np.int32(n),
                                    np.int32(c), np.int32(rows)))
            return dx, self._param_grad(pdw, w, into[0]), self._param_grad(pdb, w, into[1])
        _WIDE.typed("ln_bwd_dx", x.dtype, g, w)(*warp_grid(n), (g, x, w, mean, rstd, dx,
                                                                np.int32(n), np.int32(c)))
        rows_per_chunk = 64
        chunks = (n + rows_per_chunk - 1) // rows_per_chunk
        pdw = xp.empty((chunks, c), dtype=acc)  # partial sums stay in acc until summed
        pdb = xp.empty_like(pdw)
        _WIDE.typed("ln_bwd_dwdb", x.dtype)(
            ((c + 127) // 128, chunks), (128,),
            (g, x, mean, rstd, pdw, pdb, np.int32(n), np.int32(c), np.int32(rows_per_chunk)))
        return dx, self._param_grad(pdw, w, into[0]), self._param_grad(pdb, w, into[1])

    def _param_grad(self, partial: Any, w: Any, into: Any) -> Any:
        """The column sums of `partial` (rows of acc): added into `into` (None returned), or
        as a gradient of w's dtype."""
        if into is not None:
            return self.sum_rows(partial, into)
        return self.sum_rows(partial).astype(w.dtype, copy=False)
