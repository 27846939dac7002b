// A 16-byte vector of the storage type `real` (types.cuh): 8 16-bit values, 4 floats or 2
// doubles, loaded and stored as one access. Element-wise kernels over whole vectors take
// arrays that cuda_build.vectors has checked: equal, C-contiguous, 16-byte aligned, a whole
// number of vectors long.
#include "types.cuh"

#define RF_VEC ((int)(16 / sizeof(real)))

struct __align__(16) rf_vec {
    real v[RF_VEC];
};
