// RMSprop over the flat buffer (torch.optim.RMSprop), one element per call (cuda.py's
// ElementwiseKernels), one instance per variant: the centered average (ga) and the momentum
// buffer (buf) are read and written only when CENTERED / MOMENTUM (otherwise the caller
// passes another array, which is left alone). The weight decay is an L2 term of the gradient
// on the first `decay` elements; calpha = 1 - alpha comes from double precision.
template <bool CENTERED, bool MOMENTUM, typename T>
__device__ __forceinline__ void rf_rmsprop_update(long long i, T g, float lr, float scale,
                                                  float alpha, float calpha, float eps,
                                                  float mu, float wd, long long decay, T& p,
                                                  T& sq, T& ga, T& buf) {
    if (scale < 0) return;  // skipped (fp16 overflow: loss_scale.py)
    T gs = g * (T)scale;
    if (i < decay) gs += (T)wd * p;
    sq = (T)alpha * sq + (T)calpha * (gs * gs);
    T avg;
    if (CENTERED) { ga += (T)calpha * (gs - ga); avg = sqrt(sq - ga * ga) + (T)eps; }
    else avg = sqrt(sq) + (T)eps;
    if (MOMENTUM) { buf = (T)mu * buf + gs / avg; p -= (T)lr * buf; }
    else p -= (T)lr * (gs / avg);
}
