"""A run's frozen policy: every setting that decides how kernels compute, in one immutable object.

A backend is one device and is shared by everything in the process (library.get_backend caches
it), so nothing a run chooses may be stored on it: a mode set there would outlive the run and
leak into the next one (an evaluation after a training run, a test after another test). A run
instead builds one `RunPolicy` from its configuration before any work, and the backend view it
gets for it (`get_backend(device, policy)`) carries kernels that read the policy once, when the
view is made: nothing is looked up per call, and nothing is ever set afterwards. Two runs with
different policies in one process each compute exactly as they would alone.

Dropout needs no field here: its masks are a pure function of the model's seed, the call site
and the model's own step counter on the device (ops.Randomness), so no generator state exists
outside the model.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Literal

from .precision import MatmulCompute, Precision

Attention = Literal["auto", "own", "cudnn", "materialized"]
Switch = Literal["auto", "on", "off"]
Fp8Scaling = Literal["current", "delayed"]


@dataclasses.dataclass(frozen=True)
class RunPolicy:
    """How a run computes (hashable: a backend keeps one view per policy in use).

    - `precision`: the dtypes and the GEMM compute mode (PRECISION), engine/precision.py;
    - `attention`: which fused attention runs where one can (ATTENTION): "own" (flash.py),
      "cudnn" (cuDNN's SDPA), "auto" (cuDNN where installed and it applies to a replayed
      graph, else own);
      "materialized" keeps the batched GEMMs around the causal softmax;
    - `epilogues`: whether Linear layers may fuse bias, GELU and bias gradients into
      cuBLASLt's GEMM epilogues (GPU; off only to compare with the unfused formulation);
    - `graph`: whether the GPU step is replayed as a CUDA graph (GRAPH);
    - `threads`: CPU threads for RustyFlow's kernel pool, 0 = every core (THREADS);
    - `cpu_jit`: the CPU's numba kernels: auto, on (numba required) or off (CPU_JIT);
    - `fp8_scaling`: how a PRECISION=fp8 run scales its casts (FP8_SCALING): "current" (an
      amax pass over each tensor first) or "delayed" (in the replayed graph, by the amax the
      same cast measured in the last replay), engine/ops/gemm/fp8.py. Current here; a
      run's config defaults to delayed (training/config/config.py says why);
    - `head_chunk`: the tied LM head's rows a chunk (LM_HEAD_CHUNK): 0 makes the (N, V) logits
      of all N rows at once; a chunk of rows holds only its own logits, and forward makes
      both gradients chunk by chunk (engine/ops/softmax_xent/reference.py).
    """

    precision: Precision = dataclasses.field(default_factory=lambda: Precision.of("fp32"))
    attention: Attention = "auto"
    epilogues: bool = True
    graph: Switch = "auto"
    threads: int = 0
    cpu_jit: Switch = "auto"
    fp8_scaling: Fp8Scaling = "current"
    head_chunk: int = 0

    @property
    def matmul_compute(self) -> MatmulCompute:
        """The GEMM compute mode of float32 operands ("fp32", "tf32" or "fp64")."""
        return self.precision.matmul_compute

    @property
    def cpu_threads(self) -> int:
        """The threads the CPU kernels use: THREADS, or every core for 0."""
        return self.threads or os.cpu_count() or 1


DEFAULT = RunPolicy()  # what a backend made without a policy computes with
