"""The precision policy: which dtype each kind of array lives and is computed in, in one place.

A run's PRECISION names a `Precision`. The master flat parameter buffer, its gradients and the
optimizer state are stored in `storage` (so small updates are not lost to rounding);
activations and GEMM inputs are in `compute`; GEMMs run in the cuBLAS compute mode
`matmul_compute`; and every reduction (LayerNorm mean and variance, softmax max and sum,
log-sum-exps, dot products) accumulates in `accumulate`, which is also the dtype of the
statistics kernels keep for backward (LayerNorm mean/rstd, attention and cross-entropy
log-sum-exps, per-row losses).

Kernels see only arrays, so they derive the accumulation type from the storage type of their
inputs with `accumulate_dtype`: float64 for float64, float32 for float32 and for the 16-bit
floats. fp32 and tf32 differ only in the GEMM mode, fp64 is for gradient checks. bf16 and fp16
are mixed precision (PyTorch autocast's split): parameters, gradients and optimizer state stay
float32 and the forward runs on a 16-bit copy of the parameters refreshed once per step, so
activations and GEMM inputs are 16-bit while GEMMs and reductions accumulate in float32. fp16's
narrow exponent range needs loss scaling (`loss_scaling`); bfloat16 has float32's range.
fp8 is bf16 with the Linear layers' GEMMs (and the tied LM head's) on FP8 tensor cores: their
operands cast to FP8 under per-tensor scaling (e4m3 for activations and weights, e5m2 for
gradients; current or delayed, FP8_SCALING), accumulating in fp32 (engine/ops/gemm/fp8.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

import numpy as np

from ..errors import ConfigError, install_command

MatmulCompute = Literal["fp32", "tf32", "fp64", "fp8"]

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


@dataclasses.dataclass(frozen=True)
class Precision:
    """Where parameters live, what activations are computed in, how GEMMs and reductions run.

    `matmul_compute` applies to GEMMs of `compute`-typed operands: "tf32" lets float32 GEMMs
    use TF32 tensor cores; float64 operands always run in fp64 and 16-bit ones accumulate in
    fp32 whatever it says; "fp8" runs bfloat16 operands' 2-D GEMMs in FP8.
    """

    name: str
    storage: np.dtype
    compute: np.dtype
    matmul_compute: MatmulCompute
    accumulate: np.dtype

    @classmethod
    def of(cls, name: str) -> Precision:
        """The policy PRECISION=`name` selects."""
        if name in ("bf16", "fp8"):
            return cls(name, _F32, bfloat16(f"PRECISION={name}"),
                       "fp8" if name == "fp8" else "fp32", _F32)
        try:
            return _POLICIES[name]
        except KeyError:
            raise ValueError(f"unknown precision {name!r}: expected one of "
                             f"{', '.join(NAMES)}") from None

    @property
    def mixed(self) -> bool:
        """Whether the forward runs on a compute copy of the parameters."""
        return self.compute != self.storage

    @property
    def loss_scaling(self) -> bool:
        """Whether gradients need dynamic loss scaling (float16's range is narrow)."""
        return self.compute == np.float16


_POLICIES = {
    "fp32": Precision("fp32", _F32, _F32, "fp32", _F32),
    "tf32": Precision("tf32", _F32, _F32, "tf32", _F32),
    "fp64": Precision("fp64", _F64, _F64, "fp64", _F64),
    "fp16": Precision("fp16", _F32, np.dtype(np.float16), "fp32", _F32),
}
NAMES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp64")
GPU_ONLY = ("bf16", "fp16", "fp8")  # mixed precision: the CPU kernels have no 16-bit GEMMs
FP8_CAPABILITY = (8, 9)  # the first compute capability with FP8 tensor cores (Ada, Hopper)


def has_fp8_gemms(capability: tuple[int, int]) -> bool:
    """Whether a GPU of this compute capability has FP8 tensor cores."""
    return capability >= FP8_CAPABILITY


def check_fp8_gemms(gpu: str, capability: tuple[int, int]) -> None:
    """PRECISION=fp8 on a GPU without FP8 tensor cores: a ConfigError naming the GPU and what
    to train with instead."""
    if not has_fp8_gemms(capability):
        major, minor = capability
        raise ConfigError(f"PRECISION=fp8 needs FP8 tensor cores (compute capability 8.9 or "
                         f"later: Ada, Hopper, Blackwell), and this GPU, {gpu}, is {major}."
                         f"{minor}: train with PRECISION=bf16")


def bfloat16(needed_by: str = "PRECISION=bf16") -> np.dtype:
    """NumPy's bfloat16 (from ml_dtypes, which CuPy uses for it too), imported on first use:
    only mixed-precision GPU runs need it. `needed_by`: the setting the error names."""
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError(f"{needed_by} needs the ml_dtypes package (bf16's NumPy dtype), "
                          f"which the gpu extra brings: {install_command('gpu')}") from None
    return np.dtype(ml_dtypes.bfloat16)


@functools.cache
def dtype_name(dtype: Any) -> str:
    """`np.dtype(dtype).name`, kept per dtype: NumPy builds a dtype's name in Python (a dozen
    calls) on every access, and the GEMM and attention launchers ask for it on every call."""
    return np.dtype(dtype).name


def is_16bit(dtype: Any) -> bool:
    """Whether a float dtype is one of the 16-bit types (float16, bfloat16), which kernels
    load and store as is but compute and accumulate in float32."""
    return np.dtype(dtype).itemsize == 2


def accumulate_dtype(dtype: Any) -> np.dtype:
    """The dtype reductions over `dtype` data accumulate in, and statistics are kept in."""
    return _F64 if np.dtype(dtype) == _F64 else _F32
