"""The optimizers' reference kernels: one class per algorithm (the table's entries), on the
reference's shared pieces (Adam's moments, the L2 term, the bias correction from
double-precision pieces).

Every update runs over the flat parameter buffer and reads lr, step and the clip factor from
device memory, so the step stays inside a CUDA graph. A negative clip factor means "skip this
step" (a float16 run whose gradients overflowed, model/loss_scale.py): the GPU kernels then
leave parameters and state untouched.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from ..table import Family

# The quintic Newton-Schulz iteration's coefficients (Muon: Jordan et al. 2024)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def log_beta(beta: float) -> float:
    """log(beta) in double precision (-inf for 0), for bias_correction."""
    return math.log(beta) if beta > 0 else -math.inf


def bias_correction(xp: Any, t: Any, beta: float) -> Any:
    """Adam's 1 - beta**t for a 0-d step t, as -expm1(t * log(beta)): float32's 1 - beta**t
    loses the low digits (1 - float32(0.999) is 1.3e-5 off 0.001); this keeps t's dtype and
    is accurate to a few ulp, as torch's double-precision correction is."""
    return -xp.expm1(t * log_beta(beta))


def _mix(xp: Any, x: Any) -> Any:
    """adam.cuh's rf_mix, a 32-bit integer hash, over uint32 arrays (products wrap)."""
    x = x ^ (x >> 16)
    x = x * xp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * xp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def round_bf16_stochastic(xp: Any, x: Any, out: Any, step: Any, high: bool) -> None:
    """out (bf16) <- x (float32) rounded as adam.cuh's rf_bf16_round rounds moments: 16
    random bits added below bf16's last mantissa bit, then the cut; the bits are a hash of
    each element's index and the 0-d `step`, the noise's low half (m) or its high half (v,
    `high`). NaN stays a NaN."""
    index = xp.arange(x.size, dtype=xp.uint32)
    step_mix = _mix(xp, xp.asarray(step).astype(xp.uint32).reshape(1))
    noise = _mix(xp, index ^ step_mix)
    if high:
        noise = noise >> 16
    bits = x.view(xp.uint32)
    rounded = ((bits + (noise & xp.uint32(0xFFFF))) >> 16).astype(xp.uint16)
    nan = (bits & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)
    out.view(xp.uint16)[...] = xp.where(nan, xp.uint16(0x7FC0), rounded)


def kernel_of(reference: Callable[..., Any], body: Callable[..., Any], *first: Any
              ) -> Callable[..., Any]:
    """A device's kernel for `reference`'s op that runs body(self, *first, *args): one body
    for several ops (Adam's and AdamW's), each with its reference's signature and docs,
    which the contract test reads."""

    @functools.wraps(reference)
    def kernel(self: Any, *args: Any, **kwargs: Any) -> Any:
        return body(self, *first, *args, **kwargs)

    return kernel


class OptimizerFamily(Family):
    """An optimizer's kernels on one device, with the reference's shared helpers."""

    def _moments(self, g: Any, m: Any, v: Any, t: Any, betas: tuple[float, float],
                 eps: float) -> Any:
        """Adam's moments updated in place with g; the denominator sqrt(v / (1 - b2^t)) + eps."""
        b1, b2 = betas
        m *= b1
        m += (1.0 - b1) * g
        v *= b2
        v += (1.0 - b2) * (g * g)
        denom = self.xp.sqrt(v)
        denom /= self.xp.sqrt(bias_correction(self.xp, t, b2))
        denom += eps
        return denom

    def _l2_grad(self, p: Any, g: Any, scale: Any, weight_decay: float,
                 decay_size: int) -> Any:
        """A fresh g * scale, with the L2 term weight_decay * p added on p[:decay_size]."""
        g = g * scale.astype(g.dtype) if scale is not None else g.copy()
        if weight_decay:
            g[:decay_size] += weight_decay * p[:decay_size]
        return g


class NormReference(OptimizerFamily):
    """The global gradient norm, sqrt(sum(g * g)) of the flat buffer (clipping reads it)."""

    def l2_norm(self, g: Any) -> Any:
        return self.xp.sqrt(self.xp.dot(g, g))


class AdamReference(OptimizerFamily):
    """AdamW (decoupled weight decay, PyTorch's order) and Adam (weight decay as an L2 term
    of the gradient): one formulation with two ways of decaying."""

    def adamw(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        copy_to: Any = None,
    ) -> None:
        if m.dtype != p.dtype:  # bf16 moments (ADAM_STATE_DTYPE=bf16): widened, rounded back
            wide = m.astype(p.dtype), v.astype(p.dtype)
            AdamReference.adamw(self, p, g, *wide, lr, step, scale, betas, eps, weight_decay,
                                decay_size, copy_to)
            for moment, out, high in zip(wide, (m, v), (False, True), strict=True):
                round_bf16_stochastic(self.xp, moment, out, step, high)
            return
        if scale is not None:
            g = g * scale.astype(g.dtype)
        t = step.astype(p.dtype)
        if weight_decay:
            p[:decay_size] *= 1.0 - lr * weight_decay
        denom = self._moments(g, m, v, t, betas, eps)
        p -= (lr / bias_correction(self.xp, t, betas[0])).astype(p.dtype) * m / denom
        if copy_to is not None:
            copy_to[...] = p

    def adam(self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
             betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
             copy_to: Any = None) -> None:
        g = self._l2_grad(p, g, scale, weight_decay, decay_size)
        AdamReference.adamw(self, p, g, m, v, lr, step, None, betas, eps, 0.0, decay_size,
                            copy_to)


class SgdReference(OptimizerFamily):
    """SGD (torch.optim.SGD: momentum without dampening, optionally Nesterov; weight decay
    as an L2 term of the gradient)."""

    def sgd(
        self, p: Any, g: Any, velocity: Any, lr: Any, scale: Any, momentum: float,
        nesterov: bool, weight_decay: float, decay_size: int,
    ) -> None:
        d = g = self._l2_grad(p, g, scale, weight_decay, decay_size)
        if momentum:
            velocity *= momentum
            velocity += g
            d = g + momentum * velocity if nesterov else velocity
        p -= lr.astype(p.dtype) * d


class RmspropReference(OptimizerFamily):
    """RMSprop (torch.optim.RMSprop: optionally centered, optionally with momentum; weight
    decay as an L2 term of the gradient)."""

    def rmsprop(
        self, p: Any, g: Any, square_avg: Any, grad_avg: Any, momentum_buffer: Any, lr: Any,
        scale: Any, alpha: float, eps: float, momentum: float, weight_decay: float,
        decay_size: int,
    ) -> None:
        xp = self.xp
        g = self._l2_grad(p, g, scale, weight_decay, decay_size)
        square_avg *= alpha
        square_avg += (1.0 - alpha) * (g * g)
        if grad_avg is not None:  # centered: the variance estimate
            grad_avg += (1.0 - alpha) * (g - grad_avg)
            avg = xp.sqrt(square_avg - grad_avg * grad_avg)
        else:
            avg = xp.sqrt(square_avg)
        avg += eps
        step = g / avg
        if momentum_buffer is not None:
            momentum_buffer *= momentum
            momentum_buffer += step
            step = momentum_buffer
        p -= lr.astype(p.dtype) * step


class AdagradReference(OptimizerFamily):
    """AdaGrad (torch.optim.Adagrad, no lr decay; weight decay as an L2 term)."""

    def adagrad(
        self, p: Any, g: Any, state_sum: Any, lr: Any, scale: Any, eps: float,
        weight_decay: float, decay_size: int,
    ) -> None:
        g = self._l2_grad(p, g, scale, weight_decay, decay_size)
        state_sum += g * g
        p -= lr.astype(p.dtype) * (g / (self.xp.sqrt(state_sum) + eps))


class AdadeltaReference(OptimizerFamily):
    """AdaDelta (torch.optim.Adadelta; weight decay as an L2 term)."""

    def adadelta(
        self, p: Any, g: Any, square_avg: Any, acc_delta: Any, lr: Any, scale: Any,
        rho: float, eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        xp = self.xp
        g = self._l2_grad(p, g, scale, weight_decay, decay_size)
        square_avg *= rho
        square_avg += (1.0 - rho) * (g * g)
        delta = xp.sqrt(acc_delta + eps) / xp.sqrt(square_avg + eps) * g
        acc_delta *= rho
        acc_delta += (1.0 - rho) * (delta * delta)
        p -= lr.astype(p.dtype) * delta


class LambReference(OptimizerFamily):
    """LAMB (You et al. 2019, Algorithm 2): Adam's direction plus decoupled weight decay,
    each tensor's step scaled by its trust ratio ||p|| / ||u||."""

    def segments(self, bounds: tuple[int, ...]) -> Any:
        return tuple(zip(bounds[:-1], bounds[1:], strict=True))

    def lamb(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        segments: Any,
    ) -> None:
        u = self._lamb_direction(p, g, m, v, step, scale, betas, eps, weight_decay,
                                 decay_size)
        lr = lr.astype(p.dtype)
        for start, stop in segments:
            ratio = self._trust_ratio(p[start:stop], u[start:stop])
            p[start:stop] -= (lr * ratio).astype(p.dtype) * u[start:stop]

    def _lamb_direction(
        self, p: Any, g: Any, m: Any, v: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
    ) -> Any:
        """Update m and v in place; the fresh direction r + weight_decay * p (LAMB's u)."""
        if scale is not None:
            g = g * scale.astype(g.dtype)
        t = step.astype(p.dtype)
        denom = self._moments(g, m, v, t, betas, eps)
        u = m / bias_correction(self.xp, t, betas[0])
        u /= denom
        if weight_decay:
            u[:decay_size] += weight_decay * p[:decay_size]
        return u

    def _trust_ratio(self, w: Any, u: Any) -> Any:
        """||w|| / ||u|| as a 0-d array, 1 where either is 0 (nothing read back)."""
        xp = self.xp
        wn, un = xp.sqrt(xp.dot(w, w)), xp.sqrt(xp.dot(u, u))
        ok = (wn > 0) & (un > 0)
        return xp.where(ok, wn / xp.where(ok, un, 1.0), 1.0)


class MuonReference(OptimizerFamily):
    """Muon (Jordan et al. 2024) for the 2-D hidden weights: momentum, orthogonalised by
    quintic Newton-Schulz iterations (batched GEMMs), applied with decoupled weight decay."""

    def muon_momentum(
        self, g: Any, buf: Any, out: Any, scale: Any, momentum: float, nesterov: bool,
    ) -> None:
        if scale is not None:
            g = g * scale.astype(g.dtype)
        buf += (1.0 - momentum) * (g - buf)
        if nesterov:
            out[...] = g + momentum * (buf - g)
        else:
            out[...] = buf

    def newton_schulz(self, x: Any, steps: int, eps: float, mm: Callable[..., Any]) -> Any:
        xp = self.xp
        a, b, c = NS_COEFFICIENTS
        norm = xp.sqrt((x * x).sum(axis=(-2, -1), keepdims=True))
        x = x / (norm + eps)
        for _ in range(steps):
            gram = mm(x, x, transpose_b=True)
            poly = mm(gram, gram)
            poly *= c
            poly += b * gram
            y = mm(poly, x)
            y += a * x
            x = y
        return x

    def muon_apply(self, p: Any, update: Any, lr: Any, weight_decay: float,
                   factor: float) -> None:
        lr = lr.astype(p.dtype)
        if weight_decay:
            p *= 1.0 - lr * weight_decay
        p -= (lr * factor).astype(p.dtype) * update


class EmaReference(Family):
    """The weights' exponential moving average (model/ema.py), one pass over the flat buffer
    after each optimizer step."""

    def ema_update(self, ema: Any, p: Any, decay: float, step: Any, start: int) -> None:
        """(1 - decay) is rounded once, from double precision, to the buffers' dtype."""
        moved = p - ema
        moved *= ema.dtype.type(1.0 - decay)
        moved += ema
        self.xp.copyto(ema, self.xp.where(step > start, moved, p))
