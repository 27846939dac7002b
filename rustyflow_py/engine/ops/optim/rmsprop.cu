// RMSprop over the flat buffer (torch.optim.RMSprop), one function per variant: the centered
// average (ga) and the momentum buffer (buf) are state only when in use. calpha = 1 - alpha
// comes from double precision.
template <typename T>
__device__ __forceinline__ bool rf_rmsprop_grad(long long i, T g, float scale, float wd,
                                                long long decay, T p, T& gs) {
    if (scale < 0) return false;  // skipped (fp16 overflow: loss_scale.py)
    gs = g * (T)scale;
    if (i < decay) gs += (T)wd * p;
    return true;
}

template <typename T>
__device__ __forceinline__ void rf_rmsprop_plain(long long i, T g, float lr, float scale,
                                                 float alpha, float calpha, float eps,
                                                 float mu, float wd, long long decay, T& p,
                                                 T& sq) {
    T gs;
    if (!rf_rmsprop_grad(i, g, scale, wd, decay, p, gs)) return;
    sq = (T)alpha * sq + (T)calpha * (gs * gs);
    T avg = sqrt(sq) + (T)eps;
    p -= (T)lr * (gs / avg);
}

template <typename T>
__device__ __forceinline__ void rf_rmsprop_centered(long long i, T g, float lr, float scale,
                                                    float alpha, float calpha, float eps,
                                                    float mu, float wd, long long decay,
                                                    T& p, T& sq, T& ga) {
    T gs;
    if (!rf_rmsprop_grad(i, g, scale, wd, decay, p, gs)) return;
    sq = (T)alpha * sq + (T)calpha * (gs * gs);
    ga += (T)calpha * (gs - ga); T avg = sqrt(sq - ga * ga) + (T)eps;
    p -= (T)lr * (gs / avg);
}

template <typename T>
__device__ __forceinline__ void rf_rmsprop_momentum(long long i, T g, float lr, float scale,
                                                    float alpha, float calpha, float eps,
                                                    float mu, float wd, long long decay,
                                                    T& p, T& sq, T& buf) {
    T gs;
    if (!rf_rmsprop_grad(i, g, scale, wd, decay, p, gs)) return;
    sq = (T)alpha * sq + (T)calpha * (gs * gs);
    T avg = sqrt(sq) + (T)eps;
    buf = (T)mu * buf + gs / avg; p -= (T)lr * buf;
}

template <typename T>
__device__ __forceinline__ void rf_rmsprop_centered_momentum(
        long long i, T g, float lr, float scale, float alpha, float calpha, float eps,
        float mu, float wd, long long decay, T& p, T& sq, T& ga, T& buf) {
    T gs;
    if (!rf_rmsprop_grad(i, g, scale, wd, decay, p, gs)) return;
    sq = (T)alpha * sq + (T)calpha * (gs * gs);
    ga += (T)calpha * (gs - ga); T avg = sqrt(sq - ga * ga) + (T)eps;
    buf = (T)mu * buf + gs / avg; p -= (T)lr * buf;
}
