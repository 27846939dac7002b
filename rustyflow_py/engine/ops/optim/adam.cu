// Adam and AdamW, one element per call: the preamble of cuda.py's ElementwiseKernels, which
// call adam.cuh's rf_adam_update (the vector kernels are adam_vec.cu).
#include "adam.cuh"
