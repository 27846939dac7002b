// The weights' moving average (model/ema.py), one pass over the flat buffer after each
// optimizer step: ema <- ema + c (p - ema) once the step counter passes `start`, a copy of
// the weights before that.
template <typename T>
__device__ __forceinline__ void rf_ema_update(T p, T c, int step, long long start, T& ema) {
    ema = step > start ? ema + c * (p - ema) : p;
}
