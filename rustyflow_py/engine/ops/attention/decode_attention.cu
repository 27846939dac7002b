// One generated token's attention over the KV cache: the new key and value are written at
// the position, then the query attends over positions 0..pos. pos is read from device
// memory, so one captured graph serves every position and reads only what is filled.
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

// Block (b, h) of B*H blocks. qkv (B, 3E) this token's projections; keys, values
// (B, H, S, D) the cache; y (B, E) the heads' outputs. Dynamic shared memory: D + S acc
// (the scaled query, then the scores) plus slices * D acc for the weighted sums.
extern "C" __global__ void decode_attention(const real* qkv, real* keys, real* values,
                                            real* y, const long long* pos_ptr, int heads,
                                            int s_len, int d, acc scale) {
    extern __shared__ unsigned char smem[];
    acc* q = (acc*)smem;         // (D,)
    acc* score = q + d;          // (S,)
    acc* part = score + s_len;   // (slices, D)
    __shared__ acc red[32];
    int b = blockIdx.x / heads, h = blockIdx.x % heads, e = heads * d;
    long long pos = *pos_ptr;
    const real* row = qkv + (long long)b * 3 * e + h * d;
    long long base = ((long long)b * heads + h) * s_len * d;
    real* k_cache = keys + base;
    real* v_cache = values + base;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        q[i] = (acc)row[i] * scale;
        k_cache[pos * d + i] = row[e + i];
        v_cache[pos * d + i] = row[2 * e + i];
    }
    __syncthreads();
    int n = (int)pos + 1, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int j = warp; j < n; j += blockDim.x / 32) {  // a warp per cached position
        const real* kr = k_cache + (long long)j * d;
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
        acc p = exp(score[j] - m);
        score[j] = p;
        z += p;
    }
    z = block_reduce<false>(z, red);  // its barriers also publish the probabilities
    int slices = blockDim.x / d, slice = threadIdx.x / d, i = threadIdx.x % d;
    if (slice < slices) {  // thread (slice, i): positions slice, slice + slices, ...
        acc o = 0;
        for (int j = slice; j < n; j += slices) o += score[j] * (acc)v_cache[(long long)j * d + i];
        part[slice * d + i] = o;
    }
    __syncthreads();
    if (threadIdx.x < d) {
        acc o = 0;
        for (int k = 0; k < slices; k++) o += part[k * d + threadIdx.x];
        y[(long long)b * e + h * d + threadIdx.x] = (real)(o / z);
    }
}
