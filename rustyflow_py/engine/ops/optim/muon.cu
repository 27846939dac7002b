// Muon's elementwise kernels (cuda.py's CudaMuon): the momentum of one matrix into its (possibly
// transposed) Newton-Schulz slot, the update with decoupled weight decay, and the two small
// steps of the Newton-Schulz iteration.
template <typename T>
__device__ __forceinline__ void rf_muon_momentum_update(T g, float scale, float mu, float cmu,
                                                        bool nesterov, T& buf, T& upd) {
    if (scale < 0) return;  // skipped (fp16 overflow: loss_scale.py)
    T gs = g * (T)scale;
    buf += (T)cmu * (gs - buf);
    upd = nesterov ? gs + (T)mu * (buf - gs) : buf;
}

// p <- p (1 - lr wd) - lr f u
template <typename T>
__device__ __forceinline__ void rf_muon_apply_update(T u, float lr, float wd, float f, T& p) {
    p = p * (T)(1 - lr * wd) - (T)(lr * f) * u;
}

// y <- a x + b y in place
template <typename T>
__device__ __forceinline__ void rf_ns_axpby_update(T x, float a, float b, T& y) {
    y = (T)a * x + (T)b * y;
}

// x / (its norm + eps)
template <typename T>
__device__ __forceinline__ T rf_div_eps_value(T x, T n, float eps) {
    return x / (n + (T)eps);
}
