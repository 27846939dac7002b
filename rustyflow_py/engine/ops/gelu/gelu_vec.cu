// GELU's backward over 16-byte vectors: dx = g * gelu'(x + b), each thread loading 16 bytes
// of g and of x (8 16-bit values, 4 floats or 2 doubles) and storing 16 bytes of dx, for
// arrays of `vecs` whole vectors (gelu/cuda.py checks the size and the alignment). The
// bias b (c,) is optional (a null pointer: none); with one, c is a multiple of the vector,
// so a vector never straddles two rows.
#include "types.cuh"
#include "vec.cuh"
#include "gelu.cuh"

extern "C" __global__ void gelu_bwd_vec(const rf_vec* __restrict__ g,
                                        const rf_vec* __restrict__ x,
                                        const real* __restrict__ b, rf_vec* __restrict__ dx,
                                        long long vecs, int c) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= vecs) return;
    rf_vec gv = g[i], xv = x[i], out;
    int col = b ? (int)((i * RF_VEC) % c) : 0;
#pragma unroll
    for (int k = 0; k < RF_VEC; ++k) {
        acc u = (acc)xv.v[k] + (b ? (acc)b[col + k] : (acc)0);
        out.v[k] = (real)((acc)gv.v[k] * rf_gelu_slope(u));
    }
    dx[i] = out;
}
