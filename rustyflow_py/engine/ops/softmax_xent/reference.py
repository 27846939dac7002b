"""Softmax cross-entropy's reference kernels, and the tied LM head fused with it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ...precision import accumulate_dtype, is_16bit
from ..table import Family, add_into
from ..widen import wide


class CrossEntropyReference(Family):
    uses = ("head_chunk",)  # LM_HEAD_CHUNK: the LM head's rows a chunk (0: all at once)

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
        """All N rows at once, or, with LM_HEAD_CHUNK rows a chunk, chunk by chunk: each
        chunk's logits exist only while its own loss and both its gradients are made, so the
        head holds (chunk, V) logits, not (N, V), at the price of dW's chunk sums (V, E)."""
        n, rows = h.shape[0], self.head_chunk
        wp = self._head_weight(w)  # once for every chunk
        if not rows or rows >= n:
            return self._lm_head(h, wp, w.shape[0], targets, need_grad, mm)
        return self._chunked(h, wp, w.shape, targets, need_grad, mm)

    def _chunked(self, h: Any, wp: Any, w_shape: tuple[int, int], targets: Any,
                 need_grad: bool, mm: Callable[..., Any]) -> tuple[Any, Any]:
        """The loss, and with need_grad the gradients of its sum over rows (not its mean:
        backward scales both by g / N), made in the forward, since a chunk's logits are gone
        by backward. Each chunk's backward gets g = its row count, so that its kernels'
        own mean over the chunk cancels: float16 d(logits) are then softmax - onehot, not
        that over N, which would underflow before the loss scale came."""
        xp, n, rows = self.xp, h.shape[0], self.head_chunk
        acc = accumulate_dtype(h.dtype)
        loss = xp.zeros((), acc)
        dh = xp.empty_like(h) if need_grad else None  # (N, E)
        dw = xp.zeros(w_shape, acc) if need_grad else None  # (V, E), chunks added
        for r0 in range(0, n, rows):
            part = slice(r0, min(r0 + rows, n))
            count = part.stop - part.start
            mean, state = self._lm_head(h[part], wp, w_shape[0], targets[part], need_grad, mm)
            loss += mean * count
            if need_grad:
                # g made on the device (a fill: a captured host copy would replay later
                # contents of its staging buffer)
                dh[part] = self._lm_head_backward(state, xp.full((), count, acc), True, True,
                                                  mm, dw)[0]
            del state  # the chunk's logits, before the next chunk's
        loss /= n
        return loss, (HeadChunks(dh, dw) if need_grad else None)

    def _head_weight(self, w: Any) -> Any:
        """The head's weight as _lm_head reads it (a device may pad its rows)."""
        return w

    def _lm_head(self, h: Any, wp: Any, v: int, targets: Any, need_grad: bool,
                 mm: Callable[..., Any]) -> tuple[Any, Any]:
        """Here: the GEMM, then cross_entropy in place on the logits (a backend may fuse the
        two more tightly). `wp` is _head_weight's, of which the first `v` rows are w."""
        logits = mm(h, wp, transpose_b=True)  # (N, V)
        loss, state = self.cross_entropy(logits, targets, need_grad, True)
        return loss, ((state, h, wp) if need_grad else None)

    def lm_head_xent_backward(
        self, state: Any, g: Any, need_h: bool, need_w: bool, mm: Callable[..., Any],
        w_into: Any = None,
    ) -> tuple[Any, Any]:
        if not isinstance(state, HeadChunks):
            return self._lm_head_backward(state, g, need_h, need_w, mm, w_into)
        summed_dh, dw = state  # the gradients of the loss's sum over the N rows
        scale = self.xp.asarray(g / summed_dh.shape[0], dtype=dw.dtype)
        dh = self._scaled(summed_dh, scale, summed_dh) if need_h else None
        if not need_w:
            return dh, None
        if w_into is not None:
            self._add_scaled(w_into, dw, scale)
            return dh, None
        return dh, self._scaled(dw, scale, dw).astype(summed_dh.dtype)

    def _scaled(self, x: Any, g: Any, out: Any) -> Any:
        """out = x * g (a 0-d array)."""
        return self.xp.multiply(x, g, out=out, casting="unsafe")

    def _add_scaled(self, into: Any, x: Any, g: Any) -> None:
        """into += x * g (a 0-d array)."""
        into += x * g

    def _lm_head_backward(
        self, state: Any, g: Any, need_h: bool, need_w: bool, mm: Callable[..., Any],
        w_into: Any = None,
    ) -> tuple[Any, Any]:
        xent, h, w = state
        dlogits = self.cross_entropy_backward(xent, g)
        dh = mm(dlogits, w, gradient="a") if need_h else None
        dw = mm(dlogits.T, h, gradient="a") if need_w else None
        return dh, add_into(w_into, dw)


class HeadChunks(NamedTuple):
    """lm_head_xent's state after a chunked forward: the gradients of the loss's sum over
    the N rows, dh in h's dtype and dW in its accumulation dtype."""

    dh: Any  # (N, E)
    dw: Any  # (V, E)
