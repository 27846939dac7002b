// LayerNorm's arithmetic, value by value, in acc: the one place its expressions are written.
// The row kernels (layernorm/layernorm_rows.cu), the multi-pass ones (layernorm/layernorm.cu)
// and those that write FP8 codes too (fp8/layernorm_fp8.cu) all compute through these, so
// that the kernels the tests hold equal bit for bit round the same expressions the same way.
#include "types.cuh"
#include "warp_reduce.cuh"

// A row's mean and rstd from each lane's sum of its values and of their squared deviations.
__device__ __forceinline__ acc ln_mean(acc lane_sum, int c) { return warp_sum(lane_sum) / c; }
__device__ __forceinline__ acc ln_rstd(acc lane_sq, int c, acc eps) {
    return rsqrt(warp_sum(lane_sq) / c + eps);
}

__device__ __forceinline__ acc ln_xhat(acc x, acc m, acc r) { return (x - m) * r; }

// Forward: y = (x - mean) * rstd * w + b.
__device__ __forceinline__ acc ln_y(acc x, acc m, acc r, acc w, acc b) {
    return (x - m) * r * w + b;
}

// Backward, first pass over a row: the lane's sums s1 of g * w and s2 of g * w * xhat (their
// means are ln_mean's), and its columns' sums for dw (g * xhat) and db (g).
__device__ __forceinline__ void ln_row_sums(acc g, acc xh, acc w, acc& s1, acc& s2) {
    const acc gw = g * w;
    s1 += gw;
    s2 += gw * xh;
}
__device__ __forceinline__ void ln_col_sums(acc g, acc xh, acc& dw, acc& db) {
    dw += g * xh;
    db += g;
}

// Backward, second pass: dx = rstd * (g * w - s1 - xhat * s2) + joined, s1 and s2 the row's
// means (a residual stream's gradient `joined` added in the same pass; 0 without one).
__device__ __forceinline__ acc ln_dx(acc g, acc xh, acc w, acc s1, acc s2, acc r,
                                     acc joined) {
    return r * (g * w - s1 - xh * s2) + joined;
}
