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
    feeds_linear: bool = False  # y's only reader is the Linear right after (see layer_norm)
    from_linear: bool = False  # x was made by the Linear whose backward comes right after

    def forward(self, x: Any, w: Any, b: Any) -> Any:
        kernel = (self.kernels.layernorm_forward_for_linear if self.feeds_linear
                  else self.kernels.layernorm_forward)
        y, self.mean, self.rstd = kernel(x, w, b, self.eps)
        self.x, self.w = x, w
        return y

    def backward(self, grad: Any) -> Sequence[Any]:
        kernel = (self.kernels.layernorm_backward_for_linear if self.from_linear
                  else self.kernels.layernorm_backward)
        return kernel(grad, self.x, self.w, self.mean, self.rstd, self.grad_buffers(1, 2),
                      self.pending[0] if self.pending else None)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5,
               feeds_linear: bool = False, from_linear: bool = False) -> Tensor:
    """LayerNorm over the last axis. So that a device may make a Linear's GEMM operand in
    the LayerNorm's own pass (a PRECISION=fp8 run's FP8 codes): `feeds_linear`, the output
    goes only into the Linear or MLP called right after (layernorm_forward_for_linear);
    `from_linear`, x is the output of a Linear or MLP (its residual stream joined there, no
    op between), whose backward then comes right after this one's, and this LayerNorm and
    that residual are x's only readers (layernorm_backward_for_linear)."""
    return LayerNorm.apply(x, weight, bias, eps=eps, feeds_linear=feeds_linear,
                           from_linear=from_linear)

