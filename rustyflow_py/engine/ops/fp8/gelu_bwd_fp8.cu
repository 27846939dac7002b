// GELU's backward writing its result only as FP8 codes (e5m2: a gradient), at delayed
// scaling: dx = g * gelu'(x + b), rounded to `real` as gelu_vec.cu's gelu_bwd_sums rounds it,
// then cast at the site's scale (fp8.cuh) into both layouts the next GEMMs read, x's own
// (rows x cols) and its transpose (cols x rows), with the columns' sums of dx over each tile's
// rows (the bias gradient before the GELU, added up by the caller). It replaces gelu_bwd_sums
// and the transposing cast of its output: a 16-bit write and read of the whole array.
//
// A block of 256 threads takes a tile of TG x TG values, as fp8_cast.cu's fp8_quantize_t_vec:
// whole vectors read along the rows, their codes stored along the rows and into a shared tile
// transposed, which then goes out 16 codes an access along the transpose's rows. The threads
// of one vector column are lanes TG / RF_VEC apart in their warps: their column sums meet by
// shuffles, then across the warps in shared memory, in a fixed order. For rows and cols
// multiples of TG, arrays 16-byte aligned; a block a tile.
#include "types.cuh"
#include "vec.cuh"
#include "gelu.cuh"
#include "fp8.cuh"

#define TG 64
#define TG_PITCH (TG + 4)  // as fp8_cast.cu's TV_PITCH: rows of words on distinct banks
#define TG_THREADS 256

extern "C" __global__ void __launch_bounds__(TG_THREADS) gelu_bwd_codes(
        const rf_vec* __restrict__ g, const rf_vec* __restrict__ x, const real* __restrict__ b,
        SCALE_FROM, rf_codes* __restrict__ q_rows, unsigned char* __restrict__ q_t,
        float* __restrict__ scale_inv, acc* __restrict__ part, int rows, int cols) {
    __shared__ __align__(16) unsigned char tile[TG * TG_PITCH];  // [column][row]
    __shared__ acc sums[TG_THREADS / 32][TG];  // each warp's column sums
    SCALE_BEGIN;
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / scale;
    const int row_vecs = cols / RF_VEC, tile_vecs = TG / RF_VEC;
    const int col_tiles = cols / TG;
    const int c0 = blockIdx.x % col_tiles * TG, r0 = blockIdx.x / col_tiles * TG;
    const int cv = threadIdx.x % tile_vecs;  // the same vector column in every pass
    acc s[RF_VEC], bv[RF_VEC];
#pragma unroll
    for (int k = 0; k < RF_VEC; ++k) {
        s[k] = 0;
        bv[k] = b ? (acc)b[c0 + cv * RF_VEC + k] : (acc)0;
    }
    for (int v = threadIdx.x; v < TG * tile_vecs; v += TG_THREADS) {
        const int r = v / tile_vecs;
        const long long at = (long long)(r0 + r) * row_vecs + c0 / RF_VEC + cv;
        const rf_vec gv = g[at], xv = x[at];
        rf_codes codes;
#pragma unroll
        for (int k = 0; k < RF_VEC; ++k) {
            const real d = (real)((acc)gv.v[k] * rf_gelu_slope((acc)xv.v[k] + bv[k]));
            s[k] += (acc)d;
            SEEN(d);
            codes.b[k] = to_fp8(d, scale);
            tile[(cv * RF_VEC + k) * TG_PITCH + r] = codes.b[k];
        }
        q_rows[at] = codes;
    }
    // the warp's lanes of one vector column (lane % tile_vecs), then the warps'
#pragma unroll
    for (int k = 0; k < RF_VEC; ++k)
        for (int o = tile_vecs; o < 32; o <<= 1) s[k] += __shfl_xor_sync(0xffffffff, s[k], o);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane < tile_vecs) {
#pragma unroll
        for (int k = 0; k < RF_VEC; ++k) sums[warp][lane * RF_VEC + k] = s[k];
    }
    __syncthreads();
    for (int t = threadIdx.x; t < TG * (TG / 16); t += TG_THREADS) {
        const int oc = t / (TG / 16), chunk = t % (TG / 16);  // q_t's row, 16 codes of it
        const unsigned int* from = (const unsigned int*)&tile[oc * TG_PITCH + chunk * 16];
        *(uint4*)&q_t[(long long)(c0 + oc) * rows + r0 + chunk * 16] =
            make_uint4(from[0], from[1], from[2], from[3]);
    }
    if (threadIdx.x < TG) {
        acc total = 0;
        for (int w = 0; w < TG_THREADS / 32; ++w) total += sums[w][threadIdx.x];
        part[(long long)(r0 / TG) * cols + c0 + threadIdx.x] = total;
    }
    SCALE_END;
}
