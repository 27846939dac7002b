"""The two FP8 formats of Hopper's tensor cores, and the per-tensor scaling that fits a tensor
into one, in NumPy: the reference the GPU's kernels are tested against, bit for bit.

- e4m3 (OCP's E4M3FN): 4 exponent bits (bias 7), 3 mantissa bits, no infinities, largest
  finite 448; more precision, less range: weights and activations.
- e5m2: 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like infinities, largest finite
  57344; more range: gradients.

Per-tensor current scaling: a tensor x of absolute maximum `amax` is stored as
q = fp8(x * scale) with scale = MAX / amax (float32, at most 2^126, so that 1 / scale is a
normal float32; 1 where amax is 0 or not finite), so that its largest value lands on the
format's largest finite one, and is read back as q * scale_inv, scale_inv = 1 / scale
(float32), the factor the GEMM multiplies by. Conversion rounds to the
nearest value (ties to an even mantissa) and saturates to +-MAX, as the GPU's
__nv_cvt_float_to_fp8(..., __NV_SATFINITE, ...) does. The GPU's kernels flush float32
subnormals (below 1.2e-38) to zero: for such values the two differ, and only for them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Fp8Format:
    """One of the two formats: its bit split and largest finite value."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    max: float  # the largest finite value

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1


@dataclasses.dataclass(frozen=True)
class Fp8Tensor:
    """A tensor in FP8: its codes (uint8, the tensor's shape), the float32 (1,) factor they
    are read back with, and its format; arrays of any device."""

    codes: Any
    scale_inv: Any
    fmt: Fp8Format
    amax: Any = None  # float32 (1,): the absolute maximum the scale came from, where known


E4M3 = Fp8Format("e4m3", 4, 3, 448.0)
E5M2 = Fp8Format("e5m2", 5, 2, 57344.0)
FORMATS = {f.name: f for f in (E4M3, E5M2)}
MAX_SCALE = np.float32(2.0**126)  # so that 1 / scale stays a normal float32, never flushed


@functools.cache
def decode_table(fmt: Fp8Format) -> np.ndarray:
    """The float64 value of each of the 256 codes (NaN for NaN codes, +-inf for e5m2's)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e_mask, m_mask = 2**fmt.exponent_bits - 1, 2**fmt.mantissa_bits - 1
    exponent = (codes >> fmt.mantissa_bits) & e_mask
    mantissa = (codes & m_mask) / 2.0**fmt.mantissa_bits
    value = np.where(exponent == 0, mantissa * 2.0 ** (1 - fmt.bias),
                     (1 + mantissa) * 2.0 ** (exponent - fmt.bias))
    if fmt is E4M3:  # exponent and mantissa all ones: NaN; no infinities
        value = np.where((codes & 0x7F) == 0x7F, np.nan, value)
    else:  # IEEE: the top exponent is inf (mantissa 0) or NaN
        value = np.where(exponent == e_mask, np.where(mantissa == 0, np.inf, np.nan), value)
    return sign * value


def decode(q: np.ndarray, fmt: Fp8Format) -> np.ndarray:
    """float64 values of uint8 codes."""
    return decode_table(fmt)[np.asarray(q, dtype=np.uint8)]


def encode(x: np.ndarray, fmt: Fp8Format) -> np.ndarray:
    """uint8 codes of float values: nearest, ties to an even mantissa, saturated to +-max
    (NaN stays NaN)."""
    x = np.asarray(x, dtype=np.float64)
    table = decode_table(fmt)[:128]  # the non-negative codes, in increasing order
    finite = np.flatnonzero(np.isfinite(table) & (table <= fmt.max))
    values = table[finite]
    mag = np.minimum(np.abs(x), fmt.max)
    hi = np.clip(np.searchsorted(values, mag), 1, len(values) - 1)
    lo = hi - 1
    below, above = mag - values[lo], values[hi] - mag
    pick = np.where(below < above, lo, np.where(above < below, hi,
                                                np.where(finite[lo] % 2 == 0, lo, hi)))
    code = finite[pick].astype(np.uint8) | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), code).astype(np.uint8)  # 0x7F: NaN in both


def scale_of(amax: float, fmt: Fp8Format) -> np.float32:
    """The current-scaling factor for a tensor of absolute maximum `amax`, in float32; at
    most MAX_SCALE (MAX / a tiny amax would overflow to infinity)."""
    amax = np.float32(amax)
    if not np.isfinite(amax) or amax == 0:
        return np.float32(1.0)
    with np.errstate(over="ignore"):
        return np.minimum(np.float32(fmt.max) / amax, MAX_SCALE)


def quantize(x: np.ndarray, fmt: Fp8Format, amax: float | None = None
             ) -> tuple[np.ndarray, np.float32]:
    """(codes, scale_inv) of x under current scaling, as the GPU computes them: amax and the
    product x * scale in float32. Delayed scaling: `amax`, the last step's, instead of x's
    own (values beyond it saturate)."""
    x32 = np.asarray(x, dtype=np.float32)
    if amax is None:
        amax = float(np.max(np.abs(x32))) if x32.size else 0.0
    scale = scale_of(amax, fmt)
    return encode(x32 * scale, fmt), np.float32(1.0) / scale
