"""Softmax cross-entropy as ops: on given logits, and fused with the tied LM head."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ...autograd import Function, Tensor, grad_enabled


class CrossEntropy(Function):
    """Mean softmax cross-entropy over all positions (fused, numerically stable)."""

    name = "cross_entropy"
    need_grad: bool
    inplace: bool

    def forward(self, logits: Any, targets: Any) -> Any:
        self.shape = logits.shape
        flat = logits.reshape(-1, logits.shape[-1])
        loss, self.state = self.kernels.cross_entropy(
            flat, targets.reshape(-1), self.need_grad, self.inplace
        )
        return loss

    def backward(self, grad: Any) -> Sequence[Any]:
        return self.kernels.cross_entropy_backward(self.state, grad).reshape(self.shape), None


class LMHeadCrossEntropy(Function):
    """Mean cross-entropy of the tied LM head's logits h @ W.T, (N, E) x (V, E), as one op.

    The (N, V) logits dominate the step's memory traffic, so the backend gets GEMMs and
    softmax together and chooses how to avoid passes over them (the CPU never forms
    d(logits)). Its GEMMs are timed as matmul entries of their own, as in attention.
    """

    name = "lm_head_xent"
    need_grad: bool

    def forward(self, h: Any, w: Any, targets: Any) -> Any:
        loss, self.state = self.kernels.lm_head_xent(
            h, w, targets.reshape(-1), self.need_grad,
            functools.partial(self.matmul, phase="forward"),
        )
        return loss

    def backward(self, grad: Any) -> Sequence[Any]:
        dh, dw = self.kernels.lm_head_xent_backward(
            self.state, grad, self.needs_input_grad[0], self.needs_input_grad[1],
            functools.partial(self.matmul, phase="backward"), self.grad_buffers(1)[0],
        )
        return dh, dw, None


def cross_entropy(logits: Tensor, targets: Tensor, inplace: bool = False) -> Tensor:
    """Mean NLL; inplace=True lets the op overwrite `logits` (do not read them afterwards)."""
    need = grad_enabled() and logits.requires_grad
    return CrossEntropy.apply(logits, targets, need_grad=need, inplace=inplace)


def lm_head_cross_entropy(h: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """Mean NLL of logits = h @ weight.T (N, V) against targets (N,), without returning them."""
    need = grad_enabled() and (h.requires_grad or weight.requires_grad)
    return LMHeadCrossEntropy.apply(h, weight, targets, need_grad=need)

