"""The GEMM family's reference kernels: matmul, the bias gradients' column sums and the
Linear layers (the GEMM, then the bias, with GELU, as kernels of their own)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ...precision import accumulate_dtype
from ..table import Family, add_into


class GemmReference(Family):
    """matmul, sum_rows, linear, linear_grads, linear_dgelu, kept_for_backward,
    shared_gradient, fp8_tensors against `self.xp`."""

    calls = ("gelu_forward", "gelu_backward")  # the Linear layers' GELU

    def matmul(self, a: Any, b: Any, *, transpose_b: bool = False, out: Any = None,
               accumulate: bool = False, gradient: str | None = None) -> Any:
        b = self.xp.swapaxes(b, -1, -2) if transpose_b else b
        if accumulate:
            out += self.xp.matmul(a, b)
            return out
        return self.xp.matmul(a, b, out=out)

    def kept_for_backward(self, x: Any, w: Any) -> tuple[Any, Any]:
        """Here the arrays themselves."""
        return x, w

    def shared_gradient(self, g: Any) -> contextlib.AbstractContextManager[None]:
        """Here each GEMM reads g as it is: nothing to share."""
        return contextlib.nullcontext()

    def fp8_tensors(self) -> list[dict[str, Any]] | None:
        """Here no GEMM casts to FP8."""
        return None

    def sum_rows(self, x: Any, into: Any = None) -> Any:
        sums = x.sum(axis=0, dtype=accumulate_dtype(x.dtype))
        if into is not None:
            return add_into(into, sums)
        return sums.astype(x.dtype, copy=False)

    # ---- Linear layers: here the GEMM, then the bias (with GELU) as a kernel of its own ------
    def linear(self, x: Any, w: Any, b: Any, gelu: bool, gemm: Callable[..., Any],
               residual: Any = None) -> tuple[Any, Any]:
        z = gemm(self.matmul, x, w)  # (..., N)
        if gelu:  # the state: the GELU's input, less the bias the GELU kernels add themselves
            return self.gelu_forward(z, b), (z, b)
        z += b
        if residual is not None:
            z += residual
        return z, None

    def linear_grads(self, x: Any, g: Any, gemm: Callable[..., Any],
                     into: tuple[Any, Any] = (None, None), bias: bool = True
                     ) -> tuple[Any, Any]:
        g2 = g.reshape(-1, g.shape[-1])  # (rows, N)
        xt = x.reshape(-1, x.shape[-1]).T  # (K, rows)
        dw = None
        if into[0] is None:
            dw = gemm(self.matmul, xt, g2, gradient="b")
        else:
            gemm(self.matmul, xt, g2, out=into[0], accumulate=True, gradient="b")
        return dw, self.sum_rows(g2, into[1]) if bias else None

    def linear_dgelu(self, g: Any, w: Any, state: Any, gemm: Callable[..., Any],
                     db_into: Any = None) -> Any:
        pre, bias = state  # bias None: pre already has it (a fused backend's state)
        dh = gemm(self.matmul, g, w, transpose_b=True, gradient="a")  # (..., 4E)
        return self._dgelu(dh, pre, bias, db_into)

    def _dgelu(self, dh: Any, pre: Any, bias: Any, db_into: Any) -> Any:
        """linear_dgelu's GELU backward of dh, where a device may make dpre otherwise."""
        return self.gelu_backward(dh, pre, bias, db_into)
