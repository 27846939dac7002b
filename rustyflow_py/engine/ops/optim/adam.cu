// Adam and AdamW over the flat buffer, one element per call (adam.py's ElementwiseKernels):
// rf_adam_update<true> is Adam (torch.optim.Adam: the weight decay is an L2 term of the
// gradient), rf_adam_update<false> AdamW (decoupled decay of the parameter first); both
// decay only the first `decay` elements. c = 1 - beta and lb = log(beta) come from double
// precision: float32's 1 - beta and 1 - beta**t lose digits for beta near 1 (0.999). A
// negative scale skips the step (fp16 overflow: model/loss_scale.py).
template <bool L2, typename T>
__device__ __forceinline__ void rf_adam_update(long long i, T g, float lr, int step,
                                               float scale, float c1, float c2, float lb1,
                                               float lb2, float eps, float wd,
                                               long long decay, T& p, T& m, T& v) {
    if (scale < 0) return;
    T gs = g * (T)scale;
    if (i < decay) {
        if (L2) gs += (T)wd * p;
        else p *= (T)(1 - lr * wd);
    }
    m = (T)(1 - c1) * m + (T)c1 * gs;
    v = (T)(1 - c2) * v + (T)c2 * gs * gs;
    T bc1 = -expm1((T)step * (T)lb1), bc2 = -expm1((T)step * (T)lb2);
    p -= (T)lr / bc1 * m / (sqrt(v) / sqrt(bc2) + (T)eps);
}

// The same update over float32 buffers of whole 16-byte vectors (adam.py checks them): four
// elements a thread, loaded and stored as one access each; the scalars read from device
// memory once a thread.
template <bool L2>
__device__ __forceinline__ void rf_adam_vec_update(const float4* __restrict__ g,
                                            const float* __restrict__ lr,
                                            const int* __restrict__ step,
                                            const float* __restrict__ scale, float c1, float c2,
                                            float lb1, float lb2, float eps, float wd,
                                            long long decay, float4* __restrict__ p,
                                            float4* __restrict__ m, float4* __restrict__ v,
                                            long long vecs) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= vecs) return;
    float a = *lr, s = *scale;
    int t = *step;
    float4 gv = g[i], pv = p[i], mv = m[i], vv = v[i];
    long long e = 4 * i;
    rf_adam_update<L2, float>(e, gv.x, a, t, s, c1, c2, lb1, lb2, eps, wd, decay, pv.x, mv.x,
                              vv.x);
    rf_adam_update<L2, float>(e + 1, gv.y, a, t, s, c1, c2, lb1, lb2, eps, wd, decay, pv.y, mv.y,
                              vv.y);
    rf_adam_update<L2, float>(e + 2, gv.z, a, t, s, c1, c2, lb1, lb2, eps, wd, decay, pv.z, mv.z,
                              vv.z);
    rf_adam_update<L2, float>(e + 3, gv.w, a, t, s, c1, c2, lb1, lb2, eps, wd, decay, pv.w, mv.w,
                              vv.w);
    p[i] = pv;
    m[i] = mv;
    v[i] = vv;
}

#define RF_ADAM_VEC_ARGS                                                                       \
    const float4 *g, const float *lr, const int *step, const float *scale, float c1, float c2,  \
        float lb1, float lb2, float eps, float wd, long long decay, float4 *p, float4 *m,       \
        float4 *v, long long vecs
extern "C" __global__ void rf_adamw_vec(RF_ADAM_VEC_ARGS) {
    rf_adam_vec_update<false>(g, lr, step, scale, c1, c2, lb1, lb2, eps, wd, decay, p, m, v, vecs);
}
extern "C" __global__ void rf_adam_vec(RF_ADAM_VEC_ARGS) {
    rf_adam_vec_update<true>(g, lr, step, scale, c1, c2, lb1, lb2, eps, wd, decay, p, m, v, vecs);
}
