"""Elementwise arithmetic (a + b, a * b, with broadcasting, and with a Python number), and
`unbroadcast`, which every op whose inputs broadcast uses to sum a gradient back down."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...autograd import Function, Tensor


def unbroadcast(grad: Any, shape: tuple[int, ...], kernels: Any = None) -> Any:
    """Sum `grad` down to `shape`, undoing NumPy broadcasting (a bias: fused column sums)."""
    if kernels is not None and len(shape) == 1 and grad.ndim >= 2 and grad.shape[-1] == shape[0]:
        return kernels.sum_rows(grad.reshape(-1, shape[0]))
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad


class Add(Function):
    name = "add"

    def forward(self, a: Any, b: Any) -> Any:
        self.shapes = (a.shape, b.shape)
        return self.kernels.add(a, b)

    def backward(self, grad: Any) -> Sequence[Any]:
        return (unbroadcast(grad, self.shapes[0], self.kernels),
                unbroadcast(grad, self.shapes[1], self.kernels))


class Mul(Function):
    name = "mul"

    def forward(self, a: Any, b: Any) -> Any:
        self.a, self.b = a, b
        return a * b

    def backward(self, grad: Any) -> Sequence[Any]:
        da = unbroadcast(grad * self.b, self.a.shape) if self.needs_input_grad[0] else None
        db = unbroadcast(grad * self.a, self.b.shape) if self.needs_input_grad[1] else None
        return da, db


class ScalarAdd(Function):
    """x + c for a Python number c (no device copy of the constant)."""

    name = "add"
    c: float

    def forward(self, x: Any) -> Any:
        return x + self.c

    def backward(self, grad: Any) -> Sequence[Any]:
        return (grad,)


class ScalarMul(Function):
    name = "mul"
    c: float

    def forward(self, x: Any) -> Any:
        return x * self.c

    def backward(self, grad: Any) -> Sequence[Any]:
        return (grad * self.c,)


def add(a: Tensor, b: Tensor | float) -> Tensor:
    return Add.apply(a, b) if isinstance(b, Tensor) else ScalarAdd.apply(a, c=float(b))


def mul(a: Tensor, b: Tensor | float) -> Tensor:
    return Mul.apply(a, b) if isinstance(b, Tensor) else ScalarMul.apply(a, c=float(b))



def _sub(a: Tensor, b: Tensor | float) -> Tensor:
    return add(a, mul(b, -1.0) if isinstance(b, Tensor) else -b)

