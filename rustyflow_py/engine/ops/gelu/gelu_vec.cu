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

// The same over rows of `vcols` whole vectors, adding up the columns of dx as well (the
// gradient of the bias before the GELU): each thread walks `chunk` rows of one vector column,
// writes dx as gelu_bwd_vec does, and sums the values it stored in acc; its block's row of
// `part` gets those sums (the partial sums' rows are added after, in a fixed order).
extern "C" __global__ void gelu_bwd_sums(const rf_vec* __restrict__ g,
                                         const rf_vec* __restrict__ x,
                                         const real* __restrict__ b, rf_vec* __restrict__ dx,
                                         acc* __restrict__ part, int rows, int vcols,
                                         int chunk) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= vcols) return;
    int start = blockIdx.y * chunk, stop = min(rows, start + chunk);
    acc s[RF_VEC], bv[RF_VEC];
#pragma unroll
    for (int k = 0; k < RF_VEC; ++k) {
        s[k] = 0;
        bv[k] = b ? (acc)b[c * RF_VEC + k] : (acc)0;
    }
    long long i = (long long)start * vcols + c;
    rf_vec gv, xv;
    if (start < stop) { gv = g[i]; xv = x[i]; }
    for (int r = start; r < stop; ++r, i += vcols) {
        rf_vec gn, xn, out;  // the next row's, loaded while this one is computed
        if (r + 1 < stop) { gn = g[i + vcols]; xn = x[i + vcols]; }
#pragma unroll
        for (int k = 0; k < RF_VEC; ++k) {
            out.v[k] = (real)((acc)gv.v[k] * rf_gelu_slope((acc)xv.v[k] + bv[k]));
            s[k] += (acc)out.v[k];
        }
        dx[i] = out;
        gv = gn;
        xv = xn;
    }
    acc* row = part + (long long)blockIdx.y * vcols * RF_VEC + (long long)c * RF_VEC;
#pragma unroll
    for (int k = 0; k < RF_VEC; ++k) row[k] = s[k];
}
