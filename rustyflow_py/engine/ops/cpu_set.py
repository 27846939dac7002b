"""The CPU kernel set: the table's "cpu" entries, every big pass spread over the cores.

RustyFlow's own thread pool runs all the parallel work, GEMMs included, in cache-sized blocks
(cpu_pool.py, this set's state). Each op family's CPU kernels are a class in its folder, and
the table picks them per dtype:

    gemm/cpu.py           matmul: large products cut into single-threaded BLAS calls
    softmax_xent/cpu.py   softmax cross-entropy, and the tied LM head fused with it
    attention/cpu.py      the causal attention softmax, skipping the masked keys
    gelu/cpu.py           GELU with the bias add fused in
    layernorm/cpu.py      LayerNorm forward and backward
    embedding/cpu.py      the embedding gradient's scatter-add
    optim/<algorithm>.py  grad-norm, the optimizer updates (each file's Cpu class)

A family's class extends its reference, so what it does not override (sum_rows, the Linear
layers around the pool's GEMM, Muon's kernels) runs the reference formulation on the pool's
kernels. The families are float32/float64 code: the table sends the reducing kernels' 16-bit
(float16, bfloat16) calls to the reference classes, which compute them in float32.
"""

from __future__ import annotations

from . import kernel_table  # noqa: F401  (enters every op folder into the table)
from .cpu_pool import CpuPool


class CpuKernels(CpuPool):
    """The CPU backend's kernel set (threads and CPU_JIT come from the run policy: see
    cpu_pool.py)."""

