"""Fused kernels written once against the array module `xp` (NumPy or CuPy).

Each returns fresh arrays (or fills `out=` buffers) and keeps float32 inputs in float32:
Python scalars are used as weak scalars so no float64 temporaries appear.
"""

from __future__ import annotations

import math
from typing import Any

GELU_C = math.sqrt(2.0 / math.pi)
GELU_K = 0.044715


class XpKernels:
    """The reference formulation; backends override methods with faster equivalents."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.xp = backend.xp
        self._masks: dict[int, Any] = {}

    def matmul(self, a: Any, b: Any) -> Any:
        return self.xp.matmul(a, b)

    def sum_rows(self, x: Any) -> Any:
        """Column sums of a 2-D array (bias gradients)."""
        return x.sum(axis=0)

    # ---- LayerNorm over the last axis ------------------------------------------------------
    def layernorm_forward(self, x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
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
        """Softmax of scale*scores with future positions masked; overwrites `scores`.

        with_lse=True also returns each row's log-sum-exp (B, H, T, 1) of the scaled scores,
        from which causal_softmax_recompute rebuilds the probabilities."""
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
        """exp(scale*scores - lse) with future positions zeroed; overwrites `scores`."""
        xp = self.xp
        s = scores
        s *= scale
        xp.copyto(s, -xp.inf, where=~self.causal_mask(s.shape[-1]))  # before exp: no overflow
        s -= lse
        xp.exp(s, out=s)
        return s

    def causal_softmax_backward(self, g: Any, probs: Any, scale: float) -> Any:
        """d(scores) from d(probs); masked entries have probs == 0 so get 0."""
        ds = g * probs
        ds -= probs * ds.sum(axis=-1, keepdims=True)
        ds *= scale
        return ds

    # ---- softmax cross-entropy ---------------------------------------------------------------
    def cross_entropy(
        self, logits: Any, targets: Any, need_grad: bool, inplace: bool
    ) -> tuple[Any, Any]:
        """Mean NLL over rows of (N, V) logits, and the state its backward needs.

        Here the state is d(loss)/d(logits) itself, made in the same pass as the loss; with
        inplace=True it reuses the logits buffer, so the largest activation exists once.
        """
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
        """d(logits) for upstream gradient g (a scalar); may reuse the state's buffer."""
        state *= g
        return state

    # ---- tied LM head + cross-entropy: loss of logits = h @ w.T ---------------------------------
    def lm_head_xent(
        self, h: Any, w: Any, targets: Any, need_grad: bool, mm: Any
    ) -> tuple[Any, Any]:
        """Mean NLL of h @ w.T, (N, E) x (V, E). `mm(a, b)` runs a GEMM through the profiler's
        choke point. Here: the GEMM, then cross_entropy in place on the logits (a backend may
        fuse the two more tightly)."""
        logits = mm(h, w.T)
        loss, state = self.cross_entropy(logits, targets, need_grad, True)
        return loss, ((state, h, w) if need_grad else None)

    def lm_head_xent_backward(
        self, state: Any, g: Any, need_h: bool, need_w: bool, mm: Any
    ) -> tuple[Any, Any]:
        """(d h, d w) for upstream gradient g (a scalar); None where not needed."""
        xent, h, w = state
        dlogits = self.cross_entropy_backward(xent, g)
        dh = mm(dlogits, w) if need_h else None
        dw = mm(dlogits.T, h) if need_w else None
        return dh, dw

    # ---- embedding backward: rows of g added into the (V, E) gradient ---------------------------
    def scatter_add_rows(self, dst: Any, idx: Any, rows: Any) -> None:
        """dst[idx[i]] += rows[i] for every i, repeated indices included."""
        self.xp.add.at(dst, idx.ravel(), rows.reshape(-1, dst.shape[-1]))

    # ---- optimizer kernels over the flat parameter buffer ------------------------------------
    def l2_norm(self, g: Any) -> Any:
        return self.xp.sqrt(self.xp.dot(g, g))

    def adamw(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        """One AdamW step in place; lr/step/scale are 0-d arrays (scale None: no clipping)."""
        xp = self.xp
        b1, b2 = betas
        if scale is not None:
            g = g * scale.astype(g.dtype)
        t = step.astype(p.dtype)
        if weight_decay:
            p[:decay_size] *= 1.0 - lr * weight_decay
        m *= b1
        m += (1.0 - b1) * g
        v *= b2
        v += (1.0 - b2) * (g * g)
        denom = xp.sqrt(v)
        denom /= xp.sqrt(1.0 - b2**t)
        denom += eps
        p -= (lr / (1.0 - b1**t)).astype(p.dtype) * m / denom

    def sgd(
        self, p: Any, g: Any, velocity: Any, lr: Any, scale: Any, momentum: float,
        nesterov: bool, weight_decay: float, decay_size: int,
    ) -> None:
        if scale is not None:
            g = g * scale.astype(g.dtype)
        if weight_decay:
            p[:decay_size] *= 1.0 - lr * weight_decay
        d = g
        if momentum:
            velocity *= momentum
            velocity += g
            d = g + momentum * velocity if nesterov else velocity
        p -= lr.astype(p.dtype) * d

    # ---- data -------------------------------------------------------------------------------
    def gather_batch(self, stream: Any, step: Any, seq_len: int, x: Any, y: Any) -> None:
        """x, y <- the window of batch (step mod batches-per-epoch) of a (B, N) token stream."""
        i = int(step) % ((stream.shape[1] - 1) // seq_len)
        x[...] = stream[:, i * seq_len : (i + 1) * seq_len]
        y[...] = stream[:, i * seq_len + 1 : (i + 1) * seq_len + 1]

    def store_at_step(self, ring: Any, step: Any, value: Any) -> None:
        """ring[(step - 1) % len(ring)] = value, with `step` a 0-d device counter."""
        ring[(int(step) - 1) % len(ring)] = value
