// Data movement without the host: the batch gather and the loss ring.
#include "types.cuh"
#include "warp_reduce.cuh"

// The batch of step `*step` (mod the epoch's batch count), gathered on the device from
// this rank's b rows of the stream, starting at row0.
extern "C" __global__ void gather_batch(const int* stream, const int* step, int* x, int* y,
                                        int row0, int b, int n, int t, int nb) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= b * t) return;
    int row = k / t, col = k % t, i = step[0] % nb;
    long long src = (long long)(row0 + row) * n + (long long)i * t + col;
    x[k] = stream[src];
    y[k] = stream[src + 1];
}

extern "C" __global__ void store_at_step(real* ring, const int* step, const real* value, int n) {
    ring[(step[0] - 1) % n] = value[0];
}
