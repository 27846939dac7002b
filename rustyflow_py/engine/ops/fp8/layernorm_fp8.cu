// LayerNorm writing FP8 codes of what it produces as well, at delayed scaling (fp8.cuh), for
// the Linear next to it: forward, y (e4m3) for the Linear after it, as layernorm_rows.cu's
// ln_fwd_rows writes y, bit for bit; backward, dx with the residual stream's gradient joined
// (e5m2: a gradient) for the Linear or MLP before it, whose output x was, as ln_bwd_rows
// writes dx, bit for bit. Each writes the codes in both layouts that Linear's GEMMs read,
// rows x c and its transpose c x rows, and takes the tensor's amax for the next replay. It
// replaces the transposing cast of y or dx: a read of it and a launch.
//
// A warp takes four consecutive rows (a quad), each lane the same VPL vectors of each
// (16-byte vectors, lane l the row's vectors l, l + 32, ...), so that for each column it holds
// four codes of the transpose's row side by side: one 32-bit word into shared memory. A block
// of LQ_WARPS warps takes LQ_ROWS rows; its tile keeps the columns as rows of LQ_WORDS words,
// the quad's slot rotated by the column's group of 32 (tile_at), so that a warp's stores land
// on 32 distinct banks; the tile then goes out 16 codes an access along the transpose's rows.
// For 16-bit rows of whole vectors (a lane VPL of them, the last ones where the row has them,
// as ln_fwd_rows), rows a multiple of LQ_ROWS, arrays 16-byte aligned; c * LQ_WORDS words of
// shared memory (dynamic).
#include "layernorm.cuh"
#include "vec.cuh"
#include "fp8.cuh"

// Whether this lane has vector j of a row: LQ_PARTIAL = 1 (a -D option) for rows of fewer
// than 32 * VPL vectors, where the last ones are missing from some lanes; 0 compiles the
// checks away (a lane's whole number of vectors, GPT-2's 768: the checks cost the backward
// 18 us a call there).
#if LQ_PARTIAL
#define LANE_HAS(j) (lane + 32 * (j) < vc)
#else
#define LANE_HAS(j) true
#endif

#define LQ_WARPS 8
#define LQ_ROWS (4 * LQ_WARPS)
#define LQ_WORDS (LQ_WARPS + 1)

// The word of column `col`, quad `quad` in the tile.
__device__ __forceinline__ int tile_at(int col, int quad) {
    return col * LQ_WORDS + ((quad + (col >> 5)) & (LQ_WARPS - 1));
}

// The codes of one vector column of a quad (c[i]: row i) into the tile, at columns col ..
// col + RF_VEC.
__device__ __forceinline__ void tile_put(unsigned int* tile, const rf_codes (&c)[4], int col,
                                         int quad) {
#pragma unroll
    for (int k = 0; k < RF_VEC; ++k) tile[tile_at(col + k, quad)] = quad_word(c, k);
}

// The block's tile out as q_t's columns r0 .. r0 + LQ_ROWS (q_t: c x n), 16 codes an access.
__device__ __forceinline__ void tile_out(const unsigned int* tile, unsigned char* q_t, int n,
                                         int c, int r0) {
    for (int t = threadIdx.x; t < c * (LQ_ROWS / 16); t += blockDim.x) {
        const int col = t / (LQ_ROWS / 16), part = t % (LQ_ROWS / 16);
        unsigned int words[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) words[k] = tile[tile_at(col, part * 4 + k)];
        *(uint4*)&q_t[(long long)col * n + r0 + part * 16] =
            make_uint4(words[0], words[1], words[2], words[3]);
    }
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
            if (!LANE_HAS(j)) continue;  // a row of fewer than 32 * VPL vectors
            xv[i][j] = x[(long long)(row + i) * vc + lane + 32 * j];
#pragma unroll
            for (int k = 0; k < RF_VEC; ++k) s[i] += (acc)xv[i][j].v[k];
        }
    acc m[4], r[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        m[i] = ln_mean(s[i], c);
        acc v = 0;
#pragma unroll
        for (int j = 0; j < VPL; ++j)
#pragma unroll
            for (int k = 0; k < RF_VEC; ++k) {
                if (!LANE_HAS(j)) continue;
                const acc d = (acc)xv[i][j].v[k] - m[i];
                v += d * d;
            }
        r[i] = ln_rstd(v, c, eps);
    }
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        const int at = lane + 32 * j;  // the vector's index in a row
        if (!LANE_HAS(j)) continue;
        const rf_vec wv = w[at], bv = b[at];
        rf_codes codes[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            rf_vec o;
#pragma unroll
            for (int k = 0; k < RF_VEC; ++k)
                o.v[k] = (real)ln_y((acc)xv[i][j].v[k], m[i], r[i], (acc)wv.v[k],
                                    (acc)bv.v[k]);
            const long long off = (long long)(row + i) * vc + at;
            y[off] = o;
            codes[i] = codes_of(o, scale, seen);
            q_rows[off] = codes[i];
        }
        tile_put(tile, codes, at * RF_VEC, quad);
    }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            mean[row + i] = m[i];
            rstd[row + i] = r[i];
        }
    }
    __syncthreads();
    tile_out(tile, q_t, n, c, r0);
    SCALE_END;
}

// Backward: dx = rstd * (g * w - mean(g * w) - xhat * mean(g * w * xhat)) + res (res null:
// none) and its codes, each row as ln_bwd_rows takes it; the block's column sums of g * xhat
// and g (dw's and db's partial sums) as its row of pdw and pdb, summed in a fixed order
// across its warps (through the tile's memory once the codes are out).
extern "C" __global__ void __launch_bounds__(32 * LQ_WARPS) ln_bwd_codes(
        const rf_vec* __restrict__ g, const rf_vec* __restrict__ x,
        const rf_vec* __restrict__ w, const acc* __restrict__ mean,
        const acc* __restrict__ rstd, const rf_vec* __restrict__ res, rf_vec* __restrict__ dx,
        acc* __restrict__ pdw, acc* __restrict__ pdb, SCALE_FROM,
        rf_codes* __restrict__ q_rows, unsigned char* __restrict__ q_t,
        float* __restrict__ scale_inv, int n, int c) {
    extern __shared__ unsigned int tile[];  // c * LQ_WORDS: the codes, then the warps' sums
    SCALE_BEGIN;
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / scale;
    const int lane = threadIdx.x % 32, quad = threadIdx.x / 32, vc = c / RF_VEC;
    const int r0 = blockIdx.x * LQ_ROWS;
    rf_vec wv[VPL];
    acc dw[VPL][RF_VEC], db[VPL][RF_VEC];
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        if (LANE_HAS(j)) wv[j] = w[lane + 32 * j];
#pragma unroll
        for (int k = 0; k < RF_VEC; ++k) dw[j][k] = db[j][k] = 0;
    }
    rf_codes codes[4][VPL];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = r0 + quad * 4 + i;
        const long long off = (long long)row * vc;
        const acc m = mean[row], r = rstd[row];
        rf_vec ga[VPL], xa[VPL];
#pragma unroll
        for (int j = 0; j < VPL; ++j) {
            if (!LANE_HAS(j)) continue;
            ga[j] = g[off + lane + 32 * j];
            xa[j] = x[off + lane + 32 * j];
        }
        acc s1 = 0, s2 = 0;
#pragma unroll
        for (int j = 0; j < VPL; ++j)
#pragma unroll
            for (int k = 0; k < RF_VEC; ++k) {
                if (!LANE_HAS(j)) continue;
                const acc gv = (acc)ga[j].v[k], xh = ln_xhat((acc)xa[j].v[k], m, r);
                ln_row_sums(gv, xh, (acc)wv[j].v[k], s1, s2);
                ln_col_sums(gv, xh, dw[j][k], db[j][k]);
            }
        s1 = ln_mean(s1, c);
        s2 = ln_mean(s2, c);
#pragma unroll
        for (int j = 0; j < VPL; ++j) {
            if (!LANE_HAS(j)) continue;
            const long long at = off + lane + 32 * j;
            rf_vec o;
            if (res) o = res[at];
#pragma unroll
            for (int k = 0; k < RF_VEC; ++k) {
                const acc joined = res ? (acc)o.v[k] : (acc)0;
                o.v[k] = (real)ln_dx((acc)ga[j].v[k], ln_xhat((acc)xa[j].v[k], m, r),
                                     (acc)wv[j].v[k], s1, s2, r, joined);
            }
            dx[at] = o;
            codes[i][j] = codes_of(o, scale, seen);
            q_rows[at] = codes[i][j];
        }
    }
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        if (!LANE_HAS(j)) continue;
        const rf_codes four[4] = {codes[0][j], codes[1][j], codes[2][j], codes[3][j]};
        tile_put(tile, four, (lane + 32 * j) * RF_VEC, quad);
    }
    __syncthreads();
    tile_out(tile, q_t, n, c, r0);
    acc* sums = (acc*)tile;  // LQ_WARPS rows of c: within the tile's c * LQ_WORDS words
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
        __syncthreads();  // the tile is out (the sums of the pass before are read)
#pragma unroll
        for (int j = 0; j < VPL; ++j)
#pragma unroll
            for (int k = 0; k < RF_VEC; ++k)
                if (LANE_HAS(j))
                    sums[quad * c + (lane + 32 * j) * RF_VEC + k] = pass ? db[j][k] : dw[j][k];
        __syncthreads();
        acc* part = pass ? pdb : pdw;
        for (int col = threadIdx.x; col < c; col += blockDim.x) {
            acc total = 0;
            for (int q = 0; q < LQ_WARPS; ++q) total += sums[q * c + col];
            part[(long long)blockIdx.x * c + col] = total;
        }
    }
    SCALE_END;
}
