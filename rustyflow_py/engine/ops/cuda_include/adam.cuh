// Adam and AdamW over the flat buffer, one element per call (optim/cuda.py's ElementwiseKernels):
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


// ---- bf16 moments (ADAM_STATE_DTYPE=bf16), held as their 16 bits -------------------------
// Widened exactly, updated in float as above, then rounded back stochastically: 16 random
// bits added below bf16's last mantissa bit before the cut, so that the rounding is unbiased.
// Round-to-nearest would lose every increment under half a bf16 step: with beta2 = 0.999,
// (1 - beta2) g^2 is under it once v is a quarter of g^2, and v would stop following g^2.
// The bits are a hash of the element's index and the step (model/optim.py's reference does
// the same), so a run is reproducible and no generator state exists.
__device__ __forceinline__ unsigned int rf_mix(unsigned int x) {  // a 32-bit integer hash
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

__device__ __forceinline__ float rf_bf16_widen(unsigned short bits) {
    return __uint_as_float((unsigned int)bits << 16);
}

// f rounded to bf16 by `noise` (its low 16 bits); NaN stays a NaN (a cut could make it inf).
__device__ __forceinline__ unsigned short rf_bf16_round(float f, unsigned int noise) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (unsigned short)((u + (noise & 0xffffu)) >> 16);
}

template <bool L2>
__device__ __forceinline__ void rf_adam_update(long long i, float g, float lr, int step,
                                               float scale, float c1, float c2, float lb1,
                                               float lb2, float eps, float wd,
                                               long long decay, float& p, unsigned short& m,
                                               unsigned short& v) {
    float mf = rf_bf16_widen(m), vf = rf_bf16_widen(v);
    rf_adam_update<L2, float>(i, g, lr, step, scale, c1, c2, lb1, lb2, eps, wd, decay, p, mf,
                              vf);
    const unsigned int noise = rf_mix((unsigned int)i ^ rf_mix((unsigned int)step));
    m = rf_bf16_round(mf, noise);  // a skipped step leaves mf and vf widened: the same bits
    v = rf_bf16_round(vf, noise >> 16);
}
