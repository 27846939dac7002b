// The next token of each row of logits (B, V): argmax_rows for greedy decoding, one block of
// THREADS threads per row; sample_rows for a draw by reference.py's rules (logits /
// temperature, top-k keeping ties, softmax, top-p, the inverse CDF in vocabulary order), with
// probabilities in double as there.
//
// sample_rows spreads a row over gridDim.x blocks (blockIdx.y is the row), each owning a
// contiguous slice of it, and nothing is sorted: the k-th largest logit and top-p's threshold
// are one radix select (radix_edge), of counts and of probability mass (the largest logit
// whose tokens at or above it hold at least top_p of the mass: the nucleus a full sort gives,
// ties included). The blocks of a row meet at row_sync between the passes; the launcher (cuda.py)
// starts at most as many blocks as the GPU holds at once, so every one of them runs.
//
// With top-k on (k <= THREADS) the launcher starts one block a row instead, and the block
// takes top_k_draw's path: no barrier between blocks, two reads of the row, and only the few
// candidates for the k largest sorted in shared memory (top-p's cut and the draw among them).
// Where ties leave too many candidates, it goes on with the passes above in its one block.
//
// Both kernels also serve the decode loop's graph (model/graph_decode.py): with n_u > 0 a
// launch reads its uniforms at a device counter, and its last block (`advance`) files the ids
// and advances the counter and the decode step's position, so a token needs no host work.
#include "types.cuh"
#include "warp_reduce.cuh"

// THREADS (the block size) comes from the launcher as a -D option.
static_assert(THREADS == 1024, "block_all needs 32 warps: a warp's lanes hold one per warp");
#define WARPS (THREADS / 32)
#define UNROLL 8  // row loads issued before any is used
#define SLICE_UNROLL 4  // the same for the radix passes (cuda.py gives a block ~2 per thread)
#define FULL 0xffffffffu
#define DIGITS 256  // a radix pass chooses 8 bits

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
typedef keys::type rkey;
#define ROUNDS (keys::bits / 8)  // radix passes of a select

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

// f(x, valid) for the slice [lo, hi) of a row, thread t taking lo + t, lo + t + THREADS, ...;
// every thread of the block makes the same number of calls (valid is false past hi), so f
// may use the whole warp.
template <typename F>
__device__ __forceinline__ void for_slice(const real* __restrict__ row, int lo, int hi, F f) {
    for (int base = lo; base < hi; base += THREADS * SLICE_UNROLL) {
        acc x[SLICE_UNROLL];
#pragma unroll
        for (int j = 0; j < SLICE_UNROLL; j++) {
            const int i = base + j * THREADS + (int)threadIdx.x;
            x[j] = i < hi ? (acc)row[i] : (acc)0;
        }
#pragma unroll
        for (int j = 0; j < SLICE_UNROLL; j++)
            if (base + j * THREADS < hi) f(x[j], base + j * THREADS + (int)threadIdx.x < hi);
    }
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

// After a draw of the decode loop (n_u > 0; 0: a plain call, nothing here): the last block
// of the launch to finish copies the ids (rows,) into row count % n_u of `ring` (n_u, rows)
// and advances *count and *pos, so that the next launch (the next replay of the loop's graph)
// reads the next uniforms and the decode step after it writes the next position. `done`
// counts the blocks finished (the last one puts it back to 0). Every block calls it.
__device__ void advance(const long long* ids, int rows, int n_u, long long* count,
                        long long* ring, long long* pos, unsigned int* done) {
    if (n_u == 0) return;
    __shared__ bool last;
    __syncthreads();  // this block's ids are written
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(done, 1u) == gridDim.x * gridDim.y - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const long long slot = __ldcg(count) % n_u;  // every block read *count before it finished
    for (int b = threadIdx.x; b < rows; b += THREADS) ring[slot * rows + b] = __ldcg(&ids[b]);
    __syncthreads();
    if (threadIdx.x == 0) {
        *count += 1;
        *pos += 1;
        *done = 0;
    }
}

// Greedy: ids[b] = the first index of row b's largest logit, as argmax; then `advance`.
extern "C" __global__ void __launch_bounds__(THREADS) argmax_rows(
    const real* __restrict__ logits, long long* __restrict__ ids, int v, int n_u,
    long long* count, long long* ring, long long* pos, unsigned int* done) {
    __shared__ acc red_v[WARPS];
    __shared__ int red_i[WARPS];
    const real* row = logits + (long long)blockIdx.x * v;
    acc best = 0;
    int at = v;  // v: no element seen yet
    for_each(row, threadIdx.x, v, THREADS, [&](int i, acc x) {
        if (at == v || x > best) { best = x; at = i; }
    });
    // the block's best: the larger value, the smaller index on a tie
    const acc top = block_all(at == v ? NEG_INF : best,
                              [](acc a, acc b) { return max(a, b); }, red_v);
    const int first = block_all((at != v && best == top) ? at : v,
                                [](int a, int b) { return min(a, b); }, red_i);
    if (threadIdx.x == 0) ids[blockIdx.x] = first == v ? 0 : first;
    advance(ids, gridDim.x, n_u, count, ring, pos, done);
}

// The blocks of one row wait for each other: bar[0] counts arrivals, bar[1] counts the
// barriers passed (it never goes back, so a block that reads it before arriving can wait for
// it to move). The last to arrive resets the count, so the pair is ready for the next launch.
__device__ void row_sync(unsigned int* bar) {
    __syncthreads();
    if (gridDim.x > 1 && threadIdx.x == 0) {
        volatile unsigned int* passed = bar + 1;
        const unsigned int seen = *passed;
        __threadfence();  // this block's writes before its arrival
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (*passed == seen) {}
        }
        __threadfence();
    }
    __syncthreads();
}

// Adds each lane's x into h[digit] (digit < 0: nothing), one shared atomic per distinct digit
// of the warp: a warp's logits fall in a few digits, each summed by one butterfly. Every lane
// of the warp calls it.
template <typename T>
__device__ __forceinline__ void warp_add(T* h, int digit, T x) {
    for (unsigned int todo = __ballot_sync(FULL, digit >= 0); todo;) {
        const int d = __shfl_sync(FULL, digit, __ffs(todo) - 1);
        const unsigned int same = __ballot_sync(FULL, digit == d);
        T sum = digit == d ? x : (T)0;
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL, sum, o);
        if ((int)(threadIdx.x % 32) == __ffs(same) - 1) atomicAdd(&h[d], sum);
        todo &= ~same;
    }
}

// A row's shared state between its blocks, in global memory (cuda.py allocates it, zeroed,
// once per batch size; a launch leaves `bar` as it found it and zeroes the rest itself).
struct row_state {
    unsigned int* bar;     // (2,) row_sync's counters
    double* maxima;        // (gridDim.x,) each block's largest logit
    double* sums;          // (gridDim.x,) each block's kept mass
    unsigned int* counts;  // (ROUNDS, DIGITS) the k-th largest's radix passes
    double* mass;          // (ROUNDS, DIGITS) top-p's radix passes
};

// Folds this block's histogram `h` into the row's (`row_h`), waits for every block, and reads
// the row's histogram back into `h` (all blocks read the same values).
template <typename T>
__device__ void merge(T* h, T* row_h, unsigned int* bar) {
    __syncthreads();
    for (int d = threadIdx.x; d < DIGITS; d += THREADS)
        if (h[d] != 0) atomicAdd(&row_h[d], h[d]);
    row_sync(bar);
    for (int d = threadIdx.x; d < DIGITS; d += THREADS) h[d] = __ldcg(&row_h[d]);
    __syncthreads();
}

// Infinity for a mass, and for a count a total no row reaches: radix_edge's need once every
// element left is kept.
__device__ __forceinline__ unsigned int beyond(unsigned int) { return 0xffffffffu; }
__device__ __forceinline__ double beyond(double) {
    return __longlong_as_double(0x7ff0000000000000LL);
}

// The key of the largest element at or above which the row's elements hold at least `need`
// of weight (the first element of a descending sort at which the running sum reaches need,
// so every element tied with it is in), by a radix select: 8 bits a pass from the top,
// summing weight(x) (a T) per digit over the elements that match the digits chosen so far.
// need_of(total) gives need from the first pass's total of the whole row. Top-k: T counts,
// weight 1, need k (the k-th largest). Top-p: T mass, need top_p of the kept mass. If
// rounding leaves the sum short of need, the lowest digit holding weight (all of it kept).
template <typename T, typename W, typename N>
__device__ rkey radix_edge(const real* __restrict__ row, int lo, int hi, T* row_hist,
                           unsigned int* bar, W weight, N need_of) {
    __shared__ T hist[DIGITS];
    __shared__ rkey chosen;
    __shared__ T still;  // the weight still needed below the digits chosen so far
    rkey prefix = 0, mask = 0;
    T need = 0;
    for (int r = 0; r < ROUNDS; r++) {
        const int shift = keys::bits - 8 * (r + 1);
        for (int d = threadIdx.x; d < DIGITS; d += THREADS) hist[d] = 0;
        __syncthreads();
        for_slice(row, lo, hi, [&](acc x, bool valid) {
            const rkey key = keys::of(x);
            const bool in = valid && (key & mask) == prefix;
            warp_add(hist, in ? (int)((key >> shift) & 255) : -1, in ? weight(x) : (T)0);
        });
        merge(hist, row_hist + r * DIGITS, bar);
        if (threadIdx.x < 32) {  // lane l: digits 255 - 8l down to 248 - 8l
            const int lane = threadIdx.x;
            T c[8], sum = 0;
            for (int j = 0; j < 8; j++) sum += (c[j] = hist[255 - 8 * lane - j]);
            T incl = sum;  // weight of this lane's digits and all higher ones
            for (int o = 1; o < 32; o <<= 1) {
                const T y = __shfl_up_sync(FULL, incl, o);
                if (lane >= o) incl += y;
            }
            if (r == 0) need = need_of(__shfl_sync(FULL, incl, 31));  // of the whole row
            T before = __shfl_up_sync(FULL, incl, 1);
            if (lane == 0) before = 0;
            // the first digit from the top whose running sum reaches `need`; if rounding
            // leaves none, the lowest digit holding weight
            int hit = -1;
            T at = before;
            for (int j = 0; j < 8 && hit < 0; j++) {
                if (c[j] > 0 && at + c[j] >= need) hit = j;
                else at += c[j];
            }
            const unsigned int hits = __ballot_sync(FULL, hit >= 0);
            int low = -1;  // this lane's lowest digit (its last j) holding weight
            for (int j = 0; j < 8; j++) if (c[j] > 0) low = j;
            const unsigned int holding = __ballot_sync(FULL, low >= 0);
            if (hits ? lane == __ffs(hits) - 1 : lane == 31 - __clz(holding)) {
                chosen = prefix | ((rkey)(255 - 8 * lane - (hits ? hit : low)) << shift);
                still = hits ? need - at : beyond(need);
            }
        }
        __syncthreads();
        prefix = chosen;
        need = still;
        mask |= (rkey)255 << shift;
    }
    return prefix;
}

// Sorts the n slots (a power of 2, at most THREADS * 2) of (key, id, w) in shared memory,
// bitonically, so that before(slot i, slot j) holds for i < j.
template <typename Before>
__device__ void bitonic(rkey* key, int* id, double* w, int n, Before before) {
    for (int size = 2; size <= n; size <<= 1)
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int t = threadIdx.x; t < n / 2; t += THREADS) {
                const int i = 2 * t - (t & (stride - 1)), j = i + stride;
                if (before(key[j], id[j], key[i], id[i]) == ((i & size) == 0)) {
                    const rkey k = key[i]; key[i] = key[j]; key[j] = k;
                    const int d = id[i]; id[i] = id[j]; id[j] = d;
                    const double x = w[i]; w[i] = w[j]; w[j] = x;
                }
            }
        }
    __syncthreads();
}

// The same draw as sample_rows' passes (the same weights, cuts and ties), for top-k on
// (1 <= k <= THREADS, k < v) in one block a row. Thread t's largest key (of the elements
// t, t + THREADS, ...) gives THREADS distinct elements, so the k-th largest of them bounds
// the row's k-th largest from below: the elements at or above it (the candidates: about k,
// whatever the vocabulary) hold every token top-k keeps. Sorted by value, they give the k-th
// largest, the maximum and top-p's cut; sorted by index, the inverse CDF in vocabulary order.
// False, with nothing written, where ties leave more than THREADS candidates.
__device__ bool top_k_draw(const real* __restrict__ row, int v, double u, double temperature,
                           int top_k, double top_p, long long* id_out) {
    __shared__ rkey key[THREADS];
    __shared__ int id[THREADS];
    __shared__ double w[THREADS];  // the candidates' kept weights
    __shared__ double red[WARPS];
    __shared__ int count;
    const int t = threadIdx.x, lane = t % 32;
    auto by_value = [](rkey a, int ia, rkey b, int ib) { return a > b || (a == b && ia < ib); };
    rkey mine = 0;  // below every value's key (0 is the key of a NaN only)
    for_each(row, t, v, THREADS, [&](int, acc x) { mine = max(mine, keys::of(x)); });
    key[t] = mine;
    id[t] = t;
    if (t == 0) count = 0;
    bitonic(key, id, w, THREADS, by_value);
    const rkey bound = key[top_k - 1];
    __syncthreads();  // every thread has read it before the candidates overwrite it
    for (int base = 0; base < v; base += THREADS * UNROLL) {  // the candidates, in any order
        acc x[UNROLL];
#pragma unroll
        for (int j = 0; j < UNROLL; j++) {
            const int i = base + j * THREADS + t;
            x[j] = i < v ? (acc)row[i] : (acc)0;
        }
#pragma unroll
        for (int j = 0; j < UNROLL; j++) {
            const int i = base + j * THREADS + t;
            const bool take = i < v && keys::of(x[j]) >= bound;
            const unsigned int takers = __ballot_sync(FULL, take);
            if (!takers) continue;
            int first = 0;
            if (lane == __ffs(takers) - 1) first = atomicAdd(&count, __popc(takers));
            first = __shfl_sync(FULL, first, __ffs(takers) - 1);
            const int slot = first + __popc(takers & ((1u << lane) - 1));
            if (take && slot < THREADS) {
                key[slot] = keys::of(x[j]);
                id[slot] = i;
            }
        }
    }
    __syncthreads();
    const int n = count;
    if (n > THREADS) return false;
    int size = 2;
    while (size < n) size <<= 1;
    if (t >= n && t < size) {  // padding, sorted last both ways
        key[t] = 0;
        id[t] = 0x7fffffff;
    }
    bitonic(key, id, w, size, by_value);
    const rkey kth = key[top_k - 1];
    const double top = (double)keys::value(key[0]) / temperature;  // the largest z
    // top-k keeps the slots at or above the k-th (ties too): the first `kept` of them
    const bool in = t < n && key[t] >= kth;
    const double mass = in ? exp((double)keys::value(key[t]) / temperature - top) : 0.0;
    double smallest = 0.0;  // top-p keeps the weights at or above this
    if (top_p < 1.0) {
        // the first slot (by value) at which the running mass reaches top_p of the whole; if
        // rounding leaves none, the last one holding mass
        const double need = top_p * block_all(mass, [](double a, double b) { return a + b; },
                                              red);
        double incl = mass;
        for (int o = 1; o < 32; o <<= 1) {
            const double y = __shfl_up_sync(FULL, incl, o);
            if (lane >= o) incl += y;
        }
        __syncthreads();
        if (lane == 31) red[t / 32] = incl;
        __syncthreads();
        for (int k = 0; k < t / 32; k++) incl += red[k];
        const int hit = block_all((mass > 0 && incl >= need) ? t : THREADS,
                                  [](int a, int b) { return min(a, b); }, (int*)red);
        const int low = block_all(mass > 0 ? t : -1, [](int a, int b) { return max(a, b); },
                                  (int*)red);
        w[t] = mass;
        __syncthreads();
        smallest = w[hit < THREADS ? hit : low];
        __syncthreads();  // read by all before w is overwritten
    }
    w[t] = mass >= smallest ? mass : 0.0;
    bitonic(key, id, w, size, [](rkey, int ia, rkey, int ib) { return ia < ib; });
    // the inverse CDF in vocabulary order: warp 0, lane l walking the slots l * per, ...;
    // as in sample_rows, the token drawn is the last kept one whose start is at or below
    // u * total (the first whose cumulative mass exceeds it)
    if (t < 32) {
        const int per = (n + 31) / 32, lo = min(n, t * per), hi = min(n, lo + per);
        double sum = 0;
        for (int i = lo; i < hi; i++) sum += w[i];
        double incl = sum;
        for (int o = 1; o < 32; o <<= 1) {
            const double y = __shfl_up_sync(FULL, incl, o);
            if (lane >= o) incl += y;
        }
        const double target = u * __shfl_sync(FULL, incl, 31);
        double c = __shfl_up_sync(FULL, incl, 1);  // the mass of the earlier lanes' slots
        if (lane == 0) c = 0;
        int last = -1;
        for (int i = lo; i < hi; i++) {
            if (w[i] > 0 && c <= target) last = i;
            c += w[i];
        }
        for (int o = 16; o > 0; o >>= 1) last = max(last, __shfl_xor_sync(FULL, last, o));
        if (t == 0) *id_out = id[last];
    }
    return true;
}

// A draw from row b = blockIdx.y at the uniform u in [0, 1) into ids[b]. top_k 0 (or >= v)
// and top_p 1 are off. Block blockIdx.x of gridDim.x takes the slice [lo, hi) of the row.
__device__ void draw_row(const real* __restrict__ logits, double u, long long* ids, int v,
                         double temperature, int top_k, double top_p, unsigned int* bars,
                         double* maxima, double* sums, unsigned int* counts, double* masses) {
    __shared__ acc red_a[WARPS];
    __shared__ double red_d[WARPS];
    __shared__ double work[THREADS];  // where each thread's segment of the slice starts
    __shared__ int walker;  // the thread whose segment holds the draw
    __shared__ int picked;  // the block whose slice holds the draw
    __shared__ double from;  // the kept mass before this block's slice
    __shared__ double target;  // u * the row's kept mass
    const int b = blockIdx.y, g = blockIdx.x, blocks = gridDim.x;
    const real* row = logits + (long long)b * v;
    const row_state s = {bars + 2 * b, maxima + (long long)b * blocks,
                         sums + (long long)b * blocks, counts + (long long)b * ROUNDS * DIGITS,
                         masses + (long long)b * ROUNDS * DIGITS};
    const int per = (v + blocks - 1) / blocks, lo = min(v, g * per), hi = min(v, lo + per);
    if (blocks == 1 && 0 < top_k && top_k < v && top_k <= THREADS &&
        top_k_draw(row, v, u, temperature, top_k, top_p, ids + b))
        return;

    if (g == 0) {  // the radix passes add into these after the first row_sync
        for (int d = threadIdx.x; d < ROUNDS * DIGITS; d += THREADS) {
            s.counts[d] = 0;
            s.mass[d] = 0;
        }
        if (threadIdx.x == 0) ids[b] = v - 1;  // the reference's clip, if no segment is chosen
    }
    acc hi_x = NEG_INF;
    for_each(row, lo + threadIdx.x, hi, THREADS, [&](int, acc x) { hi_x = max(hi_x, x); });
    hi_x = block_all(hi_x, [](acc a, acc c) { return max(a, c); }, red_a);
    if (threadIdx.x == 0) s.maxima[g] = (double)hi_x;
    row_sync(s.bar);
    double largest = __ldcg(&s.maxima[0]);
    for (int i = 1; i < blocks; i++) largest = max(largest, __ldcg(&s.maxima[i]));
    const double top = largest / temperature;  // the largest z = logit / temperature

    const bool by_k = 0 < top_k && top_k < v;
    const rkey kth = by_k ? radix_edge(row, lo, hi, s.counts, s.bar,
                                       [](acc) { return 1u; },
                                       [=](unsigned int) { return (unsigned int)top_k; })
                          : 0;  // key 0: all kept
    // exp(z - top) of what top-k keeps, 0 for the rest
    auto weight = [&](acc x) { return keys::of(x) >= kth ? exp((double)x / temperature - top)
                                                         : 0.0; };
    double smallest = 0.0;  // top-p keeps the weights at or above this
    if (top_p < 1.0)
        smallest = exp((double)keys::value(radix_edge(
                           row, lo, hi, s.mass, s.bar, weight,
                           [=](double total) { return top_p * total; })) / temperature - top);

    // the inverse CDF in vocabulary order: the slice of block g starts at the kept mass of the
    // slices before it, and thread t's contiguous segment of the slice at work[t] within it.
    // Those are sums of positive terms, so 0 only where all of them are 0; they add in tree
    // order, so the starts are not exactly monotone, and the slice and then the segment walked
    // are the last ones holding kept mass that start at or below u * total. The token drawn is
    // the first there whose cumulative mass exceeds u * total.
    auto kept = [&](acc x) { const double w = weight(x); return w >= smallest ? w : 0.0; };
    const int seg = (hi - lo + THREADS - 1) / THREADS,
              start = min(hi, lo + (int)threadIdx.x * seg), stop = min(hi, start + seg);
    double mine = 0;
    for_each(row, start, stop, 1, [&](int, acc x) { mine += kept(x); });
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double incl = mine;
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
    work[threadIdx.x] = (warp ? red_d[warp - 1] : 0.0) + before;
    if (threadIdx.x == 0) s.sums[g] = red_d[WARPS - 1];
    row_sync(s.bar);
    if (threadIdx.x == 0) {  // every block finds the same slice
        double total = 0;
        for (int i = 0; i < blocks; i++) total += __ldcg(&s.sums[i]);
        target = u * total;
        double at = 0;
        picked = -1;
        for (int i = 0; i < blocks; i++) {
            const double m = __ldcg(&s.sums[i]);
            if (m > 0 && at <= target) {
                picked = i;
                from = at;
            }
            at += m;
        }
        walker = -1;
    }
    __syncthreads();
    if (picked != g) return;
    const double here = target - from;  // u * total, within this slice
    if (mine > 0 && work[threadIdx.x] <= here) atomicMax(&walker, (int)threadIdx.x);
    __syncthreads();
    if ((int)threadIdx.x == walker) {
        double c = work[threadIdx.x];
        long long last = -1;  // the step, or the segment's last kept token if rounding misses
        for_each(row, start, stop, 1, [&](int i, acc x) {
            const double w = kept(x);
            if (w > 0 && c <= here) last = i;
            c += w;
        });
        ids[b] = last;  // >= 0: the segment holds kept mass
    }
}

// sample_rows: draw_row for each row b at u[b], the uniforms being the row count % n_u of
// u (n_u, B) in the decode loop (n_u > 0), else u (B,); then `advance`.
extern "C" __global__ void __launch_bounds__(THREADS) sample_rows(
    const real* __restrict__ logits, const double* __restrict__ u, long long* __restrict__ ids,
    int v, double temperature, int top_k, double top_p, unsigned int* bars, double* maxima,
    double* sums, unsigned int* counts, double* masses, int n_u, long long* count,
    long long* ring, long long* pos, unsigned int* done) {
    const int rows = gridDim.y;
    const long long first = n_u ? (__ldcg(count) % n_u) * rows : 0;
    draw_row(logits, u[first + blockIdx.y], ids, v, temperature, top_k, top_p, bars, maxima,
             sums, counts, masses);
    advance(ids, rows, n_u, count, ring, pos, done);
}
