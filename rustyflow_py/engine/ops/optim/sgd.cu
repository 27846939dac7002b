// SGD over the flat buffer (torch.optim.SGD: momentum without dampening, optionally
// Nesterov); the weight decay is an L2 term of the gradient on the first `decay` elements.
template <typename T>
__device__ __forceinline__ void rf_sgd_update(long long i, T g, float lr, float scale,
                                              float mu, bool nesterov, float wd,
                                              long long decay, T& p, T& vel) {
    if (scale < 0) return;  // skipped (fp16 overflow: loss_scale.py)
    T gs = g * (T)scale;
    if (i < decay) gs += (T)wd * p;
    T d = gs;
    if (mu != 0) { vel = (T)mu * vel + gs; d = nesterov ? gs + (T)mu * vel : vel; }
    p -= (T)lr * d;
}
