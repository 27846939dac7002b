"""FP8 per-tensor scaling on the GPU (fp8_cast.cu). Current scaling: a tensor's amax, then its
codes and read-back factor, two kernels on the current stream with the scale kept on the
device, so the pair is graph-capturable and the host never waits. Delayed scaling: one
kernel, scaled by the amax its site kept from the last replay (`Scaling`).

Hand-written because neither CuPy (no float8 dtype) nor cuBLASLt (its FP8 GEMMs take codes
already scaled) converts a bf16 or fp32 tensor to FP8 codes with a scale it computes itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from .. import cuda_build
from ..layernorm.cuda import MAX_CPL, lane_vectors
from .formats import E4M3, E5M2, Fp8Format, Fp8Tensor

_CAST = cuda_build.source(__file__, "fp8_cast.cu",
                          cuda_build.dtype_defines(np.float32) + ("-DRF_E4M3=1",))
_GELU = cuda_build.source(__file__, "gelu_bwd_fp8.cu",
                          cuda_build.dtype_defines(np.float32) + ("-DRF_E4M3=0", "-DRF_DELAYED=1"))
_LN = cuda_build.source(__file__, "layernorm_fp8.cu",
                        cuda_build.dtype_defines(np.float32)
                        + ("-DRF_E4M3=1", "-DRF_DELAYED=1", "-DVPL=3", "-DLQ_PARTIAL=0"))
STORAGE = ("float32", "bfloat16", "float16", "float64")  # the dtypes fp8_cast.cu is built for
THREADS = 256
TILE, TILE_ROWS = 32, 8  # fp8_quantize_t's tile and block: fp8_cast.cu's TILE, TILE_ROWS
# fp8.cuh's transposed tile (TQ_ROWS x TQ_COLS values, TQ_THREADS threads): a block a tile of
# fp8_quantize_t_vec and gelu_bwd_codes
TQ_ROWS, TQ_COLS, TQ_THREADS = 128, 64, 256
CODES_TILE = 64  # fp8_transpose_codes's tile (fp8_cast.cu's TV): blocks of THREADS
LN_ROWS, LN_WARPS, LN_WORDS = 32, 8, 9  # layernorm_fp8.cu's LQ_ROWS, LQ_WARPS, LQ_WORDS
# layernorm/cuda.py's register-row width; its tile, 4 * LN_WORDS bytes a column, stays
# within the 48 KiB a block has without opting in to more
LN_MAX_WIDTH = 32 * MAX_CPL
MAX_BLOCKS = 1024  # grid-stride beyond: 8 blocks of 256 threads per SM of an H100 and more


@dataclasses.dataclass(frozen=True)
class Scaling:
    """How a cast is scaled. Current (no `site`): an amax pass over the tensor first, into
    `amax` (float32 (1,)) when given, else into a new buffer. Delayed: `site`, a float32 (4,)
    row of fp8.cuh's rf_site, whose slot of the last replay scales this one and whose slot
    of this replay (by `replay`, the uint32 (1,) count of its graph's replays) takes this
    one's amax (no amax pass; the result's `.amax` is None)."""

    amax: Any = None
    site: Any = None
    replay: Any = None

CURRENT = Scaling()


class _Layouts(NamedTuple):
    """The codes a producer writes in both layouts, (rows, cols) and (cols, rows), and their
    one read-back factor: the kernels' three output arguments, in this order."""

    codes: Any
    codes_t: Any
    scale_inv: Any

    @classmethod
    def empty(cls, rows: int, cols: int) -> _Layouts:
        import cupy

        return cls(cupy.empty((rows, cols), np.uint8), cupy.empty((cols, rows), np.uint8),
                   cupy.empty(1, np.float32))

    def tensors(self, fmt: Fp8Format) -> tuple[Fp8Tensor, Fp8Tensor]:
        return (Fp8Tensor(self.codes, self.scale_inv, fmt),
                Fp8Tensor(self.codes_t, self.scale_inv, fmt))


def _grid(n: int) -> tuple[int]:
    return (max(1, min(MAX_BLOCKS, -(-n // THREADS))),)


def _defines(fmt: Fp8Format, delayed: bool = False) -> tuple[str, ...]:
    return (f"-DRF_E4M3={int(fmt is E4M3)}",) + (("-DRF_DELAYED=1",) if delayed else ())


def _kernel(name: str, x: Any, fmt: Fp8Format, delayed: bool = False) -> tuple[Any, int]:
    """(kernel `name` for x's dtype, `fmt` and scaling, the items it takes): the form over
    16-byte vectors when x is whole aligned vectors, else the one a value at a time."""
    vecs = cuda_build.vectors(x)
    defines = _defines(fmt, delayed)
    if vecs:
        return _CAST.typed(f"{name}_vec", x.dtype, x, defines=defines), vecs
    return _CAST.typed(name, x.dtype, x, defines=defines), x.size


def _amax_into(x: Any, amax: Any) -> Any:
    """amax (float32 (1,)) = max |x| (a NaN in x wins) of a C-contiguous x, on the current
    stream."""
    amax.fill(0)
    kernel, items = _kernel("fp8_amax", x, E4M3)  # the format does not change the amax
    kernel(_grid(items), (THREADS,), (x, np.int64(items), amax))
    return amax


def _scale_from(x: Any, scaling: Scaling) -> tuple[tuple[Any, ...], Any]:
    """(the cast kernel's scale arguments: x's amax, measured now, or the site and its
    replay count; that amax or None)."""
    import cupy

    if scaling.site is not None:
        return (scaling.site, scaling.replay), None
    amax = _amax_into(x, cupy.empty(1, np.float32) if scaling.amax is None else scaling.amax)
    return (amax,), amax


def _check_storage(x: Any) -> None:
    if x.dtype.name not in STORAGE:
        raise TypeError(f"FP8 casts take {', '.join(STORAGE)} tensors, not {x.dtype}: cast "
                        f"it to one of them first")


def quantize(x: Any, fmt: Fp8Format = E4M3, scaling: Scaling = CURRENT) -> Fp8Tensor:
    """x (float32, bfloat16, float16 or float64, any shape) in FP8 (formats.py's recipe under
    current scaling), with its amax as `.amax`."""
    import cupy

    _check_storage(x)
    x = cupy.ascontiguousarray(x)
    scale, amax = _scale_from(x, scaling)
    codes = cupy.empty(x.shape, np.uint8)
    scale_inv = cupy.empty(1, np.float32)
    kernel, items = _kernel("fp8_quantize", x, fmt, scaling.site is not None)
    kernel(_grid(items), (THREADS,), (x, np.int64(items), *scale, codes, scale_inv))
    return Fp8Tensor(codes, scale_inv, fmt, amax)


def quantize_t(x: Any, fmt: Fp8Format = E4M3, scaling: Scaling = CURRENT) -> Fp8Tensor:
    """x.T in FP8 for a 2-D x (rows, cols), as C-contiguous codes (cols, rows): the layout an
    FP8 GEMM takes for an operand whose reduced axis is x's rows (a weight gradient's x and
    dy), written by one transposing cast after the amax pass, not a cast and a copy: over
    16-byte vectors where rows is a multiple of 16 and cols of a vector, else a value at a
    time."""
    return _quantize_t(x, fmt, scaling, rows=False)[1]


def quantize_both(x: Any, fmt: Fp8Format = E4M3, scaling: Scaling = CURRENT
                  ) -> tuple[Fp8Tensor, Fp8Tensor]:
    """(x, x.T) in FP8 for a 2-D x (rows, cols): codes (rows, cols) and (cols, rows), one amax
    and one scale, from a single read of x: quantize_t's kernel also writing the codes in x's
    own layout. For a gradient that one layer reads both ways."""
    made, transposed = _quantize_t(x, fmt, scaling, rows=True)
    assert made is not None  # rows=True writes them
    return made, transposed


def _quantize_t(x: Any, fmt: Fp8Format, scaling: Scaling, rows: bool
                ) -> tuple[Fp8Tensor | None, Fp8Tensor]:
    import cupy

    _check_storage(x)
    if x.ndim != 2:
        raise ValueError(f"quantize_t takes a 2-D array, not shape {x.shape}")
    x = cupy.ascontiguousarray(x)
    n, cols = x.shape
    scale, amax = _scale_from(x, scaling)
    codes = cupy.empty((cols, n), np.uint8)
    scale_inv = cupy.empty(1, np.float32)
    codes_rows = cupy.empty((n, cols), np.uint8) if rows else None
    defines = _defines(fmt, scaling.site is not None)
    per = cuda_build.per_vector(x.dtype)
    if per and n % 16 == 0 and cols % per == 0 and x.data.ptr % cuda_build.VEC_BYTES == 0:
        kernel = _CAST.typed("fp8_quantize_t_vec", x.dtype, x, defines=defines)
        grid, block = (-(-cols // TQ_COLS) * -(-n // TQ_ROWS),), (TQ_THREADS,)
    else:
        kernel = _CAST.typed("fp8_quantize_t", x.dtype, x, defines=defines)
        grid, block = (-(-cols // TILE), -(-n // TILE)), (TILE, TILE_ROWS)
    kernel(grid, block, (x, np.int32(n), np.int32(cols), *scale, codes, scale_inv,
                         np.uint64(0) if codes_rows is None else codes_rows))
    transposed = Fp8Tensor(codes, scale_inv, fmt, amax)
    return (None if codes_rows is None else Fp8Tensor(codes_rows, scale_inv, fmt, amax),
            transposed)


def transpose_codes(q: Fp8Tensor) -> Fp8Tensor:
    """q^T's codes (cols, rows), same factor and format, for FP8 codes q (rows, cols) that a
    kernel wrote without their other layout (the cross-entropy's e5m2 gradient): a byte
    transpose through shared tiles, 16 codes an access. rows and cols: multiples of 16."""
    import cupy

    rows, cols = q.codes.shape
    if rows % 16 or cols % 16 or not q.codes.flags.c_contiguous:
        raise ValueError(f"transpose_codes takes C-contiguous codes whose sides are multiples "
                         f"of 16, not {q.codes.shape}")
    out = cupy.empty((cols, rows), np.uint8)
    _CAST.typed("fp8_transpose_codes", np.dtype(np.float32))(
        (-(-cols // CODES_TILE), -(-rows // CODES_TILE)), (THREADS,),
        (q.codes, np.int32(rows), np.int32(cols), out))
    return Fp8Tensor(out, q.scale_inv, q.fmt, q.amax)


def gelu_codes_fit(g: Any, x: Any, bias: Any | None) -> bool:
    """Whether gelu_backward_codes takes these: g and x (rows, cols) of one 16-bit dtype,
    C-contiguous and 16-byte aligned, rows and cols multiples of its tile; a bias (cols,)
    of x's dtype or none."""
    return (x.ndim == 2 and g.shape == x.shape and x.itemsize == 2
            and x.shape[0] % TQ_ROWS == 0 and x.shape[1] % TQ_COLS == 0
            and cuda_build.vectors(g, x) > 0
            and (bias is None or (bias.shape == (x.shape[1],) and bias.dtype == x.dtype
                                  and cuda_build.vectors(bias) > 0)))


def gelu_backward_codes(g: Any, x: Any, bias: Any | None, scaling: Scaling
                        ) -> tuple[Fp8Tensor, Fp8Tensor, Any]:
    """GELU's backward dx = g * gelu'(x + bias) written as e5m2 codes only, at a delayed
    `scaling` (gelu_bwd_fp8.cu): (dx's codes (rows, cols), dx^T's (cols, rows), the columns'
    sums of dx over each tile of rows (rows / TQ_ROWS, cols) in float32, to be added up by
    the caller). For arrays gelu_codes_fit takes."""
    import cupy

    rows, cols = x.shape
    both = _Layouts.empty(rows, cols)
    part = cupy.empty((rows // TQ_ROWS, cols), np.float32)
    _GELU.typed("gelu_bwd_codes", x.dtype, defines=_defines(E5M2, True))(
        ((rows // TQ_ROWS) * (cols // TQ_COLS),), (TQ_THREADS,),
        (g, x, np.uint64(0) if bias is None else bias, scaling.site, scaling.replay, *both,
         part, np.int32(rows), np.int32(cols)))
    return (*both.tensors(E5M2), part)


def layernorm_codes_fit(x: Any, w: Any, b: Any, *rows: Any) -> bool:
    """Whether layernorm_forward_codes (and with the arrays `rows` of x's shape, g and the
    residual, layernorm_backward_codes) takes these: x (rows, c) of a 16-bit dtype, rows a
    multiple of LN_ROWS, c whole vectors and at most LN_MAX_WIDTH (the widest rows the
    LayerNorm kernels hold in registers: wider ones they take in several passes, which round
    otherwise, and y would not be theirs bit for bit); w and b (c,) of x's dtype; all
    C-contiguous and 16-byte aligned."""
    if x.ndim != 2 or x.itemsize != 2:
        return False
    n, c = x.shape
    per = cuda_build.per_vector(x.dtype)
    return (per > 0 and n % LN_ROWS == 0 and c % per == 0 and c <= LN_MAX_WIDTH
            and cuda_build.vectors(x, *rows) > 0
            and w.shape == b.shape == (c,) and w.dtype == b.dtype == x.dtype
            and cuda_build.vectors(w, b) > 0)


def _lanes(x: Any) -> tuple[str, ...]:
    """layernorm_fp8.cu's VPL (a lane's vectors of a row) and LQ_PARTIAL for x's rows."""
    vecs = x.shape[1] // cuda_build.per_vector(x.dtype)
    return f"-DVPL={lane_vectors(vecs)}", f"-DLQ_PARTIAL={int(vecs % 32 != 0)}"


def layernorm_forward_codes(x: Any, w: Any, b: Any, eps: float, scaling: Scaling
                            ) -> tuple[Any, Any, Any, Fp8Tensor, Fp8Tensor]:
    """LayerNorm's forward over x's rows (layernorm_fp8.cu) with y's e4m3 codes at a
    delayed `scaling` in both layouts: (y, mean and rstd (rows, 1) in float32, y's codes
    (rows, c), y^T's (c, rows)). y is the LayerNorm kernels' y, bit for bit. For arrays
    layernorm_codes_fit takes."""
    import cupy

    n, c = x.shape
    y = cupy.empty_like(x)
    mean, rstd = cupy.empty((n, 1), np.float32), cupy.empty((n, 1), np.float32)
    both = _Layouts.empty(n, c)
    _LN.typed("ln_fwd_codes", x.dtype, w, b, defines=_defines(E4M3, True) + _lanes(x))(
        (n // LN_ROWS,), (32 * LN_WARPS,),
        (x, w, b, y, mean, rstd, scaling.site, scaling.replay, *both, np.int32(n), np.int32(c),
         cuda_build.acc_scalar(eps, x.dtype)),
        shared_mem=c * LN_WORDS * 4)
    return (y, mean, rstd, *both.tensors(E4M3))


def layernorm_backward_codes(g: Any, x: Any, w: Any, mean: Any, rstd: Any, residual: Any,
                             scaling: Scaling) -> tuple[Any, Any, Any, Fp8Tensor, Fp8Tensor]:
    """LayerNorm's backward over x's rows (layernorm_fp8.cu) with dx's e5m2 codes at a
    delayed `scaling` in both layouts: (dx, with `residual` (or None) added, as the LayerNorm
    kernels give it, bit for bit; the partial sums of dw and db, a row each per LN_ROWS rows
    of x, in float32; dx's codes (rows, c); dx^T's (c, rows)). For arrays
    layernorm_codes_fit(x, w, w, g[, residual]) takes; mean and rstd the forward's."""
    import cupy

    n, c = x.shape
    dx = cupy.empty_like(x)
    pdw, pdb = (cupy.empty((n // LN_ROWS, c), np.float32) for _ in range(2))
    both = _Layouts.empty(n, c)
    _LN.typed("ln_bwd_codes", x.dtype, g, w, defines=_defines(E5M2, True) + _lanes(x))(
        (n // LN_ROWS,), (32 * LN_WARPS,),
        (g, x, w, mean, rstd, np.uint64(0) if residual is None else residual, dx, pdw, pdb,
         scaling.site, scaling.replay, *both, np.int32(n), np.int32(c)),
        shared_mem=c * LN_WORDS * 4)
    return (dx, pdw, pdb, *both.tensors(E5M2))

