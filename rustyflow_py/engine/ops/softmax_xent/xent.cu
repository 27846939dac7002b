// Softmax cross-entropy over the vocabulary, one block per row.
#include "types.cuh"
#include "warp_reduce.cuh"

// Softmax cross-entropy forward: per row (block), online max/sum -> log-sum-exp and NLL.
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
}

// Its backward: d(logits) = (softmax - onehot) * g / N, written over the logits buffer.
extern "C" __global__ void xent_bwd(const real* logits, const int* targets, const acc* lse,
                                    const acc* g, real* out, int n, int v, int ld) {
    int row = blockIdx.x;
    long long off = (long long)row * ld;
    acc l = lse[row], scale = g[0] / n;
    int t = targets[row];
    for (int i = threadIdx.x; i < v; i += blockDim.x)
        out[off + i] = (real)((exp((acc)logits[off + i] - l) - (i == t ? 1 : 0)) * scale);
}
