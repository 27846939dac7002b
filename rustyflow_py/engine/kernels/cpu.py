"""CPU kernels: the shared formulation, with every big pass spread over the cores.

RustyFlow's own thread pool runs all the parallel work, GEMMs included: a large product is
cut into chunks (of rows, columns or the reduction, whichever duplicates the least operand
packing) and each chunk is a single-threaded BLAS call. With OpenBLAS's own threads in play
instead, its idle workers busy-wait for a while after every GEMM and take a core away from
the elementwise passes that follow (measured: those ran ~1.5x slower).

The elementwise and row-wise passes (softmax cross-entropy over the (B*T, V) logits, GELU,
attention softmax, LayerNorm, AdamW) release the GIL, so the pool scales them too. Work is
cut into cache-sized blocks that the threads take from one shared queue: a kernel's several
passes over a block hit the cache rather than memory, and a core slowed down by another
process simply takes fewer blocks instead of holding the others up.

With numba installed (CPU_JIT=auto|on), a block of float32 work goes to the matching kernel of
kernels/jit.py instead of the NumPy calls: same blocks, same pool, one compiled loop.
"""

from __future__ import annotations

import ctypes
import math
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import numpy as np

from ..devices import openblas
from .reference import GELU_C, GELU_K, XpKernels

Blocks = Iterator[tuple[int, int]]

# Sizes in elements. Every NumPy call re-takes the GIL, so threads working on small blocks
# queue for it (measured: AdamW on 32K-element blocks ran 1.7x slower on 2 threads than on
# 1); blocks of 128K+ elements keep the calls long and still sit in the L2/L3 caches.
_BLOCK = 128 * 1024  # a cache block of the elementwise passes
_XENT_BLOCK = 256 * 1024  # a row block of the vocabulary-wide softmax
_QUERY_BLOCK = 64  # attention rows per block: keys past a block's last row are all masked
_MIN_PARALLEL = 256 * 1024  # the least work (elements) worth another thread
_GEMM_CHUNK = 8e6  # multiply-adds in the smallest GEMM chunk worth a BLAS call of its own
_CHUNKS_PER_THREAD = 4  # GEMM chunks per thread: enough for the threads to even out
_SAFE_SUM = 2.0**-60  # least row sum of unshifted exponentials that keeps full precision

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc mallopt parameters


def _keep_freed_memory() -> None:
    """Serve every allocation from the heap and never hand freed memory back (glibc only).

    By default glibc maps each block over 32 MiB freshly and unmaps it on free, so every
    large activation is page-faulted and zeroed again at every step (the small shape spent
    ~25% of its step there: 15.5 s -> 11.4 s a step without it). Now freed blocks are reused;
    the price is that the process keeps its peak heap, which a training run reaches anyway.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: leave the allocator alone
        return
    mallopt(_M_MMAP_MAX, 0)
    mallopt(_M_TRIM_THRESHOLD, -1)


def _blas_single_thread() -> bool:
    """Make OpenBLAS single-threaded; False if this NumPy's BLAS cannot be controlled."""
    found = openblas()
    if found is None:
        return False
    lib, pattern = found
    getattr(lib, pattern % "set_num_threads")(1)
    return True


def _redo_shifted(
    source: tuple[np.ndarray, np.ndarray], e: np.ndarray, targets: np.ndarray,
    nll: np.ndarray, sums: np.ndarray,
) -> None:
    """Redo the rows of an unshifted softmax (see _softmax_rows) whose sum left the safe
    range, with the usual max shift, from their logits h[rows] @ w.T (a small GEMM, rarely
    needed: not timed as a matmul)."""
    rows = np.flatnonzero(~((sums >= _SAFE_SUM) & (sums < np.inf)))
    if not rows.size:
        return
    h, w = source
    logits = h[rows] @ w.T
    logits -= logits.max(axis=1, keepdims=True)
    picked = logits[np.arange(rows.size), targets[rows]]
    np.exp(logits, out=logits)
    e[rows] = logits
    sums[rows] = logits.sum(axis=1)
    nll[rows] = np.log(sums[rows]) - picked


def load_jit(mode: str) -> ModuleType | None:
    """kernels/jit.py (numba) for CPU_JIT=auto when numba imports, or on; None for off."""
    if mode == "off":
        return None
    try:
        from . import jit
    except ImportError as exc:  # numba missing, or built for another NumPy
        if mode == "on":
            raise RuntimeError(f"CPU_JIT=on, but numba does not import ({exc}): pip install "
                               "'rustyflow-py[jit]', or set CPU_JIT=auto to use NumPy") from exc
        return None
    return jit


def _blocks(start: int, stop: int, size: int) -> Blocks:
    for i in range(start, stop, size):
        yield i, min(i + size, stop)


class CpuKernels(XpKernels):
    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self._pool: ThreadPoolExecutor | None = None
        self._spare: dict[tuple[tuple[int, ...], Any], np.ndarray] = {}  # see _workspace
        self._notmask: dict[int, np.ndarray] = {}
        self._ones: dict[tuple[int, Any], np.ndarray] = {}
        self.set_threads(os.cpu_count() or 1)
        self.set_jit("auto")
        _keep_freed_memory()

    def set_threads(self, threads: int) -> None:
        """Use `threads` cores; GEMMs are split by the pool only when BLAS can be pinned to
        one thread per call (otherwise BLAS threads itself and chunks would oversubscribe)."""
        self.threads = max(1, threads)
        self.split_gemms = self.threads > 1 and _blas_single_thread()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def set_jit(self, mode: str) -> None:
        """CPU_JIT: auto (numba kernels when numba imports), on (numba required) or off."""
        self.jit = load_jit(mode)

    def _jit_for(self, *arrays: np.ndarray) -> ModuleType | None:
        """The numba kernels for float32 work; float64 (gradient checks, PRECISION=fp64)
        keeps the NumPy formulation, whose exp is exact to float64."""
        return self.jit if all(a.dtype == np.float32 for a in arrays) else None

    # ---- the pool --------------------------------------------------------------------------
    def _parallel(self, worker: Callable[[Blocks], Any], n: int, block: int,
                  work: float) -> list[Any]:
        """worker(blocks) on each thread, all drawing (start, stop) blocks of [0, n) from one
        shared iterator (a list iterator: atomic under the GIL). The caller's thread is one
        of them; `work` elements below _MIN_PARALLEL per thread use fewer threads."""
        blocks = list(_blocks(0, n, max(1, block)))
        k = min(self.threads, len(blocks), max(1, int(work // _MIN_PARALLEL)))
        shared = iter(blocks)
        if k == 1:
            return [worker(shared)]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="rustyflow")
        futures = [self._pool.submit(worker, shared) for _ in range(k - 1)]
        first = worker(shared)
        return [first, *(f.result() for f in futures)]

    def _workspace(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """The (N, V) buffer of the LM head, reused from step to step (its pages are faulted
        in once, whatever the allocator). One is kept per shape given back, so training and
        evaluation batches each keep theirs instead of fragmenting the heap in turn."""
        buf = self._spare.pop((shape, np.dtype(dtype)), None)
        return np.empty(shape, dtype) if buf is None else buf

    def _give_back(self, buf: np.ndarray) -> None:
        self._spare[(buf.shape, buf.dtype)] = buf

    def _ones_vector(self, n: int, dtype: Any) -> np.ndarray:
        """ones(n): row and column sums as BLAS GEMVs, ~2-4x faster than NumPy's sum()."""
        key = (n, np.dtype(dtype))
        if key not in self._ones:
            self._ones[key] = np.ones(n, dtype)
        return self._ones[key]

    # ---- GEMM --------------------------------------------------------------------------------
    def matmul(self, a: Any, b: Any, out: Any = None) -> Any:
        """a @ b (into `out` if given), a large product spread over the pool."""
        if not self.split_gemms or a.ndim < 2 or b.ndim < 2:
            return np.matmul(a, b, out=out)
        if a.ndim > 2 and b.ndim == 2 and (out is None or out.flags.c_contiguous):
            # (..., M, K) @ (K, N): one GEMM over all the rows (out must reshape as a view)
            if out is None:
                out = np.empty((*a.shape[:-1], b.shape[1]), np.result_type(a, b))
            self._gemm(a.reshape(-1, a.shape[-1]), b, out.reshape(-1, b.shape[1]))
            return out
        if a.ndim == b.ndim == 2:
            if out is None:
                out = np.empty((a.shape[0], b.shape[1]), np.result_type(a, b))
            self._gemm(a, b, out)
            return out
        if a.shape[:-2] == b.shape[:-2]:  # batched: chunks of the leading axis
            if out is None:
                out = np.empty((*a.shape[:-1], b.shape[-1]), np.result_type(a, b))
            macs = a.size * b.shape[-1]
            size = math.ceil(a.shape[0] / self._chunks(macs, a.shape[0]))

            def batches(blocks: Blocks) -> None:
                for i, j in blocks:
                    np.matmul(a[i:j], b[i:j], out=out[i:j])

            self._parallel(batches, a.shape[0], size, macs / _GEMM_CHUNK * _MIN_PARALLEL)
            return out
        return np.matmul(a, b, out=out)

    def _chunks(self, macs: float, extent: int) -> int:
        """How many chunks to cut a GEMM into: a few per thread, for balance."""
        return max(1, min(_CHUNKS_PER_THREAD * self.threads, int(macs // _GEMM_CHUNK), extent))

    def _gemm(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        """out = a @ b for 2-D operands. Each chunk packs its own copy of the operand the
        chunks share, so cut the dimension whose sharing costs least: rows of a (b shared),
        columns of b (a shared), or the reduction (partial products summed afterwards)."""
        m, k = a.shape
        n = b.shape[1]
        macs = m * n * k
        cost = {"rows": k * n, "cols": m * k, "reduction": m * n}
        split = min(cost, key=cost.__getitem__)
        extent = {"rows": m, "cols": n, "reduction": k}[split]
        chunks = self._chunks(macs, extent // 16)
        if chunks == 1:
            np.matmul(a, b, out=out)
            return
        size = math.ceil(extent / chunks / 16) * 16
        work = macs / _GEMM_CHUNK * _MIN_PARALLEL  # in _parallel's units: one thread a chunk

        if split == "rows":
            def rows(blocks: Blocks) -> None:
                for i, j in blocks:
                    np.matmul(a[i:j], b, out=out[i:j])

            self._parallel(rows, m, size, work)
        elif split == "cols":
            def cols(blocks: Blocks) -> None:
                for i, j in blocks:
                    np.matmul(a, b[:, i:j], out=out[:, i:j])

            self._parallel(cols, n, size, work)
        else:
            def partial(blocks: Blocks) -> np.ndarray | None:
                acc = tmp = None
                for i, j in blocks:
                    if acc is None:
                        acc = np.matmul(a[:, i:j], b[i:j])
                    else:
                        tmp = np.matmul(a[:, i:j], b[i:j], out=tmp)
                        acc += tmp
                return acc

            sums = [s for s in self._parallel(partial, k, size, work) if s is not None]
            np.copyto(out, sums[0])
            for s in sums[1:]:
                out += s

    # ---- softmax cross-entropy ---------------------------------------------------------------
    def _softmax_rows(
        self, logits: np.ndarray, out: np.ndarray, targets: np.ndarray, grad_of_mean: bool,
        source: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """out <- exp(logits - shift) and per-row NLL, in row blocks that stay in cache
        through all their passes. With grad_of_mean, the same pass turns `out` into
        d(mean NLL)/d(logits). Returns (NLL, row sums of the exponentials).

        The shift is the row max, unless `source` = (h, w) with logits = h @ w.T says how to
        rebuild a row (and out is logits): then the shift is 0, which saves a max pass and a
        subtraction (~15% of this pass). That is exact while the row sum s is finite and
        >= _SAFE_SUM (no exp overflowed; what underflowed weighs < 1e-15 of s); the rare row
        outside is recomputed from `source` with the max shift."""
        n, v = logits.shape
        nll = np.empty(n, logits.dtype)
        sums = np.empty_like(nll)
        ones = self._ones_vector(v, logits.dtype)
        jit = self._jit_for(logits)

        def worker(blocks: Blocks) -> None:
            for i, j in blocks:
                x, e, t = logits[i:j], out[i:j], targets[i:j]
                if jit is not None:
                    jit.softmax_xent(e, None if out is logits else x, t, source is None,
                                     n if grad_of_mean else 0, nll[i:j], sums[i:j])
                    continue
                idx = np.arange(j - i)
                if source is None:
                    np.subtract(x, x.max(axis=1, keepdims=True), out=e)
                picked = e[idx, t]  # the target's shifted logit
                # (errstate is per thread) an unshifted row that overflows is redone below
                with np.errstate(over="ignore", divide="ignore"):
                    np.exp(e, out=e)
                    s = e @ ones  # row sums as a BLAS GEMV: ~10% faster than sum()
                    nll[i:j] = np.log(s) - picked
                sums[i:j] = s
                if grad_of_mean:
                    e *= (1.0 / (s * n))[:, None]
                    e[idx, t] -= 1.0 / n

        self._parallel(worker, n, _XENT_BLOCK // v, logits.size)
        if source is not None:
            _redo_shifted(source, out, targets, nll, sums)
        return nll, sums

    def cross_entropy(
        self, logits: Any, targets: Any, need_grad: bool, inplace: bool
    ) -> tuple[Any, Any | None]:
        out = logits if inplace else np.empty_like(logits)
        nll, _ = self._softmax_rows(logits, out, targets, need_grad)
        return nll.mean(dtype=logits.dtype), (out if need_grad else None)

    def cross_entropy_backward(self, state: Any, g: Any) -> Any:
        if float(g) == 1.0:  # the usual seed gradient: skip a full pass
            return state
        state *= g
        return state

    def lm_head_xent(
        self, h: Any, w: Any, targets: Any, need_grad: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        """Keeps e = exp(logits - shift) in a reused buffer and never forms d(logits) =
        g (e - s onehot) / (s N): backward subtracts each row sum s at its target (N writes)
        and folds the row scale g / (s N) into the GEMMs' (N, E)-sized operand or result, so
        the (N, V) matrix sees one GEMM write and one cache-blocked pass in total."""
        e = self._workspace((h.shape[0], w.shape[0]), np.result_type(h, w))
        mm(h, w.T, e)
        nll, sums = self._softmax_rows(e, e, targets, False, source=(h, w))
        loss = nll.mean(dtype=e.dtype)
        if not need_grad:
            self._give_back(e)
            return loss, None
        return loss, (e, sums, h, w, targets)

    def lm_head_xent_backward(
        self, state: Any, g: Any, need_h: bool, need_w: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        e, sums, h, w, targets = state
        n = e.shape[0]
        e[np.arange(n), targets] -= sums
        row_scale = (np.asarray(g, e.dtype) / (sums * n))[:, None]  # (N, 1)
        dh = dw = None
        if need_h:
            dh = mm(e, w)
            dh *= row_scale
        if need_w:
            dw = mm(e.T, h * row_scale)
        self._give_back(e)
        return dh, dw

    # ---- GELU (tanh approximation) as x * sigmoid(2u): one exp instead of a slower tanh ---------
    def _gelu_pass(self, x: Any, bias: Any | None, fn: Callable[..., None], *others: Any,
                   jit_fn: Callable[..., None] | None = None) -> Any:
        """Run fn(z, out, *other_blocks, scratch) over cache blocks of rows, z = x (+ bias);
        with jit_fn (numba, float32), jit_fn(*other_blocks, x_block, bias, out) instead."""
        c = x.shape[-1]
        x2 = x.reshape(-1, c)
        rest = [o.reshape(-1, c) for o in others]
        out = np.empty_like(x2)
        rows = max(1, _BLOCK // c)
        if self._jit_for(x2, *rest, *([] if bias is None else [bias])) is None:
            jit_fn = None

        def worker(blocks: Blocks) -> None:
            scratch = None if jit_fn is not None else np.empty((3, rows, c), x.dtype)
            with np.errstate(over="ignore"):  # exp(-2u) -> inf for very negative z: GELU -> 0
                for i, j in blocks:
                    if jit_fn is not None:
                        jit_fn(*(r[i:j] for r in rest), x2[i:j], bias, out[i:j])
                        continue
                    z = x2[i:j]
                    if bias is not None:
                        z = np.add(z, bias, out=out[i:j])
                    fn(z, out[i:j], *(r[i:j] for r in rest), *scratch[:, : j - i])

        self._parallel(worker, x2.shape[0], rows, x2.size)
        return out.reshape(x.shape)

    def gelu_forward(self, x: Any, bias: Any | None) -> Any:
        def fwd(z: Any, out: Any, t: Any, *_: Any) -> None:
            np.multiply(z, z, out=t)
            t *= -2.0 * GELU_C * GELU_K
            t -= 2.0 * GELU_C
            t *= z  # -2u, u = c (z + k z^3)
            np.exp(t, out=t)
            t += 1.0
            np.divide(z, t, out=out)  # z * sigmoid(2u) = 0.5 z (1 + tanh u)

        jit_fn = None if self.jit is None else self.jit.gelu_forward
        return self._gelu_pass(x, bias, fwd, jit_fn=jit_fn)

    def gelu_backward(self, g: Any, x: Any, bias: Any | None) -> Any:
        def bwd(z: Any, out: Any, gb: Any, z2: Any, sig: Any, tmp: Any) -> None:
            np.multiply(z, z, out=z2)
            np.multiply(z2, -2.0 * GELU_C * GELU_K, out=sig)
            sig -= 2.0 * GELU_C
            sig *= z
            np.exp(sig, out=sig)
            sig += 1.0
            np.reciprocal(sig, out=sig)  # sigmoid(2u)
            np.subtract(1.0, sig, out=tmp)
            z2 *= 6.0 * GELU_C * GELU_K
            z2 += 2.0 * GELU_C  # 2 du/dz
            z2 *= z
            z2 *= sig
            z2 *= tmp
            z2 += sig  # d/dz z sigmoid(2u) = s + z s (1 - s) 2 du/dz
            np.multiply(z2, gb, out=out)

        jit_fn = None if self.jit is None else self.jit.gelu_backward
        return self._gelu_pass(x, bias, bwd, g, jit_fn=jit_fn)

    # ---- causal attention softmax over (B, H, T, T) scores ------------------------------------
    # Blocks of whole (T, T) matrices, and within them blocks of _QUERY_BLOCK query rows that
    # touch only the keys up to their last row: the rest is masked, so it is zeroed without
    # being computed (at T=256, 5/8 of the exps and passes remain).
    def _causal_pass(self, arrays: tuple[Any, ...], fn: Callable[..., None],
                     jit_fn: Callable[[slice], None] | None = None) -> None:
        """fn(*views, mats, rows) for blocks of the (M, T, T) arrays, each view being
        array[mats, rows, :rows.stop] (the keys those query rows can see); the keys past
        rows.stop are masked for all of them and are zeroed in arrays[0]. jit_fn(mats), a
        numba kernel bound to its arrays, replaces that per block of matrices when given."""
        first, t = arrays[0], arrays[0].shape[-1]

        def worker(blocks: Blocks) -> None:
            for i, j in blocks:
                if jit_fn is not None:
                    jit_fn(slice(i, j))
                    continue
                for r0 in range(0, t, _QUERY_BLOCK):
                    r1 = min(r0 + _QUERY_BLOCK, t)
                    fn(*(a[i:j, r0:r1, :r1] for a in arrays), slice(i, j), slice(r0, r1))
                    first[i:j, r0:r1, r1:] = 0

        per = max(1, _BLOCK // (_QUERY_BLOCK * t))
        self._parallel(worker, first.shape[0], per, first.size)

    def _masked(self, t: int) -> np.ndarray:
        if t not in self._notmask:
            self._notmask[t] = ~self.causal_mask(t)
        return self._notmask[t]

    def causal_softmax_forward(self, scores: Any, scale: float, with_lse: bool = False) -> Any:
        t = scores.shape[-1]
        s = np.ascontiguousarray(scores).reshape(-1, t, t)
        lse = np.empty((s.shape[0], t, 1), s.dtype) if with_lse else None
        masked = self._masked(t)

        def block(x: Any, mats: slice, rows: slice) -> None:
            x *= scale
            np.copyto(x[..., rows], -np.inf, where=masked[rows, rows])  # the diagonal square
            m = x.max(axis=-1, keepdims=True)
            x -= m
            np.exp(x, out=x)
            z = x.sum(axis=-1, keepdims=True)
            x /= z
            if lse is not None:
                np.log(z, out=z)
                np.add(z, m, out=lse[mats, rows])

        jit = self._jit_for(s)
        self._causal_pass((s,), block, jit and (lambda mats: jit.causal_softmax_forward(
            s[mats], scale, None if lse is None else lse[mats])))
        probs = s.reshape(scores.shape)
        return (probs, lse.reshape((*scores.shape[:-1], 1))) if lse is not None else probs

    def causal_softmax_recompute(self, scores: Any, lse: Any, scale: float) -> Any:
        t = scores.shape[-1]
        s = np.ascontiguousarray(scores).reshape(-1, t, t)
        rows_lse = lse.reshape(-1, t, 1)
        masked = self._masked(t)

        def block(x: Any, mats: slice, rows: slice) -> None:
            x *= scale
            np.copyto(x[..., rows], -np.inf, where=masked[rows, rows])  # before exp: no overflow
            x -= rows_lse[mats, rows]
            np.exp(x, out=x)

        jit = self._jit_for(s, rows_lse)
        self._causal_pass((s,), block, jit and (lambda mats: jit.causal_softmax_recompute(
            s[mats], rows_lse[mats], scale)))
        return s.reshape(scores.shape)

    def causal_softmax_backward(self, g: Any, probs: Any, scale: float) -> Any:
        t = probs.shape[-1]
        ds = np.empty((probs.size // (t * t), t, t), np.result_type(g, probs))

        def block(d: Any, p: Any, gb: Any, *_: slice) -> None:
            np.multiply(gb, p, out=d)
            dot = d.sum(axis=-1, keepdims=True)
            np.subtract(gb, dot, out=d)
            d *= p  # p (g - <g, p>)
            d *= scale

        p3, g3 = probs.reshape(-1, t, t), g.reshape(-1, t, t)
        jit = self._jit_for(p3, g3)
        self._causal_pass((ds, p3, g3), block, jit and (lambda mats: jit.causal_softmax_backward(
            g3[mats], p3[mats], scale, ds[mats])))
        return ds.reshape(probs.shape)

    # ---- embedding backward --------------------------------------------------------------------
    def scatter_add_rows(self, dst: Any, idx: Any, rows: Any) -> None:
        jit = self._jit_for(dst, rows)
        if jit is None:
            super().scatter_add_rows(dst, idx, rows)
        else:
            jit.scatter_add_rows(dst, idx.ravel(), rows.reshape(-1, dst.shape[-1]))

    # ---- optimizer ----------------------------------------------------------------------------
    def l2_norm(self, g: Any) -> Any:
        """BLAS dots per cache block, summed in float64: as fast as one dot over the whole
        buffer, whose float32 accumulator drifts ~1e-5 over millions of squares."""

        def worker(blocks: Blocks) -> float:
            return sum(float(np.dot(g[i:j], g[i:j])) for i, j in blocks)

        return np.asarray(math.sqrt(sum(self._parallel(worker, g.size, _BLOCK, g.size))),
                          g.dtype)

    def adamw(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        """The shared formulation's arithmetic, op for op (bit-identical), per cache block;
        numba's fused loop instead when loaded (equal to within float32 rounding)."""
        b1, b2 = betas
        t = step.astype(p.dtype)
        g_scale = None if scale is None else scale.astype(g.dtype)
        decay = 1.0 - lr * weight_decay
        bias2 = np.sqrt(1.0 - b2**t)
        step_size = (lr / (1.0 - b1**t)).astype(p.dtype)

        jit = self._jit_for(p, g, m, v)
        scalars = (float(decay), b1, b2, float(step_size), float(bias2), eps,
                   1.0 if g_scale is None else float(g_scale))  # the kernel's, read once

        def worker(blocks: Blocks) -> None:
            scratch = None if jit is not None else np.empty((2, _BLOCK), p.dtype)
            for i, j in blocks:
                gb, mb, vb, pb = g[i:j], m[i:j], v[i:j], p[i:j]
                if jit is not None:
                    jit.adamw(pb, gb, mb, vb, decay_size - i if weight_decay else 0, *scalars)
                    continue
                t1, t2 = scratch[:, : j - i]
                if g_scale is not None:
                    gb = np.multiply(gb, g_scale, out=t1)
                if weight_decay and i < decay_size:
                    pb[: decay_size - i] *= decay
                mb *= b1
                np.multiply(gb, 1.0 - b1, out=t2)
                mb += t2
                vb *= b2
                np.multiply(gb, gb, out=t2)
                t2 *= 1.0 - b2
                vb += t2
                np.sqrt(vb, out=t2)
                t2 /= bias2
                t2 += eps  # the denominator
                np.multiply(mb, step_size, out=t1)
                t1 /= t2
                pb -= t1

        self._parallel(worker, p.size, _BLOCK, p.size)

    # ---- LayerNorm over the last axis, in row blocks; reductions as GEMVs ---------------------
    def layernorm_forward(self, x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
        c = x.shape[-1]
        x2 = x.reshape(-1, c)
        n = x2.shape[0]
        y = np.empty_like(x2)
        mean = np.empty((n, 1), x.dtype)
        rstd = np.empty_like(mean)
        ones = self._ones_vector(c, x.dtype)
        jit = self._jit_for(x2, w, b)

        def worker(blocks: Blocks) -> None:
            for i, j in blocks:
                xb, yb, mb, rb = x2[i:j], y[i:j], mean[i:j], rstd[i:j]
                if jit is not None:
                    jit.layernorm_forward(xb, w, b, eps, yb, mb, rb)
                    continue
                np.multiply(xb @ ones, 1.0 / c, out=mb[:, 0])
                np.subtract(xb, mb, out=yb)
                var = np.einsum("ij,ij->i", yb, yb) * (1.0 / c)
                np.divide(1.0, np.sqrt(var + eps), out=rb[:, 0])
                yb *= rb
                yb *= w
                yb += b

        self._parallel(worker, n, _BLOCK // c, x2.size)
        lead = (*x.shape[:-1], 1)
        return y.reshape(x.shape), mean.reshape(lead), rstd.reshape(lead)

    def layernorm_backward(
        self, g: Any, x: Any, w: Any, mean: Any, rstd: Any
    ) -> tuple[Any, Any, Any]:
        c = x.shape[-1]
        x2, g2 = x.reshape(-1, c), g.reshape(-1, c)
        m2, r2 = mean.reshape(-1, 1), rstd.reshape(-1, 1)
        n = x2.shape[0]
        dx = np.empty(g2.shape, np.result_type(g, x))
        rows = max(1, _BLOCK // c)
        ones_c, ones_r = self._ones_vector(c, dx.dtype), self._ones_vector(rows, dx.dtype)
        jit = self._jit_for(g2, x2, w)

        def worker(blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
            dw, db = np.zeros(c, dx.dtype), np.zeros(c, dx.dtype)
            scratch = None if jit is not None else np.empty((rows, c), dx.dtype)
            for i, j in blocks:
                if jit is not None:
                    jit.layernorm_backward(g2[i:j], x2[i:j], w, m2[i:j], r2[i:j], dx[i:j], dw, db)
                    continue
                gb, d, xhat, ones = g2[i:j], dx[i:j], scratch[: j - i], ones_r[: j - i]
                np.subtract(x2[i:j], m2[i:j], out=xhat)
                xhat *= r2[i:j]
                db += ones @ gb
                dw += ones @ np.multiply(gb, xhat, out=d)
                np.multiply(gb, w, out=d)  # g w
                mean_gw = (d @ ones_c) * (1.0 / c)
                mean_gwx = np.einsum("ij,ij->i", d, xhat) * (1.0 / c)
                d -= mean_gw[:, None]
                xhat *= mean_gwx[:, None]
                d -= xhat
                d *= r2[i:j]  # rstd (g w - mean(g w) - xhat mean(g w xhat))
            return dw, db

        partials = self._parallel(worker, n, rows, x2.size)
        dw, db = (np.sum([p[k] for p in partials], axis=0) for k in (0, 1))
        return dx.reshape(g.shape), dw, db
