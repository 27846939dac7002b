"""CUDA kernels (CuPy) for the ops where eager elementwise launches would dominate.

Each RawKernel source is written once with `real` as its element type and compiled for
float32 and float64 on first use (float64 is for gradient checks). Reductions along rows use
one warp per row (LayerNorm, attention softmax) or one block per row (the vocabulary-wide
softmax cross-entropy). Everything is launched on the backend's stream and reads scalars such
as the learning rate from device memory, so a whole training step can be graph-captured.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .cublas import Cublas
from .reference import GELU_C, GELU_K, XpKernels

_WARP_REDUCE = r"""
#define NEG_INF ((real)__longlong_as_double(0xfff0000000000000ULL))
__device__ __forceinline__ real warp_sum(real v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ __forceinline__ real warp_max(real v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
"""

_SOURCES = {
    # LayerNorm forward, one warp per row of C features.
    "ln_fwd": r"""
extern "C" __global__ void ln_fwd(const real* x, const real* w, const real* b, real* y,
                                  real* mean, real* rstd, int n, int c, real eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    const real* xr = x + (long long)row * c;
    real s = 0;
    for (int i = lane; i < c; i += 32) s += xr[i];
    real m = warp_sum(s) / c, v = 0;
    for (int i = lane; i < c; i += 32) { real d = xr[i] - m; v += d * d; }
    real r = rsqrt(warp_sum(v) / c + eps);
    real* yr = y + (long long)row * c;
    for (int i = lane; i < c; i += 32) yr[i] = (xr[i] - m) * r * w[i] + b[i];
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}""",
    # LayerNorm backward for dx, one warp per row.
    "ln_bwd_dx": r"""
extern "C" __global__ void ln_bwd_dx(const real* g, const real* x, const real* w,
                                     const real* mean, const real* rstd, real* dx, int n, int c) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    long long off = (long long)row * c;
    real m = mean[row], r = rstd[row], s1 = 0, s2 = 0;
    for (int i = lane; i < c; i += 32) {
        real gw = g[off + i] * w[i];
        s1 += gw;
        s2 += gw * (x[off + i] - m) * r;
    }
    s1 = warp_sum(s1) / c;
    s2 = warp_sum(s2) / c;
    for (int i = lane; i < c; i += 32) {
        real xhat = (x[off + i] - m) * r;
        dx[off + i] = r * (g[off + i] * w[i] - s1 - xhat * s2);
    }
}""",
    # LayerNorm backward for dw, db: per-chunk column partial sums (summed afterwards).
    "ln_bwd_dwdb": r"""
extern "C" __global__ void ln_bwd_dwdb(const real* g, const real* x, const real* mean,
                                       const real* rstd, real* pdw, real* pdb, int n, int c,
                                       int rows_per_chunk) {
    int col = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (col >= c) return;
    int start = chunk * rows_per_chunk, stop = min(n, start + rows_per_chunk);
    real dw = 0, db = 0;
    for (int row = start; row < stop; ++row) {
        long long off = (long long)row * c + col;
        dw += g[off] * (x[off] - mean[row]) * rstd[row];
        db += g[off];
    }
    pdw[(long long)chunk * c + col] = dw;
    pdb[(long long)chunk * c + col] = db;
}""",
    # Causal scale + mask + softmax over rows of (B*H*T, T) scores, in place; warp per row.
    "softmax_fwd": r"""
extern "C" __global__ void softmax_fwd(real* s, real* lse, int rows, int t, real scale) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int q = row % t;  // query position: keys 0..q are visible
    real* sr = s + (long long)row * t;
    real m = NEG_INF;
    for (int j = lane; j <= q; j += 32) m = max(m, sr[j] * scale);
    m = warp_max(m);
    real z = 0;
    for (int j = lane; j <= q; j += 32) z += exp(sr[j] * scale - m);
    z = warp_sum(z);
    real inv = 1 / z;
    for (int j = lane; j < t; j += 32) sr[j] = j <= q ? exp(sr[j] * scale - m) * inv : 0;
    if (lse != 0 && lane == 0) lse[row] = m + log(z);
}""",
    # Probabilities again from the saved log-sum-exp (attention backward), in place.
    "softmax_recompute": r"""
extern "C" __global__ void softmax_recompute(real* s, const real* lse, int rows, int t,
                                             real scale) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int q = row % t;
    real* sr = s + (long long)row * t;
    real l = lse[row];
    for (int j = lane; j < t; j += 32) sr[j] = j <= q ? exp(sr[j] * scale - l) : 0;
}""",
    "softmax_bwd": r"""
extern "C" __global__ void softmax_bwd(const real* g, const real* p, real* ds, int rows, int t,
                                       real scale) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    long long off = (long long)row * t;
    real dot = 0;
    for (int j = lane; j < t; j += 32) dot += g[off + j] * p[off + j];
    dot = warp_sum(dot);
    for (int j = lane; j < t; j += 32) ds[off + j] = p[off + j] * (g[off + j] - dot) * scale;
}""",
    # Softmax cross-entropy forward: per row (block), online max/sum -> log-sum-exp and NLL.
    "xent_fwd": r"""
extern "C" __global__ void xent_fwd(const real* logits, const int* targets, real* lse,
                                    real* nll, int v) {
    __shared__ real sm[32], ss[32];
    int row = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const real* xr = logits + (long long)row * v;
    real m = NEG_INF, s = 0;
    for (int i = threadIdx.x; i < v; i += blockDim.x) {
        real xi = xr[i];
        if (xi > m) { s = s * exp(m - xi) + 1; m = xi; } else { s += exp(xi - m); }
    }
    for (int o = 16; o > 0; o >>= 1) {  // merge (m, s) pairs across the warp
        real m2 = __shfl_xor_sync(0xffffffff, m, o), s2 = __shfl_xor_sync(0xffffffff, s, o);
        real mm = max(m, m2);
        s = (m == NEG_INF ? 0 : s * exp(m - mm)) + (m2 == NEG_INF ? 0 : s2 * exp(m2 - mm));
        m = mm;
    }
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    if (threadIdx.x == 0) {
        real mt = sm[0], st = ss[0];
        for (int k = 1; k < blockDim.x / 32; ++k) {
            real mm = max(mt, sm[k]);
            st = st * exp(mt - mm) + ss[k] * exp(sm[k] - mm);
            mt = mm;
        }
        real l = mt + log(st);
        lse[row] = l;
        nll[row] = l - xr[targets[row]];
    }
}""",
    # Its backward: d(logits) = (softmax - onehot) * g / N, written over the logits buffer.
    "xent_bwd": r"""
extern "C" __global__ void xent_bwd(const real* logits, const int* targets, const real* lse,
                                    const real* g, real* out, int n, int v) {
    int row = blockIdx.x;
    long long off = (long long)row * v;
    real l = lse[row], scale = g[0] / n;
    int t = targets[row];
    for (int i = threadIdx.x; i < v; i += blockDim.x)
        out[off + i] = (exp(logits[off + i] - l) - (i == t ? 1 : 0)) * scale;
}""",
    # The batch of step `*step` (mod the epoch's batch count), gathered on the device.
    "gather_batch": r"""
extern "C" __global__ void gather_batch(const int* stream, const int* step, int* x, int* y,
                                        int b, int n, int t, int nb) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= b * t) return;
    int row = k / t, col = k % t, i = step[0] % nb;
    long long src = (long long)row * n + (long long)i * t + col;
    x[k] = stream[src];
    y[k] = stream[src + 1];
}""",
    "store_at_step": r"""
extern "C" __global__ void store_at_step(real* ring, const int* step, const real* value, int n) {
    ring[(step[0] - 1) % n] = value[0];
}""",
}

_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_WARPS_PER_BLOCK = 8


@functools.cache
def _kernel(name: str, dtype: np.dtype) -> Any:
    import cupy

    code = f"typedef {_CTYPE[dtype]} real;\n{_WARP_REDUCE}\n{_SOURCES[name]}"
    return cupy.RawKernel(code, name)


@functools.cache
def _elementwise() -> dict[str, Any]:
    import cupy

    gelu = f"T u = x + b; T t = tanh((T){GELU_C!r} * u * (1 + (T){GELU_K!r} * u * u));"
    return {
        "gelu_fwd": cupy.ElementwiseKernel(
            "T x, T b", "T y", gelu + "y = (T)0.5 * u * (1 + t);", "rf_gelu_fwd"),
        "gelu_bwd": cupy.ElementwiseKernel(
            "T g, T x, T b", "T dx",
            gelu + f"T d = (T)0.5 * (1 + t) + (T)0.5 * u * (1 - t * t) * (T){GELU_C!r}"
            f" * (1 + 3 * (T){GELU_K!r} * u * u); dx = g * d;",
            "rf_gelu_bwd"),
        # Decoupled weight decay on the first `decay` elements, then the Adam moment update.
        "adamw": cupy.ElementwiseKernel(
            "T g, float32 lr, int32 step, float32 scale, float32 b1, float32 b2, float32 eps, "
            "float32 wd, int64 decay",
            "T p, T m, T v",
            """
            T gs = g * (T)scale;
            if (i < decay) p *= (T)(1 - lr * wd);
            m = (T)b1 * m + (T)(1 - b1) * gs;
            v = (T)b2 * v + (T)(1 - b2) * gs * gs;
            T bc1 = 1 - pow((T)b1, (T)step), bc2 = 1 - pow((T)b2, (T)step);
            p -= (T)lr / bc1 * m / (sqrt(v) / sqrt(bc2) + (T)eps);
            """,
            "rf_adamw"),
        "sgd": cupy.ElementwiseKernel(
            "T g, float32 lr, float32 scale, float32 mu, bool nesterov, float32 wd, int64 decay",
            "T p, T vel",
            """
            T gs = g * (T)scale;
            if (i < decay) p *= (T)(1 - lr * wd);
            T d = gs;
            if (mu != 0) { vel = (T)mu * vel + gs; d = nesterov ? gs + (T)mu * vel : vel; }
            p -= (T)lr * d;
            """,
            "rf_sgd"),
        "sumsq": cupy.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0",
                                      "rf_l2norm"),
    }


def _grid(rows: int) -> tuple[tuple[int], tuple[int]]:
    return ((rows + _WARPS_PER_BLOCK - 1) // _WARPS_PER_BLOCK,), (32 * _WARPS_PER_BLOCK,)


class CudaKernels(XpKernels):
    """Fused CuPy kernels; anything not overridden uses the shared formulation."""

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self._one = backend.xp.ones((), dtype=np.float32)
        self.cublas = Cublas(backend.xp, backend.stream)
        self._ones: dict[tuple[int, Any], Any] = {}

    def matmul(self, a: Any, b: Any) -> Any:
        return self.cublas.matmul(a, b)

    def sum_rows(self, x: Any) -> Any:
        """Column sums of (N, C) as ones(1, N) @ x: one bandwidth-bound GEMM, several times
        faster than a strided column reduction (bias gradients)."""
        n = x.shape[0]
        key = (n, x.dtype)
        if key not in self._ones:
            self._ones[key] = self.xp.ones((1, n), dtype=x.dtype)
        return self.cublas.matmul(self._ones[key], x, strict=True)[0]

    def _k(self, name: str, dtype: Any) -> Any:
        return _kernel(name, np.dtype(dtype))

    def _real(self, value: float, dtype: Any) -> Any:
        return np.dtype(dtype).type(value)

    # ---- LayerNorm -------------------------------------------------------------------------
    def layernorm_forward(self, x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
        xp = self.xp
        x = xp.ascontiguousarray(x)
        c = x.shape[-1]
        n = x.size // c
        y = xp.empty_like(x)
        mean = xp.empty(x.shape[:-1] + (1,), dtype=x.dtype)
        rstd = xp.empty_like(mean)
        self._k("ln_fwd", x.dtype)(*_grid(n), (x, w, b, y, mean, rstd, np.int32(n), np.int32(c),
                                               self._real(eps, x.dtype)))
        return y, mean, rstd

    def layernorm_backward(
        self, g: Any, x: Any, w: Any, mean: Any, rstd: Any
    ) -> tuple[Any, Any, Any]:
        xp = self.xp
        g, x = xp.ascontiguousarray(g), xp.ascontiguousarray(x)
        c = x.shape[-1]
        n = x.size // c
        dx = xp.empty_like(x)
        self._k("ln_bwd_dx", x.dtype)(*_grid(n), (g, x, w, mean, rstd, dx, np.int32(n),
                                                  np.int32(c)))
        rows_per_chunk = 64
        chunks = (n + rows_per_chunk - 1) // rows_per_chunk
        pdw = xp.empty((chunks, c), dtype=x.dtype)
        pdb = xp.empty_like(pdw)
        self._k("ln_bwd_dwdb", x.dtype)(
            ((c + 127) // 128, chunks), (128,),
            (g, x, mean, rstd, pdw, pdb, np.int32(n), np.int32(c), np.int32(rows_per_chunk)))
        return dx, self.sum_rows(pdw), self.sum_rows(pdb)

    # ---- GELU ---------------------------------------------------------------------------------
    def gelu_forward(self, x: Any, bias: Any | None) -> Any:
        b = bias if bias is not None else x.dtype.type(0)
        return _elementwise()["gelu_fwd"](x, b)

    def gelu_backward(self, g: Any, x: Any, bias: Any | None) -> Any:
        b = bias if bias is not None else x.dtype.type(0)
        return _elementwise()["gelu_bwd"](g, x, b)

    # ---- attention softmax --------------------------------------------------------------------
    def causal_softmax_forward(
        self, scores: Any, scale: float, with_lse: bool = False
    ) -> Any:
        s = self.xp.ascontiguousarray(scores)
        t = s.shape[-1]
        rows = s.size // t
        lse = self.xp.empty(s.shape[:-1] + (1,), dtype=s.dtype) if with_lse else None
        self._k("softmax_fwd", s.dtype)(*_grid(rows), (s, lse if with_lse else 0,
                                                       np.int32(rows), np.int32(t),
                                                       self._real(scale, s.dtype)))
        return (s, lse) if with_lse else s

    def causal_softmax_recompute(self, scores: Any, lse: Any, scale: float) -> Any:
        s = self.xp.ascontiguousarray(scores)
        t = s.shape[-1]
        rows = s.size // t
        self._k("softmax_recompute", s.dtype)(*_grid(rows), (s, lse, np.int32(rows),
                                                             np.int32(t),
                                                             self._real(scale, s.dtype)))
        return s

    def causal_softmax_backward(self, g: Any, probs: Any, scale: float) -> Any:
        g = self.xp.ascontiguousarray(g)
        t = probs.shape[-1]
        rows = probs.size // t
        ds = self.xp.empty_like(probs)
        self._k("softmax_bwd", g.dtype)(*_grid(rows), (g, probs, ds, np.int32(rows),
                                                       np.int32(t), self._real(scale, g.dtype)))
        return ds

    # ---- softmax cross-entropy ------------------------------------------------------------
    def cross_entropy(
        self, logits: Any, targets: Any, need_grad: bool, inplace: bool
    ) -> tuple[Any, Any]:
        """Forward reads the logits once (online log-sum-exp); backward writes d(logits)
        over them in one more pass, folding in the upstream gradient."""
        xp = self.xp
        logits = xp.ascontiguousarray(logits)
        targets = xp.ascontiguousarray(targets, dtype=np.int32)
        n, v = logits.shape
        lse = xp.empty(n, dtype=logits.dtype)
        nll = xp.empty_like(lse)
        self._k("xent_fwd", logits.dtype)((n,), (512,), (logits, targets, lse, nll, np.int32(v)))
        state = (logits, targets, lse, inplace) if need_grad else None
        return nll.mean(), state

    def cross_entropy_backward(self, state: Any, g: Any) -> Any:
        logits, targets, lse, inplace = state
        n, v = logits.shape
        out = logits if inplace else self.xp.empty_like(logits)
        g = self.xp.ascontiguousarray(g, dtype=logits.dtype)
        self._k("xent_bwd", logits.dtype)((n,), (512,), (logits, targets, lse, g, out,
                                                         np.int32(n), np.int32(v)))
        return out

    # ---- optimizer ------------------------------------------------------------------------
    def l2_norm(self, g: Any) -> Any:
        return _elementwise()["sumsq"](g)

    def adamw(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        f32 = np.float32
        _elementwise()["adamw"](
            g, lr, step, self._one if scale is None else scale, f32(betas[0]), f32(betas[1]),
            f32(eps), f32(weight_decay), np.int64(decay_size), p, m, v)

    def sgd(
        self, p: Any, g: Any, velocity: Any, lr: Any, scale: Any, momentum: float,
        nesterov: bool, weight_decay: float, decay_size: int,
    ) -> None:
        f32 = np.float32
        _elementwise()["sgd"](g, lr, self._one if scale is None else scale, f32(momentum),
                              bool(nesterov), f32(weight_decay), np.int64(decay_size), p,
                              velocity)

    # ---- data ---------------------------------------------------------------------------------
    def gather_batch(self, stream: Any, step: Any, seq_len: int, x: Any, y: Any) -> None:
        """x, y <- the window of batch (step mod batches-per-epoch), without the host."""
        b, n = stream.shape
        nb = (n - 1) // seq_len
        total = b * seq_len
        self._k("gather_batch", np.dtype(np.float32))(
            ((total + 255) // 256,), (256,),
            (stream, step, x, y, np.int32(b), np.int32(n), np.int32(seq_len), np.int32(nb)))


    def store_at_step(self, ring: Any, step: Any, value: Any) -> None:
        value = self.xp.ascontiguousarray(value, dtype=ring.dtype)
        self._k("store_at_step", ring.dtype)((1,), (1,), (ring, step, value, np.int32(len(ring))))
