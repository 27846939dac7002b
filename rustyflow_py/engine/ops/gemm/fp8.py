"""The GEMMs of a PRECISION=fp8 run: bfloat16 operands cast to FP8 just before each GEMM, the
GEMM on FP8 tensor cores through cuBLASLt (CublasLt.matmul_fp8), accumulating in fp32.

Formats follow Transformer Engine's hybrid recipe: e4m3 (more precision) for activations and
weights, e5m2 (more range) for gradients; the op says which operand is a gradient. Scaling is
per tensor, by FP8_SCALING. Delayed (the run's default): in the replayed graph each cast is
scaled by the amax its own site kept from the last replay and takes this one's while casting
(fp8_sites.py), Transformer Engine's recipe; a value above the last amax saturates, and a
producer can write FP8 itself, the scale being known before it runs: the MLP's GELU backward
(`gelu_backward`) and the LayerNorm next to a Linear (`layernorm_forward`,
`layernorm_backward`), whose codes the GEMMs after them take. Current (RunPolicy's default,
for direct engine use): each cast first takes its tensor's amax on the device (fp8/cuda.py),
so a GEMM never sees a saturated value, at the cost of one more read of the tensor.

FP8 GEMMs take both operands with the reduced axis contiguous (the "TN" layout), so an operand
stored the other way round (a weight, or an activation or gradient whose rows are the reduced
axis in a weight gradient) is cast by a transposing kernel straight into that layout. Each
tensor is read once for all the layouts its GEMMs take: a Linear's x and w in forward, their
other layouts kept as codes for backward (`kept`), and a gradient in the block of the two
GEMMs that read it (`shared`).
Anything cuBLASLt cannot take in FP8 (a shape off its 16-byte multiples, float32 operands, a
batched product) raises CublasLtUnsupported, and the caller runs its bf16 GEMM instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ...precision import dtype_name
from ..fp8 import cuda as casts
from ..fp8.formats import E4M3, E5M2, Fp8Format, Fp8Tensor, decode_table
from .cublaslt import CublasLt, CublasLtUnsupported
from .fp8_sites import Fp8Sites


@dataclasses.dataclass(frozen=True)
class Fp8Operand:
    """A 2-D bfloat16 operand of a backward GEMM held as FP8 codes only: `q` the codes of this
    (R, C) array, `q_t` those of its transpose (C, R), either or both (one of a Linear's x or
    w kept from forward, Fp8Gemms.kept; both for a gradient whose producer wrote its codes,
    Fp8Gemms.gelu_backward). It has what the GEMM path reads of an array (shape, dtype,
    nbytes, T), so that the profile counts its FLOPs and bytes; `dense` gives the array
    back (a fallback)."""

    q: Fp8Tensor | None
    q_t: Fp8Tensor | None
    dtype: Any  # the dtype it stands for
    ndim = 2

    @property
    def shape(self) -> tuple[int, int]:
        if self.q is not None:
            return self.q.codes.shape
        assert self.q_t is not None
        cols, rows = self.q_t.codes.shape
        return rows, cols

    @property
    def nbytes(self) -> int:  # what a GEMM reads: one layout
        return int(self.shape[0] * self.shape[1])

    @property
    def T(self) -> Fp8Operand:  # noqa: N802 (an array's name for it)
        return dataclasses.replace(self, q=self.q_t, q_t=self.q)

    def block(self, rows: slice) -> Fp8Operand:
        """The operand of a block of its rows, from the row codes without a copy."""
        if self.q is None:
            raise ValueError("a block of rows is taken from an operand's row codes")
        return Fp8Operand(dataclasses.replace(self.q, codes=self.q.codes[rows]), None,
                          self.dtype)

    def rows(self, fmt: Fp8Format) -> Fp8Tensor:
        """The codes (R, C) in `fmt`, or CublasLtUnsupported where they are kept otherwise."""
        if self.q is None or self.q.fmt is not fmt:
            kept = self.q_t if self.q is None else self.q
            raise CublasLtUnsupported(f"FP8 operand {self.shape} kept as {kept.fmt.name}"
                                      f"{' transposed' if self.q is None else ''}, not "
                                      f"{fmt.name} rows")
        return self.q

    def dense(self, xp: Any) -> Any:
        """The values the codes stand for, as an array of `dtype` (when a GEMM cannot take
        the codes: the bf16 product of the same quantised values)."""
        q = self.q if self.q is not None else self.q_t
        table = xp.asarray(decode_table(q.fmt), np.float32)  # exact: FP8 fits float32
        values = (table[q.codes] * q.scale_inv).astype(self.dtype)
        return values if self.q is not None else values.T


def dense(x: Any, xp: Any) -> Any:
    """x, or the array an Fp8Operand stands for."""
    return x.dense(xp) if isinstance(x, Fp8Operand) else x


def codes(x: Any, fmt: Fp8Format, scaling: casts.Scaling = casts.CURRENT) -> Fp8Tensor:
    """The 2-D x (R, C) in FP8 as C-contiguous codes (R, C), whichever way x is stored: a
    transposed view of a C-contiguous array is cast by the transposing kernel, not copied."""
    stored = _stored(x)
    if stored is None:
        return casts.quantize(x.copy(), fmt, scaling)
    if stored[1]:
        return casts.quantize_t(stored[0], fmt, scaling)
    return casts.quantize(x, fmt, scaling)


def _stored(x: Any) -> tuple[Any, bool] | None:
    """(the C-contiguous 2-D array x reads, whether x is its transpose), or None."""
    if x.flags.c_contiguous:
        return x, False
    if x.T.flags.c_contiguous:
        return x.T, True
    return None


def _layout(x: Any) -> Any:
    """How an operand is stored, for a refusal's key: an array's strides, or kept codes."""
    if isinstance(x, Fp8Operand):
        return "codes", x.q is not None, x.q_t is not None
    return x.strides


def _key(x: Any) -> tuple[Any, ...]:
    """Which memory a C-contiguous 2-D array is: its address, shape and dtype."""
    return x.data.ptr, x.shape, x.dtype.str


def _rows(x: Any, what: str) -> Any:
    """x (..., K) as a 2-D (rows, K) operand without a copy, or CublasLtUnsupported."""
    if x.ndim == 2:
        return x
    if x.ndim < 2 or not x.flags.c_contiguous:
        raise CublasLtUnsupported(f"FP8 GEMM: {what} of shape {x.shape} is not (..., K) "
                                  "C-contiguous")
    return x.reshape(-1, x.shape[-1])


def _made_for(made: Any, key: tuple[Any, ...], fmt: Fp8Format) -> bool:
    """Whether a LayerNorm's hand-off (Fp8Gemms._made) holds the codes of the array of `key`
    in format `fmt`."""
    return made is not None and made[0] == key and made[1].fmt is fmt


class Fp8Gemms:
    """matmul and the Linear layer's GEMM in FP8, on the kernel set's cuBLASLt handle (`lt`,
    the set's maker of it: cuBLASLt is made on first use). A problem cuBLASLt refused is
    remembered by its shapes, so later calls skip its casts and go to bf16 at once.

    Inside `shared(g)`, the GEMMs read the gradient g in both layouts from one cast (see
    there). A Linear's x and w are cast in forward into both layouts at once, and its
    backward reads the layouts it needs from there (`kept`)."""

    def __init__(self, lt: Callable[[], CublasLt], delayed: bool = False) -> None:
        self._lt = lt
        self.sites = Fp8Sites(lt, delayed)  # each cast's scaling (FP8_SCALING)
        self._refused: set[tuple[Any, ...]] = set()
        # shared(g)'s arrays, by _key: None until first cast, then (format, rows, transposed)
        self._shared: dict[tuple[Any, ...], tuple[Fp8Format, Fp8Tensor, Fp8Tensor] | None] = {}
        self._kept: Any = None  # the last linear's (keys, x^T's codes, w's codes): kept()
        # a LayerNorm's codes of what it made (y, e4m3, for the linear next; dx, e5m2, for the
        # shared() block next), both layouts: (key, codes, transposed codes)
        self._made: Any = None

    @contextlib.contextmanager
    def shared(self, g: Any) -> Iterator[None]:
        """A block whose GEMMs read g (..., C) both as rows (an input gradient's GEMM) and
        transposed (a weight gradient's): the first to need it casts it into both layouts by
        one kernel (casts.quantize_both: one amax pass and one read of g instead of two
        each), the other takes the codes made. g must not change inside the block; the codes
        are dropped when it ends."""
        if isinstance(g, Fp8Operand):  # its producer wrote both layouts (gelu_backward)
            yield
            return
        rows = g.reshape(-1, g.shape[-1]) if g.ndim != 2 and g.flags.c_contiguous else g
        made, self._made = self._made, None
        if rows.ndim != 2 or not rows.flags.c_contiguous:
            yield
            return
        key = _key(rows)
        self._shared[key] = (E5M2, made[1], made[2]) if _made_for(made, key, E5M2) else None
        try:
            yield
        finally:
            self._shared.pop(key, None)

    def _codes(self, x: Any, fmt: Fp8Format) -> Fp8Tensor:
        """codes(x, fmt), from the block's cast where x is a layout of a shared(g) gradient,
        or the kept codes of an Fp8Operand."""
        if isinstance(x, Fp8Operand):
            return x.rows(fmt)
        stored = _stored(x) if self._shared else None
        key = None if stored is None else _key(stored[0])
        if key is None or key not in self._shared:
            return codes(x, fmt, self.sites.scaling("matmul operand", fmt, x.shape))
        made = self._shared[key]
        if made is None or made[0] is not fmt:
            made = (fmt, *casts.quantize_both(stored[0], fmt,
                                              self.sites.scaling("gradient", fmt, stored[0].shape)))
            self._shared[key] = made
        return made[2] if stored[1] else made[1]

    def matmul(self, a: Any, b: Any, *, out: Any = None, accumulate: bool = False,
               gradient: str | None = None) -> Any:
        """a (..., M, K) @ b (K, N) in FP8, b 2-D (either may be a transposed view);
        `gradient` ("a" or "b"): the operand cast to e5m2. out: as GemmReference.matmul's
        (bfloat16, or float32 for a gradient buffer)."""
        # a LayerNorm's codes are for the linear (or shared() block) right after it only
        self._made = None
        self._check(a, b)
        a2 = _rows(a, "a")
        shape = (*a.shape[:-1], b.shape[1])
        key = ("matmul", a2.shape, b.shape, _layout(a2), _layout(b), gradient,
               None if out is None else dtype_name(out.dtype), accumulate)
        self._known(key)
        if out is not None and out.shape != shape:
            raise CublasLtUnsupported(f"FP8 GEMM: out {out.shape}, expected {shape}")
        qa = self._codes(a2, E5M2 if gradient == "a" else E4M3)  # (M, K)
        qb = self._codes(b.T, E5M2 if gradient == "b" else E4M3)  # (N, K)
        result = a.dtype if out is None else out.dtype
        target = (self._new(shape, result) if out is None else out).reshape(-1, shape[-1])
        self._run(key, lambda: self._lt().matmul_fp8(qa, qb, target, accumulate=accumulate))
        return target.reshape(shape)

    def linear(self, x: Any, w: Any, b: Any, *, gelu: bool = False, pre_gelu_out: Any = None,
               residual: Any = None) -> Any:
        """y = x @ w + b, or gelu of it (the pre-activation into `pre_gelu_out`), plus a
        `residual`: CublasLt.matmul_bias's contract with x and w cast to e4m3, the bias,
        GELU and residual in the FP8 GEMM's epilogue."""
        self._kept, made, self._made = None, self._made, None
        self._check(x, w)
        x2 = _rows(x, "x")
        shape = (*x.shape[:-1], w.shape[1])
        key = ("linear", x2.shape, w.shape, w.strides, gelu, pre_gelu_out is not None,
               residual is not None)
        self._known(key)
        qx, qw, kept = self._forward_codes(x2, w, made)  # (M, K), (N, K)
        y = self._new(shape, x.dtype)
        n = shape[-1]

        def run() -> Any:
            return self._lt().matmul_fp8(
                qx, qw, y.reshape(-1, n), bias=b, gelu=gelu,
                pre_gelu_out=None if pre_gelu_out is None else pre_gelu_out.reshape(-1, n),
                residual=None if residual is None else residual.reshape(-1, n))

        self._run(key, run)
        self._kept = kept
        return y

    def operand(self, w: Any) -> Fp8Operand:
        """w (R, C), C-contiguous, as the e4m3 codes of its rows, for several GEMMs that
        take it with C reduced (as a, or as b with transpose_b; or blocks of its rows): one
        cast for all of them."""
        return Fp8Operand(codes(w, E4M3, self.sites.scaling("matmul operand", E4M3, w.shape)),
                          None, w.dtype)

    def kept(self, x: Any, w: Any) -> tuple[Any, Any]:
        """(x, w) as the Linear's backward reads them, right after `linear(x, w, ...)`: the
        FP8 codes its casts made in the layouts the backward GEMMs take (x^T for the weight
        gradient, w for the input gradient), as Fp8Operands, or x and w themselves where
        that call did not run in FP8."""
        kept, self._kept = self._kept, None
        x2 = x.reshape(-1, x.shape[-1]) if x.ndim != 2 and x.flags.c_contiguous else x
        if kept is None or (_key(x2), _key(w)) != kept[0]:
            return x, w
        return kept[1], kept[2]

    def _forward_codes(self, x2: Any, w: Any, made: Any) -> tuple[Fp8Tensor, Fp8Tensor, Any]:
        """x's and w^T's codes for the forward GEMM, and (keys, x^T's, w's) codes for its
        backward from the same casts (quantize_both: one read of each, one amax), or x's
        both layouts as the LayerNorm before wrote them (`made`, by layernorm_forward)."""
        if _made_for(made, _key(x2), E4M3):
            qx, qxt = made[1], made[2]
        elif x2.flags.c_contiguous:
            qx, qxt = casts.quantize_both(x2, E4M3, self.sites.scaling("linear x", E4M3,
                                                                       x2.shape))
        else:
            qx, qxt = codes(x2, E4M3, self.sites.scaling("linear x", E4M3, x2.shape)), None
        if w.flags.c_contiguous:
            qw, qwt = casts.quantize_both(w, E4M3, self.sites.scaling("linear w", E4M3, w.shape))
        else:
            qw, qwt = None, codes(w.T, E4M3, self.sites.scaling("linear w", E4M3, w.shape))
        if qxt is None or qw is None:
            return qx, qwt, None
        kept = ((_key(x2), _key(w)), Fp8Operand(None, qxt, x2.dtype),
                Fp8Operand(qw, None, w.dtype))
        return qx, qwt, kept

    def layernorm_forward(self, x: Any, w: Any, b: Any, eps: float
                          ) -> tuple[Any, Any, Any] | None:
        """LayerNorm's forward for the linear right after it: (y, mean, rstd) as the
        LayerNorm kernels give them, with y's e4m3 codes in both layouts written by the same
        pass (casts.layernorm_forward_codes) and kept for that linear, which takes them
        instead of casting y (`_forward_codes`). Only with delayed scaling inside a capture:
        the scale must be known before y is made, and the pass takes the site the linear's
        cast of y would take (the eager warm-up step's cast, in the same order, seeds it).
        None otherwise, or where the shapes do not fit: the caller then runs the LayerNorm
        alone, and the linear casts y."""
        if (not self.sites.delayed or dtype_name(x.dtype) != "bfloat16" or x.ndim < 2
                or not x.flags.c_contiguous):
            return None
        x2 = x.reshape(-1, x.shape[-1])  # (N, C)
        scaling = self._site(casts.layernorm_codes_fit(x2, w, b), "linear x", E4M3, x2.shape)
        if scaling is None:
            return None
        y, mean, rstd, q, q_t = casts.layernorm_forward_codes(x2, w, b, eps, scaling)
        self._made = (_key(y), q, q_t)
        lead = x.shape[:-1]
        return y.reshape(x.shape), mean.reshape(*lead, 1), rstd.reshape(*lead, 1)

    def gelu_backward(self, dh: Any, pre: Any, bias: Any, sums_into: Any,
                      sum_rows: Callable[[Any, Any], Any]) -> Fp8Operand | None:
        """The gradient into an MLP's GELU, dpre = dh * gelu'(pre + bias), as the e5m2 codes of
        both its layouts, written by the GELU backward's own pass (casts.gelu_backward_codes),
        with its column sums added into `sums_into` (the bias's float32 gradient buffer, by
        `sum_rows` from the pass's partial sums). Only with delayed scaling inside a capture:
        the scale must be known before dpre is made, and the cast takes the site the
        separate cast of dpre would take (the warm-up step's eager casts, in the same order,
        seed it). None otherwise, or where the shapes do not fit: the caller then runs the
        bf16 GELU backward, and the GEMMs that read dpre cast it."""
        if (not self.sites.delayed or sums_into is None or sums_into.dtype != np.float32
                or dtype_name(dh.dtype) != "bfloat16" or dh.shape != pre.shape
                or not (dh.flags.c_contiguous and pre.flags.c_contiguous)):
            return None
        dh2, pre2 = dh.reshape(-1, dh.shape[-1]), pre.reshape(-1, pre.shape[-1])  # (N, C)
        scaling = self._site(casts.gelu_codes_fit(dh2, pre2, bias), "gelu gradient", E5M2,
                             dh2.shape)
        if scaling is None:
            return None
        q, q_t, part = casts.gelu_backward_codes(dh2, pre2, bias, scaling)
        sum_rows(part, sums_into)
        return Fp8Operand(q, q_t, dh.dtype)

    def layernorm_backward(self, g: Any, x: Any, w: Any, mean: Any, rstd: Any,
                           residual: Any) -> tuple[Any, Any, Any] | None:
        """LayerNorm's backward for the Linear or MLP whose output x was: (dx with `residual`
        added, dw's and db's partial sums) as casts.layernorm_backward_codes gives them, with
        dx's e5m2 codes in both layouts from the same pass, kept for the shared(dx) block of
        that layer's backward, which takes them instead of casting dx. As layernorm_forward:
        only with delayed scaling inside a capture, taking the site that block's cast of dx
        would take; None otherwise, or where the shapes do not fit."""
        arrays = (g, x) if residual is None else (g, x, residual)
        if (not self.sites.delayed or dtype_name(x.dtype) != "bfloat16" or x.ndim < 2
                or any(a.shape != x.shape or not a.flags.c_contiguous for a in arrays)):
            return None
        g2, x2, *r2 = (a.reshape(-1, x.shape[-1]) for a in arrays)  # (N, C)
        scaling = self._site(casts.layernorm_codes_fit(x2, w, w, g2, *r2), "gradient", E5M2,
                             x2.shape)
        if scaling is None:
            return None
        dx, pdw, pdb, q, q_t = casts.layernorm_backward_codes(g2, x2, w, mean, rstd,
                                                              r2[0] if r2 else None, scaling)
        self._made = (_key(dx), q, q_t)
        return dx.reshape(x.shape), pdw, pdb

    # ---- internals ------------------------------------------------------------------------
    def _site(self, fits: bool, what: str, fmt: Fp8Format, shape: tuple[int, ...]
              ) -> casts.Scaling | None:
        """For a producer that writes codes itself (its arrays `fits` its kernel): the site
        of the cast it replaces, with a delayed scale; None outside a capture, where
        cuBLASLt cannot be had (the producer then runs its plain kernel, as without FP8), or
        where no site is left."""
        try:
            if not fits or not self._lt().stream.is_capturing():
                return None
        except CublasLtUnsupported:
            return None
        scaling = self.sites.scaling(what, fmt, shape)
        return None if scaling.site is None else scaling

    def _check(self, a: Any, b: Any) -> None:
        if dtype_name(a.dtype) != "bfloat16" or b.dtype != a.dtype or b.ndim != 2:
            raise CublasLtUnsupported(f"FP8 GEMMs take bfloat16 (..., K) x (K, N) operands, "
                                      f"not {a.dtype} {a.shape} x {b.dtype} {b.shape}")

    def _known(self, key: tuple[Any, ...]) -> None:
        if key in self._refused:
            raise CublasLtUnsupported(f"cuBLASLt refused this FP8 problem before: {key}")

    def _run(self, key: tuple[Any, ...], call: Callable[[], Any]) -> None:
        try:
            call()
        except CublasLtUnsupported:
            if not self._lt().stream.is_capturing():  # a capture's refusal is not the shape's
                self._refused.add(key)
            raise

    def _new(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._lt().xp.empty(shape, dtype=dtype)
