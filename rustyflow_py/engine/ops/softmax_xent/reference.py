"""Softmax cross-entropy's reference kernels, and the tied LM head fused with it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...precision import is_16bit
from ..table import Family, add_into
from ..widen import wide


class CrossEntropyReference(Family):

    def cross_entropy(
        self, logits: Any, targets: Any, need_grad: bool, inplace: bool
    ) -> tuple[Any, Any]:
        """Here the state is d(loss)/d(logits) itself, made in the same pass as the loss; with
        inplace=True it reuses the logits buffer, so the largest activation exists once.
        For 16-bit logits that state is rounded to their dtype, as d(logits) will be.
        """
        if is_16bit(logits.dtype):
            loss, e = CrossEntropyReference.cross_entropy(self, *wide(logits), targets,
                                                          need_grad, True)
            return loss, (e.astype(logits.dtype) if need_grad else None)
        xp = self.xp
        n = logits.shape[0]
        rows = xp.arange(n)
        e = logits if inplace else logits.copy()
        e -= e.max(axis=1, keepdims=True)
        picked = e[rows, targets]  # shifted logit of the target, (N,)
        xp.exp(e, out=e)
        s = e.sum(axis=1)  # (N,)
        loss = (xp.log(s) - picked).mean()
        if not need_grad:
            return loss, None
        e *= (1.0 / (s * n))[:, None]
        e[rows, targets] -= 1.0 / n
        return loss, e

    def cross_entropy_backward(self, state: Any, g: Any) -> Any:
        state *= g
        return state

    # ---- tied LM head + cross-entropy: loss of logits = h @ w.T ---------------------------------
    def lm_head_xent(
        self, h: Any, w: Any, targets: Any, need_grad: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        """Here: the GEMM, then cross_entropy in place on the logits (a backend may fuse the
        two more tightly)."""
        logits = mm(h, w, transpose_b=True)  # (N, V)
        loss, state = self.cross_entropy(logits, targets, need_grad, True)
        return loss, ((state, h, w) if need_grad else None)

    def lm_head_xent_backward(
        self, state: Any, g: Any, need_h: bool, need_w: bool, mm: Callable[..., Any],
        w_into: Any = None,
    ) -> tuple[Any, Any]:
        xent, h, w = state
        dlogits = self.cross_entropy_backward(xent, g)
        dh = mm(dlogits, w, gradient="a") if need_h else None
        dw = mm(dlogits.T, h, gradient="a") if need_w else None
        return dh, add_into(w_into, dw)
