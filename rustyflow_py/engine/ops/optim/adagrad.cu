// AdaGrad over the flat buffer (torch.optim.Adagrad, no lr decay).
template <typename T>
__device__ __forceinline__ void rf_adagrad_update(long long i, T g, float lr, float scale,
                                                  float eps, float wd, long long decay,
                                                  T& p, T& ssum) {
    if (scale < 0) return;  // skipped (fp16 overflow: loss_scale.py)
    T gs = g * (T)scale;
    if (i < decay) gs += (T)wd * p;
    ssum += gs * gs;
    p -= (T)lr * (gs / (sqrt(ssum) + (T)eps));
}
