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

// A vector's codes at `scale`, its values taken into `seen` (delayed scaling).
__device__ __forceinline__ rf_codes codes_of(const rf_vec& v, float scale, float& seen) {
    rf_codes c;
#pragma unroll
    for (int j = 0; j < RF_VEC; j++) {
        SEEN(v.v[j]);
        c.b[j] = to_fp8(v.v[j], scale);
    }
    return c;
}
