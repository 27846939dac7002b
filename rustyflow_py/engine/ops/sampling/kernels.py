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
"""

from __future__ import annotations

from ..table import ANY, declare
from .cpu import CpuSampling
from .cuda import CudaSampling
from .reference import SamplingReference

declare(("argmax_rows", "sample_rows"), reference={ANY: SamplingReference},
        cpu={ANY: CpuSampling}, gpu={ANY: CudaSampling})
