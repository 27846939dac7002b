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
    optim/cpu.py          grad-norm, the optimizer updates
    sampling/cpu.py       the next token

A family's class extends its reference, so what it does not override (sum_rows, the Linear
layers around the pool's GEMM, Muon's kernels) runs the reference formulation on the pool's
kernels. The families are float32/float64 code: the table sends the reducing kernels' 16-bit
(float16, bfloat16) calls to the reference classes, which compute them in float32.

CPU_JIT is decided here: with numba installed (auto, or on), a family's block of float32
work goes to the numba kernel of its folder's jit.py (cpu_jit.py loads them all) instead of
the NumPy calls: same blocks, same pool, one compiled loop.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from ...errors import install_command
from ..policy import RunPolicy
from . import kernel_table  # noqa: F401  (enters every op folder into the table)
from .cpu_pool import CpuPool


def load_jit(mode: str) -> ModuleType | None:
    """cpu_jit.py (every op folder's numba kernels) for CPU_JIT=auto when numba imports, or
    on; None for off."""
    if mode == "off":
        return None
    try:
        from . import cpu_jit as jit
    except ImportError as exc:  # numba missing, or built for another NumPy
        if mode == "on":
            raise RuntimeError(f"CPU_JIT=on, but numba does not import ({exc}): "
                               f"{install_command('jit')}, or set CPU_JIT=auto to use NumPy"
                               ) from exc
        return None
    return jit


class CpuKernels(CpuPool):
    """The CPU backend's kernel set (threads and CPU_JIT come from the run policy)."""

    # what its families may take (Family.uses): the policy's THREADS and CPU_JIT, the pool
    # and its buffers
    offers = (*CpuPool.offers, "threads", "split_gemms", "jit", "_parallel", "_jit_for",
              "blas_threaded", "_workspace", "_give_back", "_ones_vector")

    def _read_policy(self, policy: RunPolicy) -> None:
        """CPU_JIT: auto (numba kernels when numba imports), on (numba required) or off."""
        super()._read_policy(policy)
        self.jit = load_jit(policy.cpu_jit)

    def _jit_for(self, *arrays: np.ndarray) -> ModuleType | None:
        """The numba kernels for float32 work (a family takes its folder's: `jit.gelu`);
        float64 (gradient checks, PRECISION=fp64) keeps the NumPy formulation, whose exp is
        exact to float64."""
        return self.jit if all(a.dtype == np.float32 for a in arrays) else None
