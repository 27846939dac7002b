"""LayerNorm on the GPU: for rows of up to 32 * MAX_CPL columns the row held in registers
and read once (layernorm_rows.cu), as 16-byte vectors where the rows are whole vectors and
aligned, else a value at a time; wider rows one warp per row, read again for each pass
(layernorm.cu).

Why 16-byte vectors: at GPT-2's shape in bf16, moving 2-byte values per lane ran well below
the memory's bandwidth (benchmarks/results/gpt2-fusions-h100.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...precision import accumulate_dtype
from .. import cuda_build
from ..cuda_build import acc_scalar, warp_grid
from .reference import LayerNormReference

_WIDE = cuda_build.source(__file__, "layernorm.cu", cuda_build.dtype_defines(np.float32))
_ROWS = cuda_build.source(__file__, "layernorm_rows.cu",
                          cuda_build.dtype_defines(np.float32)
                          + ("-DVPL=1", "-DLN_VEC=1", "-DLN_AHEAD=0"))
# LayerNorm rows of up to 32 * MAX_CPL columns are held in registers (layernorm_rows.cu);
# wider ones take the kernels that read the row from memory again for each pass.
MAX_CPL = 32
LN_BWD_WARPS = 1024  # ln_bwd_rows' warps (and rows of partial sums): about 8 per SM of an H100
# The value sizes (bytes) whose ln_bwd_rows issues the next row's loads before this row's sums
# (LN_AHEAD): faster for float32 rows; no faster for bf16 ones, and slower for float64 ones,
# whose registers it pushes to the limit (benchmarks/results/layernorm-bwd-h100.md)
LN_AHEAD_ITEMSIZES = frozenset({4})
LN_BWD_BLOCK_WARPS = 4  # ln_bwd_rows' warps a block (benchmarks/results/layernorm-bwd-h200.md)


def lane_vectors(vecs: int) -> int:
    """A lane's vectors of a row of `vecs` vectors, a warp to a row: the register-row
    kernels' VPL (and layernorm_fp8.cu's)."""
    return -(-vecs // 32)


def _row_kernel(name: str, x: Any, *same: Any) -> Any:
    """The register-row kernel `name` for x's rows when a row fits the lanes' registers
    (else None: the multi-pass kernels): over 16-byte vectors when the rows are whole vectors
    and x and `same` (the other arrays of x's dtype) are aligned, else a value at a time."""
    c, per = x.shape[-1], cuda_build.per_vector(x.dtype)
    if not (per and c % per == 0
            and all(a.data.ptr % cuda_build.VEC_BYTES == 0 for a in (x, *same))):
        per = 1
    vpl = lane_vectors(-(-c // per))
    if vpl * per > MAX_CPL:
        return None
    ahead = int(x.dtype.itemsize in LN_AHEAD_ITEMSIZES)
    return _ROWS.typed(name, x.dtype, *same,
                       defines=(f"-DVPL={vpl}", f"-DLN_VEC={per}", f"-DLN_AHEAD={ahead}"))


class CudaLayerNorm(LayerNormReference):
    uses = ("fp8",)  # PRECISION=fp8's GEMMs (gemm/fp8.py), or None
    calls = ("sum_rows",)  # dw and db from the kernels' partial sums

    def layernorm_forward_for_linear(self, x: Any, w: Any, b: Any, eps: float
                                     ) -> tuple[Any, Any, Any]:
        """In a PRECISION=fp8 run with delayed scaling, inside the captured step, y comes
        with its FP8 codes for the next Linear (Fp8Gemms.layernorm_forward)."""
        made = None if self.fp8 is None else self.fp8.layernorm_forward(x, w, b, eps)
        return made if made is not None else self.layernorm_forward(x, w, b, eps)

    def layernorm_forward(self, x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
        xp = self.xp
        x = xp.ascontiguousarray(x)
        c = x.shape[-1]
        n = x.size // c
        y = xp.empty_like(x)
        mean = xp.empty(x.shape[:-1] + (1,), dtype=accumulate_dtype(x.dtype))
        rstd = xp.empty_like(mean)
        kernel = _row_kernel("ln_fwd_rows", x, w, b) or _WIDE.typed("ln_fwd", x.dtype, w, b)
        kernel(*warp_grid(n), (x, w, b, y, mean, rstd, np.int32(n), np.int32(c),
                               acc_scalar(eps, x.dtype)))
        return y, mean, rstd

    def layernorm_backward(
        self, g: Any, x: Any, w: Any, mean: Any, rstd: Any,
        into: tuple[Any, Any] = (None, None), residual: Any = None,
    ) -> tuple[Any, Any, Any]:
        """dx, with the residual gradient added in the same pass by the register-row kernel
        (after it, by the multi-pass ones), and the partial sums of dw and db (rows of acc)
        that sum_rows then sums, straight into the gradient buffers when given."""
        xp = self.xp
        if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
            dx, dw, db = self.layernorm_backward(g, x, w, mean, rstd, into)
            return self.add(dx, residual), dw, db
        g, x = xp.ascontiguousarray(g), xp.ascontiguousarray(x)
        res = () if residual is None else (xp.ascontiguousarray(residual),)
        c = x.shape[-1]
        n = x.size // c
        dx = xp.empty_like(x)
        acc = accumulate_dtype(x.dtype)
        kernel = _row_kernel("ln_bwd_rows", x, g, w, *res)
        if kernel is not None:  # one pass; about LN_BWD_WARPS warps, each a row of partials
            rows = -(-n // LN_BWD_WARPS)
            warps = -(-n // rows)
            pdw = xp.empty((warps, c), dtype=acc)
            pdb = xp.empty_like(pdw)
            kernel(*warp_grid(warps, LN_BWD_BLOCK_WARPS),
                   (g, x, w, mean, rstd, res[0] if res else np.uint64(0), dx, pdw, pdb,
                    np.int32(n), np.int32(c), np.int32(rows)))
        else:
            _WIDE.typed("ln_bwd_dx", x.dtype, g, w)(
                *warp_grid(n), (g, x, w, mean, rstd, dx, np.int32(n), np.int32(c)))
            rows_per_chunk = 64
            chunks = (n + rows_per_chunk - 1) // rows_per_chunk
            pdw = xp.empty((chunks, c), dtype=acc)  # partial sums stay in acc until summed
            pdb = xp.empty_like(pdw)
            _WIDE.typed("ln_bwd_dwdb", x.dtype)(
                ((c + 127) // 128, chunks), (128,),
                (g, x, mean, rstd, pdw, pdb, np.int32(n), np.int32(c),
                 np.int32(rows_per_chunk)))
            if res:
                dx = self.add(dx, res[0])
        return dx, self._param_grad(pdw, w, into[0]), self._param_grad(pdb, w, into[1])

    def layernorm_backward_for_linear(
        self, g: Any, x: Any, w: Any, mean: Any, rstd: Any,
        into: tuple[Any, Any] = (None, None), residual: Any = None,
    ) -> tuple[Any, Any, Any]:
        """In a PRECISION=fp8 run with delayed scaling, inside the captured step, dx comes
        with its FP8 codes for the layer before (Fp8Gemms.layernorm_backward)."""
        made = (None if self.fp8 is None
                else self.fp8.layernorm_backward(g, x, w, mean, rstd, residual))
        if made is None:
            return self.layernorm_backward(g, x, w, mean, rstd, into, residual)
        dx, pdw, pdb = made
        return dx, self._param_grad(pdw, w, into[0]), self._param_grad(pdb, w, into[1])

    def _param_grad(self, partial: Any, w: Any, into: Any) -> Any:
        """The column sums of `partial` (rows of acc): added into `into` (None returned), or
        as a gradient of w's dtype."""
        if into is not None:
            return self.sum_rows(partial, into)
        return self.sum_rows(partial).astype(w.dtype, copy=False)
