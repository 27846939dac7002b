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

