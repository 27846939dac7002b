// Column sums of a few rows of acc (LayerNorm's partial sums of its parameters' gradients),
// written or added into the destination (a gradient's float32 buffer) in a fixed order: the
// same bits every run (gemm/cuda.py's sum_rows).
#include "types.cuh"

// dst[c] (+)= the sum of part[p][c] over the `parts` rows; add = 0 overwrites dst. A block is
// 32 columns x SUM_LANES lanes, each lane summing every SUM_LANES-th row, then the lanes' sums
// are added in shared memory in a fixed order.
#ifndef SUM_LANES
#define SUM_LANES 32  // gemm/cuda.py passes its own (-DSUM_LANES), the block's y extent
#endif
extern "C" __global__ void __launch_bounds__(32 * SUM_LANES) sum_rows_into(const acc* __restrict__ part, acc* __restrict__ dst,
                                         int parts, int cols, int add) {
    __shared__ acc lanes[SUM_LANES][33];
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
