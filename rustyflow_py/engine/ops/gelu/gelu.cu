// GELU (tanh approximation) of x + b, and its derivative times g, for CuPy ElementwiseKernels
// (gelu/cuda.py) over any storage type T: loads and stores are T, the arithmetic runs in
// A = rf_acc<T>::type (float, double for double), as the RawKernels do.
#include "acc_trait.cuh"
#include "gelu.cuh"

template <typename T>
__device__ __forceinline__ T rf_gelu_forward(T x, T b) {
    typedef typename rf_acc<T>::type A;
    return (T)rf_gelu_value((A)x + (A)b);
}

template <typename T>
__device__ __forceinline__ T rf_gelu_backward(T g, T x, T b) {
    typedef typename rf_acc<T>::type A;
    return (T)((A)g * rf_gelu_slope((A)x + (A)b));
}
