// Softmax cross-entropy over the vocabulary, one block per row. A row whose start is 16-byte
// aligned (vec = 1: cuda.py checks the pointer and the row stride) is read as 16-byte vectors
// (vec.cuh) up to its last whole vector, the rest one value at a time: at GPT-2's (16384,
// 50304) bf16 logits, scalar 2-byte loads left both passes at a third of the bandwidth.
#include "types.cuh"
#include "vec.cuh"
#include "warp_reduce.cuh"

// exp in acc: the SFU's __expf for float (the loss and its gradient are in 16 bits or float,
// where its few-ulp error never shows), the exact exp for the double checks.
__device__ __forceinline__ float rf_exp(float x) { return __expf(x); }
__device__ __forceinline__ double rf_exp(double x) { return exp(x); }

// Fold x into a running (max m, sum s of exp(. - m)).
__device__ __forceinline__ void lse_add(acc& m, acc& s, acc x) {
    if (x > m) { s = s * rf_exp(m - x) + 1; m = x; } else { s += rf_exp(x - m); }
}

// Softmax cross-entropy forward: per row (block), online max/sum -> log-sum-exp and NLL.
extern "C" __global__ void xent_fwd(const real* logits, const int* targets, acc* lse,
                                    acc* nll, int v, int ld, int vec) {
    __shared__ acc sm[32], ss[32];
    int row = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const real* xr = logits + (long long)row * ld;
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
        acc l = mt + log(st);
        lse[row] = l;
        nll[row] = l - (acc)xr[targets[row]];
    }
}

// Its backward: d(logits) = (softmax - onehot) * g / N, written over the logits buffer (or
// another of the same row stride), vectors as the forward reads them.
extern "C" __global__ void xent_bwd(const real* logits, const int* targets, const acc* lse,
                                    const acc* g, real* out, int n, int v, int ld, int vec) {
    int row = blockIdx.x;
    long long off = (long long)row * ld;
    acc l = lse[row], scale = g[0] / n;
    int t = targets[row];
    int head = vec ? v / RF_VEC * RF_VEC : 0;
    for (int i = threadIdx.x; i < head / RF_VEC; i += blockDim.x) {
        rf_vec a = ((const rf_vec*)(logits + off))[i], d;
#pragma unroll
        for (int k = 0; k < RF_VEC; ++k)
            d.v[k] = (real)((rf_exp((acc)a.v[k] - l) - (i * RF_VEC + k == t ? 1 : 0)) * scale);
        ((rf_vec*)(out + off))[i] = d;
    }
    for (int i = head + threadIdx.x; i < v; i += blockDim.x)
        out[off + i] = (real)((rf_exp((acc)logits[off + i] - l) - (i == t ? 1 : 0)) * scale);
}
