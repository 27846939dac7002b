// GELU (tanh approximation) of x + b, and its derivative times g, for CuPy ElementwiseKernels
// (gelu/cuda.py) over any storage type T: loads and stores are T, the arithmetic runs in
// A = rf_acc<T>::type (float, double for double), as the RawKernels do. The constants are
// the decimal reprs of gelu/reference.py's GELU_C = sqrt(2 / pi) and GELU_K (a CPU test holds
// them equal).
#include "acc_trait.cuh"

template <typename T>
__device__ __forceinline__ T rf_gelu_forward(T x, T b) {
    typedef typename rf_acc<T>::type A; A u = (A)x + (A)b;
    A t = tanh((A)0.7978845608028654 * u * (1 + (A)0.044715 * u * u));
    return (T)((A)0.5 * u * (1 + t));
}

template <typename T>
__device__ __forceinline__ T rf_gelu_backward(T g, T x, T b) {
    typedef typename rf_acc<T>::type A; A u = (A)x + (A)b;
    A t = tanh((A)0.7978845608028654 * u * (1 + (A)0.044715 * u * u));
    A d = (A)0.5 * (1 + t) + (A)0.5 * u * (1 - t * t) * (A)0.7978845608028654
        * (1 + 3 * (A)0.044715 * u * u);
    return (T)((A)g * d);
}
