// Casts between float32 and the storage type `real`, over whole vectors of `real` (vec.cuh),
// for elementwise/cuda.py's cast_into. cast_vec, float32 -> `real`: mixed precision's 16-bit
// copy of the parameters, refreshed from the float32 master after every update.
#include "types.cuh"
#include "vec.cuh"

extern "C" __global__ void cast_vec(const float4* __restrict__ src, rf_vec* __restrict__ dst,
                                    long long vecs) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= vecs) return;
    rf_vec o;
#pragma unroll
    for (int j = 0; j < RF_VEC / 4; ++j) {
        float4 f = src[i * (RF_VEC / 4) + j];
        o.v[4 * j] = (real)f.x;
        o.v[4 * j + 1] = (real)f.y;
        o.v[4 * j + 2] = (real)f.z;
        o.v[4 * j + 3] = (real)f.w;
    }
    dst[i] = o;
}

// The storage type `real` -> float32, over whole vectors of `real`: a gradient bucket summed
// in bf16 over the GPUs, widened back into the float32 gradient (distributed/data_parallel.py).
extern "C" __global__ void widen_vec(const rf_vec* __restrict__ src, float4* __restrict__ dst,
                                     long long vecs) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= vecs) return;
    rf_vec o = src[i];
#pragma unroll
    for (int j = 0; j < RF_VEC / 4; ++j)
        dst[i * (RF_VEC / 4) + j] = make_float4((float)o.v[4 * j], (float)o.v[4 * j + 1],
                                                (float)o.v[4 * j + 2], (float)o.v[4 * j + 3]);
}
