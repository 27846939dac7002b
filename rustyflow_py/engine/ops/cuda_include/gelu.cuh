// GELU's tanh approximation in the arithmetic type A: its value and its slope at u. The
// constants are the decimal reprs of gelu/reference.py's GELU_C = sqrt(2 / pi) and GELU_K (a
// CPU test holds them equal).
template <typename A>
__device__ __forceinline__ A rf_gelu_tanh(A u) {
    return tanh((A)0.7978845608028654 * u * (1 + (A)0.044715 * u * u));
}

template <typename A>
__device__ __forceinline__ A rf_gelu_value(A u) {
    return (A)0.5 * u * (1 + rf_gelu_tanh(u));
}

template <typename A>
__device__ __forceinline__ A rf_gelu_slope(A u) {
    A t = rf_gelu_tanh(u);
    return (A)0.5 * (1 + t) + (A)0.5 * u * (1 - t * t) * (A)0.7978845608028654
        * (1 + 3 * (A)0.044715 * u * u);
}
