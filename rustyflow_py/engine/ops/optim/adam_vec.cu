// Adam and AdamW (adam.cuh's update) over float32 buffers of whole 16-byte vectors (cuda.py
// checks them): four elements a thread, loaded and stored as one access each, the scalars
// read from device memory once a thread. With `copy` (null: none) the updated parameters
// are also written there in the storage type `real`: mixed precision's 16-bit compute copy,
// refreshed in this pass instead of one of its own.
// The gradient is float32, or bf16 where compiled with -DRF_GRAD=__nv_bfloat16 (and RF_BF16
// for its header): a data-parallel run's summed bf16 copy, read where NCCL left it.
// The moments are float32, or bf16 held as their bits where compiled with -DRF_STATE_BF16=1
// (ADAM_STATE_DTYPE=bf16: adam.cuh rounds them stochastically).
#include "types.cuh"
#include "adam.cuh"
#ifndef RF_GRAD
#define RF_GRAD float
#endif
#if RF_STATE_BF16
typedef unsigned short rf_state;
#else
typedef float rf_state;
#endif

struct __align__(4 * sizeof(rf_state)) rf_state4 {  // four moments, one access
    rf_state v[4];
};

// The gradient's four values of vector i, as float (bf16 widens exactly).
__device__ __forceinline__ float4 rf_grad4(const float* __restrict__ g, long long i) {
    return reinterpret_cast<const float4*>(g)[i];
}
#if RF_BF16
__device__ __forceinline__ float4 rf_grad4(const __nv_bfloat16* __restrict__ g, long long i) {
    uint2 raw = reinterpret_cast<const uint2*>(g)[i];  // four bf16, one 8-byte load
    float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}
#endif

template <bool L2>
__device__ __forceinline__ void rf_adam_vec_update(const RF_GRAD* __restrict__ g,
                                            const float* __restrict__ lr,
                                            const int* __restrict__ step,
                                            const float* __restrict__ scale, float c1, float c2,
                                            float lb1, float lb2, float eps, float wd,
                                            long long decay, float4* __restrict__ p,
                                            rf_state4* __restrict__ m, rf_state4* __restrict__ v,
                                            real* __restrict__ copy, long long vecs) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= vecs) return;
    float a = *lr, s = *scale;
    int t = *step;
    float4 gv = rf_grad4(g, i), pv = p[i];
    rf_state4 mv = m[i], vv = v[i];
    float gs[4] = {gv.x, gv.y, gv.z, gv.w}, ps[4] = {pv.x, pv.y, pv.z, pv.w};
    long long e = 4 * i;
#pragma unroll
    for (int k = 0; k < 4; ++k)
        rf_adam_update<L2>(e + k, gs[k], a, t, s, c1, c2, lb1, lb2, eps, wd, decay, ps[k],
                           mv.v[k], vv.v[k]);
    p[i] = make_float4(ps[0], ps[1], ps[2], ps[3]);
    m[i] = mv;
    v[i] = vv;
    if (copy) {
#pragma unroll
        for (int k = 0; k < 4; ++k) copy[e + k] = (real)ps[k];
    }
}

#define RF_ADAM_VEC_ARGS                                                                       \
    const RF_GRAD *g, const float *lr, const int *step, const float *scale, float c1, float c2,  \
        float lb1, float lb2, float eps, float wd, long long decay, float4 *p, rf_state4 *m,    \
        rf_state4 *v, real *copy, long long vecs
extern "C" __global__ void rf_adamw_vec(RF_ADAM_VEC_ARGS) {
    rf_adam_vec_update<false>(g, lr, step, scale, c1, c2, lb1, lb2, eps, wd, decay, p, m, v, copy,
                              vecs);
}
extern "C" __global__ void rf_adam_vec(RF_ADAM_VEC_ARGS) {
    rf_adam_vec_update<true>(g, lr, step, scale, c1, c2, lb1, lb2, eps, wd, decay, p, m, v, copy,
                             vecs);
}
