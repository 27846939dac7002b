"""The LayerNorm kernels: their contract, and their entries in the kernel table.

Every device's kernel for an op takes exactly these arguments and keeps these rules (and
table.py's common ones); tests/test_kernel_contract.py holds each to the reference.

    layernorm_forward(x, w, b, eps) -> tuple[Any, Any, Any]
        (y, mean, rstd) for x (..., C), w and b (C,): y (..., C) is the normalised x scaled
        by w and shifted by b; mean and rstd (..., 1) are its backward's inputs.

    layernorm_forward_for_linear(x, w, b, eps) -> tuple[Any, Any, Any]
        layernorm_forward's, for a y that only the Linear (or MLP) right after reads. A
        device may make that layer's GEMM operand of y in the same pass, for the layer to
        take: the GPU in a PRECISION=fp8 run (delayed scaling, inside a captured step)
        writes y's FP8 codes with y, so that the Linear casts nothing of it.

    layernorm_backward(g, x, w, mean, rstd, into=(None, None), residual=None)
        -> tuple[Any, Any, Any]
        (dx (..., C), dw (C,), db (C,)) for upstream g (..., C), from the forward's x, w and
        its mean, rstd (..., 1). `into`: (dw's, db's) gradient buffers or None each; a given
        one receives its gradient, added, and None is returned in its place. `residual`
        (..., C): a gradient of x from elsewhere (the residual stream's), added to dx.

    layernorm_backward_for_linear(g, x, w, mean, rstd, into=(None, None), residual=None)
        -> tuple[Any, Any, Any]
        layernorm_backward's, for an x that the Linear (or MLP) whose backward comes right
        after made, dx (with the residual joined) being all of x's gradient. A device may
        make that layer's GEMM operand of dx in the same pass: the GPU in a PRECISION=fp8
        run (delayed scaling, inside a captured step) writes dx's FP8 codes with dx.
"""

from __future__ import annotations

from ..table import ANY, F32, F64, FLOATS, SIXTEEN, declare
from .cpu import CpuLayerNorm
from .cuda import CudaLayerNorm
from .reference import LayerNormReference

declare(("layernorm_forward", "layernorm_forward_for_linear", "layernorm_backward",
         "layernorm_backward_for_linear"),
        reference={ANY: LayerNormReference},
        cpu={(F32, F64): CpuLayerNorm, SIXTEEN: LayerNormReference},
        gpu={FLOATS: CudaLayerNorm})
