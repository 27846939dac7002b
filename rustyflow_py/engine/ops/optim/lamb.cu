// LAMB in three launches over chunks of the flat buffer (cuda.py's _Segments).
#include "types.cuh"
#include "warp_reduce.cuh"

// LAMB, pass 1 over chunks of one tensor each: Adam's moments, the direction u (with the
// weight decay) and the chunk's partial sums of p*p and u*u.
extern "C" __global__ void lamb_moments(const real* g, const real* p, real* m, real* v, real* u,
                                        acc* pw, acc* pu, const long long* lo,
                                        const long long* hi, const int* step,
                                        const float* scale, acc c1, acc c2, acc lb1, acc lb2,
                                        acc eps, acc wd, long long decay) {
    __shared__ acc s1[32], s2[32];
    int c = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    acc t = (acc)step[0], sc = (acc)scale[0];
    if (sc < 0) return;  // a skipped step (fp16 overflow); lamb_apply skips it too
    acc bc1 = -expm1(t * lb1), bc2 = sqrt(-expm1(t * lb2));  // 1 - b**t, lb = log(b)
    acc sw = 0, su = 0;
    for (long long i = lo[c] + threadIdx.x; i < hi[c]; i += blockDim.x) {
        acc gi = (acc)g[i] * sc, pi = (acc)p[i];
        acc mi = (1 - c1) * (acc)m[i] + c1 * gi;  // c = 1 - beta, from double
        acc vi = (1 - c2) * (acc)v[i] + c2 * (gi * gi);
        m[i] = (real)mi;
        v[i] = (real)vi;
        acc ui = (mi / bc1) / (sqrt(vi) / bc2 + eps);
        if (i < decay) ui += wd * pi;
        u[i] = (real)ui;
        sw += pi * pi;
        su += ui * ui;
    }
    sw = warp_sum(sw);
    su = warp_sum(su);
    if (lane == 0) { s1[warp] = sw; s2[warp] = su; }
    __syncthreads();
    if (threadIdx.x == 0) {
        acc a = 0, b = 0;
        for (int k = 0; k < blockDim.x / 32; ++k) { a += s1[k]; b += s2[k]; }
        pw[c] = a;
        pu[c] = b;
    }
}

// LAMB, pass 2: each tensor's trust ratio from its chunks' sums, in order (deterministic).
extern "C" __global__ void lamb_trust(const acc* pw, const acc* pu, const int* first,
                                      acc* trust, int segments) {
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= segments) return;
    acc a = 0, b = 0;
    for (int c = first[s]; c < first[s + 1]; ++c) { a += pw[c]; b += pu[c]; }
    trust[s] = (a > 0 && b > 0) ? sqrt(a) / sqrt(b) : (acc)1;
}

// LAMB, pass 3: p -= lr * trust[tensor] * u over the same chunks.
extern "C" __global__ void lamb_apply(real* p, const real* u, const acc* trust, const int* seg,
                                      const long long* lo, const long long* hi,
                                      const float* lr, const float* scale) {
    if (scale[0] < 0) return;
    int c = blockIdx.x;
    acc f = (acc)lr[0] * trust[seg[c]];
    for (long long i = lo[c] + threadIdx.x; i < hi[c]; i += blockDim.x)
        p[i] = (real)((acc)p[i] - f * (acc)u[i]);
}
