"""CUDA kernels (CuPy) for the ops where eager elementwise launches would dominate.

Each RawKernel source is written once over two types and compiled per storage dtype on first
use: `real`, the type of the arrays it loads and stores (float, double or __half), and `acc`,
the type it computes and reduces in (float, and double for float64, the gradient checks'
type). Loads convert real -> acc and stores acc -> real, so 16-bit data is summed in fp32;
statistics kept for backward (LayerNorm mean/rstd, log-sum-exps, per-row losses) are acc
arrays, and scalar arguments (eps, scale) are acc. For float32 acc is real and the casts are
no-ops: the arithmetic is the one a plain float kernel does. Reductions along rows use one
warp per row (LayerNorm, attention softmax) or one block per row (the vocabulary-wide
softmax cross-entropy). Everything is launched on the backend's stream and reads scalars such
as the learning rate from device memory, so a whole training step can be graph-captured.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..policy import RunPolicy
from ..precision import accumulate_dtype
from . import cuda_attention, philox
from .cublas import Cublas
from .cublaslt import CublasLt, CublasLtUnsupported
from .cuda_optim import CudaOptimizer
from .philox import PHILOX_CUDA
from .reference import GELU_C, GELU_K, XpKernels

_WARP_REDUCE = r"""
#define NEG_INF ((acc)__longlong_as_double(0xfff0000000000000ULL))
__device__ __forceinline__ acc warp_sum(acc v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ __forceinline__ acc warp_max(acc v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
"""

_SOURCES = {
    # LayerNorm forward, one warp per row of C features.
    "ln_fwd": r"""
extern "C" __global__ void ln_fwd(const real* x, const real* w, const real* b, real* y,
                                  acc* mean, acc* rstd, int n, int c, acc eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    const real* xr = x + (long long)row * c;
    acc s = 0;
    for (int i = lane; i < c; i += 32) s += (acc)xr[i];
    acc m = warp_sum(s) / c, v = 0;
    for (int i = lane; i < c; i += 32) { acc d = (acc)xr[i] - m; v += d * d; }
    acc r = rsqrt(warp_sum(v) / c + eps);
    real* yr = y + (long long)row * c;
    for (int i = lane; i < c; i += 32)
        yr[i] = (real)(((acc)xr[i] - m) * r * (acc)w[i] + (acc)b[i]);
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}""",
    # The same with the row held in registers (lane l keeps columns l, l + 32, ...: CPL of
    # them, CPL = ceil(c / 32) fixed at compile time): x is read from memory once.
    "ln_fwd_rows": r"""
extern "C" __global__ void ln_fwd_rows(const real* x, const real* w, const real* b, real* y,
                                       acc* mean, acc* rstd, int n, int c, acc eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    long long off = (long long)row * c;
    acc xv[CPL], s = 0;
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
        int i = lane + 32 * j;
        xv[j] = i < c ? (acc)x[off + i] : (acc)0;
        s += xv[j];
    }
    acc m = warp_sum(s) / c, v = 0;
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
        acc d = lane + 32 * j < c ? xv[j] - m : (acc)0;
        v += d * d;
    }
    acc r = rsqrt(warp_sum(v) / c + eps);
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
        int i = lane + 32 * j;
        if (i < c) y[off + i] = (real)((xv[j] - m) * r * (acc)w[i] + (acc)b[i]);
    }
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}""",
    # LayerNorm backward in one pass, the row in registers as in ln_fwd_rows: each warp takes
    # `rows` consecutive rows, writes their dx, and sums its columns of g * xhat (dw) and g
    # (db) over them in registers, then writes those as its row of the partial sums (summed
    # afterwards): no atomics, so the sums are the same bits every run.
    "ln_bwd_rows": r"""
extern "C" __global__ void ln_bwd_rows(const real* g, const real* x, const real* w,
                                       const acc* mean, const acc* rstd, real* dx, acc* pdw,
                                       acc* pdb, int n, int c, int rows) {
    int warp = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    int start = warp * rows;
    if (start >= n) return;
    int stop = min(n, start + rows);
    acc dw[CPL], db[CPL], wv[CPL];
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
        int i = lane + 32 * j;
        dw[j] = 0;
        db[j] = 0;
        wv[j] = i < c ? (acc)w[i] : (acc)0;
    }
    for (int row = start; row < stop; ++row) {
        long long off = (long long)row * c;
        acc m = mean[row], r = rstd[row], s1 = 0, s2 = 0, gv[CPL], xh[CPL];
#pragma unroll
        for (int j = 0; j < CPL; ++j) {
            int i = lane + 32 * j;
            gv[j] = i < c ? (acc)g[off + i] : (acc)0;
            xh[j] = i < c ? ((acc)x[off + i] - m) * r : (acc)0;
            acc gw = gv[j] * wv[j];
            s1 += gw;
            s2 += gw * xh[j];
            dw[j] += gv[j] * xh[j];
            db[j] += gv[j];
        }
        s1 = warp_sum(s1) / c;
        s2 = warp_sum(s2) / c;
#pragma unroll
        for (int j = 0; j < CPL; ++j) {
            int i = lane + 32 * j;
            if (i < c) dx[off + i] = (real)(r * (gv[j] * wv[j] - s1 - xh[j] * s2));
        }
    }
    long long part = (long long)warp * c;
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
        int i = lane + 32 * j;
        if (i < c) { pdw[part + i] = dw[j]; pdb[part + i] = db[j]; }
    }
}""",
    # LayerNorm backward for dx, one warp per row.
    "ln_bwd_dx": r"""
extern "C" __global__ void ln_bwd_dx(const real* g, const real* x, const real* w,
                                     const acc* mean, const acc* rstd, real* dx, int n, int c) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    long long off = (long long)row * c;
    acc m = mean[row], r = rstd[row], s1 = 0, s2 = 0;
    for (int i = lane; i < c; i += 32) {
        acc gw = (acc)g[off + i] * (acc)w[i];
        s1 += gw;
        s2 += gw * ((acc)x[off + i] - m) * r;
    }
    s1 = warp_sum(s1) / c;
    s2 = warp_sum(s2) / c;
    for (int i = lane; i < c; i += 32) {
        acc xhat = ((acc)x[off + i] - m) * r;
        dx[off + i] = (real)(r * ((acc)g[off + i] * (acc)w[i] - s1 - xhat * s2));
    }
}""",
    # LayerNorm backward for dw, db: per-chunk column partial sums in acc (summed afterwards).
    "ln_bwd_dwdb": r"""
extern "C" __global__ void ln_bwd_dwdb(const real* g, const real* x, const acc* mean,
                                       const acc* rstd, acc* pdw, acc* pdb, int n, int c,
                                       int rows_per_chunk) {
    int col = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (col >= c) return;
    int start = chunk * rows_per_chunk, stop = min(n, start + rows_per_chunk);
    acc dw = 0, db = 0;
    for (int row = start; row < stop; ++row) {
        long long off = (long long)row * c + col;
        dw += (acc)g[off] * ((acc)x[off] - mean[row]) * rstd[row];
        db += (acc)g[off];
    }
    pdw[(long long)chunk * c + col] = dw;
    pdb[(long long)chunk * c + col] = db;
}""",
    # Causal scale + mask + softmax over rows of (B*H*T, T) scores, in place; warp per row.
    "softmax_fwd": r"""
extern "C" __global__ void softmax_fwd(real* s, acc* lse, int rows, int t, acc scale) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int q = row % t;  // query position: keys 0..q are visible
    real* sr = s + (long long)row * t;
    acc m = NEG_INF;
    for (int j = lane; j <= q; j += 32) m = max(m, (acc)sr[j] * scale);
    m = warp_max(m);
    acc z = 0;
    for (int j = lane; j <= q; j += 32) z += exp((acc)sr[j] * scale - m);
    z = warp_sum(z);
    acc inv = 1 / z;
    for (int j = lane; j < t; j += 32)
        sr[j] = (real)(j <= q ? exp((acc)sr[j] * scale - m) * inv : 0);
    if (lse != 0 && lane == 0) lse[row] = m + log(z);
}""",
    # Probabilities again from the saved log-sum-exp (attention backward), in place.
    "softmax_recompute": r"""
extern "C" __global__ void softmax_recompute(real* s, const acc* lse, int rows, int t,
                                             acc scale) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int q = row % t;
    real* sr = s + (long long)row * t;
    acc l = lse[row];
    for (int j = lane; j < t; j += 32) sr[j] = (real)(j <= q ? exp((acc)sr[j] * scale - l) : 0);
}""",
    "softmax_bwd": r"""
extern "C" __global__ void softmax_bwd(const real* g, const real* p, real* ds, int rows, int t,
                                       acc scale) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    long long off = (long long)row * t;
    acc dot = 0;
    for (int j = lane; j < t; j += 32) dot += (acc)g[off + j] * (acc)p[off + j];
    dot = warp_sum(dot);
    for (int j = lane; j < t; j += 32)
        ds[off + j] = (real)((acc)p[off + j] * ((acc)g[off + j] - dot) * scale);
}""",
    # Softmax cross-entropy forward: per row (block), online max/sum -> log-sum-exp and NLL.
    "xent_fwd": r"""
extern "C" __global__ void xent_fwd(const real* logits, const int* targets, acc* lse,
                                    acc* nll, int v, int ld) {
    __shared__ acc sm[32], ss[32];
    int row = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const real* xr = logits + (long long)row * ld;
    acc m = NEG_INF, s = 0;
    for (int i = threadIdx.x; i < v; i += blockDim.x) {
        acc xi = (acc)xr[i];
        if (xi > m) { s = s * exp(m - xi) + 1; m = xi; } else { s += exp(xi - m); }
    }
    for (int o = 16; o > 0; o >>= 1) {  // merge (m, s) pairs across the warp
        acc m2 = __shfl_xor_sync(0xffffffff, m, o), s2 = __shfl_xor_sync(0xffffffff, s, o);
        acc mm = max(m, m2);
        s = (m == NEG_INF ? 0 : s * exp(m - mm)) + (m2 == NEG_INF ? 0 : s2 * exp(m2 - mm));
        m = mm;
    }
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    if (threadIdx.x == 0) {
        acc mt = sm[0], st = ss[0];
        for (int k = 1; k < blockDim.x / 32; ++k) {
            acc mm = max(mt, sm[k]);
            st = st * exp(mt - mm) + ss[k] * exp(sm[k] - mm);
            mt = mm;
        }
        acc l = mt + log(st);
        lse[row] = l;
        nll[row] = l - (acc)xr[targets[row]];
    }
}""",
    # Its backward: d(logits) = (softmax - onehot) * g / N, written over the logits buffer.
    "xent_bwd": r"""
extern "C" __global__ void xent_bwd(const real* logits, const int* targets, const acc* lse,
                                    const acc* g, real* out, int n, int v, int ld) {
    int row = blockIdx.x;
    long long off = (long long)row * ld;
    acc l = lse[row], scale = g[0] / n;
    int t = targets[row];
    for (int i = threadIdx.x; i < v; i += blockDim.x)
        out[off + i] = (real)((exp((acc)logits[off + i] - l) - (i == t ? 1 : 0)) * scale);
}""",
    # The batch of step `*step` (mod the epoch's batch count), gathered on the device from
    # this rank's b rows of the stream, starting at row0.
    "gather_batch": r"""
extern "C" __global__ void gather_batch(const int* stream, const int* step, int* x, int* y,
                                        int row0, int b, int n, int t, int nb) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= b * t) return;
    int row = k / t, col = k % t, i = step[0] % nb;
    long long src = (long long)(row0 + row) * n + (long long)i * t + col;
    x[k] = stream[src];
    y[k] = stream[src + 1];
}""",
    # LAMB, pass 1 over chunks of one tensor each: Adam's moments, the direction u (with the
    # weight decay) and the chunk's partial sums of p*p and u*u.
    "lamb_moments": r"""
extern "C" __global__ void lamb_moments(const real* g, const real* p, real* m, real* v, real* u,
                                        acc* pw, acc* pu, const long long* lo,
                                        const long long* hi, const int* step,
                                        const float* scale, acc c1, acc c2, acc lb1, acc lb2,
                                        acc eps, acc wd, long long decay) {
    __shared__ acc s1[32], s2[32];
    int c = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    acc t = (acc)step[0], sc = (acc)scale[0];
    if (sc < 0) return;  // a skipped step (fp16 overflow); lamb_apply skips it too
    acc bc1 = -expm1(t * lb1), bc2 = sqrt(-expm1(t * lb2));  // 1 - b**t, lb = log(b)
    acc sw = 0, su = 0;
    for (long long i = lo[c] + threadIdx.x; i < hi[c]; i += blockDim.x) {
        acc gi = (acc)g[i] * sc, pi = (acc)p[i];
        acc mi = (1 - c1) * (acc)m[i] + c1 * gi;  // c = 1 - beta, from double
        acc vi = (1 - c2) * (acc)v[i] + c2 * (gi * gi);
        m[i] = (real)mi;
        v[i] = (real)vi;
        acc ui = (mi / bc1) / (sqrt(vi) / bc2 + eps);
        if (i < decay) ui += wd * pi;
        u[i] = (real)ui;
        sw += pi * pi;
        su += ui * ui;
    }
    sw = warp_sum(sw);
    su = warp_sum(su);
    if (lane == 0) { s1[warp] = sw; s2[warp] = su; }
    __syncthreads();
    if (threadIdx.x == 0) {
        acc a = 0, b = 0;
        for (int k = 0; k < blockDim.x / 32; ++k) { a += s1[k]; b += s2[k]; }
        pw[c] = a;
        pu[c] = b;
    }
}""",
    # LAMB, pass 2: each tensor's trust ratio from its chunks' sums, in order (deterministic).
    "lamb_trust": r"""
extern "C" __global__ void lamb_trust(const acc* pw, const acc* pu, const int* first,
                                      acc* trust, int segments) {
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= segments) return;
    acc a = 0, b = 0;
    for (int c = first[s]; c < first[s + 1]; ++c) { a += pw[c]; b += pu[c]; }
    trust[s] = (a > 0 && b > 0) ? sqrt(a) / sqrt(b) : (acc)1;
}""",
    # LAMB, pass 3: p -= lr * trust[tensor] * u over the same chunks.
    "lamb_apply": r"""
extern "C" __global__ void lamb_apply(real* p, const real* u, const acc* trust, const int* seg,
                                      const long long* lo, const long long* hi,
                                      const float* lr, const float* scale) {
    if (scale[0] < 0) return;
    int c = blockIdx.x;
    acc f = (acc)lr[0] * trust[seg[c]];
    for (long long i = lo[c] + threadIdx.x; i < hi[c]; i += blockDim.x)
        p[i] = (real)((acc)p[i] - f * (acc)u[i]);
}""",
    "store_at_step": r"""
extern "C" __global__ void store_at_step(real* ring, const int* step, const real* value, int n) {
    ring[(step[0] - 1) % n] = value[0];
}""",
}

# Storage dtype -> (real, acc, the header that defines real).
_CTYPE = {
    np.dtype(np.float32): ("float", "float", ""),
    np.dtype(np.float64): ("double", "double", ""),
    np.dtype(np.float16): ("__half", "float", "#include <cuda_fp16.h>"),
}


def _ctype(dtype: np.dtype) -> tuple[str, str, str]:
    """_CTYPE's row for `dtype`; bfloat16 (ml_dtypes) is looked up by name, so this module
    imports without it."""
    if dtype.name == "bfloat16":
        return "__nv_bfloat16", "float", "#include <cuda_bf16.h>"
    return _CTYPE[dtype]
# The acc of an ElementwiseKernel's T: float, or double for double (CuPy names its 16-bit
# types itself, so they take the default).
_ACC_TRAIT = """
template <typename T> struct rf_acc { typedef float type; };
template <> struct rf_acc<double> { typedef double type; };
"""
_WARPS_PER_BLOCK = 8
VOCAB_PAD = 64  # the LM head's logits rows are padded to a multiple of this many columns
# LayerNorm rows of up to 32 * MAX_CPL columns are held in registers (the *_rows kernels);
# wider ones take the kernels that read the row from memory again for each pass.
MAX_CPL = 32
LN_BWD_WARPS = 1024  # ln_bwd_rows' warps (and rows of partial sums), about


@functools.cache
def _kernel(name: str, dtype: np.dtype, cpl: int = 0) -> Any:
    """Kernel `name` for storage `dtype`; `cpl`: the per-lane column count of a *_rows
    kernel."""
    import cupy

    real, acc, header = _ctype(dtype)
    code = (f"{header}\ntypedef {real} real;\ntypedef {acc} acc;\n#define CPL {cpl}\n"
            f"{_WARP_REDUCE}\n{_SOURCES[name]}")
    return cupy.RawKernel(code, name)


@functools.cache
def _elementwise() -> dict[str, Any]:
    import cupy

    # GELU loads and stores T and computes in A = rf_acc<T>::type, as the RawKernels do.
    gelu = (f"typedef rf_acc<T>::type A; A u = (A)x + (A)b;"
            f" A t = tanh((A){GELU_C!r} * u * (1 + (A){GELU_K!r} * u * u));")
    return {
        "gelu_fwd": cupy.ElementwiseKernel(
            "T x, T b", "T y", gelu + "y = (T)((A)0.5 * u * (1 + t));", "rf_gelu_fwd",
            preamble=_ACC_TRAIT),
        "gelu_bwd": cupy.ElementwiseKernel(
            "T g, T x, T b", "T dx",
            gelu + f"A d = (A)0.5 * (1 + t) + (A)0.5 * u * (1 - t * t) * (A){GELU_C!r}"
            f" * (1 + 3 * (A){GELU_K!r} * u * u); dx = (T)((A)g * d);",
            "rf_gelu_bwd", preamble=_ACC_TRAIT),
        # Dropout's multiplier from Philox (kernels/philox.py's function in CUDA C): element
        # i takes word i % 4 of block i / 4's output at (step, site); the step is read on the
        # device, so a replayed graph draws fresh masks.
        "dropout_mask": cupy.ElementwiseKernel(
            "int32 step, uint32 seed, uint32 site, uint32 thresh, float64 scale", "T mask",
            """
            unsigned int bits = rf_dropout_bits(i, (unsigned int)step, seed, site);
            mask = bits >= thresh ? (T)scale : (T)0.0f;
            """,
            "rf_dropout_mask", preamble=PHILOX_CUDA),
        # The same draw applied to x on the fly: no mask array is written or read.
        "dropout_apply": cupy.ElementwiseKernel(
            "T x, int32 step, uint32 seed, uint32 site, uint32 thresh, float64 scale", "T y",
            """
            unsigned int bits = rf_dropout_bits(i, (unsigned int)step, seed, site);
            typedef rf_acc<T>::type A;
            y = bits >= thresh ? (T)((A)x * (A)(T)scale) : (T)0.0f;
            """,
            "rf_dropout_apply", preamble=PHILOX_CUDA + _ACC_TRAIT),
    }


def _drop(dropout: tuple[float, int, int, Any] | None) -> cuda_attention.Dropout | None:
    return None if dropout is None else cuda_attention.Dropout(*dropout)


def _row_stride(x: Any) -> int:
    """Elements from one row of a 2-D array to the next (its rows may be padded)."""
    return x.strides[0] // x.itemsize


def _grid(rows: int) -> tuple[tuple[int], tuple[int]]:
    return ((rows + _WARPS_PER_BLOCK - 1) // _WARPS_PER_BLOCK,), (32 * _WARPS_PER_BLOCK,)


class CudaKernels(CudaOptimizer, XpKernels):
    """Fused CuPy kernels; anything not overridden uses the shared formulation."""

    def __init__(self, backend: Any) -> None:
        self._device_cublas = Cublas(backend.xp, backend.stream)  # shared by the views
        self._device_lt: list[CublasLt] = []  # the device's cuBLASLt handle, once made
        super().__init__(backend)
        self._one = backend.xp.ones((), dtype=np.float32)
        self._ones: dict[tuple[int, Any], Any] = {}

    def _read_policy(self, policy: RunPolicy) -> None:
        """The GEMM compute mode (TF32 or not) and whether Linear layers go through
        cuBLASLt's epilogues where it can: the run's, on views of the device's handles."""
        super()._read_policy(policy)
        self.tf32 = policy.matmul_compute == "tf32"
        self.epilogues = policy.epilogues
        self.cublas = self._device_cublas.with_compute(policy.matmul_compute)
        self._cublaslt: CublasLt | None = None  # this view's, on first use

    def matmul(self, a: Any, b: Any, *, transpose_b: bool = False, out: Any = None) -> Any:
        """cuBLAS takes the swapped view as op=T: no copy."""
        return self.cublas.matmul(a, self.xp.swapaxes(b, -1, -2) if transpose_b else b, out=out)

    def sum_rows(self, x: Any) -> Any:
        """Column sums of (N, C) as ones(1, N) @ x: one bandwidth-bound GEMM, several times
        faster than a strided column reduction (bias gradients)."""
        n = x.shape[0]
        ones = self._ones.get((n, x.dtype))
        if ones is None:
            ones = self.xp.ones((1, n), dtype=x.dtype)
            if not self.backend.stream.is_capturing():
                # one made during a graph capture lives in that graph's private pool and is
                # filled only when the graph replays: it is this step's, not a cache entry
                self._ones[(n, x.dtype)] = ones
        return self.cublas.matmul(ones, x, strict=True)[0]

    # ---- Linear layers: bias, GELU and the bias gradient in the GEMM's epilogue --------------
    # cuBLASLt refuses (CublasLtUnsupported) float64, the odd layout, and a problem first seen
    # during graph capture (its plan must come from an eager call, which the trainer's warm-up
    # steps make); each refusal takes the shared formulation: GEMM, then a kernel.
    def _lt(self) -> CublasLt:
        """The cuBLASLt handle (the device's, made on first use) in the policy's compute
        mode."""
        if self._cublaslt is None:
            if not self._device_lt:
                if self.backend.stream.is_capturing():  # its workspace would be the graph's
                    raise CublasLtUnsupported("cuBLASLt's handle is made by an eager call, "
                                              "not during graph capture")
                self._device_lt.append(CublasLt(self.xp, self.backend.stream))
            self._cublaslt = self._device_lt[0].with_compute(self.cublas.matmul_compute)
        return self._cublaslt

    def linear(self, x: Any, w: Any, b: Any, gelu: bool,
               gemm: Callable[..., Any]) -> tuple[Any, Any]:
        """Epilogue BIAS, or GELU_AUX_BIAS writing the pre-activation x @ w + b (the state,
        bias included) for backward. cuBLASLt's GELU may use a fast tanh (relative errors
        near 1e-3): below tf32's and 16-bit's own rounding, but not exact float32, so a
        float32 run without TF32 keeps the GELU kernel."""
        exact = x.dtype == np.float32 and not self.tf32
        if self.epilogues and not (gelu and exact):
            try:
                if not gelu:
                    return gemm(self._lt().matmul_bias, x, w, b), None
                pre = self.xp.empty((*x.shape[:-1], w.shape[1]), dtype=x.dtype)  # (..., N)
                y = gemm(self._lt().matmul_bias, x, w, b, gelu=True, pre_gelu_out=pre)
                return y, (pre, None)
            except CublasLtUnsupported:
                pass
        return super().linear(x, w, b, gelu, gemm)

    def linear_grads(self, x: Any, g: Any, gemm: Callable[..., Any]) -> tuple[Any, Any]:
        """Epilogue BGRADA: db from the dW GEMM's own pass over g; 16-bit inputs give float32
        dW and db straight from it."""
        if self.epilogues:
            try:
                return gemm(self._lt().matmul_bgrad, x.reshape(-1, x.shape[-1]).T, g,
                            out_dtype=accumulate_dtype(g.dtype))
            except CublasLtUnsupported:
                pass
        return super().linear_grads(x, g, gemm)

    def linear_dgelu(self, g: Any, w: Any, state: Any,
                     gemm: Callable[..., Any]) -> tuple[Any, Any]:
        """Epilogue DGELU_BGRAD on g @ w.T, given the state of the fused forward."""
        pre, bias = state
        if self.epilogues and bias is None:
            try:
                return gemm(self._lt().matmul_dgelu_bgrad, g, w.T, pre)
            except CublasLtUnsupported:
                pass
        return super().linear_dgelu(g, w, state, gemm)

    def _k(self, name: str, dtype: Any, *same: Any, cpl: int = 0) -> Any:
        """Kernel `name` for storage `dtype`. It reads raw pointers, so the arrays in `same`
        are checked to be of that dtype: another would be read as garbage."""
        for a in same:
            if a.dtype != dtype:
                raise TypeError(f"{name}: {a.dtype} array where the kernel takes {dtype}")
        return _kernel(name, np.dtype(dtype), cpl)

    def _acc(self, value: float, dtype: Any) -> Any:
        """A scalar argument in the acc type of storage `dtype`."""
        return accumulate_dtype(dtype).type(value)

    # ---- LayerNorm -------------------------------------------------------------------------
    def layernorm_forward(self, x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
        xp = self.xp
        x = xp.ascontiguousarray(x)
        c = x.shape[-1]
        n = x.size // c
        y = xp.empty_like(x)
        mean = xp.empty(x.shape[:-1] + (1,), dtype=accumulate_dtype(x.dtype))
        rstd = xp.empty_like(mean)
        cpl = -(-c // 32)
        name = "ln_fwd_rows" if cpl <= MAX_CPL else "ln_fwd"
        self._k(name, x.dtype, w, b, cpl=cpl)(*_grid(n), (x, w, b, y, mean, rstd, np.int32(n),
                                                          np.int32(c), self._acc(eps, x.dtype)))
        return y, mean, rstd

    def layernorm_backward(
        self, g: Any, x: Any, w: Any, mean: Any, rstd: Any
    ) -> tuple[Any, Any, Any]:
        xp = self.xp
        g, x = xp.ascontiguousarray(g), xp.ascontiguousarray(x)
        c = x.shape[-1]
        n = x.size // c
        dx = xp.empty_like(x)
        acc = accumulate_dtype(x.dtype)
        cpl = -(-c // 32)
        if cpl <= MAX_CPL:  # one pass; about LN_BWD_WARPS warps, each a row of partial sums
            rows = -(-n // LN_BWD_WARPS)
            warps = -(-n // rows)
            pdw = xp.empty((warps, c), dtype=acc)
            pdb = xp.empty_like(pdw)
            self._k("ln_bwd_rows", x.dtype, g, w, cpl=cpl)(
                *_grid(warps), (g, x, w, mean, rstd, dx, pdw, pdb, np.int32(n), np.int32(c),
                                np.int32(rows)))
            return (dx, self.sum_rows(pdw).astype(w.dtype, copy=False),
                    self.sum_rows(pdb).astype(w.dtype, copy=False))
        self._k("ln_bwd_dx", x.dtype, g, w)(*_grid(n), (g, x, w, mean, rstd, dx, np.int32(n),
                                                        np.int32(c)))
        rows_per_chunk = 64
        chunks = (n + rows_per_chunk - 1) // rows_per_chunk
        pdw = xp.empty((chunks, c), dtype=acc)  # partial sums stay in acc until summed
        pdb = xp.empty_like(pdw)
        self._k("ln_bwd_dwdb", x.dtype)(
            ((c + 127) // 128, chunks), (128,),
            (g, x, mean, rstd, pdw, pdb, np.int32(n), np.int32(c), np.int32(rows_per_chunk)))
        return (dx, self.sum_rows(pdw).astype(w.dtype, copy=False),
                self.sum_rows(pdb).astype(w.dtype, copy=False))

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
        acc = accumulate_dtype(s.dtype)
        lse = self.xp.empty(s.shape[:-1] + (1,), dtype=acc) if with_lse else None
        self._k("softmax_fwd", s.dtype)(*_grid(rows), (s, lse if with_lse else 0,
                                                       np.int32(rows), np.int32(t),
                                                       acc.type(scale)))
        return (s, lse) if with_lse else s

    def causal_softmax_recompute(self, scores: Any, lse: Any, scale: float) -> Any:
        s = self.xp.ascontiguousarray(scores)
        t = s.shape[-1]
        rows = s.size // t
        self._k("softmax_recompute", s.dtype)(*_grid(rows), (s, lse, np.int32(rows),
                                                             np.int32(t),
                                                             self._acc(scale, s.dtype)))
        return s

    def causal_softmax_backward(self, g: Any, probs: Any, scale: float) -> Any:
        g = self.xp.ascontiguousarray(g)
        t = probs.shape[-1]
        rows = probs.size // t
        ds = self.xp.empty_like(probs)
        self._k("softmax_bwd", g.dtype, probs)(*_grid(rows), (g, probs, ds, np.int32(rows),
                                                              np.int32(t),
                                                              self._acc(scale, g.dtype)))
        return ds

    # ---- softmax cross-entropy ------------------------------------------------------------
    def cross_entropy(
        self, logits: Any, targets: Any, need_grad: bool, inplace: bool
    ) -> tuple[Any, Any]:
        """Forward reads the logits once (online log-sum-exp); backward writes d(logits)
        over them in one more pass, folding in the upstream gradient. Rows may be padded
        (a (N, V) view of wider rows, as lm_head_xent makes): the pad is never read."""
        xp = self.xp
        if logits.strides[1] != logits.itemsize:
            logits = xp.ascontiguousarray(logits)
        targets = xp.ascontiguousarray(targets, dtype=np.int32)
        n, v = logits.shape
        lse = xp.empty(n, dtype=accumulate_dtype(logits.dtype))  # and the loss, in acc
        nll = xp.empty_like(lse)
        self._k("xent_fwd", logits.dtype)((n,), (512,), (logits, targets, lse, nll, np.int32(v),
                                                         np.int32(_row_stride(logits))))
        state = (logits, targets, lse, inplace) if need_grad else None
        return nll.mean(), state

    def cross_entropy_backward(self, state: Any, g: Any) -> Any:
        logits, targets, lse, inplace = state
        n, v = logits.shape
        # the kernel reads and writes at one row stride
        out = logits if inplace else self.xp.empty((n, _row_stride(logits)), logits.dtype)[:, :v]
        g = self.xp.ascontiguousarray(g, dtype=lse.dtype)
        self._k("xent_bwd", logits.dtype)((n,), (512,), (logits, targets, lse, g, out,
                                                         np.int32(n), np.int32(v),
                                                         np.int32(_row_stride(logits))))
        return out

    def lm_head_xent(
        self, h: Any, w: Any, targets: Any, need_grad: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        """The logits' rows are padded to a multiple of 64 columns. A vocabulary such as
        WikiText-2's 33,278 leaves every row of an unpadded (N, V) misaligned for the tensor
        cores, and cuBLAS runs the LM head's GEMMs markedly slower. Unless V is a multiple
        already, the weight is copied once per step into a (Vp, E) buffer whose pad rows are
        zero, so the pad logits are exactly 0: the softmax never reads them, and they add
        nothing to either gradient."""
        v, e = w.shape
        vp = -(-v // VOCAB_PAD) * VOCAB_PAD
        wp = w
        if vp != v:
            wp = self.xp.empty((vp, e), dtype=w.dtype)  # (Vp, E)
            wp[:v] = w
            wp[v:] = 0
        padded = mm(h, wp, transpose_b=True)  # (N, Vp)
        loss, xent = self.cross_entropy(padded[:, :v], targets, need_grad, True)
        return loss, ((xent, h, wp, padded, v) if need_grad else None)

    def lm_head_xent_backward(
        self, state: Any, g: Any, need_h: bool, need_w: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        xent, h, wp, padded, v = state
        self.cross_entropy_backward(xent, g)  # d(logits) over the logits; the pad stays 0
        dh = mm(padded, wp) if need_h else None  # (N, E)
        dw = mm(padded.T, h)[:v] if need_w else None  # (V, E)
        return dh, dw

    # ---- optimizer ------------------------------------------------------------------------
    def gather_batch(self, stream: Any, step: Any, seq_len: int, x: Any, y: Any, *,
                     rank: int = 0, world_size: int = 1) -> None:
        """x, y <- the window of batch (step mod batches-per-epoch), without the host."""
        row0 = self._shard_start(stream, x, rank, world_size)
        b, n = x.shape[0], stream.shape[1]
        nb = (n - 1) // seq_len
        total = b * seq_len
        self._k("gather_batch", np.dtype(np.float32))(
            ((total + 255) // 256,), (256,),
            (stream, step, x, y, np.int32(row0), np.int32(b), np.int32(n), np.int32(seq_len),
             np.int32(nb)))

    def store_at_step(self, ring: Any, step: Any, value: Any) -> None:
        value = self.xp.ascontiguousarray(value, dtype=ring.dtype)
        self._k("store_at_step", ring.dtype)((1,), (1,), (ring, step, value, np.int32(len(ring))))

    # ---- fused attention (kernels/cuda_attention.py) -------------------------------------------
    def fused_attention(self, dtype: Any, head_dim: int, seq_len: int) -> bool:
        """Its float32 products run on tf32 tensor cores, so an fp32 run keeps the
        materialised path; the policy's ATTENTION=materialized turns it off."""
        if self.attention == "materialized":
            return False
        if np.dtype(dtype) == np.float32 and not self.tf32:
            return False
        return cuda_attention.supports(dtype, head_dim, seq_len)

    def attention_forward(self, q: Any, k: Any, v: Any, scale: float,
                          dropout: tuple[float, int, int, Any] | None,
                          out: Any = None) -> tuple[Any, Any]:
        return cuda_attention.flash_attention_forward(q, k, v, scale, _drop(dropout), out)

    def attention_backward(self, q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any,
                           scale: float, dropout: tuple[float, int, int, Any] | None,
                           out: tuple[Any, Any, Any] | None = None) -> tuple[Any, Any, Any]:
        return cuda_attention.flash_attention_backward(q, k, v, o, do, lse, scale,
                                                       _drop(dropout), out)

    # ---- randomness -----------------------------------------------------------------------------
    def dropout_mask(self, shape: tuple[int, ...], dtype: Any, p: float, seed: int, site: int,
                     step: Any) -> Any:
        """One fused launch, the bits of the shared Philox formulation."""
        mask = self.xp.empty(shape, dtype)
        _elementwise()["dropout_mask"](step, np.uint32(seed & 0xFFFFFFFF), np.uint32(site),
                                       np.uint32(philox.keep_threshold(p)),
                                       np.float64(1.0 / (1.0 - p)), mask)
        return mask

    def dropout_apply(self, x: Any, p: float, seed: int, site: int, step: Any) -> Any:
        """x times the mask above in one launch, the bits drawn inline."""
        return _elementwise()["dropout_apply"](
            x, step, np.uint32(seed & 0xFFFFFFFF), np.uint32(site),
            np.uint32(philox.keep_threshold(p)), np.float64(1.0 / (1.0 - p)))
