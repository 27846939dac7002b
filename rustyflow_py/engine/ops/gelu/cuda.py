"""GELU on the GPU: CuPy ElementwiseKernels calling gelu.cu's device functions."""

from __future__ import annotations

import functools
from typing import Any

from .. import cuda_build
from .reference import GeluReference

_GELU = cuda_build.source(__file__, "gelu.cu")


@functools.cache
def _kernels() -> dict[str, Any]:
    """GELU loads and stores T and computes in A = rf_acc<T>::type, as the RawKernels do."""
    return {
        "gelu_fwd": cuda_build.elementwise(_GELU, "T x, T b", "T y",
                                           "y = rf_gelu_forward(x, b)", "rf_gelu_fwd"),
        "gelu_bwd": cuda_build.elementwise(_GELU, "T g, T x, T b", "T dx",
                                           "dx = rf_gelu_backward(g, x, b)", "rf_gelu_bwd"),
    }


class CudaGelu(GeluReference):
    def gelu_forward(self, x: Any, bias: Any | None) -> Any:
        b = bias if bias is not None else x.dtype.type(0)
        return _kernels()["gelu_fwd"](x, b)

    def gelu_backward(self, g: Any, x: Any, bias: Any | None) -> Any:
        b = bias if bias is not None else x.dtype.type(0)
        return _kernels()["gelu_bwd"](g, x, b)
