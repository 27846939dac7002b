"""The softmax cross-entropy kernels: their contract, and their entries in the kernel table.

Every device's kernel for an op takes exactly these arguments and keeps these rules (and
table.py's common ones); tests/test_kernel_contract.py holds each to the reference.

`mm` is called like matmul (mm(a, b, transpose_b=..., out=...)), so the caller can time it.

    cross_entropy(logits, targets, need_grad, inplace) -> tuple[Any, Any]
        (loss, state): the mean NLL, a 0-d array, of logits (N, V) against targets (N,).
        state is None unless need_grad; with inplace=True the logits buffer may be
        overwritten (by this call or by the backward: do not read it afterwards).

    cross_entropy_backward(state, g) -> Any
        d(logits) (N, V) for upstream g, a 0-d array (the loss's gradient). May reuse the
        state's buffers, so it runs once per state.

    lm_head_xent(h, w, targets, need_grad, mm) -> tuple[Any, Any]
        (loss, state): the mean NLL, a 0-d array, of h (N, E) @ w.T, w (V, E), against
        targets (N,), without handing the (N, V) logits back. Every GEMM goes through `mm`,
        called like matmul (mm(a, b, transpose_b=..., out=...)), so the caller can time it.
        state is None unless need_grad. Under LM_HEAD_CHUNK (the kernel set's `head_chunk`
        rows) the logits are made a chunk of rows at a time, and the forward runs the
        gradients' GEMMs too: a chunk's logits are gone by backward.

    lm_head_xent_backward(state, g, need_h, need_w, mm, w_into=None) -> tuple[Any, Any]
        (dh (N, E) or None, dw (V, E) or None) for upstream g, a 0-d array; GEMMs through
        `mm` as in the forward. Consumes the state (once). A given `w_into` (w's gradient
        buffer) receives dw, added, and None is returned in its place.
"""

from __future__ import annotations

from ..table import ANY, F32, F64, FLOATS, SIXTEEN, declare
from .cpu import CpuCrossEntropy
from .cuda import CudaCrossEntropy
from .reference import CrossEntropyReference

declare(("cross_entropy", "lm_head_xent", "lm_head_xent_backward"),
        reference={ANY: CrossEntropyReference},
        cpu={(F32, F64): CpuCrossEntropy, SIXTEEN: CrossEntropyReference},
        gpu={FLOATS: CudaCrossEntropy})
# the CPU backward takes the 16-bit reference state too (an array it scales in place)
declare("cross_entropy_backward", reference={ANY: CrossEntropyReference},
        cpu={FLOATS: CpuCrossEntropy}, gpu={FLOATS: CudaCrossEntropy})
