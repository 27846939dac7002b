"""LayerNorm over the last axis as an op."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...autograd import Function, Tensor


class LayerNorm(Function):
    """LayerNorm over the last axis. In a pre-LN transformer its input also feeds the
    residual stream, whose gradient arrives first in backward: it joins dx in the same pass
    (`joins`), not in an add of its own."""

    name = "layernorm"
    joins = (0,)
    eps: float

    def forward(self, x: Any, w: Any, b: Any) -> Any:
        y, self.mean, self.rstd = self.kernels.layernorm_forward(x, w, b, self.eps)
        self.x, self.w = x, w
        return y

    def backward(self, grad: Any) -> Sequence[Any]:
        return self.kernels.layernorm_backward(grad, self.x, self.w, self.mean, self.rstd,
                                               self.grad_buffers(1, 2),
                                               self.pending[0] if self.pending else None)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    return LayerNorm.apply(x, weight, bias, eps=eps)

