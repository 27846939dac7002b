// Per-tensor FP8 scaling's device side (fp8/formats.py states the recipe), for the casts
// (fp8/fp8_cast.cu) and the kernels that write FP8 codes of what they produce. Compiled per
// storage type `real` (types.cuh) and per format: RF_E4M3 = 1 for e4m3, 0 for e5m2.
// RF_DELAYED = 1: delayed scaling (a replayed graph's casts, gemm/fp8.py's Fp8Gemms): instead
// of an amax the caller measured first, a kernel takes a `site` of its own and scales by the
// amax its tensor had in the previous replay, while taking this replay's amax on the way.
#include "types.cuh"
#include "vec.cuh"
#include <cuda_fp8.h>

#if RF_E4M3
#define FP8_MAX 448.0f
#define FP8_KIND __NV_E4M3
#else
#define FP8_MAX 57344.0f
#define FP8_KIND __NV_E5M2
#endif

// The larger of two magnitudes, a NaN winning (fmaxf, and so warp_reduce.cuh's warp_max,
// would drop it).
__device__ __forceinline__ float max_nan(float m, float v) {
    return (v > m || isnan(v)) ? v : m;
}

__device__ __forceinline__ float warp_max_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

__device__ __forceinline__ float abs_max(float m, real x) {
    return max_nan(m, fabsf((float)x));
}

// The block's maximum of each thread's m, into amax (blocks of up to 1024 threads, 1-D or 2-D).
__device__ __forceinline__ void block_amax(float m, float* amax) {
    __shared__ float part[32];
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    const int warps = (blockDim.x * blockDim.y) >> 5;
    m = warp_max_f(m);
    if ((tid & 31) == 0) part[tid >> 5] = m;
    __syncthreads();
    if (tid < 32) {
        m = tid < warps ? part[tid] : 0.0f;
        m = warp_max_f(m);
        if (tid == 0) atomicMax((int*)amax, __float_as_int(m));
    }
}

// MAX / amax, at most 2^126 (a tiny amax would make it infinite, and the codes of zeros NaN;
// 2^126 keeps 1 / scale a normal float, which a flush to zero would not turn into 0); 1 when
// amax is 0 or not finite.
__device__ __forceinline__ float scale_of(const float* amax) {
    float a = *amax;
    return (isfinite(a) && a > 0.0f) ? fminf(FP8_MAX / a, 0x1p126f) : 1.0f;
}

__device__ __forceinline__ unsigned char to_fp8(real x, float scale) {
    return __nv_cvt_float_to_fp8((float)x * scale, __NV_SATFINITE, FP8_KIND);
}

// A delayed-scaling site: its cast's amax in three replays, by turns. Replay r of a captured
// graph (`replay`, the count that graph's first kernel adds 1 to) reads slot (r - 1) % 3, the
// last replay's, takes its own amax into slot r % 3, and its first block clears slot
// (r + 1) % 3 for the next: no block waits for another or counts itself done. All zero at
// first (the scale is then 1); Fp8Gemms seeds slot 0, which the first replay reads, with the
// amax the warm-up step measured at the same cast.
struct rf_site {
    float amax[3];
    float unused;  // 16 bytes a row
};

// A kernel's scale: from the amax the caller measured (current scaling) or from its site
// (delayed: the last replay's, this one's taken in `seen` and added in at the end). `seen`
// takes fmaxf, one instruction a value, not max_nan's three: it drops a NaN, whose code is NaN
// whatever the scale (an infinity still counts, and the next scale falls back to 1). Every
// thread of every block must reach SCALE_END (it synchronises the block).
#if RF_DELAYED
#define SCALE_FROM rf_site* __restrict__ site, const unsigned int* __restrict__ replay
#define SCALE_BEGIN                                                                     \
    const unsigned int turn = *replay % 3;                                              \
    const float scale = scale_of(&site->amax[(turn + 2) % 3]);                          \
    float seen = 0.0f;                                                                  \
    if ((blockIdx.x | blockIdx.y | threadIdx.x | threadIdx.y) == 0)                     \
    site->amax[(turn + 1) % 3] = 0.0f
#define SEEN(v) seen = fmaxf(seen, fabsf((float)(v)))
#define SCALE_END block_amax(seen, &site->amax[turn])
#else
#define SCALE_FROM const float* __restrict__ amax
#define SCALE_BEGIN const float scale = scale_of(amax); float seen = 0.0f
#define SEEN(v)
#define SCALE_END
#endif

// The codes of a vector (vec.cuh), stored as one access (aligned to RF_VEC bytes).
struct __align__(RF_VEC) rf_codes {
    unsigned char b[RF_VEC];
};

// A vector's codes at `scale`, its values taken into `seen` (delayed scaling): two values a
// conversion (the paired instruction of FP8 tensor-core GPUs; the same rounding as one at a
// time, half the instructions).
__device__ __forceinline__ rf_codes codes_of(const rf_vec& v, float scale, float& seen) {
    rf_codes c;
#pragma unroll
    for (int j = 0; j < RF_VEC; j += 2) {
        SEEN(v.v[j]);
        SEEN(v.v[j + 1]);
        const __nv_fp8x2_storage_t two = __nv_cvt_float2_to_fp8x2(
            make_float2((float)v.v[j] * scale, (float)v.v[j + 1] * scale), __NV_SATFINITE,
            FP8_KIND);
        c.b[j] = (unsigned char)(two & 0xff);
        c.b[j + 1] = (unsigned char)(two >> 8);
    }
    return c;
}

// ---- A transposed tile of codes ------------------------------------------------------------
// The kernels that write codes in both layouts take x (rows x cols) in tiles of TQ_ROWS x
// TQ_COLS values, a block of TQ_THREADS threads a tile. A thread reads one vector column of
// four consecutive rows (a "quad"), so that it holds, for each of the vector's columns, four
// codes of the transpose's row side by side: one 32-bit word into shared memory, not four
// byte stores. The tile keeps x's columns as rows of TQ_WORDS words (an odd number, so that a
// warp's eight quads of four vector columns land on 32 distinct banks for 16-bit x), then
// goes out 16 codes an access along the transpose's rows.
#define TQ_ROWS 128
#define TQ_COLS 64
#define TQ_THREADS 256
#define TQ_WORDS (TQ_ROWS / 4 + 1)
#define TQ_VECS (TQ_COLS / RF_VEC)          // vector columns of a tile
#define TQ_PAIRS ((TQ_ROWS / 4) * TQ_VECS)  // (quad, vector column) pairs of a tile

// Pair p's quad and vector column: a warp's lanes take eight quads (p's low three bits) of
// four neighbouring vector columns, so that its loads read 64 bytes of each of eight rows.
__device__ __forceinline__ void tq_pair(int p, int& quad, int& cv) {
    quad = (p & 7) | ((p >> 3) / TQ_VECS) << 3;
    cv = (p >> 3) % TQ_VECS;
}

// Code k of four rows' vectors (c[i]: row i) as one word of the transpose's row, row 0 in
// its lowest byte: what the tiles of codes here and in layernorm_fp8.cu hold.
__device__ __forceinline__ unsigned int quad_word(const rf_codes* c, int k) {
    return c[0].b[k] | c[1].b[k] << 8 | c[2].b[k] << 16 | (unsigned int)c[3].b[k] << 24;
}

// The codes of a quad's four vectors (c[i]: row 4 * quad + i of the tile) into the tile.
__device__ __forceinline__ void tq_put(unsigned int* tile, int quad, int cv, const rf_codes* c) {
#pragma unroll
    for (int j = 0; j < RF_VEC; j++) tile[(cv * RF_VEC + j) * TQ_WORDS + quad] = quad_word(c, j);
}

// The tile at (r0, c0) of x out as codes of x^T (cols x rows): rows a multiple of 16, q
// 16-byte aligned. The block must have synchronised since the last tq_put.
__device__ __forceinline__ void tq_out(const unsigned int* tile, unsigned char* q, int rows,
                                       int cols, int r0, int c0) {
    for (int t = threadIdx.x; t < TQ_COLS * (TQ_ROWS / 16); t += blockDim.x) {
        const int oc = t / (TQ_ROWS / 16), part = t % (TQ_ROWS / 16);  // q's row, 16 codes
        const int c = c0 + oc, r = r0 + part * 16;
        if (c < cols && r < rows) {
            const unsigned int* w = tile + oc * TQ_WORDS + part * 4;
            *(uint4*)&q[(long long)c * rows + r] = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}
