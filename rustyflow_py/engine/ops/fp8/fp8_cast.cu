// Per-tensor FP8 scaling (formats.py states the recipe): the absolute maximum of a tensor,
// then its values times MAX / amax rounded to the nearest FP8 value, saturated. Compiled per
// storage type `real` (types.cuh) and per format: RF_E4M3 = 1 for e4m3, 0 for e5m2. Each
// kernel has a form over 16-byte vectors (vec.cuh: the tensor a whole number of them,
// aligned) and one a value at a time for the rest.
//
// RF_DELAYED = 1 compiles the casts for delayed scaling; fp8.cuh holds the scale, the codes
// and the delayed-scaling sites, shared with the kernels that write FP8 of what they produce.
#include "fp8.cuh"

// amax (one float, zeroed by the caller) = max |x| over n values. Non-negative floats order
// as their bit patterns do, so the blocks meet in an integer atomicMax. A NaN wins (its bits
// are above every finite value's): the scale then falls back to 1 and the NaN is kept.
extern "C" __global__ void fp8_amax(const real* __restrict__ x, long long n,
                                    float* __restrict__ amax) {
    float m = 0.0f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        m = abs_max(m, x[i]);
    block_amax(m, amax);
}

extern "C" __global__ void fp8_amax_vec(const rf_vec* __restrict__ x, long long vecs,
                                        float* __restrict__ amax) {
    float m = 0.0f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < vecs;
         i += (long long)gridDim.x * blockDim.x) {
        rf_vec v = x[i];
#pragma unroll
        for (int j = 0; j < RF_VEC; j++) m = abs_max(m, v.v[j]);
    }
    block_amax(m, amax);
}

// q = fp8(x * scale), the scale computed by every thread from the device's amax (scale_of:
// no host round trip); scale_inv = 1 / scale, the factor a GEMM reads q back with.
extern "C" __global__ void fp8_quantize(const real* __restrict__ x, long long n,
                                        SCALE_FROM, unsigned char* __restrict__ q,
                                        float* __restrict__ scale_inv) {
    SCALE_BEGIN;
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / scale;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        SEEN(x[i]);
        q[i] = to_fp8(x[i], scale);
    }
    SCALE_END;
}

extern "C" __global__ void fp8_quantize_vec(const rf_vec* __restrict__ x, long long vecs,
                                            SCALE_FROM, rf_codes* __restrict__ q,
                                            float* __restrict__ scale_inv) {
    SCALE_BEGIN;
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / scale;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < vecs;
         i += (long long)gridDim.x * blockDim.x)
        q[i] = codes_of(x[i], scale, seen);
    SCALE_END;
}

// q (cols x rows) = fp8(x^T * scale) for x (rows x cols) row-major: the codes of the transpose,
// which an FP8 GEMM needs where the reduced axis is x's rows (a weight gradient). Tiles of
// TILE x TILE go through shared memory, so that the reads of x and the writes of q both run
// along a row; a block is (TILE, TILE_ROWS) threads. Where q_rows is not null, the codes go
// there in x's own layout (rows x cols) as well: a gradient that a layer reads both ways
// (its input gradient's GEMM and its weight gradient's) is read and scaled once.
#define TILE 32
#define TILE_ROWS 8
extern "C" __global__ void fp8_quantize_t(const real* __restrict__ x, int rows, int cols,
                                          SCALE_FROM, unsigned char* __restrict__ q,
                                          float* __restrict__ scale_inv,
                                          unsigned char* __restrict__ q_rows) {
    __shared__ unsigned char tile[TILE][TILE + 4];  // + 4: rows land on distinct banks
    SCALE_BEGIN;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0)
        *scale_inv = 1.0f / scale;
    int c0 = blockIdx.x * TILE, r0 = blockIdx.y * TILE;
    for (int i = threadIdx.y; i < TILE; i += TILE_ROWS) {
        int r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols) {
            real value = x[(long long)r * cols + c];
            SEEN(value);
            unsigned char code = to_fp8(value, scale);
            tile[i][threadIdx.x] = code;
            if (q_rows) q_rows[(long long)r * cols + c] = code;
        }
    }
    __syncthreads();
    for (int i = threadIdx.y; i < TILE; i += TILE_ROWS) {
        int c = c0 + i, r = r0 + threadIdx.x;
        if (r < rows && c < cols) q[(long long)c * rows + r] = tile[threadIdx.x][i];
    }
    SCALE_END;
}

// fp8_quantize_t over 16-byte vectors, for rows % 16 == 0 and cols a whole number of vectors,
// both arrays 16-byte aligned: a block of TQ_THREADS threads a tile of TQ_ROWS x TQ_COLS
// values (fp8.cuh's transposed tile: each thread reads a vector of four rows, 64 bytes in
// flight, and stores a word of four codes a column), its codes written 16 at a time along q's
// rows. (A tile of 64 x 64 whose threads stored each code by itself moved about 2.5 TB/s on
// an H200: benchmarks/results/fp8-h200.md.) q_rows as fp8_quantize_t's, a vector's codes
// stored as one access.
extern "C" __global__ void __launch_bounds__(TQ_THREADS) fp8_quantize_t_vec(
        const rf_vec* __restrict__ x, int rows, int cols, SCALE_FROM,
        unsigned char* __restrict__ q, float* __restrict__ scale_inv,
        rf_codes* __restrict__ q_rows) {
    __shared__ unsigned int tile[TQ_COLS * TQ_WORDS];
    SCALE_BEGIN;
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / scale;
    const int row_vecs = cols / RF_VEC, col_tiles = (cols + TQ_COLS - 1) / TQ_COLS;
    const int c0 = blockIdx.x % col_tiles * TQ_COLS, r0 = blockIdx.x / col_tiles * TQ_ROWS;
    for (int p = threadIdx.x; p < TQ_PAIRS; p += TQ_THREADS) {
        int quad, cv;
        tq_pair(p, quad, cv);
        const int r = r0 + quad * 4, c = c0 + cv * RF_VEC;
        if (r < rows && c < cols) {  // rows % 16 == 0: the quad's four rows are all there
            const long long at = (long long)r * row_vecs + c / RF_VEC;
            rf_vec v[4];
#pragma unroll
            for (int i = 0; i < 4; i++) v[i] = x[at + (long long)i * row_vecs];
            rf_codes codes[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                codes[i] = codes_of(v[i], scale, seen);
                if (q_rows) q_rows[at + (long long)i * row_vecs] = codes[i];
            }
            tq_put(tile, quad, cv, codes);
        }
    }
    __syncthreads();
    tq_out(tile, q, rows, cols, r0, c0);
    SCALE_END;
}

// q_t (cols x rows) = q^T for FP8 codes q (rows x cols) made elsewhere (the cross-entropy's
// gradient, xent.cu): tiles of TV x TV codes, each thread reading 16 codes of a row of q and
// writing 16 of a row of q_t, through a tile in shared memory of TV_PITCH bytes a row (rows
// of 4-byte words on distinct banks for the scattered byte stores). For rows and cols
// multiples of 16, both arrays 16-byte aligned.
#define TV 64
#define TV_PITCH (TV + 4)
extern "C" __global__ void fp8_transpose_codes(const uint4* __restrict__ q, int rows, int cols,
                                               unsigned char* __restrict__ q_t) {
    __shared__ __align__(16) unsigned char tile[TV * TV_PITCH];  // [q's column][q's row]
    const int c0 = blockIdx.x * TV, r0 = blockIdx.y * TV;
    const int row_vecs = cols / 16;
    for (int v = threadIdx.x; v < TV * (TV / 16); v += blockDim.x) {
        int r = v / (TV / 16), cv = v % (TV / 16);
        int c = c0 + cv * 16;
        if (r0 + r < rows && c < cols) {
            uint4 in = q[(long long)(r0 + r) * row_vecs + c / 16];
            const unsigned char* codes = (const unsigned char*)&in;
#pragma unroll
            for (int j = 0; j < 16; j++) tile[(cv * 16 + j) * TV_PITCH + r] = codes[j];
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < TV * (TV / 16); t += blockDim.x) {
        int oc = t / (TV / 16), part = t % (TV / 16);  // q_t's row (q's column), 16-code chunk
        int c = c0 + oc, r = r0 + part * 16;
        if (c < cols && r < rows) {
            const unsigned int* from = (const unsigned int*)&tile[oc * TV_PITCH + part * 16];
            *(uint4*)&q_t[(long long)c * rows + r] = make_uint4(from[0], from[1], from[2], from[3]);
        }
    }
}
