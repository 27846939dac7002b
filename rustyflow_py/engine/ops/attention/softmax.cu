// The materialised attention's causal scale + mask + softmax over rows of (B*H*T, T)
// scores, one warp per row.
#include "types.cuh"
#include "warp_reduce.cuh"

// Causal scale + mask + softmax over rows of (B*H*T, T) scores, in place; warp per row.
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
}

// Probabilities again from the saved log-sum-exp (attention backward), in place.
extern "C" __global__ void softmax_recompute(real* s, const acc* lse, int rows, int t,
                                             acc scale) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int q = row % t;
    real* sr = s + (long long)row * t;
    acc l = lse[row];
    for (int j = lane; j < t; j += 32) sr[j] = (real)(j <= q ? exp((acc)sr[j] * scale - l) : 0);
}

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
}
