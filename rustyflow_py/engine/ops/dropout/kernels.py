"""The dropout kernels: their contract, and their entries in the kernel table.

Every device's kernel for an op takes exactly these arguments and keeps these rules (and
table.py's common ones); tests/test_kernel_contract.py holds each to the reference.

    dropout_mask(shape, dtype, p, seed, site, step) -> Any
        Inverted dropout's multiplier, a fresh array of `shape` and float `dtype`: 1/(1-p)
        where element i is kept, else 0, kept when Philox4x32-10's draw for (seed, site,
        step, i) is at least p (dropout/philox.py). `step` is a 0-d int32 device counter.
        Every backend returns the same bits for the same arguments.

    dropout_apply(x, p, seed, site, step) -> Any
        x * dropout_mask(x.shape, x.dtype, p, seed, site, step), a fresh array, where a
        backend can without forming the mask (the GPU draws the bits inline): backward
        applies it again to the gradient instead of keeping a mask.
"""

from __future__ import annotations

from ..table import ANY, FLOATS, declare
from .cuda import CudaDropout
from .reference import DropoutReference

declare("dropout_mask", reference={ANY: DropoutReference}, cpu={ANY: DropoutReference},
        gpu={ANY: CudaDropout})
declare("dropout_apply", reference={ANY: DropoutReference}, cpu={FLOATS: DropoutReference},
        gpu={FLOATS: CudaDropout})
