"""The CPU kernel set: the shared formulation, with every big pass spread over the cores.

RustyFlow's own thread pool runs all the parallel work, GEMMs included, in cache-sized blocks
(cpu_pool.py). Each op family's CPU kernels are a class in its folder, and CpuKernels
composes them:

    gemm/cpu.py           matmul: large products cut into single-threaded BLAS calls
    softmax_xent/cpu.py   softmax cross-entropy, and the tied LM head fused with it
    attention/cpu.py      the causal attention softmax, skipping the masked keys
    gelu/cpu.py           GELU with the bias add fused in
    layernorm/cpu.py      LayerNorm forward and backward
    embedding/cpu.py      the embedding gradient's scatter-add
    optim/cpu.py          grad-norm, the optimizer updates

Whatever no family overrides (sum_rows, Muon's kernels, gather_batch, store_at_step) runs the
reference formulation, and so do the families' kernels called on 16-bit (float16) arrays
(ReferenceFor16Bit): the families are float32/float64 code.
"""

from __future__ import annotations

from .attention.cpu import CpuAttention
from .embedding.cpu import CpuEmbedding
from .gelu.cpu import CpuGelu
from .gemm.cpu import CpuGemm
from .layernorm.cpu import CpuLayerNorm
from .optim.cpu import CpuOptimizer
from .reference_set import ReferenceFor16Bit
from .softmax_xent.cpu import CpuCrossEntropy


class CpuKernels(ReferenceFor16Bit, CpuGemm, CpuCrossEntropy, CpuAttention, CpuGelu,
                 CpuLayerNorm, CpuEmbedding, CpuOptimizer):
    """The CPU backend's kernel set (threads and CPU_JIT are set on it: see cpu_pool.py)."""
