// The next token of each row of logits (B, V), one block of THREADS threads per row:
// argmax_rows for greedy decoding, sample_rows for a draw by reference.py's rules (logits /
// temperature, top-k keeping ties, softmax, top-p over what top-k kept, the inverse CDF in
// vocabulary order). Probabilities are double, as there. A row is read from memory (L2 after
// the first pass) once per pass; nothing is sorted but the entries above the k-th largest.
#include "types.cuh"
#include "warp_reduce.cuh"

// THREADS (the block size) and KEPT_MAX (top-p sorts fewer than top_k <= KEPT_MAX entries)
// come from the launcher (cuda.py) as -D options.
static_assert(THREADS == 1024, "block_all needs 32 warps: a warp's lanes hold one per warp");
static_assert(KEPT_MAX >= THREADS, "the draw keeps one segment start per thread in `work`");
#define WARPS (THREADS / 32)
#define UNROLL 8  // row loads issued before any is used
#define FULL 0xffffffffu

// Order-preserving keys of acc values: a larger value has a larger unsigned key. A value's
// key is taken of value + 0, so -0 and +0 share one (they compare equal).
template <typename A> struct rf_key;
template <> struct rf_key<float> {
    typedef unsigned int type;
    static constexpr int bits = 32;
    __device__ static type of(float f) {
        const unsigned int u = __float_as_uint(f + 0.0f);
        return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    }
    __device__ static float value(type k) {
        return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
    }
};
template <> struct rf_key<double> {
    typedef unsigned long long type;
    static constexpr int bits = 64;
    __device__ static type of(double f) {
        const unsigned long long u = (unsigned long long)__double_as_longlong(f + 0.0);
        return (u >> 63) ? ~u : (u | (1ull << 63));
    }
    __device__ static double value(type k) {
        return __longlong_as_double((long long)((k >> 63) ? (k & ~(1ull << 63)) : ~k));
    }
};
typedef rf_key<acc> keys;
typedef keys::type key_t;

// f(i, x) for the elements i = first, first + stride, ... below stop, in order; UNROLL loads
// are issued before any is used.
template <typename F>
__device__ __forceinline__ void for_each(const real* __restrict__ row, int first, int stop,
                                         int stride, F f) {
    for (int base = first; base < stop; base += stride * UNROLL) {
        acc x[UNROLL];
#pragma unroll
        for (int j = 0; j < UNROLL; j++) {
            const int i = base + j * stride;
            x[j] = i < stop ? (acc)row[i] : (acc)0;
        }
#pragma unroll
        for (int j = 0; j < UNROLL; j++)
            if (base + j * stride < stop) f(base + j * stride, x[j]);
    }
}

// f(i, x) for every element of the row, thread t taking i = t, t + THREADS, ...
template <typename F>
__device__ __forceinline__ void for_row(const real* __restrict__ row, int v, F f) {
    for_each(row, threadIdx.x, v, THREADS, f);
}

// op over the whole block; every thread gets the result. `red` holds WARPS values.
template <typename T, typename Op>
__device__ __forceinline__ T block_all(T x, Op op, T* red) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(FULL, x, o));
    __syncthreads();  // `red` may still be read by the previous call
    if (lane == 0) red[warp] = x;
    __syncthreads();
    x = red[lane];
    for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(FULL, x, o));
    return x;
}

// Greedy: ids[b] = the first index of row b's largest logit, as argmax.
extern "C" __global__ void argmax_rows(const real* __restrict__ logits,
                                       long long* __restrict__ ids, int v) {
    __shared__ acc red_v[WARPS];
    __shared__ int red_i[WARPS];
    const real* row = logits + (long long)blockIdx.x * v;
    acc best = 0;
    int at = v;  // v: no element seen yet
    for_row(row, v, [&](int i, acc x) {
        if (at == v || x > best) { best = x; at = i; }
    });
    // the block's best: the larger value, the smaller index on a tie
    const acc top = block_all(at == v ? NEG_INF : best,
                              [](acc a, acc b) { return max(a, b); }, red_v);
    const int first = block_all((at != v && best == top) ? at : v,
                                [](int a, int b) { return min(a, b); }, red_i);
    if (threadIdx.x == 0) ids[blockIdx.x] = first == v ? 0 : first;
}

// The key of the row's k-th largest element (1 <= k <= v): a radix select, 8 bits a pass
// from the top, counting the elements that match the digits chosen so far.
__device__ key_t kth_largest(const real* __restrict__ row, int v, int k) {
    __shared__ unsigned int hist[256];
    __shared__ key_t chosen;
    __shared__ int left;
    key_t prefix = 0, mask = 0;
    int remaining = k;
    for (int shift = keys::bits - 8; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += THREADS) hist[d] = 0;
        __syncthreads();
        for_row(row, v, [&](int, acc x) {
            const key_t key = keys::of(x);
            const int digit = (key & mask) == prefix ? (int)((key >> shift) & 255) : 256;
            const unsigned int same = __match_any_sync(__activemask(), digit);
            if (digit < 256 && (threadIdx.x % 32) == __ffs(same) - 1)  // one add per digit
                atomicAdd(&hist[digit], (unsigned int)__popc(same));
        });
        __syncthreads();
        if (threadIdx.x < 32) {  // lane l: digits 255 - 8l down to 248 - 8l
            const int lane = threadIdx.x;
            unsigned int c[8], sum = 0;
            for (int j = 0; j < 8; j++) sum += (c[j] = hist[255 - 8 * lane - j]);
            unsigned int above = sum;  // elements of this lane's digits and all higher ones
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned int y = __shfl_up_sync(FULL, above, o);
                if (lane >= o) above += y;
            }
            unsigned int seen = above - sum;
            if (seen < (unsigned int)remaining && (unsigned int)remaining <= above) {
                for (int j = 0; j < 8; j++) {
                    if (seen + c[j] >= (unsigned int)remaining) {
                        chosen = prefix | ((key_t)(255 - 8 * lane - j) << shift);
                        left = remaining - (int)seen;
                        break;
                    }
                    seen += c[j];
                }
            }
        }
        __syncthreads();
        prefix = chosen;
        remaining = left;
        mask |= (key_t)255 << shift;
    }
    return prefix;
}

// Sort s[0..n) descending in place (a bitonic sort over the next power of two, padded with
// -1: below every weight).
__device__ void sort_descending(double* s, int n) {
    int n2 = 1;
    while (n2 < n) n2 <<= 1;
    for (int t = threadIdx.x + n; t < n2; t += THREADS) s[t] = -1.0;
    __syncthreads();
    for (int size = 2; size <= n2; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < n2; t += THREADS) {
                const int other = t ^ stride;
                if (other > t) {
                    const double a = s[t], b = s[other];
                    if ((t & size) == 0 ? a < b : a > b) { s[t] = b; s[other] = a; }
                }
            }
            __syncthreads();
        }
    }
}

// A draw from row b: `u` (B,) uniforms in [0, 1). top_k 0 (or >= v) and top_p 1 are off; with
// top_p < 1 the launcher guarantees 0 < top_k <= KEPT_MAX.
extern "C" __global__ void sample_rows(const real* __restrict__ logits,
                                       const double* __restrict__ u,
                                       long long* __restrict__ ids, int v,
                                       double temperature, int top_k, double top_p) {
    __shared__ acc red_a[WARPS];
    __shared__ double red_d[WARPS];
    __shared__ double work[KEPT_MAX];  // top-p's sorted entries, then the segments' starts
    __shared__ int count;
    __shared__ long long drawn;
    __shared__ int walker;  // the thread whose segment holds the draw
    const real* row = logits + (long long)blockIdx.x * v;

    acc hi = NEG_INF;
    for_row(row, v, [&](int, acc x) { hi = max(hi, x); });
    const double top = (double)block_all(hi, [](acc a, acc b) { return max(a, b); }, red_a)
                       / temperature;  // the largest z = logit / temperature
    const bool by_k = 0 < top_k && top_k < v;
    const key_t kth = by_k ? kth_largest(row, v, top_k) : 0;  // key 0: every element kept
    // exp(z - top) of what top-k keeps, 0 for the rest
    auto weight = [&](acc x) { return keys::of(x) >= kth ? exp((double)x / temperature - top)
                                                         : 0.0; };

    double smallest = 0.0;  // top-p keeps the weights at or above this
    if (top_p < 1.0) {
        // the kept mass, and the entries above the k-th largest (fewer than top_k) to sort
        if (threadIdx.x == 0) count = 0;
        __syncthreads();
        double mass = 0;
        for_row(row, v, [&](int, acc x) {
            const double w = weight(x);
            mass += w;
            if (keys::of(x) > kth) work[atomicAdd(&count, 1)] = w;
        });
        const double total = block_all(mass, [](double a, double b) { return a + b; }, red_d);
        const int above = count;
        sort_descending(work, above);
        // the first sorted position whose prefix mass reaches top_p; past the sorted
        // entries, the k-th largest's weight (its ties are all kept)
        double prefix = 0;
        if (threadIdx.x < 32) {
            for (int base = 0; base < above; base += 32) {
                const int t = base + threadIdx.x;
                double p = t < above ? work[t] : 0.0;
                for (int o = 1; o < 32; o <<= 1) {
                    const double y = __shfl_up_sync(FULL, p, o);
                    if ((int)threadIdx.x >= o) p += y;
                }
                p += prefix;
                const unsigned int reached = __ballot_sync(FULL, t < above && p / total >= top_p);
                if (reached) {
                    smallest = work[base + __ffs(reached) - 1];
                    break;
                }
                prefix = __shfl_sync(FULL, p, 31);
            }
            if (threadIdx.x == 0) red_d[0] = smallest;
        }
        __syncthreads();
        smallest = red_d[0];
        if (smallest == 0.0) smallest = exp((double)keys::value(kth) / temperature - top);
        __syncthreads();  // red_d and work are reused below
    }

    // the inverse CDF in vocabulary order: thread t's contiguous segment of the row starts at
    // work[t], the kept mass of the segments before it (a sum of positive terms, so 0 only
    // where all of them are 0; the scan adds in tree order, so the starts are not exactly
    // monotone, and the segment walked is the last one holding kept mass that starts at or
    // below u * total, chosen once by atomicMax); the token drawn is the first there whose
    // cumulative mass exceeds u * total
    auto kept = [&](acc x) { const double w = weight(x); return w >= smallest ? w : 0.0; };
    const int seg = (v + THREADS - 1) / THREADS, start = min(v, (int)threadIdx.x * seg),
              stop = min(v, start + seg);
    double s = 0;
    for_each(row, start, stop, 1, [&](int, acc x) { s += kept(x); });
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double incl = s;
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(FULL, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) red_d[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        double w = red_d[lane];
        for (int o = 1; o < 32; o <<= 1) {
            const double y = __shfl_up_sync(FULL, w, o);
            if (lane >= o) w += y;
        }
        red_d[lane] = w;
    }
    __syncthreads();
    double before = __shfl_up_sync(FULL, incl, 1);  // the mass of this warp's earlier lanes
    if (lane == 0) before = 0.0;
    work[threadIdx.x] = (warp ? red_d[warp - 1] : 0.0) + before;  // where this segment starts
    if (threadIdx.x == 0) {
        walker = -1;
        drawn = v - 1;  // no segment chosen: the reference's clip
    }
    __syncthreads();
    const double target = u[blockIdx.x] * red_d[WARPS - 1];  // u * the kept mass
    if (s > 0 && work[threadIdx.x] <= target) atomicMax(&walker, (int)threadIdx.x);
    __syncthreads();
    if ((int)threadIdx.x == walker) {
        double c = work[threadIdx.x];
        long long last = -1;  // the step, or the segment's last kept token if rounding misses
        for_each(row, start, stop, 1, [&](int i, acc x) {
            const double w = kept(x);
            if (w > 0 && c <= target) last = i;
            c += w;
        });
        drawn = last;  // >= 0: the segment holds kept mass
    }
    __syncthreads();
    if (threadIdx.x == 0) ids[blockIdx.x] = drawn;
}
