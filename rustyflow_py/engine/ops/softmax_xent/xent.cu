// Softmax cross-entropy over the vocabulary, one block per row. A row whose start is 16-byte
// aligned (vec = 1: cuda.py checks the pointer and the row stride) is read as 16-byte vectors
// (vec.cuh) up to its last whole vector, the rest one value at a time: at GPT-2's (16384,
// 50304) bf16 logits, scalar 2-byte loads left both passes at a third of the bandwidth.
#include "types.cuh"
#include "vec.cuh"
#include "warp_reduce.cuh"
#include <cuda_fp8.h>

// exp in acc: the SFU's __expf for float (the loss and its gradient are in 16 bits or float,
// where its few-ulp error never shows), the exact exp for the double checks.
__device__ __forceinline__ float rf_exp(float x) { return __expf(x); }
__device__ __forceinline__ double rf_exp(double x) { return exp(x); }

// Fold x into a running (max m, sum s of exp(. - m)).
__device__ __forceinline__ void lse_add(acc& m, acc& s, acc x) {
    if (x > m) { s = s * rf_exp(m - x) + 1; m = x; } else { s += rf_exp(x - m); }
}

// A row's log-sum-exp, returned to every thread of the block: online max/sum over the row,
// merged across each warp, then across the block's warps.
__device__ acc row_lse(const real* xr, int v, int vec) {
    __shared__ acc sm[32], ss[32], total;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    acc m = NEG_INF, s = 0;
    int head = vec ? v / RF_VEC * RF_VEC : 0;  // values read as whole vectors
    for (int i = threadIdx.x; i < head / RF_VEC; i += blockDim.x) {
        rf_vec a = ((const rf_vec*)xr)[i];
        acc mv = m;
#pragma unroll
        for (int k = 0; k < RF_VEC; ++k) mv = max(mv, (acc)a.v[k]);
        if (mv > m) { s *= rf_exp(m - mv); m = mv; }
#pragma unroll
        for (int k = 0; k < RF_VEC; ++k) s += rf_exp((acc)a.v[k] - m);
    }
    for (int i = head + threadIdx.x; i < v; i += blockDim.x) lse_add(m, s, (acc)xr[i]);
    for (int o = 16; o > 0; o >>= 1) {  // merge (m, s) pairs across the warp
        acc m2 = __shfl_xor_sync(0xffffffff, m, o), s2 = __shfl_xor_sync(0xffffffff, s, o);
        acc mm = max(m, m2);
        s = (m == NEG_INF ? 0 : s * rf_exp(m - mm)) + (m2 == NEG_INF ? 0 : s2 * rf_exp(m2 - mm));
        m = mm;
    }
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    if (threadIdx.x == 0) {
        acc mt = sm[0], st = ss[0];
        for (int k = 1; k < blockDim.x / 32; ++k) {
            acc mm = max(mt, sm[k]);
            st = st * rf_exp(mt - mm) + ss[k] * rf_exp(sm[k] - mm);
            mt = mm;
        }
        total = mt + log(st);
    }
    __syncthreads();
    return total;
}

// d(logits) of a row, (softmax - onehot(t)) * scale, from its log-sum-exp l, written to `out`
// (which may be the row itself), vectors as row_lse reads them.
__device__ void row_grad(const real* xr, real* out, int t, acc l, acc scale, int v, int vec) {
    int head = vec ? v / RF_VEC * RF_VEC : 0;
    for (int i = threadIdx.x; i < head / RF_VEC; i += blockDim.x) {
        rf_vec a = ((const rf_vec*)xr)[i], d;
#pragma unroll
        for (int k = 0; k < RF_VEC; ++k)
            d.v[k] = (real)((rf_exp((acc)a.v[k] - l) - (i * RF_VEC + k == t ? 1 : 0)) * scale);
        ((rf_vec*)out)[i] = d;
    }
    for (int i = head + threadIdx.x; i < v; i += blockDim.x)
        out[i] = (real)((rf_exp((acc)xr[i] - l) - (i == t ? 1 : 0)) * scale);
}

// Softmax cross-entropy forward: per row (block), its log-sum-exp and NLL.
extern "C" __global__ void xent_fwd(const real* logits, const int* targets, acc* lse,
                                    acc* nll, int v, int ld, int vec) {
    int row = blockIdx.x;
    const real* xr = logits + (long long)row * ld;
    acc l = row_lse(xr, v, vec);
    if (threadIdx.x == 0) {
        lse[row] = l;
        nll[row] = l - (acc)xr[targets[row]];
    }
}

// Its backward: d(logits) = (softmax - onehot) * g / N, written over the logits buffer (or
// another of the same row stride).
extern "C" __global__ void xent_bwd(const real* logits, const int* targets, const acc* lse,
                                    const acc* g, real* out, int n, int v, int ld, int vec) {
    long long off = (long long)blockIdx.x * ld;
    row_grad(logits + off, out + off, targets[blockIdx.x], lse[blockIdx.x], g[0] / n, v, vec);
}

// Both in one pass over the logits, for a loss whose gradient is known up to its upstream
// factor: the NLL, then (softmax - onehot) / N written over the row. The row is read a second
// time right after the first, by the same block, so that read comes mostly from L2: the
// (N, V) logits cross HBM once each way instead of twice in and once out.
extern "C" __global__ void __launch_bounds__(1024) xent_fwd_grad(real* logits, const int* targets, acc* lse, acc* nll,
                                         int n, int v, int ld, int vec) {
    int row = blockIdx.x, t = targets[row];
    real* xr = logits + (long long)row * ld;
    acc l = row_lse(xr, v, vec);
    if (threadIdx.x == 0) {
        lse[row] = l;
        nll[row] = l - (acc)xr[t];
    }
    __syncthreads();  // the target's logit is read before the row is overwritten
    row_grad(xr, xr, t, l, (acc)1 / n, v, vec);
}

// The codes of a row's d(logits) in e5m2, for a PRECISION=fp8 run's LM head: (softmax -
// onehot(t)) * 57344 (e5m2's largest value), so that their read-back factor is
// 1 / (57344 N) for the gradient (softmax - onehot) / N, whose magnitude is at most 1 / N:
// scaled by that bound, no amax pass is needed. Columns v to ldq (the pad) get zero codes.
// q's rows are ldq codes apart, a multiple of 8 (its vectors of RF_VEC codes stay aligned).
struct __align__(RF_VEC) rf_codes8 {
    unsigned char b[RF_VEC];
};

__device__ __forceinline__ unsigned char e5m2_of(acc x) {
    return __nv_cvt_float_to_fp8((float)x * 57344.0f, __NV_SATFINITE, __NV_E5M2);
}

__device__ void row_grad_e5m2(const real* xr, unsigned char* q, int t, acc l, int v, int ldq,
                              int vec) {
    int head = vec ? v / RF_VEC * RF_VEC : 0;
    for (int i = threadIdx.x; i < head / RF_VEC; i += blockDim.x) {
        rf_vec a = ((const rf_vec*)xr)[i];
        rf_codes8 d;
#pragma unroll
        for (int k = 0; k < RF_VEC; ++k)
            d.b[k] = e5m2_of(rf_exp((acc)a.v[k] - l) - (i * RF_VEC + k == t ? 1 : 0));
        ((rf_codes8*)q)[i] = d;
    }
    for (int i = head + threadIdx.x; i < ldq; i += blockDim.x)
        q[i] = i < v ? e5m2_of(rf_exp((acc)xr[i] - l) - (i == t ? 1 : 0)) : 0;
}

// xent_fwd_grad with the gradient as e5m2 codes into q (N x ldq) instead of over the logits.
extern "C" __global__ void __launch_bounds__(1024) xent_fwd_grad_e5m2(
        const real* logits, const int* targets, acc* lse, acc* nll, unsigned char* q, int v,
        int ld, int ldq, int vec) {
    int row = blockIdx.x, t = targets[row];
    const real* xr = logits + (long long)row * ld;
    acc l = row_lse(xr, v, vec);
    if (threadIdx.x == 0) {
        lse[row] = l;
        nll[row] = l - (acc)xr[t];
    }
    row_grad_e5m2(xr, q + (long long)row * ldq, t, l, v, ldq, vec);
}

// out = x * g[0] over 16-byte vectors (out may be x): the upstream gradient applied on the
// (N, E) side of the LM head after xent_fwd_grad (cuda.py checks the vectors).
extern "C" __global__ void scale_vec(const rf_vec* x, const acc* g, rf_vec* out, long long vecs) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= vecs) return;
    acc s = g[0];
    rf_vec a = x[i], o;
#pragma unroll
    for (int k = 0; k < RF_VEC; ++k) o.v[k] = (real)((acc)a.v[k] * s);
    out[i] = o;
}

// into += x * g[0] over 16-byte vectors, both in the accumulation dtype: a chunked LM head's
// sum of dW over its chunks, added into the weight's gradient once backward knows g.
extern "C" __global__ void add_scaled_vec(const rf_vec* x, const acc* g, rf_vec* into,
                                          long long vecs) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= vecs) return;
    acc s = g[0];
    rf_vec a = x[i], o = into[i];
#pragma unroll
    for (int k = 0; k < RF_VEC; ++k) o.v[k] = (real)((acc)o.v[k] + (acc)a.v[k] * s);
    into[i] = o;
}
