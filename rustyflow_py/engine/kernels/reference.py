"""The kernels written once against the array module `xp` (NumPy or CuPy): the truth that
every backend's faster version is tested against (contract.py documents each one).

Each returns fresh arrays (or fills `out=` buffers) and keeps float32 inputs in float32:
Python scalars are used as weak scalars so no float64 temporaries appear. 16-bit inputs
(float16) are computed in float32, their accumulation type, and only the results are rounded
back: outputs keep the input's dtype, statistics (mean, rstd, lse, the loss) stay float32.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

from ..policy import RunPolicy
from ..precision import accumulate_dtype, is_16bit
from .reference_step import StepKernels

GELU_C = math.sqrt(2.0 / math.pi)
GELU_K = 0.044715


def _wide(*arrays: Any) -> tuple[Any, ...]:
    """The arrays (None passes through), the 16-bit ones converted to float32."""
    return tuple(a.astype(accumulate_dtype(a.dtype)) if a is not None and is_16bit(a.dtype)
                 else a for a in arrays)


class XpKernels(StepKernels):
    """The reference formulation; backends override methods with faster equivalents."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.xp = backend.xp
        self._masks: dict[int, Any] = {}
        self._read_policy(backend.policy)

    def bound(self, backend: Any) -> Any:
        """This kernel set for `backend`, a view of the same device under another run policy:
        the device's handles, caches and buffers are shared, and what the policy decides is
        read once, here (engine/policy.py)."""
        view = copy.copy(self)
        view.backend = backend
        view._read_policy(backend.policy)
        return view

    def _read_policy(self, policy: RunPolicy) -> None:
        """Read what this kernel set needs from the run's policy (at creation only)."""
        self.policy = policy
        self.attention = policy.attention

    def matmul(self, a: Any, b: Any, *, transpose_b: bool = False, out: Any = None) -> Any:
        return self.xp.matmul(a, self.xp.swapaxes(b, -1, -2) if transpose_b else b, out=out)

    def sum_rows(self, x: Any) -> Any:
        if is_16bit(x.dtype):
            return x.sum(axis=0, dtype=accumulate_dtype(x.dtype)).astype(x.dtype)
        return x.sum(axis=0)

    # ---- Linear layers: here the GEMM, then the bias (with GELU) as a kernel of its own ------
    def linear(self, x: Any, w: Any, b: Any, gelu: bool,
               gemm: Callable[..., Any]) -> tuple[Any, Any]:
        z = gemm(self.matmul, x, w)  # (..., N)
        if gelu:  # the state: the GELU's input, less the bias the GELU kernels add themselves
            return self.gelu_forward(z, b), (z, b)
        z += b
        return z, None

    def linear_grads(self, x: Any, g: Any, gemm: Callable[..., Any]) -> tuple[Any, Any]:
        g2 = g.reshape(-1, g.shape[-1])  # (rows, N)
        return gemm(self.matmul, x.reshape(-1, x.shape[-1]).T, g2), self.sum_rows(g2)

    def linear_dgelu(self, g: Any, w: Any, state: Any,
                     gemm: Callable[..., Any]) -> tuple[Any, Any]:
        pre, bias = state  # bias None: pre already has it (a fused backend's state)
        dpre = self.gelu_backward(gemm(self.matmul, g, w, transpose_b=True), pre, bias)
        return dpre, self.sum_rows(dpre.reshape(-1, dpre.shape[-1]))

    # ---- LayerNorm over the last axis ------------------------------------------------------
    def layernorm_forward(self, x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
        if is_16bit(x.dtype):
            y, mean, rstd = XpKernels.layernorm_forward(self, *_wide(x, w, b), eps)
            return y.astype(x.dtype), mean, rstd
        xp = self.xp
        mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
        xc = x - mean
        var = (xc * xc).mean(axis=-1, keepdims=True)
        rstd = 1.0 / xp.sqrt(var + eps)  # (..., 1)
        xc *= rstd  # x-hat
        y = xc * w
        y += b
        return y, mean, rstd

    def layernorm_backward(
        self, g: Any, x: Any, w: Any, mean: Any, rstd: Any
    ) -> tuple[Any, Any, Any]:
        if is_16bit(x.dtype):
            dx, dw, db = XpKernels.layernorm_backward(self, *_wide(g, x, w), mean, rstd)
            return dx.astype(x.dtype), dw.astype(w.dtype), db.astype(w.dtype)
        lead = tuple(range(x.ndim - 1))
        xhat = (x - mean) * rstd
        db = g.sum(axis=lead)
        dw = (g * xhat).sum(axis=lead)
        gw = g * w
        dx = gw - gw.mean(axis=-1, keepdims=True)
        dx -= xhat * (gw * xhat).mean(axis=-1, keepdims=True)
        dx *= rstd
        return dx, dw, db

    # ---- GELU (tanh approximation), optionally with the preceding bias add fused in ----------
    def gelu_forward(self, x: Any, bias: Any | None) -> Any:
        if is_16bit(x.dtype):
            return XpKernels.gelu_forward(self, *_wide(x, bias)).astype(x.dtype)
        xp = self.xp
        if bias is not None:
            x = x + bias
        inner = x * x
        inner *= GELU_K
        inner += 1.0
        inner *= x
        inner *= GELU_C
        t = xp.tanh(inner, out=inner)
        t += 1.0
        t *= x
        t *= 0.5
        return t

    def gelu_backward(self, g: Any, x: Any, bias: Any | None) -> Any:
        if is_16bit(x.dtype):
            return XpKernels.gelu_backward(self, *_wide(g, x, bias)).astype(x.dtype)
        xp = self.xp
        if bias is not None:
            x = x + bias
        x2 = x * x
        t = xp.tanh(GELU_C * x * (1.0 + GELU_K * x2))
        # d/dx 0.5 x (1 + t) = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2)
        dt = (1.0 - t * t) * (GELU_C * (1.0 + 3.0 * GELU_K * x2))
        dt *= x
        dt += 1.0 + t
        dt *= 0.5
        dt *= g
        return dt

    # ---- causal scale + mask + softmax over the last axis of (B, H, T, T) scores --------------
    def causal_mask(self, t: int) -> Any:
        if t not in self._masks:
            self._masks[t] = self.xp.tri(t, dtype=bool)
        return self._masks[t]

    def causal_softmax_forward(
        self, scores: Any, scale: float, with_lse: bool = False
    ) -> Any:
        if is_16bit(scores.dtype):
            out = XpKernels.causal_softmax_forward(self, *_wide(scores), scale, with_lse)
            return (out[0].astype(scores.dtype), out[1]) if with_lse else out.astype(scores.dtype)
        xp = self.xp
        s = scores
        s *= scale
        xp.copyto(s, -xp.inf, where=~self.causal_mask(s.shape[-1]))
        m = s.max(axis=-1, keepdims=True)
        s -= m
        xp.exp(s, out=s)
        z = s.sum(axis=-1, keepdims=True)
        s /= z
        if not with_lse:
            return s
        return s, xp.log(z) + m

    def causal_softmax_recompute(self, scores: Any, lse: Any, scale: float) -> Any:
        """exp(scale*scores - lse) with future positions zeroed."""
        if is_16bit(scores.dtype):
            return XpKernels.causal_softmax_recompute(self, *_wide(scores), lse,
                                                      scale).astype(scores.dtype)
        xp = self.xp
        s = scores
        s *= scale
        xp.copyto(s, -xp.inf, where=~self.causal_mask(s.shape[-1]))  # before exp: no overflow
        s -= lse
        xp.exp(s, out=s)
        return s

    def causal_softmax_backward(self, g: Any, probs: Any, scale: float) -> Any:
        """d(scores) from d(probs); masked entries have probs == 0 so get 0."""
        if is_16bit(probs.dtype):
            return XpKernels.causal_softmax_backward(self, *_wide(g, probs),
                                                     scale).astype(probs.dtype)
        ds = g * probs
        ds -= probs * ds.sum(axis=-1, keepdims=True)
        ds *= scale
        return ds

    # ---- softmax cross-entropy ---------------------------------------------------------------
    def cross_entropy(
        self, logits: Any, targets: Any, need_grad: bool, inplace: bool
    ) -> tuple[Any, Any]:
        """Here the state is d(loss)/d(logits) itself, made in the same pass as the loss; with
        inplace=True it reuses the logits buffer, so the largest activation exists once.
        For 16-bit logits that state is rounded to their dtype, as d(logits) will be.
        """
        if is_16bit(logits.dtype):
            loss, e = XpKernels.cross_entropy(self, *_wide(logits), targets, need_grad, True)
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
        self, state: Any, g: Any, need_h: bool, need_w: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        xent, h, w = state
        dlogits = self.cross_entropy_backward(xent, g)
        dh = mm(dlogits, w) if need_h else None
        dw = mm(dlogits.T, h) if need_w else None
        return dh, dw

    # ---- embedding backward: rows of g added into the (V, E) gradient ---------------------------
    def scatter_add_rows(self, dst: Any, idx: Any, rows: Any) -> None:
        """(Mixed precision: 16-bit rows into a float32 gradient, converted first.)"""
        rows = rows.reshape(-1, dst.shape[-1]).astype(dst.dtype, copy=False)
        self.xp.add.at(dst, idx.ravel(), rows)



class ReferenceFor16Bit:
    """For a backend whose own kernels are float32/float64 only (the CPU's): first among its
    bases, this sends the kernels that reduce or keep statistics, called on 16-bit arrays, to
    the reference formulation above (float32 inside), and everything else on to the backend.
    The rest (GEMM, scatter-add, cross_entropy_backward, the optimizer on its float32 buffer)
    take 16-bit arrays as they are."""

    def layernorm_forward(self, x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
        if is_16bit(x.dtype):
            return XpKernels.layernorm_forward(self, x, w, b, eps)
        return super().layernorm_forward(x, w, b, eps)

    def layernorm_backward(
        self, g: Any, x: Any, w: Any, mean: Any, rstd: Any
    ) -> tuple[Any, Any, Any]:
        if is_16bit(x.dtype):
            return XpKernels.layernorm_backward(self, g, x, w, mean, rstd)
        return super().layernorm_backward(g, x, w, mean, rstd)

    def gelu_forward(self, x: Any, bias: Any | None) -> Any:
        if is_16bit(x.dtype):
            return XpKernels.gelu_forward(self, x, bias)
        return super().gelu_forward(x, bias)

    def gelu_backward(self, g: Any, x: Any, bias: Any | None) -> Any:
        if is_16bit(x.dtype):
            return XpKernels.gelu_backward(self, g, x, bias)
        return super().gelu_backward(g, x, bias)

    def causal_softmax_forward(self, scores: Any, scale: float, with_lse: bool = False) -> Any:
        if is_16bit(scores.dtype):
            return XpKernels.causal_softmax_forward(self, scores, scale, with_lse)
        return super().causal_softmax_forward(scores, scale, with_lse)

    def causal_softmax_recompute(self, scores: Any, lse: Any, scale: float) -> Any:
        if is_16bit(scores.dtype):
            return XpKernels.causal_softmax_recompute(self, scores, lse, scale)
        return super().causal_softmax_recompute(scores, lse, scale)

    def causal_softmax_backward(self, g: Any, probs: Any, scale: float) -> Any:
        if is_16bit(probs.dtype):
            return XpKernels.causal_softmax_backward(self, g, probs, scale)
        return super().causal_softmax_backward(g, probs, scale)

    def cross_entropy(
        self, logits: Any, targets: Any, need_grad: bool, inplace: bool
    ) -> tuple[Any, Any]:
        if is_16bit(logits.dtype):
            return XpKernels.cross_entropy(self, logits, targets, need_grad, inplace)
        return super().cross_entropy(logits, targets, need_grad, inplace)

    def lm_head_xent(
        self, h: Any, w: Any, targets: Any, need_grad: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        if is_16bit(h.dtype):
            return XpKernels.lm_head_xent(self, h, w, targets, need_grad, mm)
        return super().lm_head_xent(h, w, targets, need_grad, mm)

    def lm_head_xent_backward(
        self, state: Any, g: Any, need_h: bool, need_w: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        if is_16bit(state[0].dtype):  # the reference's (16-bit d(logits), h, w)
            return XpKernels.lm_head_xent_backward(self, state, g, need_h, need_w, mm)
        return super().lm_head_xent_backward(state, g, need_h, need_w, mm)
