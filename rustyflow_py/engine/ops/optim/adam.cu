// Adam over the flat buffer (torch.optim.Adam): as adamw.cu, but the weight decay is an L2
// term of the gradient on the first `decay` elements.
template <typename T>
__device__ __forceinline__ void rf_adam_update(long long i, T g, float lr, int step,
                                               float scale, float c1, float c2, float lb1,
                                               float lb2, float eps, float wd,
                                               long long decay, T& p, T& m, T& v) {
    if (scale < 0) return;  // skipped (fp16 overflow: loss_scale.py)
    T gs = g * (T)scale;
    if (i < decay) gs += (T)wd * p;
    m = (T)(1 - c1) * m + (T)c1 * gs;
    v = (T)(1 - c2) * v + (T)c2 * gs * gs;
    T bc1 = -expm1((T)step * (T)lb1), bc2 = -expm1((T)step * (T)lb2);
    p -= (T)lr / bc1 * m / (sqrt(v) / sqrt(bc2) + (T)eps);
}
