"""Softmax cross-entropy on the GPU (xent.cu: one block per row, an online log-sum-exp), and
the tied LM head with its logits' rows padded for the tensor cores."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ...precision import accumulate_dtype, dtype_name
from .. import cuda_build
from ..fp8 import cuda as casts
from ..fp8.formats import E5M2, Fp8Tensor
from ..gemm.fp8 import Fp8Operand
from .reference import CrossEntropyReference

_XENT = cuda_build.source(__file__, "xent.cu", cuda_build.dtype_defines(np.float32))
VOCAB_PAD = 64  # the LM head's logits rows are padded to a multiple of this many columns
# xent_fwd_grad's block: at 1024 threads two blocks fit an SM, so about 264 rows are read at a
# time (26 MB of GPT-2's bf16 logits), and a row's second read finds it in the 50 MB L2
_FUSED_THREADS = 1024
HEAD_BLOCKS = 4  # PRECISION=fp8: the head's logits are made this many blocks of rows at a time


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
    uses = ("fp8",)  # a PRECISION=fp8 run's GEMMs (else None): the head's gradient in e5m2

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

    def _head_weight(self, w: Any) -> Any:
        """The logits' rows are padded to a multiple of 64 columns. A vocabulary such as
        WikiText-2's 33,278 leaves every row of an unpadded (N, V) misaligned for the tensor
        cores, and cuBLAS runs the LM head's GEMMs markedly slower. Unless V is a multiple
        already, the weight is copied once per step into a (Vp, E) buffer whose pad rows are
        zero, so the pad logits are exactly 0: the softmax never reads them, and they add
        nothing to either gradient."""
        v, e = w.shape
        vp = -(-v // VOCAB_PAD) * VOCAB_PAD
        if vp == v:
            return w
        wp = self.xp.empty((vp, e), dtype=w.dtype)  # (Vp, E)
        wp[:v] = w
        wp[v:] = 0
        return wp

    def _lm_head(
        self, h: Any, wp: Any, v: int, targets: Any, need_grad: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        if (need_grad and self.fp8 is not None and dtype_name(h.dtype) == "bfloat16"
                and h.shape[0] % 16 == 0):
            # the head's FP8 GEMMs read the gradient as codes: the bf16 logits are not kept
            loss, codes = self._loss_and_codes(h, wp, targets, v, mm)
            return loss, (None, h, wp, codes, v)
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

    def _loss_and_codes(self, h: Any, wp: Any, targets: Any, v: int, mm: Callable[..., Any]
                        ) -> tuple[Any, Fp8Operand]:
        """The logits h @ Wp^T with _loss_and_grad's work for a PRECISION=fp8 run: the
        gradient (N, Vp) as e5m2 codes scaled by its bound 1 / N (xent_fwd_grad_e5m2), the
        pad columns zero. It needs no amax pass and no cast; the codes (a byte a logit)
        replace the bf16 gradient (two), and the bf16 logits are not kept for backward. They
        are made HEAD_BLOCKS blocks of rows at a time, each block's codes written before the
        next block's logits exist, so that the codes are held beside one block of bf16
        logits, not all of them (which took more memory than a bf16 run's head)."""
        xp = self.xp
        targets = xp.ascontiguousarray(targets, dtype=np.int32)
        n, vp = h.shape[0], wp.shape[0]
        lse = xp.empty(n, dtype=np.float32)
        nll = xp.empty_like(lse)
        codes = xp.empty((n, vp), np.uint8)
        block = n // HEAD_BLOCKS if n % (16 * HEAD_BLOCKS) == 0 else n  # FP8 GEMMs: 16 rows
        h_codes, w_codes = self.fp8.operand(h), self.fp8.operand(wp)  # once for all blocks
        for r0 in range(0, n, block):
            rows = slice(r0, r0 + block)
            logits = mm(h_codes.block(rows), w_codes, transpose_b=True)  # (block, Vp)
            _XENT.typed("xent_fwd_grad_e5m2", logits.dtype)(
                (block,), (_FUSED_THREADS,), (logits, targets[rows], lse[rows], nll[rows],
                                              codes[rows], np.int32(v),
                                              np.int32(_row_stride(logits)), np.int32(vp),
                                              _vec(logits)))
            del logits  # before the next block's
        scale_inv = xp.full(1, 1.0 / (E5M2.max * n), np.float32)
        return nll.mean(), Fp8Operand(Fp8Tensor(codes, scale_inv, E5M2), None, h.dtype)

    def _head_grads(self, padded: Any, wp: Any, h: Any, v: int, need_h: bool, need_w: bool,
                    mm: Callable[..., Any], w_into: Any) -> tuple[Any, Any]:
        """dh = d(logits) @ Wp and dW = d(logits)[:, :V]^T @ h from the bf16 d(logits). Both
        GEMMs read all of it, as rows and transposed, unless dW is added from its first V
        columns only (a view that is neither): then it is not a shared gradient."""
        both = need_h and need_w and (w_into is None or padded.shape[1] == v)
        with self.shared_gradient(padded) if both else contextlib.nullcontext():
            dh = mm(padded, wp, gradient="a") if need_h else None  # (N, E)
            if need_w and w_into is not None:
                mm(padded[:, :v].T, h, out=w_into, accumulate=True, gradient="a")  # (V, E)
                return dh, None
            return dh, (mm(padded.T, h, gradient="a")[:v] if need_w else None)  # (V, E)

    def _head_grads_e5m2(self, codes: Fp8Operand, wp: Any, h: Any, v: int, need_h: bool,
                         need_w: bool, mm: Callable[..., Any], w_into: Any
                         ) -> tuple[Any, Any]:
        """dh = d(logits) @ Wp and dW = d(logits)[:, :V]^T @ h from the forward's e5m2 codes:
        their transpose's first V rows (V, N) for dW, by one byte transpose."""
        dh = mm(codes, wp, gradient="a") if need_h else None  # (N, E)
        if not need_w:
            return dh, None
        t = casts.transpose_codes(codes.q)  # (Vp, N)
        cols = Fp8Operand(Fp8Tensor(t.codes[:v], t.scale_inv, E5M2), None, codes.dtype)
        dw = mm(cols, h, out=w_into, accumulate=w_into is not None, gradient="a")  # (V, E)
        return dh, (dw if w_into is None else None)

    def _scaled(self, x: Any, g: Any, out: Any) -> Any:
        """out = x * g (a 0-d acc array), over 16-byte vectors where x and out allow."""
        vecs = cuda_build.vectors(x, out)
        if not vecs:
            return super()._scaled(x, g, out)
        _XENT.typed("scale_vec", x.dtype)(*cuda_build.vector_grid(vecs),
                                          (x, g, out, np.int64(vecs)))
        return out

    def _add_scaled(self, into: Any, x: Any, g: Any) -> None:
        """into += x * g, one pass over 16-byte vectors where both allow (two CuPy
        elementwise passes took three times as long at GPT-2's (V, E))."""
        vecs = cuda_build.vectors(x, into)
        if not vecs:
            super()._add_scaled(into, x, g)
            return
        _XENT.typed("add_scaled_vec", x.dtype)(*cuda_build.vector_grid(vecs),
                                               (x, g, into, np.int64(vecs)))

    def _lm_head_backward(
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
        if isinstance(padded, Fp8Operand):  # e5m2 codes from the forward
            dh, dw = self._head_grads_e5m2(padded, wp, h, v, need_h, need_w, mm, w_into)
        else:
            dh, dw = self._head_grads(padded, wp, h, v, need_h, need_w, mm, w_into)
        if dh is not None and g is not None:
            self._scaled(dh, g, dh)
        return dh, dw
