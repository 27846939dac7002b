// Sums and maxima across the 32 lanes of a warp (butterfly shuffles), in acc.
#include "types.cuh"
#define NEG_INF ((acc)__longlong_as_double(0xfff0000000000000ULL))
__device__ __forceinline__ acc warp_sum(acc v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ __forceinline__ acc warp_max(acc v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
