// Data movement without the host: the batch gather and the loss ring.
#include "types.cuh"
#include "warp_reduce.cuh"

// A stream row's offset in [0, t) for an epoch: Wellons' lowbias32 finaliser over (shift,
// epoch, row), the same bits as reference.py's epoch_offsets.
__device__ __forceinline__ int row_offset(unsigned shift, unsigned epoch, unsigned row, int t) {
    unsigned h = shift * 0x9E3779B1u ^ epoch * 0x85EBCA77u ^ row * 0xC2B2AE3Du;
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    h ^= h >> 16;
    return (int)(h % (unsigned)t);
}

// The batch of step `*step` (mod the epoch's nb windows), gathered on the device from this
// rank's b rows of the stream, starting at row0; with `shifted`, each row is read from its
// epoch's offset (row_offset), so window boundaries move from one epoch to the next.
extern "C" __global__ void gather_batch(const int* stream, const int* step, int* x, int* y,
                                        int row0, int b, int n, int t, int nb, int shifted,
                                        unsigned shift) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= b * t) return;
    int row = k / t, col = k % t, epoch = step[0] / nb, i = step[0] % nb;
    int offset = shifted ? row_offset(shift, (unsigned)epoch, (unsigned)(row0 + row), t) : 0;
    long long src = (long long)(row0 + row) * n + (long long)i * t + offset + col;
    x[k] = stream[src];
    y[k] = stream[src + 1];
}

extern "C" __global__ void store_at_step(real* ring, const int* step, const real* value, int n) {
    ring[(step[0] - 1) % n] = value[0];
}
