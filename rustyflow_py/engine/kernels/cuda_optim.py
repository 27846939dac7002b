"""CUDA optimizer kernels (CuPy): each optimizer's update over the whole flat buffer in as
few launches as it can (one ElementwiseKernel for the elementwise ones; three RawKernels for
LAMB's per-tensor trust ratios; batched GEMMs for Muon's Newton-Schulz), reading the learning
rate, step and clip factor from device memory so the step stays inside the CUDA graph. A
negative factor means "skip this step" (a float16 run whose gradients overflowed,
model/loss_scale.py): the kernels then leave parameters and state untouched.

A mixin of CudaKernels (cuda.py): it uses that class's `_k` (the RawKernels compiled from
cuda.py's sources, LAMB's among them) and `xp`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from ..precision import accumulate_dtype
from .reference_step import NS_COEFFICIENTS, log_beta


@functools.cache
def _optimizer_kernels() -> dict[str, Any]:
    import cupy

    return {
        # Decoupled weight decay on the first `decay` elements, then the Adam moment update.
        # c = 1 - beta and lb = log(beta) come from double precision: float32's 1 - beta and
        # 1 - beta**t lose digits for beta near 1 (0.999).
        "adamw": cupy.ElementwiseKernel(
            "T g, float32 lr, int32 step, float32 scale, float32 c1, float32 c2, float32 lb1, "
            "float32 lb2, float32 eps, float32 wd, int64 decay",
            "T p, T m, T v",
            """
            if (scale < 0) return;  // skipped (fp16 overflow: loss_scale.py)
            T gs = g * (T)scale;
            if (i < decay) p *= (T)(1 - lr * wd);
            m = (T)(1 - c1) * m + (T)c1 * gs;
            v = (T)(1 - c2) * v + (T)c2 * gs * gs;
            T bc1 = -expm1((T)step * (T)lb1), bc2 = -expm1((T)step * (T)lb2);
            p -= (T)lr / bc1 * m / (sqrt(v) / sqrt(bc2) + (T)eps);
            """,
            "rf_adamw"),
        # Adam: the weight decay is an L2 term of the gradient on the first `decay` elements.
        "adam": cupy.ElementwiseKernel(
            "T g, float32 lr, int32 step, float32 scale, float32 c1, float32 c2, float32 lb1, "
            "float32 lb2, float32 eps, float32 wd, int64 decay",
            "T p, T m, T v",
            """
            if (scale < 0) return;  // skipped (fp16 overflow: loss_scale.py)
            T gs = g * (T)scale;
            if (i < decay) gs += (T)wd * p;
            m = (T)(1 - c1) * m + (T)c1 * gs;
            v = (T)(1 - c2) * v + (T)c2 * gs * gs;
            T bc1 = -expm1((T)step * (T)lb1), bc2 = -expm1((T)step * (T)lb2);
            p -= (T)lr / bc1 * m / (sqrt(v) / sqrt(bc2) + (T)eps);
            """,
            "rf_adam"),
        "sgd": cupy.ElementwiseKernel(
            "T g, float32 lr, float32 scale, float32 mu, bool nesterov, float32 wd, int64 decay",
            "T p, T vel",
            """
            if (scale < 0) return;  // skipped (fp16 overflow: loss_scale.py)
            T gs = g * (T)scale;
            if (i < decay) gs += (T)wd * p;
            T d = gs;
            if (mu != 0) { vel = (T)mu * vel + gs; d = nesterov ? gs + (T)mu * vel : vel; }
            p -= (T)lr * d;
            """,
            "rf_sgd"),
        "adagrad": cupy.ElementwiseKernel(
            "T g, float32 lr, float32 scale, float32 eps, float32 wd, int64 decay",
            "T p, T ssum",
            """
            if (scale < 0) return;  // skipped (fp16 overflow: loss_scale.py)
            T gs = g * (T)scale;
            if (i < decay) gs += (T)wd * p;
            ssum += gs * gs;
            p -= (T)lr * (gs / (sqrt(ssum) + (T)eps));
            """,
            "rf_adagrad"),
        "adadelta": cupy.ElementwiseKernel(
            "T g, float32 lr, float32 scale, float32 rho, float32 crho, float32 eps, float32 wd, "
            "int64 decay",
            "T p, T sq, T dacc",
            """
            if (scale < 0) return;  // skipped (fp16 overflow: loss_scale.py)
            T gs = g * (T)scale;
            if (i < decay) gs += (T)wd * p;
            sq = (T)rho * sq + (T)crho * (gs * gs);
            T delta = sqrt(dacc + (T)eps) / sqrt(sq + (T)eps) * gs;
            dacc = (T)rho * dacc + (T)crho * (delta * delta);
            p -= (T)lr * delta;
            """,
            "rf_adadelta"),
        # Muon: the momentum of one matrix into its (possibly transposed) Newton-Schulz slot,
        # and the update with decoupled weight decay.
        "muon_momentum": cupy.ElementwiseKernel(
            "T g, float32 scale, float32 mu, float32 cmu, bool nesterov", "T buf, T upd",
            """
            if (scale < 0) return;  // skipped (fp16 overflow: loss_scale.py)
            T gs = g * (T)scale;
            buf += (T)cmu * (gs - buf);
            upd = nesterov ? gs + (T)mu * (buf - gs) : buf;
            """,
            "rf_muon_momentum"),
        "muon_apply": cupy.ElementwiseKernel(
            "T u, float32 lr, float32 wd, float32 f", "T p",
            "p = p * (T)(1 - lr * wd) - (T)(lr * f) * u;", "rf_muon_apply"),
        # the weights' moving average (model/ema.py): one pass, started after step `start`
        "ema_update": cupy.ElementwiseKernel(
            "T p, T c, int32 step, int64 start", "T ema",
            "ema = step > start ? ema + c * (p - ema) : p;", "rf_ema_update"),
        "ns_axpby": cupy.ElementwiseKernel(  # y <- a x + b y in place
            "T x, float32 a, float32 b", "T y", "y = (T)a * x + (T)b * y;", "rf_ns_axpby"),
        "div_eps": cupy.ElementwiseKernel(
            "T x, T n, float32 eps", "T y", "y = x / (n + (T)eps);", "rf_div_eps"),
        # sqrt(sum(x * x)): the global grad norm, and the Frobenius norms in Newton-Schulz
        "sumsq": cupy.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0",
                                      "rf_l2norm"),
    }


@functools.cache
def _rmsprop(centered: bool, with_momentum: bool) -> Any:
    """RMSprop's kernel for one variant: the centered average and the momentum buffer are
    outputs only when in use. calpha = 1 - alpha comes from double precision."""
    import cupy

    outs = "T p, T sq" + (", T ga" if centered else "") + (", T buf" if with_momentum else "")
    avg = ("ga += (T)calpha * (gs - ga); T avg = sqrt(sq - ga * ga) + (T)eps;"
           if centered else "T avg = sqrt(sq) + (T)eps;")
    step = ("buf = (T)mu * buf + gs / avg; p -= (T)lr * buf;" if with_momentum
            else "p -= (T)lr * (gs / avg);")
    return cupy.ElementwiseKernel(
        "T g, float32 lr, float32 scale, float32 alpha, float32 calpha, float32 eps, "
        "float32 mu, float32 wd, int64 decay", outs,
        f"""
        if (scale < 0) return;  // skipped (fp16 overflow: loss_scale.py)
            T gs = g * (T)scale;
        if (i < decay) gs += (T)wd * p;
        sq = (T)alpha * sq + (T)calpha * (gs * gs);
        {avg}
        {step}
        """,
        f"rf_rmsprop_{int(centered)}{int(with_momentum)}")


@dataclasses.dataclass(frozen=True)
class _Segments:
    """The tensors of a flat buffer cut into chunks of at most _CHUNK elements, each inside
    one tensor: the launch grid of the LAMB kernels (one block per chunk)."""

    count: int  # segments (tensors)
    chunks: int
    lo: Any  # (chunks,) int64: each chunk's first element
    hi: Any  # (chunks,) int64: one past its last
    seg: Any  # (chunks,) int32: its segment
    first: Any  # (count + 1,) int32: segment s's chunks are first[s] .. first[s + 1] - 1


_CHUNK = 8192


class CudaOptimizer:
    """The optimizer half of the CUDA kernel set."""

    xp: Any
    backend: Any
    _k: Any
    _one: Any  # a device 1.0: the clip factor when there is no clipping

    def l2_norm(self, g: Any) -> Any:
        return _optimizer_kernels()["sumsq"](g)

    def adamw(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        f32 = np.float32
        _optimizer_kernels()["adamw"](
            g, lr, step, self._scale(scale), *self._betas(betas), f32(eps), f32(weight_decay),
            np.int64(decay_size), p, m, v)

    def adam(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        f32 = np.float32
        _optimizer_kernels()["adam"](
            g, lr, step, self._scale(scale), *self._betas(betas), f32(eps), f32(weight_decay),
            np.int64(decay_size), p, m, v)

    def sgd(
        self, p: Any, g: Any, velocity: Any, lr: Any, scale: Any, momentum: float,
        nesterov: bool, weight_decay: float, decay_size: int,
    ) -> None:
        f32 = np.float32
        _optimizer_kernels()["sgd"](g, lr, self._scale(scale), f32(momentum), bool(nesterov),
                              f32(weight_decay), np.int64(decay_size), p, velocity)

    def rmsprop(
        self, p: Any, g: Any, square_avg: Any, grad_avg: Any, momentum_buffer: Any, lr: Any,
        scale: Any, alpha: float, eps: float, momentum: float, weight_decay: float,
        decay_size: int,
    ) -> None:
        f32 = np.float32
        state = [a for a in (grad_avg, momentum_buffer) if a is not None]
        _rmsprop(grad_avg is not None, momentum_buffer is not None)(
            g, lr, self._scale(scale), f32(alpha), f32(1.0 - alpha), f32(eps), f32(momentum),
            f32(weight_decay), np.int64(decay_size), p, square_avg, *state)

    def adagrad(
        self, p: Any, g: Any, state_sum: Any, lr: Any, scale: Any, eps: float,
        weight_decay: float, decay_size: int,
    ) -> None:
        f32 = np.float32
        _optimizer_kernels()["adagrad"](g, lr, self._scale(scale), f32(eps), f32(weight_decay),
                                  np.int64(decay_size), p, state_sum)

    def adadelta(
        self, p: Any, g: Any, square_avg: Any, acc_delta: Any, lr: Any, scale: Any,
        rho: float, eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        f32 = np.float32
        _optimizer_kernels()["adadelta"](g, lr, self._scale(scale), f32(rho), f32(1.0 - rho),
                                   f32(eps), f32(weight_decay), np.int64(decay_size), p,
                                   square_avg, acc_delta)

    @staticmethod
    def _betas(betas: tuple[float, float], dtype: Any = np.float32) -> tuple[Any, ...]:
        """(1 - b1, 1 - b2, log b1, log b2), each computed in double, then rounded."""
        b1, b2 = betas
        return tuple(np.dtype(dtype).type(x) for x in (1.0 - b1, 1.0 - b2, log_beta(b1),
                                                        log_beta(b2)))

    def _scale(self, scale: Any) -> Any:
        """The clip factor, or a device 1 without clipping."""
        return self._one if scale is None else scale

    # ---- LAMB: three launches over chunks of the flat buffer, no host loop ------------------
    def segments(self, bounds: tuple[int, ...]) -> Any:
        lo, hi, seg, first = [], [], [], [0]
        for s, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            for i in range(start, stop, _CHUNK):
                lo.append(i)
                hi.append(min(i + _CHUNK, stop))
                seg.append(s)
            first.append(len(lo))
        dev = self.backend.from_host
        return _Segments(len(bounds) - 1, len(lo), dev(np.asarray(lo, np.int64)),
                         dev(np.asarray(hi, np.int64)), dev(np.asarray(seg, np.int32)),
                         dev(np.asarray(first, np.int32)))

    def lamb(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        segments: Any,
    ) -> None:
        xp, t = self.xp, segments
        acc = accumulate_dtype(p.dtype)
        u = xp.empty_like(p)
        pw, pu = xp.empty(t.chunks, acc), xp.empty(t.chunks, acc)
        trust = xp.empty(t.count, acc)
        self._k("lamb_moments", p.dtype, g, m, v)(
            (t.chunks,), (256,),
            (g, p, m, v, u, pw, pu, t.lo, t.hi, step, self._scale(scale),
             *self._betas(betas, acc), acc.type(eps), acc.type(weight_decay),
             np.int64(decay_size)))
        self._k("lamb_trust", p.dtype)(((t.count + 127) // 128,), (128,),
                                       (pw, pu, t.first, trust, np.int32(t.count)))
        self._k("lamb_apply", p.dtype, u)((t.chunks,), (256,),
                                          (p, u, trust, t.seg, t.lo, t.hi, lr,
                                           self._scale(scale)))

    # ---- Muon ---------------------------------------------------------------------------------
    def muon_momentum(
        self, g: Any, buf: Any, out: Any, scale: Any, momentum: float, nesterov: bool,
    ) -> None:
        _optimizer_kernels()["muon_momentum"](g, self._scale(scale), np.float32(momentum),
                                        np.float32(1.0 - momentum), bool(nesterov), buf, out)

    def newton_schulz(self, x: Any, steps: int, eps: float, mm: Any) -> Any:
        """Two fused launches for the norm, then per iteration three GEMMs (through `mm`)
        and two in-place axpby launches; the work buffers come from the pool once."""
        ew, xp = _optimizer_kernels(), self.xp
        a, b, c = NS_COEFFICIENTS
        norm = ew["sumsq"](x, axis=(x.ndim - 2, x.ndim - 1), keepdims=True)
        x = ew["div_eps"](x, norm, np.float32(eps))
        rows = x.shape[-2]
        gram = xp.empty((*x.shape[:-1], rows), x.dtype)
        poly, prod = xp.empty_like(gram), xp.empty_like(x)
        for _ in range(steps):
            mm(x, x, transpose_b=True, out=gram)
            mm(gram, gram, out=poly)
            ew["ns_axpby"](gram, np.float32(b), np.float32(c), poly)  # b A + c A @ A
            mm(poly, x, out=prod)
            ew["ns_axpby"](prod, np.float32(1.0), np.float32(a), x)  # a X + B @ X
        return x

    def muon_apply(self, p: Any, update: Any, lr: Any, weight_decay: float,
                   factor: float) -> None:
        _optimizer_kernels()["muon_apply"](update, lr, np.float32(weight_decay), np.float32(factor),
                                     p)

    def ema_update(self, ema: Any, p: Any, decay: float, step: Any, start: int) -> None:
        _optimizer_kernels()["ema_update"](p, ema.dtype.type(1.0 - decay), step,
                                           np.int64(start), ema)

    # ---- data ---------------------------------------------------------------------------------
