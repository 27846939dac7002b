"""The CUDA kernel set: each op family's CuPy kernels (their CUDA C in .cu files beside the
launchers, compiled by cuda_build.py), cuBLAS for the GEMMs and cuBLASLt for the Linear
layers' fused epilogues; anything no family overrides runs the shared formulation.

Kernels are compiled per storage dtype on first use: `real`, the type of the arrays they load
and store (float, double or __half), and `acc`, the type they compute and reduce in (float,
and double for float64, the gradient checks' type). Loads convert real -> acc and stores
acc -> real, so 16-bit data is summed in fp32; statistics kept for backward (LayerNorm
mean/rstd, log-sum-exps, per-row losses) are acc arrays, and scalar arguments (eps, scale)
are acc. For float32 acc is real and the casts are no-ops: the arithmetic is the one a plain
float kernel does. Everything is launched on the backend's stream and reads scalars such as
the learning rate from device memory, so a whole training step can be graph-captured.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .attention.cuda import CudaAttention
from .batch.cuda import CudaBatch
from .dropout.cuda import CudaDropout
from .gelu.cuda import CudaGelu
from .gemm.cublas import Cublas
from .gemm.cublaslt import CublasLt
from .gemm.cuda import CudaGemm
from .layernorm.cuda import CudaLayerNorm
from .optim.cuda import CudaOptimizer
from .reference_set import XpKernels
from .softmax_xent.cuda import CudaCrossEntropy


class CudaKernels(CudaGemm, CudaLayerNorm, CudaGelu, CudaAttention, CudaCrossEntropy,
                  CudaBatch, CudaDropout, CudaOptimizer, XpKernels):
    """Fused CuPy kernels; anything not overridden uses the shared formulation."""

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self._one = backend.xp.ones((), dtype=np.float32)
        self.cublas = Cublas(backend.xp, backend.stream)
        self._cublaslt: CublasLt | None = None
        self.epilogues = True  # Linear layers through cuBLASLt's epilogues where it can
        self._ones: dict[tuple[int, Any], Any] = {}
