"""Softmax cross-entropy on the GPU (xent.cu: one block per row, an online log-sum-exp), and
the tied LM head with its logits' rows padded for the tensor cores."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ...precision import accumulate_dtype
from .. import cuda_build
from .reference import CrossEntropyReference

_XENT = cuda_build.source(__file__, "xent.cu", cuda_build.dtype_defines(np.float32))
VOCAB_PAD = 64  # the LM head's logits rows are padded to a multiple of this many columns
# xent_fwd_grad's block: at 1024 threads two blocks fit an SM, so about 264 rows are read at a
# time (26 MB of GPT-2's bf16 logits), and a row's second read finds it in the 50 MB L2
_FUSED_THREADS = 1024


def _row_stride(x: Any) -> int:
    """Elements from one row of a 2-D array to the next (its rows may be padded)."""
    return x.strides[0] // x.itemsize


def _vec(x: Any) -> np.int32:
    """xent.cu's `vec`: 1 when every row of x starts 16-byte aligned (its vectors' rule)."""
    per = cuda_build.per_vector(x.dtype)
    return np.int32(bool(per) and _row_stride(x) % per == 0
                    and x.data.ptr % cuda_build.VEC_BYTES == 0)



class CudaCrossEntropy(CrossEntropyReference):
    calls = ("shared_gradient",)  # the head's two backward GEMMs read d(logits) both ways

    def cross_entropy(
        self, logits: Any, targets: Any, need_grad: bool, inplace: bool
    ) -> tuple[Any, Any]:
        """Forward reads the logits once (online log-sum-exp); backward writes d(logits)
        over them in one more pass, folding in the upstream gradient; both by 16-byte
        vectors where the rows are aligned (xent.cu). Rows may be padded
        (a (N, V) view of wider rows, as lm_head_xent makes): the pad is never read."""
        xp = self.xp
        if logits.strides[1] != logits.itemsize:
            logits = xp.ascontiguousarray(logits)
        targets = xp.ascontiguousarray(targets, dtype=np.int32)
        n, v = logits.shape
        lse = xp.empty(n, dtype=accumulate_dtype(logits.dtype))  # and the loss, in acc
        nll = xp.empty_like(lse)
        _XENT.typed("xent_fwd", logits.dtype)((n,), (512,), (logits, targets, lse, nll, np.int32(v),
                                                         np.int32(_row_stride(logits)),
                                                         _vec(logits)))
        state = (logits, targets, lse, inplace) if need_grad else None
        return nll.mean(), state

    def cross_entropy_backward(self, state: Any, g: Any) -> Any:
        logits, targets, lse, inplace = state
        n, v = logits.shape
        # the kernel reads and writes at one row stride
        out = logits if inplace else self.xp.empty((n, _row_stride(logits)), logits.dtype)[:, :v]
        g = self.xp.ascontiguousarray(g, dtype=lse.dtype)
        vec = np.int32(_vec(logits) and _vec(out))
        _XENT.typed("xent_bwd", logits.dtype)((n,), (512,), (logits, targets, lse, g, out,
                                                         np.int32(n), np.int32(v),
                                                         np.int32(_row_stride(logits)), vec))
        return out

    def lm_head_xent(
        self, h: Any, w: Any, targets: Any, need_grad: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        """The logits' rows are padded to a multiple of 64 columns. A vocabulary such as
        WikiText-2's 33,278 leaves every row of an unpadded (N, V) misaligned for the tensor
        cores, and cuBLAS runs the LM head's GEMMs markedly slower. Unless V is a multiple
        already, the weight is copied once per step into a (Vp, E) buffer whose pad rows are
        zero, so the pad logits are exactly 0: the softmax never reads them, and they add
        nothing to either gradient."""
        v, e = w.shape
        vp = -(-v // VOCAB_PAD) * VOCAB_PAD
        wp = w
        if vp != v:
            wp = self.xp.empty((vp, e), dtype=w.dtype)  # (Vp, E)
            wp[:v] = w
            wp[v:] = 0
        padded = mm(h, wp, transpose_b=True)  # (N, Vp)
        if need_grad and padded.dtype != np.float16:
            # the loss and (softmax - onehot) / N in one pass; backward scales by g on the
            # (N, E) side. Not float16: its gradients are loss-scaled, and (softmax -
            # onehot) / N alone would underflow float16 before the scale could save it.
            return self._loss_and_grad(padded[:, :v], targets), (None, h, wp, padded, v)
        loss, xent = self.cross_entropy(padded[:, :v], targets, need_grad, True)
        return loss, ((xent, h, wp, padded, v) if need_grad else None)

    def _loss_and_grad(self, logits: Any, targets: Any) -> Any:
        """The mean NLL, with (softmax - onehot) / N written over the logits (xent.cu's
        xent_fwd_grad): the backward's d(logits) for an upstream gradient of 1."""
        targets = self.xp.ascontiguousarray(targets, dtype=np.int32)
        n, v = logits.shape
        lse = self.xp.empty(n, dtype=accumulate_dtype(logits.dtype))
        nll = self.xp.empty_like(lse)
        _XENT.typed("xent_fwd_grad", logits.dtype)(
            (n,), (_FUSED_THREADS,), (logits, targets, lse, nll, np.int32(n), np.int32(v),
                           np.int32(_row_stride(logits)), _vec(logits)))
        return nll.mean()

    def _scaled(self, x: Any, g: Any, out: Any) -> Any:
        """out = x * g (a 0-d acc array), over 16-byte vectors where x and out allow."""
        vecs = cuda_build.vectors(x, out)
        if not vecs:
            return self.xp.multiply(x, g, out=out, casting="unsafe")
        _XENT.typed("scale_vec", x.dtype)(*cuda_build.vector_grid(vecs),
                                          (x, g, out, np.int64(vecs)))
        return out

    def lm_head_xent_backward(
        self, state: Any, g: Any, need_h: bool, need_w: bool, mm: Callable[..., Any],
        w_into: Any = None,
    ) -> tuple[Any, Any]:
        """The weight's gradient from the unpadded columns, added into its buffer (beta = 1)
        when given. After a forward that wrote d(logits) for g = 1 (no xent state), g
        scales dh and h instead: (N, E) each, not the (N, V) logits."""
        xent, h, wp, padded, v = state
        if xent is not None:
            self.cross_entropy_backward(xent, g)  # d(logits) over the logits; the pad stays 0
            g = None
        else:
            g = self.xp.ascontiguousarray(g, dtype=accumulate_dtype(h.dtype))
            if need_w:
                h = self._scaled(h, g, self.xp.empty_like(h))
        # both GEMMs read the whole of d(logits), as rows and transposed, unless the weight
        # gradient is added from its first V columns only (a view that is neither)
        both = need_h and need_w and (w_into is None or padded.shape[1] == v)
        with self.shared_gradient(padded) if both else contextlib.nullcontext():
            dh = mm(padded, wp, gradient="a") if need_h else None  # (N, E)
            dw = None
            if need_w and w_into is not None:
                mm(padded[:, :v].T, h, out=w_into, accumulate=True, gradient="a")  # (V, E)
            elif need_w:
                dw = mm(padded.T, h, gradient="a")[:v]  # (V, E)
        if dh is not None and g is not None:
            self._scaled(dh, g, dh)
        return dh, dw
