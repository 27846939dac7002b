// LayerNorm with each row held in registers: lane l keeps columns l, l + 32, ..., CPL of
// them (CPL = ceil(c / 32), a -D option: one build per width).
#include "types.cuh"
#include "warp_reduce.cuh"

// LayerNorm forward with the row held in registers (lane l keeps columns l, l + 32, ...: CPL of
// them, CPL = ceil(c / 32) fixed at compile time): x is read from memory once.
extern "C" __global__ void ln_fwd_rows(const real* __restrict__ x, const real* __restrict__ w,
                                       const real* __restrict__ b, real* __restrict__ y,
                                       acc* __restrict__ mean, acc* __restrict__ rstd, int n,
                                       int c, acc eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    long long off = (long long)row * c;
    acc xv[CPL], s = 0;
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
        int i = lane + 32 * j;
        xv[j] = i < c ? (acc)x[off + i] : (acc)0;
        s += xv[j];
    }
    acc m = warp_sum(s) / c, v = 0;
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
        acc d = lane + 32 * j < c ? xv[j] - m : (acc)0;
        v += d * d;
    }
    acc r = rsqrt(warp_sum(v) / c + eps);
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
        int i = lane + 32 * j;
        if (i < c) y[off + i] = (real)((xv[j] - m) * r * (acc)w[i] + (acc)b[i]);
    }
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

// LayerNorm backward in one pass, the row in registers as in ln_fwd_rows: each warp takes
// `rows` consecutive rows, writes their dx, and sums its columns of g * xhat (dw) and g
// (db) over them in registers, then writes those as its row of the partial sums (summed
// afterwards): no atomics, so the sums are the same bits every run.
extern "C" __global__ void ln_bwd_rows(const real* __restrict__ g, const real* __restrict__ x,
                                       const real* __restrict__ w, const acc* __restrict__ mean,
                                       const acc* __restrict__ rstd, real* __restrict__ dx,
                                       acc* __restrict__ pdw, acc* __restrict__ pdb, int n, int c,
                                       int rows) {
    int warp = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    int start = warp * rows;
    if (start >= n) return;
    int stop = min(n, start + rows);
    acc dw[CPL], db[CPL], wv[CPL];
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
        int i = lane + 32 * j;
        dw[j] = 0;
        db[j] = 0;
        wv[j] = i < c ? (acc)w[i] : (acc)0;
    }
    for (int row = start; row < stop; ++row) {
        long long off = (long long)row * c;
        acc m = mean[row], r = rstd[row], s1 = 0, s2 = 0, gv[CPL], xh[CPL];
#pragma unroll
        for (int j = 0; j < CPL; ++j) {
            int i = lane + 32 * j;
            gv[j] = i < c ? (acc)g[off + i] : (acc)0;
            xh[j] = i < c ? ((acc)x[off + i] - m) * r : (acc)0;
            acc gw = gv[j] * wv[j];
            s1 += gw;
            s2 += gw * xh[j];
            dw[j] += gv[j] * xh[j];
            db[j] += gv[j];
        }
        s1 = warp_sum(s1) / c;
        s2 = warp_sum(s2) / c;
#pragma unroll
        for (int j = 0; j < CPL; ++j) {
            int i = lane + 32 * j;
            if (i < c) dx[off + i] = (real)(r * (gv[j] * wv[j] - s1 - xh[j] * s2));
        }
    }
    long long part = (long long)warp * c;
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
        int i = lane + 32 * j;
        if (i < c) { pdw[part + i] = dw[j]; pdb[part + i] = db[j]; }
    }
}
