// Dropout from Philox (dropout/philox.py's function in CUDA C, cuda_include/philox.cuh), for
// CuPy ElementwiseKernels (dropout/cuda.py): element i takes word i % 4 of block i / 4's
// output at (step, site); the step is read on the device, so a replayed graph draws fresh
// masks.
#include "philox.cuh"
#include "acc_trait.cuh"

// Dropout's multiplier of element i: `scale` = 1/(1-p) where kept, 0 where dropped.
template <typename T>
__device__ __forceinline__ T rf_dropout_multiplier(unsigned long long i, int step,
                                                   unsigned int seed, unsigned int site,
                                                   unsigned int thresh, double scale) {
    unsigned int bits = rf_dropout_bits(i, (unsigned int)step, seed, site);
    return bits >= thresh ? (T)scale : (T)0.0f;
}

// The same draw applied to x on the fly: no mask array is written or read.
template <typename T>
__device__ __forceinline__ T rf_dropout_applied(T x, unsigned long long i, int step,
                                                unsigned int seed, unsigned int site,
                                                unsigned int thresh, double scale) {
    unsigned int bits = rf_dropout_bits(i, (unsigned int)step, seed, site);
    typedef typename rf_acc<T>::type A;
    return bits >= thresh ? (T)((A)x * (A)(T)scale) : (T)0.0f;
}
