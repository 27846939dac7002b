"""The CUDA kernel set: each op family's CuPy kernels (their CUDA C in .cu files beside the
launchers, compiled by cuda_build.py), cuBLAS for the GEMMs and cuBLASLt for the Linear
layers' fused epilogues; what a family's class does not override runs its reference.

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

from .gemm.cublas import Cublas
from .gemm.cublaslt import CublasLt, CublasLtUnsupported
from .kernel_table import FAMILIES
from .table import KernelSet


class CudaKernels(KernelSet):
    """The GPU backend's kernel set: the table's "gpu" entries, and the state they share (the
    cuBLAS and cuBLASLt handles, cached ones vectors, a device 1.0)."""

    kind = "gpu"
    families = FAMILIES

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self._one = backend.xp.ones((), dtype=np.float32)  # the clip factor without clipping
        self.cublas = Cublas(backend.xp, backend.stream)
        self._cublaslt: CublasLt | None = None
        self.epilogues = True  # Linear layers through cuBLASLt's epilogues where it can
        self._ones: dict[tuple[int, Any], Any] = {}  # sum_rows' ones vectors

    def _lt(self) -> CublasLt:
        """The cuBLASLt handle, made on first use, in the cuBLAS handle's compute mode."""
        if self._cublaslt is None:
            if self.backend.stream.is_capturing():  # its workspace would be the graph's
                raise CublasLtUnsupported("cuBLASLt's handle is made by an eager call, not "
                                          "during graph capture")
            self._cublaslt = CublasLt(self.xp, self.backend.stream)
        self._cublaslt.matmul_compute = self.cublas.matmul_compute
        return self._cublaslt
