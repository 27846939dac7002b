// The storage type `real` (what a kernel loads and stores) and the accumulation type `acc`
// (what it computes and reduces in) of a source compiled per dtype, from the -D options
// of cuda_build.dtype_defines: RF_REAL, RF_ACC, and RF_FP16 / RF_BF16 for the 16-bit types'
// headers. Loads convert real -> acc and stores acc -> real.
#if RF_FP16
#include <cuda_fp16.h>
#endif
#if RF_BF16
#include <cuda_bf16.h>
#endif
typedef RF_REAL real;
#ifdef RF_ACC
typedef RF_ACC acc;
#endif
