"""The attention kernels: their contract, and their entries in the kernel table.

Every device's kernel for an op takes exactly these arguments and keeps these rules (and
table.py's common ones); tests/test_kernel_contract.py holds each to the reference.

The fused attention exists on the GPU only: attention_path says "materialized" elsewhere,
and the table has no attention_forward/backward for the CPU.

    causal_softmax_forward(scores, scale, with_lse: bool = False) -> Any
        Softmax over the last axis of scale * scores (B, H, T, T) with the keys after each
        query masked (probability exactly 0). Overwrites `scores` (the probabilities may be
        that buffer). with_lse=True returns (probs, lse), lse (B, H, T, 1) being each row's
        log-sum-exp of the scaled scores, which causal_softmax_recompute takes.

    causal_softmax_recompute(scores, lse, scale) -> Any
        The probabilities (B, H, T, T) again from the same scores and the forward's lse (B,
        H, T, 1), without a reduction. Overwrites `scores`.

    causal_softmax_backward(g, probs, scale) -> Any
        d(scores) (B, H, T, T) for upstream g (B, H, T, T) on the probabilities; masked
        entries come out 0.

    attention_path(dtype, head_dim, seq_len, dropout: bool) -> str
        What computes attention of q, k, v of this dtype and shape (`dropout`: with dropout
        of the probabilities): "flash" (the own fused kernels) or "cudnn" (cuDNN's SDPA),
        both through attention_forward/backward, or "materialized" (batched GEMMs around
        the causal softmax). The run record names it.

    attention_forward(q, k, v, scale, dropout, out: Any = None) -> tuple[Any, Any]
        Causal attention of q, k, v (B, H, T, D) without forming T x T: (o (B, H, T, D), the
        softmax's row log-sum-exps (B, H, T), float32). `dropout` is (p, seed, stream,
        step): the probabilities' mask dropout_mask would draw for (B, H, T, T). q, k, v may
        be strided views (the heads of one packed (B, T, 3E) projection); o is written into
        `out` when given (e.g. the head-major view of a (B, T, E) array) and returned.

    attention_backward(q, k, v, o, do, lse, scale, dropout, out: tuple[Any, Any, Any] | None
        = None) -> tuple[Any, Any, Any]
        (dq, dk, dv) of attention_forward for upstream do, from its o and lse; written into
        `out`'s three views when given (e.g. those of one (B, T, 3E) gradient).

    decode_attention(qkv, keys, values, pos, scale, n) -> Any
        Generation's attention for one new position per sequence: write the key and value
        of qkv (B, 3E) at `pos` ((1,) int64 on the device) into one layer's cache keys/values
        (B, H, S, D) in place, then attend the query over cache positions 0..pos; y (B, E).
        `n` (pos + 1 eagerly, S in a captured graph) is the window a device that cannot read
        pos on the device masks within.
"""

from __future__ import annotations

from ..table import ANY, F32, F64, FLOATS, SIXTEEN, declare
from .cpu import CpuAttention
from .cuda import CudaAttention
from .reference import AttentionReference

declare(("causal_softmax_forward", "causal_softmax_recompute", "causal_softmax_backward"),
        reference={ANY: AttentionReference},
        cpu={(F32, F64): CpuAttention, SIXTEEN: AttentionReference},
        gpu={FLOATS: CudaAttention})
declare("attention_path", reference={ANY: AttentionReference}, cpu={ANY: AttentionReference},
        gpu={ANY: CudaAttention})
declare(("attention_forward", "attention_backward"), gpu={FLOATS: CudaAttention})
declare("decode_attention", reference={ANY: AttentionReference},
        cpu={(F32, F64): CpuAttention, SIXTEEN: AttentionReference}, gpu={FLOATS: CudaAttention})
