// LayerNorm's forward writing its output's FP8 codes as well (e4m3: the input of the Linear
// after it), at delayed scaling (fp8.cuh): y as layernorm_rows.cu's ln_fwd_rows writes it, bit
// for bit, and y's codes in both layouts the Linear's GEMMs read, y's own (rows x c: its
// forward) and its transpose (c x rows: its weight gradient), with y's amax for the next
// replay. It replaces the transposing cast of y: a read of y and a launch.
//
// A warp takes four consecutive rows at once (a quad), each lane holding the same VPL vectors
// of each (16-byte vectors, lane l the row's vectors l, l + 32, ...), so that for each column
// it holds four codes of the transpose's row side by side: one 32-bit word into shared
// memory. A block of LQ_WARPS warps takes LQ_ROWS rows; its tile keeps y's columns as rows of
// LQ_WORDS words, the quad's slot rotated by the column's group of 32 (tile_at), so that a
// warp's stores land on 32 distinct banks; the tile then goes out 16 codes an access along
// the transpose's rows. For bf16/fp16 rows of c a multiple of 32 vectors (VPL = c / 256 for
// 16-bit values), rows a multiple of LQ_ROWS, arrays 16-byte aligned; c * LQ_WORDS words of
// shared memory (dynamic).
#include "types.cuh"
#include "vec.cuh"
#include "warp_reduce.cuh"
#include "fp8.cuh"

#define LQ_WARPS 8
#define LQ_ROWS (4 * LQ_WARPS)
#define LQ_WORDS (LQ_WARPS + 1)

// The word of column `col`, quad `quad` in the tile.
__device__ __forceinline__ int tile_at(int col, int quad) {
    return col * LQ_WORDS + ((quad + (col >> 5)) & (LQ_WARPS - 1));
}

extern "C" __global__ void __launch_bounds__(32 * LQ_WARPS) ln_fwd_codes(
        const rf_vec* __restrict__ x, const rf_vec* __restrict__ w,
        const rf_vec* __restrict__ b, rf_vec* __restrict__ y, acc* __restrict__ mean,
        acc* __restrict__ rstd, SCALE_FROM, rf_codes* __restrict__ q_rows,
        unsigned char* __restrict__ q_t, float* __restrict__ scale_inv, int n, int c, acc eps) {
    extern __shared__ unsigned int tile[];  // c * LQ_WORDS
    SCALE_BEGIN;
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / scale;
    const int lane = threadIdx.x % 32, quad = threadIdx.x / 32, vc = c / RF_VEC;
    const int r0 = blockIdx.x * LQ_ROWS, row = r0 + quad * 4;
    rf_vec xv[4][VPL];  // the quad's rows as loaded: 16-bit values, converted where used
    acc s[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < VPL; ++j) {
            xv[i][j] = x[(long long)(row + i) * vc + lane + 32 * j];
#pragma unroll
            for (int k = 0; k < RF_VEC; ++k) s[i] += (acc)xv[i][j].v[k];
        }
    acc m[4], r[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        m[i] = warp_sum(s[i]) / c;
        acc v = 0;
#pragma unroll
        for (int j = 0; j < VPL; ++j)
#pragma unroll
            for (int k = 0; k < RF_VEC; ++k) {
                const acc d = (acc)xv[i][j].v[k] - m[i];
                v += d * d;
            }
        r[i] = rsqrt(warp_sum(v) / c + eps);
    }
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        const int at = lane + 32 * j;  // the vector's index in a row
        const rf_vec wv = w[at], bv = b[at];
        rf_codes codes[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            rf_vec o;
#pragma unroll
            for (int k = 0; k < RF_VEC; ++k)
                o.v[k] = (real)(((acc)xv[i][j].v[k] - m[i]) * r[i] * (acc)wv.v[k]
                                + (acc)bv.v[k]);
            const long long off = (long long)(row + i) * vc + at;
            y[off] = o;
            codes[i] = codes_of(o, scale, seen);
            q_rows[off] = codes[i];
        }
#pragma unroll
        for (int k = 0; k < RF_VEC; ++k)
            tile[tile_at(at * RF_VEC + k, quad)] = codes[0].b[k] | codes[1].b[k] << 8
                | codes[2].b[k] << 16 | (unsigned int)codes[3].b[k] << 24;
    }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            mean[row + i] = m[i];
            rstd[row + i] = r[i];
        }
    }
    __syncthreads();
    // out: each of y's columns is LQ_ROWS codes of q_t's row, 16 at a time
    for (int t = threadIdx.x; t < c * (LQ_ROWS / 16); t += blockDim.x) {
        const int col = t / (LQ_ROWS / 16), part = t % (LQ_ROWS / 16);
        unsigned int words[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) words[k] = tile[tile_at(col, part * 4 + k)];
        *(uint4*)&q_t[(long long)col * n + r0 + part * 16] =
            make_uint4(words[0], words[1], words[2], words[3]);
    }
    SCALE_END;
}
