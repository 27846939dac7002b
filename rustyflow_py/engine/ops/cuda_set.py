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

from ..devices import gpu_capability
from ..policy import RunPolicy
from ..precision import check_fp8_gemms
from . import kernel_table  # noqa: F401  (enters every op folder into the table)
from .attention import cudnn
from .gemm.cublas import Cublas, in_compute
from .gemm.cublaslt import CublasLt, CublasLtUnsupported
from .gemm.fp8 import Fp8Gemms
from .table import KernelSet


class CudaKernels(KernelSet):
    """The GPU backend's kernel set: the table's "gpu" entries, and the state they share (the
    cuBLAS and cuBLASLt handles, cached ones vectors, a device 1.0). A view for another run
    policy shares the device's handles through views of them in its compute mode."""

    kind = "gpu"
    # what its families may take (Family.uses): the policy's GEMM compute mode and
    # epilogues, its FP8 GEMMs (PRECISION=fp8; else None), the cuBLAS and cuBLASLt handles,
    # the ones vectors and the device 1.0
    offers = (*KernelSet.offers, "cublas", "epilogues", "fp8", "_lt", "_ones", "_one")

    def __init__(self, backend: Any) -> None:
        self._device_cublas = Cublas(backend.xp, backend.stream)  # shared by the views
        self._device_lt: list[CublasLt] = []  # the device's cuBLASLt handle, once made
        self._ones: dict[tuple[int, Any], Any] = {}  # sum_rows' ones vectors
        super().__init__(backend)
        self._one = backend.xp.ones((), dtype=np.float32)  # the clip factor without clipping

    def _read_policy(self, policy: RunPolicy) -> None:
        """The GEMM compute mode (TF32 or not) and whether Linear layers go through
        cuBLASLt's epilogues where it can: the run's, on views of the device's handles."""
        super()._read_policy(policy)
        if policy.attention == "cudnn":
            cudnn.load()  # ATTENTION=cudnn without cuDNN: the error now, not in a step
        self.fp8 = None
        if policy.matmul_compute == "fp8":  # on a GPU without FP8 GEMMs: the error now
            check_fp8_gemms(self.backend.hardware(), gpu_capability(self.backend.index))
            self.fp8 = Fp8Gemms(self._lt, delayed=policy.fp8_scaling == "delayed")
        self.epilogues = policy.epilogues
        self.cublas = in_compute(self._device_cublas, policy.matmul_compute)
        self._cublaslt: CublasLt | None = None  # this view's, on first use

    def _lt(self) -> CublasLt:
        """The cuBLASLt handle (the device's, made on first use) in the policy's compute
        mode."""
        if self._cublaslt is None:
            if not self._device_lt:
                if self.backend.stream.is_capturing():  # its workspace would be the graph's
                    raise CublasLtUnsupported("cuBLASLt's handle is made by an eager call, "
                                              "not during graph capture")
                self._device_lt.append(CublasLt(self.xp, self.backend.stream))
            self._cublaslt = in_compute(self._device_lt[0], self.cublas.matmul_compute)
        return self._cublaslt
