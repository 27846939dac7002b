"""The next-token kernels: their contract, and their entries in the kernel table.

Every device's kernel for an op takes exactly these arguments and keeps these rules (and
table.py's common ones); tests/test_kernel_contract.py holds each to the reference.

    argmax_rows(logits) -> Any
        int64 ids (B,): the first index of each row's largest logit, for logits (B, V).

    sample_rows(logits, u, temperature, top_k, top_p) -> Any
        int64 ids (B,) drawn from each row of logits (B, V) by reference.py's rules
        (temperature > 0; top_k 0 and top_p 1 are off) at the float64 uniforms u (B,) in
        [0, 1). The probabilities are float64; a kernel's may differ from the reference's in
        rounding only, so a draw differs only where u * total falls that close to a step.

    next_tokens(logits, uniforms, count, tokens, ring, pos, temperature, top_k, top_p) -> None
        The decode loop's draw, with no host value read (a CUDA graph replays it): with
        slot = count % N, the ids that argmax_rows (temperature 0) or sample_rows at the
        uniforms uniforms[slot] (B,) give for logits (B, V) are written into tokens (B,) and
        ring[slot], then count and pos (int64 (1,) each) go up by 1. uniforms (N, B) float64
        and ring (N, B) int64; tokens, ring, count and pos are modified.
"""

from __future__ import annotations

from ..table import ANY, declare
from .cpu import CpuSampling
from .cuda import CudaSampling
from .reference import SamplingReference

declare(("argmax_rows", "sample_rows", "next_tokens"), reference={ANY: SamplingReference},
        cpu={ANY: CpuSampling}, gpu={ANY: CudaSampling})
