// LayerNorm with each row held in registers, read and written LN_VEC values at a time: lane l
// keeps the row's vectors l, l + 32, ..., VPL of them (VPL = ceil(c / (32 * LN_VEC)); both
// -D options, one build per width). LN_VEC = 16 / sizeof(real) (16-byte vectors, a warp
// moves a row 512 bytes at a time) where the rows are whole vectors and x, w, b (and g, res)
// are 16-byte aligned, else 1: a value at a time (layernorm/cuda.py picks).
#include "layernorm.cuh"

struct __align__(LN_VEC * sizeof(real)) ln_vec {
    real v[LN_VEC];
};

// Forward: x read once, y = (x - mean) * rstd * w + b.
extern "C" __global__ void ln_fwd_rows(const ln_vec* __restrict__ x,
                                       const ln_vec* __restrict__ w,
                                       const ln_vec* __restrict__ b, ln_vec* __restrict__ y,
                                       acc* __restrict__ mean, acc* __restrict__ rstd, int n,
                                       int c, acc eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    int vc = c / LN_VEC;
    long long off = (long long)row * vc;
    acc xv[VPL][LN_VEC], s = 0;
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        int i = lane + 32 * j;
        ln_vec a;
        if (i < vc) a = x[off + i];
#pragma unroll
        for (int k = 0; k < LN_VEC; ++k) {
            xv[j][k] = i < vc ? (acc)a.v[k] : (acc)0;
            s += xv[j][k];
        }
    }
    acc m = ln_mean(s, c), v = 0;
#pragma unroll
    for (int j = 0; j < VPL; ++j)
#pragma unroll
        for (int k = 0; k < LN_VEC; ++k) {
            acc d = lane + 32 * j < vc ? xv[j][k] - m : (acc)0;
            v += d * d;
        }
    acc r = ln_rstd(v, c, eps);
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        int i = lane + 32 * j;
        if (i >= vc) continue;
        ln_vec wv = w[i], bv = b[i], o;
#pragma unroll
        for (int k = 0; k < LN_VEC; ++k)
            o.v[k] = (real)ln_y(xv[j][k], m, r, (acc)wv.v[k], (acc)bv.v[k]);
        y[off + i] = o;
    }
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

// One lane's vectors of row `row` of g, x and the residual (null: not loaded), and the row's
// statistics.
__device__ __forceinline__ void load_row(const ln_vec* __restrict__ g,
                                         const ln_vec* __restrict__ x,
                                         const ln_vec* __restrict__ res,
                                         const acc* __restrict__ mean,
                                         const acc* __restrict__ rstd, int row, int vc, int lane,
                                         ln_vec (&ga)[VPL], ln_vec (&xa)[VPL], ln_vec (&ra)[VPL],
                                         acc& m, acc& r) {
    m = mean[row];
    r = rstd[row];
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        int i = lane + 32 * j;
        if (i < vc) {
            long long at = (long long)row * vc + i;
            ga[j] = g[at];
            xa[j] = x[at];
            if (res) ra[j] = res[at];
        }
    }
}

// Backward in one pass: each warp takes `rows` consecutive rows, writes their dx, and sums
// its columns of g * xhat (dw) and g (db) over them in registers, then writes those as its
// row of the partial sums (summed afterwards, in a fixed order). A residual
// gradient `res` (null: none) is added to dx as it is written: where the LayerNorm's input
// also feeds the residual stream, the two gradients join in this pass.
// LN_AHEAD (a -D option; layernorm/cuda.py says for which dtypes): 1 issues the next row's
// loads, residual included, before this row's sums, so they are in flight while it sums;
// 0 loads each row (residual included) when its turn comes.
extern "C" __global__ void ln_bwd_rows(const ln_vec* __restrict__ g,
                                       const ln_vec* __restrict__ x,
                                       const ln_vec* __restrict__ w, const acc* __restrict__ mean,
                                       const acc* __restrict__ rstd,
                                       const ln_vec* __restrict__ res, ln_vec* __restrict__ dx,
                                       acc* __restrict__ pdw, acc* __restrict__ pdb, int n, int c,
                                       int rows) {
    int warp = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    int start = warp * rows;
    if (start >= n) return;
    int stop = min(n, start + rows), vc = c / LN_VEC;
    // Without LN_AHEAD, w stays in its own dtype (converted where used), and g and x too:
    // the dx loop converts them again rather than holding float copies across the sums, so
    // that fewer registers bound how many warps fit an SM
    acc dw[VPL][LN_VEC], db[VPL][LN_VEC];
#if LN_AHEAD
    acc wv[VPL][LN_VEC];
#define LN_W(j, k) wv[j][k]
#else
    ln_vec wp[VPL];
#define LN_W(j, k) ((acc)wp[j].v[k])
#endif
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        int i = lane + 32 * j;
        ln_vec a;
#pragma unroll
        for (int k = 0; k < LN_VEC; ++k) a.v[k] = (real)0;
        if (i < vc) a = w[i];
#pragma unroll
        for (int k = 0; k < LN_VEC; ++k) {
            dw[j][k] = 0;
            db[j][k] = 0;
#if LN_AHEAD
            wv[j][k] = (acc)a.v[k];
#endif
        }
#if !LN_AHEAD
        wp[j] = a;
#endif
    }
    ln_vec ga[VPL], xa[VPL], ra[VPL];  // a row's loads (with LN_AHEAD, the next row's)
    acc m, r;
#if LN_AHEAD
    load_row(g, x, res, mean, rstd, start, vc, lane, ga, xa, ra, m, r);
#endif
    for (int row = start; row < stop; ++row) {
        long long off = (long long)row * vc;
#if !LN_AHEAD
        load_row(g, x, res, mean, rstd, row, vc, lane, ga, xa, ra, m, r);
#endif
        acc s1 = 0, s2 = 0;
#if LN_AHEAD
        // this row's values, before the next row's loads replace them
        acc gv[VPL][LN_VEC], xh[VPL][LN_VEC], rv[VPL][LN_VEC];
#endif
#pragma unroll
        for (int j = 0; j < VPL; ++j) {
            int i = lane + 32 * j;
#pragma unroll
            for (int k = 0; k < LN_VEC; ++k) {
                acc gk = i < vc ? (acc)ga[j].v[k] : (acc)0;
                acc xk = i < vc ? ln_xhat((acc)xa[j].v[k], m, r) : (acc)0;
#if LN_AHEAD
                gv[j][k] = gk;
                xh[j][k] = xk;
                rv[j][k] = i < vc && res ? (acc)ra[j].v[k] : (acc)0;
#endif
                ln_row_sums(gk, xk, LN_W(j, k), s1, s2);
                ln_col_sums(gk, xk, dw[j][k], db[j][k]);
            }
        }
        acc rr = r;
#if LN_AHEAD
        if (row + 1 < stop) load_row(g, x, res, mean, rstd, row + 1, vc, lane, ga, xa, ra, m, r);
#endif
        s1 = ln_mean(s1, c);
        s2 = ln_mean(s2, c);
#pragma unroll
        for (int j = 0; j < VPL; ++j) {
            int i = lane + 32 * j;
            if (i >= vc) continue;
            ln_vec o;
#if !LN_AHEAD
            ln_vec rb;
            if (res) rb = ra[j];
#endif
#pragma unroll
            for (int k = 0; k < LN_VEC; ++k) {
#if LN_AHEAD
                acc gk = gv[j][k], xk = xh[j][k], joined = rv[j][k];
#else
                acc gk = (acc)ga[j].v[k], xk = ln_xhat((acc)xa[j].v[k], m, r);
                acc joined = res ? (acc)rb.v[k] : (acc)0;
#endif
                o.v[k] = (real)ln_dx(gk, xk, LN_W(j, k), s1, s2, rr, joined);
            }
            dx[off + i] = o;
        }
    }
#undef LN_W
    long long part = (long long)warp * c;
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        int i = lane + 32 * j;
        if (i >= vc) continue;
#pragma unroll
        for (int k = 0; k < LN_VEC; ++k) {
            pdw[part + i * LN_VEC + k] = dw[j][k];
            pdb[part + i * LN_VEC + k] = db[j][k];
        }
    }
}
