"""Muon (Jordan et al. 2024) for the 2-D hidden weights: momentum, orthogonalised by quintic
Newton-Schulz iterations (batched GEMMs), applied with decoupled weight decay (muon.cu)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import cuda_build
from .common import CudaOptimizerFamily, OptimizerFamily
from .norm import sumsq

# The quintic Newton-Schulz iteration's coefficients (Muon: Jordan et al. 2024)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
_SRC = cuda_build.source(__file__, "muon.cu")


@functools.cache
def _kernels() -> dict[str, Any]:
    """muon.cu's device functions as ElementwiseKernels."""
    ew = cuda_build.elementwise
    return {
        "muon_momentum": ew(_SRC, "T g, float32 scale, float32 mu, float32 cmu, bool nesterov",
                            "T buf, T upd",
                            "rf_muon_momentum_update(g, scale, mu, cmu, nesterov, buf, upd)",
                            "rf_muon_momentum"),
        "muon_apply": ew(_SRC, "T u, float32 lr, float32 wd, float32 f", "T p",
                         "rf_muon_apply_update(u, lr, wd, f, p)", "rf_muon_apply"),
        "ns_axpby": ew(_SRC, "T x, float32 a, float32 b", "T y",  # y <- a x + b y
                       "rf_ns_axpby_update(x, a, b, y)", "rf_ns_axpby"),
        "div_eps": ew(_SRC, "T x, T n, float32 eps", "T y", "y = rf_div_eps_value(x, n, eps)",
                      "rf_div_eps"),
    }


class MuonReference(OptimizerFamily):
    def muon_momentum(
        self, g: Any, buf: Any, out: Any, scale: Any, momentum: float, nesterov: bool,
    ) -> None:
        if scale is not None:
            g = g * scale.astype(g.dtype)
        buf += (1.0 - momentum) * (g - buf)
        if nesterov:
            out[...] = g + momentum * (buf - g)
        else:
            out[...] = buf

    def newton_schulz(self, x: Any, steps: int, eps: float, mm: Callable[..., Any]) -> Any:
        xp = self.xp
        a, b, c = NS_COEFFICIENTS
        norm = xp.sqrt((x * x).sum(axis=(-2, -1), keepdims=True))
        x = x / (norm + eps)
        for _ in range(steps):
            gram = mm(x, x, transpose_b=True)
            poly = mm(gram, gram)
            poly *= c
            poly += b * gram
            y = mm(poly, x)
            y += a * x
            x = y
        return x

    def muon_apply(self, p: Any, update: Any, lr: Any, weight_decay: float,
                   factor: float) -> None:
        lr = lr.astype(p.dtype)
        if weight_decay:
            p *= 1.0 - lr * weight_decay
        p -= (lr * factor).astype(p.dtype) * update


class CudaMuon(MuonReference, CudaOptimizerFamily):
    def muon_momentum(
        self, g: Any, buf: Any, out: Any, scale: Any, momentum: float, nesterov: bool,
    ) -> None:
        _kernels()["muon_momentum"](g, self._scale(scale), np.float32(momentum),
                                        np.float32(1.0 - momentum), bool(nesterov), buf, out)

    def newton_schulz(self, x: Any, steps: int, eps: float, mm: Any) -> Any:
        """Two fused launches for the norm, then per iteration three GEMMs (through `mm`)
        and two in-place axpby launches; the work buffers come from the pool once."""
        ew, xp = _kernels(), self.xp
        a, b, c = NS_COEFFICIENTS
        norm = sumsq()(x, axis=(x.ndim - 2, x.ndim - 1), keepdims=True)
        x = ew["div_eps"](x, norm, np.float32(eps))
        rows = x.shape[-2]
        gram = xp.empty((*x.shape[:-1], rows), x.dtype)
        poly, prod = xp.empty_like(gram), xp.empty_like(x)
        for _ in range(steps):
            mm(x, x, transpose_b=True, out=gram)
            mm(gram, gram, out=poly)
            ew["ns_axpby"](gram, np.float32(b), np.float32(c), poly)  # b A + c A @ A
            mm(poly, x, out=prod)
            ew["ns_axpby"](prod, np.float32(1.0), np.float32(a), x)  # a X + B @ X
        return x

    def muon_apply(self, p: Any, update: Any, lr: Any, weight_decay: float,
                   factor: float) -> None:
        _kernels()["muon_apply"](update, lr, np.float32(weight_decay), np.float32(factor),
                                     p)
