"""The optimizers on the GPU: a CuPy ElementwiseKernel per update calling the device function
of the algorithm's .cu file (Adam's over 16-byte vectors where the buffers allow,
adam_vec.cu), LAMB in three launches over chunks of the flat buffer (lamb.cu: the
per-tensor sums in order, deterministic, no host loop), and Muon's Newton-Schulz on batched
GEMMs around muon.cu's small steps.

The kernels take their scalars as float32 (the betas' complements and logarithms computed in
double first) and read lr, step and the clip factor from device memory: a step is captured
in a CUDA graph whole, and a negative clip factor (a skipped float16 step) leaves
parameters and state untouched.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from ...precision import accumulate_dtype
from .. import cuda_build
from .reference import (
    NS_COEFFICIENTS,
    AdadeltaReference,
    AdagradReference,
    AdamReference,
    EmaReference,
    LambReference,
    MuonReference,
    NormReference,
    OptimizerFamily,
    RmspropReference,
    SgdReference,
    kernel_of,
    log_beta,
)

_ADAM = cuda_build.source(__file__, "adam.cu")
_ADAM_VEC = cuda_build.source(__file__, "adam_vec.cu", cuda_build.dtype_defines(np.float32))
_SGD = cuda_build.source(__file__, "sgd.cu")
_RMSPROP = cuda_build.source(__file__, "rmsprop.cu")
_ADAGRAD = cuda_build.source(__file__, "adagrad.cu")
_ADADELTA = cuda_build.source(__file__, "adadelta.cu")
_LAMB = cuda_build.source(__file__, "lamb.cu", cuda_build.dtype_defines(np.float32))
_MUON = cuda_build.source(__file__, "muon.cu")
_EMA = cuda_build.source(__file__, "ema.cu")
_ADAM_PARAMS = ("T g, float32 lr, int32 step, float32 scale, float32 c1, float32 c2, "
                "float32 lb1, float32 lb2, float32 eps, float32 wd, int64 decay")
_ADAM_ARGS = "i, g, lr, step, scale, c1, c2, lb1, lb2, eps, wd, decay, p, m, v"
_CHUNK = 8192  # LAMB's chunks: at most this many elements, each inside one tensor
f32 = np.float32


@functools.cache
def _kernels() -> dict[str, Any]:
    """The updates' ElementwiseKernels, each calling its .cu file's device function (AdamW
    and Adam one template, adam.cuh's, with L2 = true for Adam)."""
    ew = cuda_build.elementwise
    return {
        **{name: ew(_ADAM, _ADAM_PARAMS, "T p, T m, T v", f"rf_adam_update<{l2}>({_ADAM_ARGS})",
                    f"rf_{name}") for name, l2 in (("adamw", "false"), ("adam", "true"))},
        # bf16 moments as their bits (ADAM_STATE_DTYPE=bf16): adam.cuh's overload for them
        **{f"{name}_bf16": ew(_ADAM, _ADAM_PARAMS, "T p, uint16 m, uint16 v",
                              f"rf_adam_update<{l2}>({_ADAM_ARGS})", f"rf_{name}_bf16")
           for name, l2 in (("adamw", "false"), ("adam", "true"))},
        "sgd": ew(_SGD, "T g, float32 lr, float32 scale, float32 mu, bool nesterov, "
                  "float32 wd, int64 decay", "T p, T vel",
                  "rf_sgd_update(i, g, lr, scale, mu, nesterov, wd, decay, p, vel)", "rf_sgd"),
        "adagrad": ew(_ADAGRAD, "T g, float32 lr, float32 scale, float32 eps, float32 wd, "
                      "int64 decay", "T p, T ssum",
                      "rf_adagrad_update(i, g, lr, scale, eps, wd, decay, p, ssum)",
                      "rf_adagrad"),
        "adadelta": ew(_ADADELTA, "T g, float32 lr, float32 scale, float32 rho, float32 crho, "
                       "float32 eps, float32 wd, int64 decay", "T p, T sq, T dacc",
                       "rf_adadelta_update(i, g, lr, scale, rho, crho, eps, wd, decay, p, sq, "
                       "dacc)", "rf_adadelta"),
        "muon_momentum": ew(_MUON, "T g, float32 scale, float32 mu, float32 cmu, "
                            "bool nesterov", "T buf, T upd",
                            "rf_muon_momentum_update(g, scale, mu, cmu, nesterov, buf, upd)",
                            "rf_muon_momentum"),
        "muon_apply": ew(_MUON, "T u, float32 lr, float32 wd, float32 f", "T p",
                         "rf_muon_apply_update(u, lr, wd, f, p)", "rf_muon_apply"),
        "ns_axpby": ew(_MUON, "T x, float32 a, float32 b", "T y",  # y <- a x + b y
                       "rf_ns_axpby_update(x, a, b, y)", "rf_ns_axpby"),
        "div_eps": ew(_MUON, "T x, T n, float32 eps", "T y", "y = rf_div_eps_value(x, n, eps)",
                      "rf_div_eps"),
        "ema": ew(_EMA, "T p, T c, int32 step, int64 start", "T ema",
                  "rf_ema_update(p, c, step, start, ema)", "rf_ema"),
    }


@functools.cache
def _rmsprop(centered: bool, with_momentum: bool) -> Any:
    """RMSprop's kernel for one variant: the centered average and the momentum buffer are
    outputs only when in use (the square average stands in for the others: a variant never
    touches what it does not use)."""
    outs = "T p, T sq" + (", T ga" if centered else "") + (", T buf" if with_momentum else "")
    ga, buf = ("ga" if centered else "sq"), ("buf" if with_momentum else "sq")
    flags = f"{str(centered).lower()}, {str(with_momentum).lower()}"
    return cuda_build.elementwise(
        _RMSPROP, "T g, float32 lr, float32 scale, float32 alpha, float32 calpha, "
        "float32 eps, float32 mu, float32 wd, int64 decay", outs,
        f"rf_rmsprop_update<{flags}>(i, g, lr, scale, alpha, calpha, eps, mu, wd, decay, p, "
        f"sq, {ga}, {buf})",
        f"rf_rmsprop_{int(centered)}{int(with_momentum)}")


@functools.cache
def sumsq(widen: bool = False) -> Any:
    """sqrt(sum(x * x)) as one CuPy ReductionKernel: the global grad norm, and the Frobenius
    norms in Muon's Newton-Schulz (a map, a sum and a post-map expression: no .cu file).
    `widen`: each value widened to float32 first, the sum and the norm float32 (a bf16
    gradient's)."""
    import cupy

    y, x = ("float32 y", "float(x)") if widen else ("T y", "x")
    return cupy.ReductionKernel("T x", y, f"{x} * {x}", "a + b", "y = sqrt(a)", "0",
                                "rf_l2norm_bf16" if widen else "rf_l2norm")


class CudaOptimizerFamily(OptimizerFamily):
    """The GPU's: the scalar arguments of the update kernels."""

    uses = ("_one",)

    @staticmethod
    def _betas(betas: tuple[float, float], dtype: Any = np.float32) -> tuple[Any, ...]:
        """(1 - b1, 1 - b2, log b1, log b2), each computed in double, then rounded."""
        b1, b2 = betas
        return tuple(np.dtype(dtype).type(x) for x in (1.0 - b1, 1.0 - b2, log_beta(b1),
                                                        log_beta(b2)))

    def _scale(self, scale: Any) -> Any:
        """The clip factor, or a device 1 without clipping."""
        return self._one if scale is None else scale


def launched(reference: Callable[..., None], kernel: Callable[..., Any],
             constants: Callable[..., tuple[Any, ...]]) -> Callable[..., None]:
    """A GPU family's update for `reference`'s op, whose arguments are (p, g, *state, lr,
    scale, *hyper, weight_decay, decay_size): one launch of kernel(*state) (the
    ElementwiseKernel for the state given, None where unused) over (g, lr, the clip factor,
    *constants(*hyper), weight_decay, decay_size, p, *the state given). The signature and
    docs are the reference's."""
    state = list(inspect.signature(reference).parameters).index("lr") - 3  # self, p, g

    @functools.wraps(reference)
    def update(self: CudaOptimizerFamily, p: Any, g: Any, *args: Any) -> None:
        lr, scale, *hyper, weight_decay, decay_size = args[state:]
        kernel(*args[:state])(g, lr, self._scale(scale), *constants(*hyper), f32(weight_decay),
                              np.int64(decay_size), p, *(a for a in args[:state] if a is not None))

    return update


class CudaNorm(NormReference):
    def l2_norm(self, g: Any) -> Any:
        """sqrt(sum(g * g)); a bf16 gradient (a data-parallel run's summed copy) is squared
        and summed in float32, as its widened copy would be."""
        return sumsq(widen=g.dtype.name == "bfloat16")(g)


class CudaSgd(SgdReference, CudaOptimizerFamily):
    sgd = launched(SgdReference.sgd, lambda velocity: _kernels()["sgd"],
                   lambda momentum, nesterov: (f32(momentum), bool(nesterov)))


class CudaRmsprop(RmspropReference, CudaOptimizerFamily):
    rmsprop = launched(RmspropReference.rmsprop,
                       lambda square, centered, momentum: _rmsprop(centered is not None,
                                                                   momentum is not None),
                       lambda alpha, eps, momentum: (f32(alpha), f32(1.0 - alpha), f32(eps),
                                                     f32(momentum)))


class CudaAdagrad(AdagradReference, CudaOptimizerFamily):
    adagrad = launched(AdagradReference.adagrad, lambda state_sum: _kernels()["adagrad"],
                       lambda eps: (f32(eps),))


class CudaAdadelta(AdadeltaReference, CudaOptimizerFamily):
    adadelta = launched(AdadeltaReference.adadelta,
                        lambda square, delta: _kernels()["adadelta"],
                        lambda rho, eps: (f32(rho), f32(1.0 - rho), f32(eps)))


def _quad(a: Any, p: Any) -> str | None:
    """How adam_vec.cu loads `a` (the gradient, or a moment) beside float32 parameters `p`,
    four values at a time: "float32" (16-byte aligned) or "bfloat16" (8-byte aligned); None
    where it cannot (shape, layout, dtype or alignment)."""
    if a.shape != p.shape or not a.flags.c_contiguous:
        return None
    align = {"float32": 16, "bfloat16": 8}.get(a.dtype.name)
    return a.dtype.name if align and a.data.ptr % align == 0 else None


def _vector_defines(grad: str, state: str, real: Any) -> tuple[str, ...]:
    """adam_vec.cu's -D options for a gradient and moments of these dtypes (_quad's names)
    and a compute copy of dtype `real`: a bf16 gradient (the data-parallel run's summed
    copy) is RF_GRAD, bf16 moments (ADAM_STATE_DTYPE=bf16) RF_STATE_BF16."""
    defines = ()
    if grad == "bfloat16":
        defines = ("-DRF_GRAD=__nv_bfloat16",) + (() if real.name == "bfloat16"
                                                  else ("-DRF_BF16=1",))
    return defines + (("-DRF_STATE_BF16=1",) if state == "bfloat16" else ())


class CudaAdam(AdamReference, CudaOptimizerFamily):
    def _update(self, name: str, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any,
                scale: Any, betas: tuple[float, float], eps: float, weight_decay: float,
                decay_size: int, copy_to: Any = None) -> None:
        """One launch of AdamW's or Adam's kernel (they take the same arguments): over
        vectors of four where the buffers allow (float32 parameters, aligned, a multiple of 4
        long; the gradient and the moments float32 or bf16: adam_vec.cu), writing the
        compute copy in the same pass; otherwise adam.cu's one-element-a-thread
        ElementwiseKernel, then the copy. bf16 moments (ADAM_STATE_DTYPE=bf16) are rounded
        stochastically either way, by the same bits (adam.cuh). At GPT-2's
        124M parameters the vector kernel reads and writes memory markedly faster
        (benchmarks/results/gpt2-fusions-h100.md)."""
        scale = self._scale(scale)
        scalars = (*self._betas(betas), f32(eps), f32(weight_decay), np.int64(decay_size))
        vecs = cuda_build.vectors(p)
        fits = copy_to is None or (copy_to.shape == p.shape and copy_to.flags.c_contiguous
                                   and copy_to.itemsize == 2)
        real = np.dtype(f32 if copy_to is None else copy_to.dtype)
        grad, state = _quad(g, p), _quad(m, p)
        if vecs and fits and grad and state and _quad(v, p) == state and p.dtype == f32 and (
                lr.dtype, step.dtype, scale.dtype) == (f32, np.int32, f32):
            _ADAM_VEC.typed(f"rf_{name}_vec", real, defines=_vector_defines(grad, state, real))(
                *cuda_build.vector_grid(vecs),
                (g, lr, step, scale, *scalars, p, m, v,
                 np.uint64(0) if copy_to is None else copy_to, np.int64(vecs)))
            return
        if g.dtype != p.dtype:  # the one-element kernel takes one dtype: a widened copy
            g = g.astype(p.dtype)
        if m.dtype.name == "bfloat16":  # their bits, for adam.cuh's overload
            _kernels()[f"{name}_bf16"](g, lr, step, scale, *scalars, p, m.view(np.uint16),
                                       v.view(np.uint16))
        else:
            _kernels()[name](g, lr, step, scale, *scalars, p, m, v)
        if copy_to is not None:
            copy_to[...] = p

    adamw = kernel_of(AdamReference.adamw, _update, "adamw")
    adam = kernel_of(AdamReference.adam, _update, "adam")


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


class CudaLamb(LambReference, CudaOptimizerFamily):
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


class CudaMuon(MuonReference, CudaOptimizerFamily):
    def muon_momentum(
        self, g: Any, buf: Any, out: Any, scale: Any, momentum: float, nesterov: bool,
    ) -> None:
        _kernels()["muon_momentum"](g, self._scale(scale), f32(momentum), f32(1.0 - momentum),
                                    bool(nesterov), buf, out)

    def newton_schulz(self, x: Any, steps: int, eps: float, mm: Any) -> Any:
        """Two fused launches for the norm, then per iteration three GEMMs (through `mm`)
        and two in-place axpby launches; the work buffers come from the pool once."""
        ew, xp = _kernels(), self.xp
        a, b, c = NS_COEFFICIENTS
        norm = sumsq()(x, axis=(x.ndim - 2, x.ndim - 1), keepdims=True)
        x = ew["div_eps"](x, norm, f32(eps))
        rows = x.shape[-2]
        gram = xp.empty((*x.shape[:-1], rows), x.dtype)
        poly, prod = xp.empty_like(gram), xp.empty_like(x)
        for _ in range(steps):
            mm(x, x, transpose_b=True, out=gram)
            mm(gram, gram, out=poly)
            ew["ns_axpby"](gram, f32(b), f32(c), poly)  # b A + c A @ A
            mm(poly, x, out=prod)
            ew["ns_axpby"](prod, f32(1.0), f32(a), x)  # a X + B @ X
        return x

    def muon_apply(self, p: Any, update: Any, lr: Any, weight_decay: float,
                   factor: float) -> None:
        _kernels()["muon_apply"](update, lr, f32(weight_decay), f32(factor), p)


class CudaEma(EmaReference):
    def ema_update(self, ema: Any, p: Any, decay: float, step: Any, start: int) -> None:
        _kernels()["ema"](p, ema.dtype.type(1.0 - decay), step, np.int64(start), ema)
