"""Data movement without arithmetic: reshape, transpose, basic indexing (and `split`,
built on it) and sum over axes (and `mean`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...autograd import Function, Tensor
from ..elementwise.function import mul


class Reshape(Function):
    name = "reshape"
    shape: tuple[int, ...]

    def forward(self, x: Any) -> Any:
        self.in_shape = x.shape
        return x.reshape(self.shape)

    def backward(self, grad: Any) -> Sequence[Any]:
        return (grad.reshape(self.in_shape),)


class Transpose(Function):
    name = "transpose"
    axes: tuple[int, ...] | None

    def forward(self, x: Any) -> Any:
        self.axes = self.axes or tuple(reversed(range(x.ndim)))
        return x.transpose(self.axes)

    def backward(self, grad: Any) -> Sequence[Any]:
        inverse = [0] * len(self.axes)
        for i, a in enumerate(self.axes):
            inverse[a] = i
        return (grad.transpose(inverse),)


class Index(Function):
    """x[key] for basic (slice/int) indexing; backward scatters into zeros."""

    name = "index"
    key: Any

    def forward(self, x: Any) -> Any:
        self.in_shape, self.in_dtype = x.shape, x.dtype
        return x[self.key]

    def backward(self, grad: Any) -> Sequence[Any]:
        dx = self.xp.zeros(self.in_shape, dtype=self.in_dtype)
        dx[self.key] = grad
        return (dx,)


class Sum(Function):
    name = "sum"
    axis: int | tuple[int, ...] | None
    keepdims: bool

    def forward(self, x: Any) -> Any:
        self.in_shape = x.shape
        return x.sum(axis=self.axis, keepdims=self.keepdims)

    def backward(self, grad: Any) -> Sequence[Any]:
        if not self.keepdims and self.axis is not None:
            axes = (self.axis,) if isinstance(self.axis, int) else self.axis
            grad = self.xp.expand_dims(grad, tuple(a % len(self.in_shape) for a in axes))
        return (self.xp.broadcast_to(grad, self.in_shape),)


def reshape(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    return Reshape.apply(x, shape=tuple(shape))


def transpose(x: Tensor, axes: tuple[int, ...] | None = None) -> Tensor:
    return Transpose.apply(x, axes=tuple(axes) if axes else None)


def index(x: Tensor, key: Any) -> Tensor:
    return Index.apply(x, key=key)


def split(x: Tensor, sections: int, axis: int = -1) -> list[Tensor]:
    """Split into equal parts along `axis` (each part a view with its own gradient)."""
    n = x.shape[axis]
    if n % sections:
        raise ValueError(f"split: axis of size {n} is not divisible into {sections} parts")
    step, axis = n // sections, axis % x.ndim
    lead = (slice(None),) * axis
    return [index(x, (*lead, slice(i * step, (i + 1) * step))) for i in range(sections)]


def sum(x: Tensor, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Tensor:
    return Sum.apply(x, axis=axis, keepdims=keepdims)


def mean(x: Tensor, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Tensor:
    total = Sum.apply(x, axis=axis, keepdims=keepdims)
    return mul(total, total.data.size / x.data.size)



def _reshape(x: Tensor, *shape: Any) -> Tensor:
    return reshape(x, shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape)


def _transpose(x: Tensor, *axes: int) -> Tensor:
    return transpose(x, axes or None)

