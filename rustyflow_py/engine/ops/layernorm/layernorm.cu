// LayerNorm over the last axis for rows of any width: one warp per row, the row read from
// memory again for each pass (layernorm_rows.cu holds rows of up to 32 * MAX_CPL columns in
// registers instead).
#include "layernorm.cuh"

// LayerNorm forward, one warp per row of C features.
extern "C" __global__ void ln_fwd(const real* __restrict__ x, const real* __restrict__ w,
                                  const real* __restrict__ b, real* __restrict__ y,
                                  acc* __restrict__ mean, acc* __restrict__ rstd, int n, int c,
                                  acc eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    const real* xr = x + (long long)row * c;
    acc s = 0;
    for (int i = lane; i < c; i += 32) s += (acc)xr[i];
    acc m = ln_mean(s, c), v = 0;
    for (int i = lane; i < c; i += 32) { acc d = (acc)xr[i] - m; v += d * d; }
    acc r = ln_rstd(v, c, eps);
    real* yr = y + (long long)row * c;
    for (int i = lane; i < c; i += 32) yr[i] = (real)ln_y((acc)xr[i], m, r, (acc)w[i], (acc)b[i]);
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

// LayerNorm backward for dx, one warp per row.
extern "C" __global__ void ln_bwd_dx(const real* __restrict__ g, const real* __restrict__ x,
                                     const real* __restrict__ w, const acc* __restrict__ mean,
                                     const acc* __restrict__ rstd, real* __restrict__ dx, int n,
                                     int c) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    long long off = (long long)row * c;
    acc m = mean[row], r = rstd[row], s1 = 0, s2 = 0;
    for (int i = lane; i < c; i += 32)
        ln_row_sums((acc)g[off + i], ln_xhat((acc)x[off + i], m, r), (acc)w[i], s1, s2);
    s1 = ln_mean(s1, c);
    s2 = ln_mean(s2, c);
    for (int i = lane; i < c; i += 32)
        dx[off + i] = (real)ln_dx((acc)g[off + i], ln_xhat((acc)x[off + i], m, r), (acc)w[i],
                                  s1, s2, r, (acc)0);
}

// LayerNorm backward for dw, db: per-chunk column partial sums in acc (summed afterwards).
extern "C" __global__ void ln_bwd_dwdb(const real* __restrict__ g, const real* __restrict__ x,
                                       const acc* __restrict__ mean, const acc* __restrict__ rstd,
                                       acc* __restrict__ pdw, acc* __restrict__ pdb, int n, int c,
                                       int rows_per_chunk) {
    int col = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (col >= c) return;
    int start = chunk * rows_per_chunk, stop = min(n, start + rows_per_chunk);
    acc dw = 0, db = 0;
    for (int row = start; row < stop; ++row) {
        long long off = (long long)row * c + col;
        ln_col_sums((acc)g[off], ln_xhat((acc)x[off], mean[row], rstd[row]), dw, db);
    }
    pdw[(long long)chunk * c + col] = dw;
    pdb[(long long)chunk * c + col] = db;
}
