// AdaDelta over the flat buffer (torch.optim.Adadelta); crho = 1 - rho from double.
template <typename T>
__device__ __forceinline__ void rf_adadelta_update(long long i, T g, float lr, float scale,
                                                   float rho, float crho, float eps, float wd,
                                                   long long decay, T& p, T& sq, T& dacc) {
    if (scale < 0) return;  // skipped (fp16 overflow: loss_scale.py)
    T gs = g * (T)scale;
    if (i < decay) gs += (T)wd * p;
    sq = (T)rho * sq + (T)crho * (gs * gs);
    T delta = sqrt(dacc + (T)eps) / sqrt(sq + (T)eps) * gs;
    dacc = (T)rho * dacc + (T)crho * (delta * delta);
    p -= (T)lr * delta;
}
