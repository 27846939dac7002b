"""GELU (tanh approximation) as an op, with the preceding bias add fused in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...autograd import Function, Tensor


class Gelu(Function):
    """GELU, tanh approximation; with a second input, bias + GELU fused."""

    name = "gelu"

    def forward(self, x: Any, bias: Any = None) -> Any:
        self.x, self.bias = x, bias
        return self.kernels.gelu_forward(x, bias)

    def backward(self, grad: Any) -> Sequence[Any]:
        if self.bias is None:
            return (self.kernels.gelu_backward(grad, self.x, None),)
        (into,) = self.grad_buffers(1)
        dx = self.kernels.gelu_backward(grad, self.x, self.bias, into)
        return dx, None if into is not None else self.kernels.sum_rows(
            dx.reshape(-1, dx.shape[-1]))


def gelu(x: Tensor, bias: Tensor | None = None) -> Tensor:
    return Gelu.apply(x) if bias is None else Gelu.apply(x, bias)

