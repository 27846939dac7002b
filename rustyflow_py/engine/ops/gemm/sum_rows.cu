// Column sums of x (rows, cols) in acc, in two deterministic passes (no atomics: the same bits
// every run): sum_rows_part sums each chunk of `chunk` rows over 16-byte vectors (vec.cuh),
// one vector column a thread, into a row of partial sums; sum_rows_into sums those rows and
// writes, or adds into, the destination (a gradient's float32 buffer).
#include "types.cuh"
#include "vec.cuh"

extern "C" __global__ void sum_rows_part(const rf_vec* __restrict__ x, acc* __restrict__ part,
                                         int rows, int vcols, int chunk) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= vcols) return;
    int start = blockIdx.y * chunk, stop = min(rows, start + chunk);
    acc s[RF_VEC];
#pragma unroll
    for (int k = 0; k < RF_VEC; ++k) s[k] = 0;
    for (int r = start; r < stop; ++r) {
        rf_vec v = x[(long long)r * vcols + c];
#pragma unroll
        for (int k = 0; k < RF_VEC; ++k) s[k] += (acc)v.v[k];
    }
    acc* out = part + (long long)blockIdx.y * vcols * RF_VEC + (long long)c * RF_VEC;
#pragma unroll
    for (int k = 0; k < RF_VEC; ++k) out[k] = s[k];
}

// dst[c] (+)= the sum of part[p][c] over the `parts` rows; add = 0 overwrites dst. A block is
// 32 columns x SUM_LANES lanes, each lane summing every SUM_LANES-th row, then the lanes' sums
// are added in shared memory in a fixed order.
#define SUM_LANES 8
extern "C" __global__ void sum_rows_into(const acc* __restrict__ part, acc* __restrict__ dst,
                                         int parts, int cols, int add) {
    __shared__ acc lanes[SUM_LANES][32];
    int c = blockIdx.x * 32 + threadIdx.x;
    acc s = 0;
    if (c < cols)
        for (int p = threadIdx.y; p < parts; p += SUM_LANES) s += part[(long long)p * cols + c];
    lanes[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y || c >= cols) return;
    for (int l = 1; l < SUM_LANES; ++l) s += lanes[l][threadIdx.x];
    dst[c] = add ? dst[c] + s : s;
}
