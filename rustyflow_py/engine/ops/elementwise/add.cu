// a + b over 16-byte vectors of the storage type (vec.cuh), the sum in acc: the residual
// stream's adds and the gradients' where branches join (elementwise/cuda.py).
#include "types.cuh"
#include "vec.cuh"

extern "C" __global__ void add_vec(const rf_vec* __restrict__ a, const rf_vec* __restrict__ b,
                                   rf_vec* __restrict__ out, long long vecs) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= vecs) return;
    rf_vec av = a[i], bv = b[i], o;
#pragma unroll
    for (int k = 0; k < RF_VEC; ++k) o.v[k] = (real)((acc)av.v[k] + (acc)bv.v[k]);
    out[i] = o;
}
