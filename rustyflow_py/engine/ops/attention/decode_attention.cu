// One generated token's attention over the KV cache, split over the cached positions the way
// flash-decoding does: at batch 1 a block per (sequence, head) would leave most of the GPU idle
// (12 blocks for GPT-2), so each block takes one chunk of CHUNK positions and a second kernel
// combines the chunks. pos is read from device memory, so one captured graph serves every
// position and only chunks holding filled positions do any work.
#include "types.cuh"
#include "warp_reduce.cuh"

// A block-wide maximum (or sum) of one value per thread through `red` (32 acc of shared
// memory): within each warp, then across the warps; every thread gets the result.
template <bool is_max>
__device__ __forceinline__ acc block_reduce(acc v, acc* red) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  // `red` may still be read by the previous reduction
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < warps ? red[lane] : (is_max ? NEG_INF : (acc)0);
    return is_max ? warp_max(v) : warp_sum(v);
}

// Block (b*heads + h, c): positions c*CHUNK.. of sequence b, head h, up to pos. qkv (B, 3E)
// this token's projections; keys, values (B, H, S, D) the cache, where the block holding pos
// first writes the new key and value. ws (B*H, chunks, D + 2): the chunk's unnormalised
// output, its score maximum and its sum of exp(score - maximum). Dynamic shared memory:
// D + CHUNK + slices * D acc (the scaled query, the chunk's scores, the partial sums).
extern "C" __global__ void decode_chunk(const real* __restrict__ qkv, real* __restrict__ keys,
                                        real* __restrict__ values, acc* __restrict__ ws,
                                        const long long* __restrict__ pos_ptr, int heads,
                                        int s_len, int d, acc scale) {
    extern __shared__ unsigned char smem[];
    acc* q = (acc*)smem;           // (D,)
    acc* score = q + d;            // (CHUNK,)
    acc* part = score + CHUNK;     // (slices, D)
    __shared__ acc red[32];
    const int bh = blockIdx.x, c = blockIdx.y, chunks = gridDim.y, e = heads * d;
    const int b = bh / heads, h = bh % heads;
    const long long pos = *pos_ptr;
    const int start = c * CHUNK;
    acc* out = ws + ((long long)bh * chunks + c) * (d + 2);
    if (start > pos) {  // an empty chunk: nothing to add (decode_combine reads every chunk)
        for (int i = threadIdx.x; i < d + 2; i += blockDim.x) out[i] = i == d ? NEG_INF : 0;
        return;
    }
    const int n = (int)min(pos + 1 - start, (long long)CHUNK);
    const real* row = qkv + (long long)b * 3 * e + h * d;
    const long long base = (long long)bh * s_len * d;
    real* k_cache = keys + base;
    real* v_cache = values + base;
    const bool owner = pos < start + CHUNK;  // this chunk holds the new position
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        q[i] = (acc)row[i] * scale;
        if (owner) {
            k_cache[pos * d + i] = row[e + i];
            v_cache[pos * d + i] = row[2 * e + i];
        }
    }
    __syncthreads();  // the query, and the new key and value, for the whole block
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll 4
    for (int j = warp; j < n; j += blockDim.x / 32) {  // a warp per cached position
        const real* kr = k_cache + (long long)(start + j) * d;
        acc s = 0;
        for (int i = lane; i < d; i += 32) s += q[i] * (acc)kr[i];
        s = warp_sum(s);
        if (lane == 0) score[j] = s;
    }
    __syncthreads();
    acc m = NEG_INF;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = max(m, score[j]);
    m = block_reduce<true>(m, red);
    acc z = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const acc p = exp(score[j] - m);
        score[j] = p;
        z += p;
    }
    z = block_reduce<false>(z, red);  // its barriers also publish the probabilities
    const int slices = blockDim.x / d, slice = threadIdx.x / d, i = threadIdx.x % d;
    if (slice < slices) {  // thread (slice, i): positions slice, slice + slices, ...
        acc o = 0;
#pragma unroll 8
        for (int j = slice; j < n; j += slices)
            o += score[j] * (acc)v_cache[(long long)(start + j) * d + i];
        part[slice * d + i] = o;
    }
    __syncthreads();
    if (threadIdx.x < d) {
        acc o = 0;
        for (int k = 0; k < slices; k++) o += part[k * d + threadIdx.x];
        out[threadIdx.x] = o;
    }
    if (threadIdx.x == 0) {
        out[d] = m;
        out[d + 1] = z;
    }
}

// Block b*heads + h: the chunks of ws rescaled to their common maximum, y (B, E) = sum of
// outputs / sum of exp sums. Its threads first take a chunk each (maxima, factors), then
// (slice, i) pairs sum output element i over chunks slice, slice + slices, ... skipping the
// empty ones (factor 0), so no thread walks all chunks in a chain of dependent loads. It reads
// only ws, never pos: what it combines is exactly what decode_chunk wrote. Dynamic shared
// memory: chunks + slices * D acc (the factors, the partial sums).
extern "C" __global__ void decode_combine(const acc* __restrict__ ws, real* __restrict__ y,
                                          int heads, int d, int chunks) {
    extern __shared__ unsigned char smem[];
    acc* factor = (acc*)smem;      // (chunks,)
    acc* part = factor + chunks;   // (slices, D)
    __shared__ acc red[32];
    const int bh = blockIdx.x, stride = d + 2;
    const acc* w = ws + (long long)bh * chunks * stride;
    acc m = NEG_INF;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) m = max(m, w[c * stride + d]);
    m = block_reduce<true>(m, red);
    acc z = 0;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        const acc f = exp(w[c * stride + d] - m);  // 0 for an empty chunk (maximum -inf)
        factor[c] = f;
        z += f * w[c * stride + d + 1];
    }
    z = block_reduce<false>(z, red);  // its barriers also publish the factors
    const int slices = blockDim.x / d, slice = threadIdx.x / d, i = threadIdx.x % d;
    if (slice < slices) {
        acc o = 0;
#pragma unroll 4
        for (int c = slice; c < chunks; c += slices)
            if (factor[c] != 0) o += factor[c] * w[c * stride + i];
        part[slice * d + i] = o;
    }
    __syncthreads();
    if (threadIdx.x < d) {
        acc o = 0;
        for (int k = 0; k < slices; k++) o += part[k * d + threadIdx.x];
        const int b = bh / heads, h = bh % heads;
        y[(long long)b * heads * d + h * d + threadIdx.x] = (real)(o / z);
    }
}
