// The embedding's row gradient on the GPU (embedding/cuda.py): rows of `real` added into an
// `acc` gradient table, one block a row, its threads across the row's columns.
#include "types.cuh"

// dst[idx[j]] += rows[j] for every row j (repeated indices add up: atomics). Reads the 16-bit
// rows as they are, with no float32 copy of them first.
extern "C" __global__ void scatter_add_rows(acc* __restrict__ dst, const int* __restrict__ idx,
                                            const real* __restrict__ rows, int width) {
    const real* r = rows + (long long)blockIdx.x * width;
    acc* d = dst + (long long)idx[blockIdx.x] * width;
    for (int c = threadIdx.x; c < width; c += blockDim.x) atomicAdd(d + c, (acc)r[c]);
}
