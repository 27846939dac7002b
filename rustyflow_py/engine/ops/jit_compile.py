"""How the op folders' numba kernels (each folder's jit.py, CPU_JIT) are compiled: the
decorators, and the float32 exp they share.

Why numba: NumPy's float32 `exp` does not take a vectorised path, and the seed shape needs 34M
of them a step in the LM head's softmax alone, a sizeable part of a CPU step. The polynomial
exp below, which LLVM vectorises, fused with the row sum and the target pick in one pass, is
several times faster per element (benchmarks/results/cpu-*.md compares the step with and
without these kernels). The other kernels fuse what NumPy runs as several passes with
temporaries (GELU, AdamW, LayerNorm, the attention softmax) or one slow call (add.at for the
embedding gradient).

Floating point: `kernel` allows `contract` (FMA) and `reassoc` (vectorised sums) only; NaN and
inf keep their IEEE meaning so a diverging run is still caught by the trainer's
non-finite-loss check. `exact` (the sampler's) takes no liberty at all: its sums run in
NumPy's order. Every kernel releases the GIL, so RustyFlow's own thread pool spreads them
over the cores exactly like the NumPy passes (no second threading layer); compiled code is
cached on disk by numba (an edit here, inlined into the folders' kernels, is seen by their
cache only once their own files change too).
"""

from __future__ import annotations

import functools
from typing import Any

import numba
import numpy as np

_FLAGS = {"contract", "reassoc"}
# error_model="numpy": x / 0 is inf as in NumPy; Python's ZeroDivisionError check would keep
# every loop with a division from vectorising.
kernel = functools.partial(numba.njit, nogil=True, fastmath=_FLAGS, error_model="numpy",
                           cache=True)
# no fastmath: sums in order, as np.cumsum and np.bincount add
exact = functools.partial(numba.njit, nogil=True, error_model="numpy", cache=True)
f32 = np.float32


@kernel(inline="always")
def _pow2(k: Any) -> Any:
    """2.0**k for an integer k in [-126, 127], from the float32 exponent bits."""
    return np.int32((k + np.int32(127)) << np.int32(23)).view(np.float32)


@kernel(inline="always")
def fexp(x: Any) -> Any:
    """float32 exp within 1 ulp (tests/test_cpu_jit.py): 2**n * p(r) with x = n ln2 + r,
    |r| <= ln2 / 2 (Cody-Waite reduction, Cephes' degree-6 polynomial). exp(x) = 0 below
    -87.3 (no subnormals); branch-free after LLVM turns the two tests into selects."""
    n = np.floor(x * f32(1.44269504) + f32(0.5))
    r = x - n * f32(0.693359375)
    r = r - n * f32(-2.12194440e-4)
    p = f32(1.9875691500e-4)
    p = p * r + f32(1.3981999507e-3)
    p = p * r + f32(8.3334519073e-3)
    p = p * r + f32(4.1665795894e-2)
    p = p * r + f32(1.6666665459e-1)
    p = p * r + f32(5.0000001201e-1)
    p = p * r * r + r + f32(1.0)
    # 2**n as two factors 2**a * 2**b, a = floor(n / 2): each exponent stays in float32's
    # range for every n a finite result can have (-126..128)
    a = np.int32(np.floor(n * f32(0.5)))
    b = np.int32(n) - a
    scaled = p * _pow2(a) * _pow2(b)
    if x > f32(88.7228391):
        return f32(np.inf)
    if x < f32(-87.3365447):
        return f32(0.0)
    return scaled  # NaN in, NaN out (through p)
