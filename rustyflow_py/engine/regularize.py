"""The small-data regularisers' ops: locked (variational) dropout and label smoothing.

Kept apart from the op library (ops/) because both are compositions of existing kernels (a
dropout mask, a gather, a scatter-add): no backend needs a kernel of its own for them.

Locked dropout (Gal & Ghahramani 2016; AWD-LSTM's "variational" dropout) draws one mask per
sequence and feature, (B, 1, E), and applies it at every position: a dropped feature is
absent for the whole sequence, so the model cannot repair it from a neighbouring position's
copy. The mask is B*E Philox draws instead of B*T*E, and backward reuses it.

Label smoothing (Szegedy et al. 2016) trains against (1 - eps) * one-hot + eps / V. For the
tied LM head's logits z = h @ W.T that loss is
    (1 - eps) * (lse - z_t) + eps * (lse - mean_v z_v) = NLL + eps * (z_t - mean_v z_v),
and z_t - mean_v z_v = h . (W[t] - mean_v W[v]): the smoothing is a term of its own that
never forms the (N, V) logits, added to the fused LM-head cross-entropy's NLL (which stays
untouched: evaluation never adds the term, so perplexity is always the plain NLL's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .autograd import Function, Tensor
from .ops import Dropout, Randomness, add
from .precision import accumulate_dtype


class LockedDropout(Dropout):
    """x (B, T, E) times a (B, 1, E) inverted-dropout mask of (rng, site), broadcast over T
    (Dropout's settings; its mask is kept, being T times smaller than x)."""

    name = "locked_dropout"

    def forward(self, x: Any) -> Any:
        b, _, e = x.shape
        self.keep = self.rng.mask(self.kernels, (b, 1, e), x.dtype, self.p, self.site)
        return x * self.keep

    def backward(self, grad: Any) -> Sequence[Any]:
        return (grad * self.keep,)


class SmoothingTerm(Function):
    """eps * mean_n h_n . (W[t_n] - mean_v W[v]) for h (N, E), W (V, E), targets t (N,): label
    smoothing's addition to the NLL of logits h @ W.T (see the module docstring)."""

    name = "label_smoothing"
    eps: float

    def forward(self, h: Any, w: Any, targets: Any) -> Any:
        acc = accumulate_dtype(h.dtype)
        targets = targets.reshape(-1)  # (N,)
        self.h, self.targets, self.w_shape, self.w_dtype = h, targets, w.shape, w.dtype
        self.d = w[targets].astype(acc) - w.astype(acc, copy=False).mean(axis=0)  # (N, E)
        scale = acc.type(self.eps / h.shape[0])
        return (self.xp.sum(h.astype(acc, copy=False) * self.d) * scale).astype(acc)

    def backward(self, grad: Any) -> Sequence[Any]:
        xp = self.xp
        acc = self.d.dtype
        c = grad.astype(acc) * acc.type(self.eps / self.h.shape[0])  # 0-d
        dh = (self.d * c).astype(self.h.dtype) if self.needs_input_grad[0] else None
        dw = None
        if self.needs_input_grad[1]:
            ch = self.h.astype(acc, copy=False) * c  # (N, E)
            dw = xp.zeros(self.w_shape, dtype=acc)  # (V, E)
            dw -= ch.sum(axis=0) / acc.type(self.w_shape[0])  # the mean row's share
            self.kernels.scatter_add_rows(dw, self.targets, ch)
            dw = dw.astype(self.w_dtype, copy=False)
        return dh, dw, None


def locked_dropout(x: Tensor, p: float, rng: Randomness, site: int) -> Tensor:
    """Dropout of x (B, T, E) with one mask per sequence shared by its T positions; p = 0
    returns x itself."""
    if p == 0.0:
        return x
    return LockedDropout.apply(x, p=p, rng=rng, site=site)


def smoothed(nll: Tensor, h: Tensor, weight: Tensor, targets: Tensor, eps: float) -> Tensor:
    """The label-smoothed loss of logits h @ weight.T (N, V), from their mean NLL `nll`
    (lm_head_cross_entropy's): nll itself when eps is 0."""
    if eps == 0.0:
        return nll
    return add(nll, SmoothingTerm.apply(h, weight, targets, eps=eps))
