"""CPU kernels: the shared formulation, with every big pass spread over the cores.

RustyFlow's own thread pool runs all the parallel work, GEMMs included, in cache-sized blocks
(cpu_pool.py). Each family of kernels is a class of its own, and CpuKernels composes them:

    cpu_gemm.py        matmul: large products cut into single-threaded BLAS calls
    cpu_xent.py        softmax cross-entropy, and the tied LM head fused with it
    cpu_attention.py   the causal attention softmax, skipping the masked keys
    cpu_gelu.py        GELU with the bias add fused in
    cpu_layernorm.py   LayerNorm forward and backward
    cpu_optim.py       embedding gradient scatter-add, grad-norm, the optimizer updates

Whatever no family overrides (sum_rows, Muon's kernels, gather_batch, store_at_step) runs the
reference formulation, and so do the families' kernels called on 16-bit (float16) arrays
(ReferenceFor16Bit): the families are float32/float64 code.
"""

from __future__ import annotations

from .cpu_attention import CpuAttention
from .cpu_gelu import CpuGelu
from .cpu_gemm import CpuGemm
from .cpu_layernorm import CpuLayerNorm
from .cpu_optim import CpuOptimizer
from .cpu_xent import CpuCrossEntropy
from .reference import ReferenceFor16Bit


class CpuKernels(ReferenceFor16Bit, CpuGemm, CpuCrossEntropy, CpuAttention, CpuGelu,
                 CpuLayerNorm, CpuOptimizer):
    """The CPU backend's kernel set (threads and CPU_JIT come from the run policy: see
    cpu_pool.py)."""
