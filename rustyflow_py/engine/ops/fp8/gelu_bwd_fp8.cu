// GELU's backward writing its result only as FP8 codes (e5m2: a gradient), at delayed
// scaling: dx = g * gelu'(x + b), rounded to `real` as gelu_vec.cu's gelu_bwd_sums rounds it,
// then cast at the site's scale (fp8.cuh) into both layouts the next GEMMs read, x's own
// (rows x cols) and its transpose (cols x rows), with the columns' sums of dx over each tile's
// rows (the bias gradient before the GELU, added up by the caller). It replaces gelu_bwd_sums
// and the transposing cast of its output: a 16-bit write and read of the whole array.
//
// A block of TQ_THREADS threads takes a tile of TQ_ROWS x TQ_COLS values, as fp8_cast.cu's
// fp8_quantize_t_vec (fp8.cuh's transposed tile): each thread a vector column of four rows,
// their codes stored along the rows and as words of four into the shared tile, which then
// goes out 16 codes an access along the transpose's rows. The eight lanes of a warp that share
// a vector column (tq_pair) add their column sums by shuffles, then the warps theirs in shared
// memory, in a fixed order. For rows a multiple of TQ_ROWS and cols of TQ_COLS, arrays 16-byte
// aligned; a block a tile.
#include "types.cuh"
#include "vec.cuh"
#include "gelu.cuh"
#include "fp8.cuh"

#define WARPS (TQ_THREADS / 32)

extern "C" __global__ void __launch_bounds__(TQ_THREADS, 3) gelu_bwd_codes(
        const rf_vec* __restrict__ g, const rf_vec* __restrict__ x, const real* __restrict__ b,
        SCALE_FROM, rf_codes* __restrict__ q_rows, unsigned char* __restrict__ q_t,
        float* __restrict__ scale_inv, acc* __restrict__ part, int rows, int cols) {
    __shared__ unsigned int tile[TQ_COLS * TQ_WORDS];
    __shared__ acc sums[WARPS][TQ_COLS];  // each warp's column sums (its four vector columns)
    SCALE_BEGIN;
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / scale;
    const int row_vecs = cols / RF_VEC, col_tiles = cols / TQ_COLS;
    const int c0 = blockIdx.x % col_tiles * TQ_COLS, r0 = blockIdx.x / col_tiles * TQ_ROWS;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int k = lane; k < TQ_COLS; k += 32) sums[warp][k] = 0;  // a warp writes its own row
    __syncwarp();
    for (int p = threadIdx.x; p < TQ_PAIRS; p += TQ_THREADS) {
        int quad, cv;
        tq_pair(p, quad, cv);
        const long long at = (long long)(r0 + quad * 4) * row_vecs + c0 / RF_VEC + cv;
        acc s[RF_VEC], bv[RF_VEC];
#pragma unroll
        for (int k = 0; k < RF_VEC; ++k) {
            s[k] = 0;
            bv[k] = b ? (acc)b[c0 + cv * RF_VEC + k] : (acc)0;
        }
        rf_vec gv[4], xv[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            gv[i] = g[at + (long long)i * row_vecs];
            xv[i] = x[at + (long long)i * row_vecs];
        }
        rf_codes codes[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            rf_vec d;
#pragma unroll
            for (int k = 0; k < RF_VEC; ++k) {
                d.v[k] = (real)((acc)gv[i].v[k] * rf_gelu_slope((acc)xv[i].v[k] + bv[k]));
                s[k] += (acc)d.v[k];
            }
            codes[i] = codes_of(d, scale, seen);
            q_rows[at + (long long)i * row_vecs] = codes[i];
        }
        tq_put(tile, quad, cv, codes);
        // the eight lanes of this vector column (lane % 8 apart by tq_pair), then the warp's
#pragma unroll
        for (int k = 0; k < RF_VEC; ++k)
            for (int o = 1; o < 8; o <<= 1) s[k] += __shfl_xor_sync(0xffffffff, s[k], o);
        if ((lane & 7) == 0) {
#pragma unroll
            for (int k = 0; k < RF_VEC; ++k) sums[warp][cv * RF_VEC + k] += s[k];
        }
    }
    __syncthreads();
    tq_out(tile, q_t, rows, cols, r0, c0);
    if (threadIdx.x < TQ_COLS) {
        acc total = 0;
        for (int w = 0; w < WARPS; ++w) total += sums[w][threadIdx.x];
        part[(long long)(r0 / TQ_ROWS) * cols + c0 + threadIdx.x] = total;
    }
    SCALE_END;
}
