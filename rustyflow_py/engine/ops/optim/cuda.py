"""CUDA optimizer kernels (CuPy): each optimizer's update over the whole flat buffer in as
few launches as it can (one ElementwiseKernel for the elementwise ones; three RawKernels for
LAMB's per-tensor trust ratios; batched GEMMs for Muon's Newton-Schulz), reading the learning
rate, step and clip factor from device memory so the step stays inside the CUDA graph. A
negative factor means "skip this step" (a float16 run whose gradients overflowed,
model/loss_scale.py): the kernels then leave parameters and state untouched.

The CUDA C is in this folder's .cu files, one per optimizer (cuda_build.py compiles them).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from ...precision import accumulate_dtype
from .. import cuda_build
from .reference import NS_COEFFICIENTS, log_beta

_SRC = {name: cuda_build.source(__file__, f"{name}.cu")
        for name in ("adamw", "adam", "sgd", "rmsprop", "adagrad", "adadelta", "muon", "ema")}
_LAMB = cuda_build.source(__file__, "lamb.cu", cuda_build.dtype_defines(np.float32))
_ADAM_PARAMS = ("T g, float32 lr, int32 step, float32 scale, float32 c1, float32 c2, "
                "float32 lb1, float32 lb2, float32 eps, float32 wd, int64 decay")
_ADAM_ARGS = "i, g, lr, step, scale, c1, c2, lb1, lb2, eps, wd, decay, p, m, v"


@functools.cache
def _optimizer_kernels() -> dict[str, Any]:
    """One ElementwiseKernel per update, each calling its .cu file's device function."""
    import cupy

    ew = cuda_build.elementwise
    return {
        "adamw": ew(_SRC["adamw"], _ADAM_PARAMS, "T p, T m, T v",
                    f"rf_adamw_update({_ADAM_ARGS})", "rf_adamw"),
        "adam": ew(_SRC["adam"], _ADAM_PARAMS, "T p, T m, T v",
                   f"rf_adam_update({_ADAM_ARGS})", "rf_adam"),
        "sgd": ew(_SRC["sgd"], "T g, float32 lr, float32 scale, float32 mu, bool nesterov, "
                  "float32 wd, int64 decay", "T p, T vel",
                  "rf_sgd_update(i, g, lr, scale, mu, nesterov, wd, decay, p, vel)", "rf_sgd"),
        "adagrad": ew(_SRC["adagrad"], "T g, float32 lr, float32 scale, float32 eps, "
                      "float32 wd, int64 decay", "T p, T ssum",
                      "rf_adagrad_update(i, g, lr, scale, eps, wd, decay, p, ssum)",
                      "rf_adagrad"),
        "adadelta": ew(_SRC["adadelta"], "T g, float32 lr, float32 scale, float32 rho, "
                       "float32 crho, float32 eps, float32 wd, int64 decay",
                       "T p, T sq, T dacc",
                       "rf_adadelta_update(i, g, lr, scale, rho, crho, eps, wd, decay, p, sq, "
                       "dacc)", "rf_adadelta"),
        "muon_momentum": ew(_SRC["muon"], "T g, float32 scale, float32 mu, float32 cmu, "
                            "bool nesterov", "T buf, T upd",
                            "rf_muon_momentum_update(g, scale, mu, cmu, nesterov, buf, upd)",
                            "rf_muon_momentum"),
        "muon_apply": ew(_SRC["muon"], "T u, float32 lr, float32 wd, float32 f", "T p",
                         "rf_muon_apply_update(u, lr, wd, f, p)", "rf_muon_apply"),
        "ns_axpby": ew(_SRC["muon"], "T x, float32 a, float32 b", "T y",  # y <- a x + b y
                       "rf_ns_axpby_update(x, a, b, y)", "rf_ns_axpby"),
        "div_eps": ew(_SRC["muon"], "T x, T n, float32 eps", "T y",
                      "y = rf_div_eps_value(x, n, eps)", "rf_div_eps"),
        "ema_update": ew(_SRC["ema"], "T p, T c, int32 step, int64 start", "T ema",
                         "rf_ema_update(p, c, step, start, ema)", "rf_ema"),
        # sqrt(sum(x * x)): the global grad norm, and the Frobenius norms in Newton-Schulz
        "sumsq": cupy.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0",
                                      "rf_l2norm"),
    }


@functools.cache
def _rmsprop(centered: bool, with_momentum: bool) -> Any:
    """RMSprop's kernel for one variant: the centered average and the momentum buffer are
    outputs only when in use (rmsprop.cu has a function per variant)."""
    outs = "T p, T sq" + (", T ga" if centered else "") + (", T buf" if with_momentum else "")
    variant = {(False, False): "plain", (True, False): "centered",
               (False, True): "momentum", (True, True): "centered_momentum"}
    return cuda_build.elementwise(
        _SRC["rmsprop"], "T g, float32 lr, float32 scale, float32 alpha, float32 calpha, "
        "float32 eps, float32 mu, float32 wd, int64 decay", outs,
        f"rf_rmsprop_{variant[centered, with_momentum]}(i, g, lr, scale, alpha, calpha, eps, "
        f"mu, wd, decay, {outs.replace('T ', '')})",
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
        _LAMB.typed("lamb_moments", p.dtype, g, m, v)(
            (t.chunks,), (256,),
            (g, p, m, v, u, pw, pu, t.lo, t.hi, step, self._scale(scale),
             *self._betas(betas, acc), acc.type(eps), acc.type(weight_decay),
             np.int64(decay_size)))
        _LAMB.typed("lamb_trust", p.dtype)(((t.count + 127) // 128,), (128,),
                                       (pw, pu, t.first, trust, np.int32(t.count)))
        _LAMB.typed("lamb_apply", p.dtype, u)((t.chunks,), (256,),
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
