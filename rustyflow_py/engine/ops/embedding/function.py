"""The embedding lookup, weight[idx], whose gradient is row-sparse (a RowGrad)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...autograd import Function, RowGrad, Tensor


class Embedding(Function):
    """weight[idx]; the gradient is row-sparse: a RowGrad, scatter-added into weight.grad."""

    name = "embedding"

    def forward(self, weight: Any, idx: Any) -> Any:
        self.idx, self.shape = idx, weight.shape
        return weight[idx]

    def backward(self, grad: Any) -> Sequence[Any]:
        return RowGrad(self.idx, grad, self.shape, self.kernels), None


def embedding(weight: Tensor, idx: Tensor) -> Tensor:
    return Embedding.apply(weight, idx)

