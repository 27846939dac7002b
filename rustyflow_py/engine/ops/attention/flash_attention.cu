// Fused causal attention (FlashAttention-2 style): the four kernels fa_fwd, fa_bwd_pre,
// fa_bwd_dq and fa_bwd_dkdv, launched by attention/flash.py, whose docstring describes the
// layout of the work. One build per variant, configured by -D options (flash.options):
// RF_REAL (with RF_FP16 / RF_BF16), HEAD_DIM, FA_TF32, FA_BF16, FA_DROPOUT and STAGES.
#include "types.cuh"
#define BM 64                   // query rows per block: 4 warps x 16
#define BN 64                   // keys per tile (BM == BN: query tile i meets key tile i on
                                // the diagonal)
#define NTHREADS 128
// fa_bwd_dkdv's registers capped for 3 blocks per SM (from 2) where that costs few spills:
// 16-bit types up to HEAD_DIM 64 (measured faster there, slower for float32 and 128)
#define DKDV_MIN_BLOCKS (!FA_TF32 && HEAD_DIM <= 64 ? 3 : 1)
#if FA_TF32
#define LDK HEAD_DIM            // row stride of a [64][HEAD_DIM] tile: unpadded, swizzled
#else
#define LDK (HEAD_DIM + 8)      // row stride of a [64][HEAD_DIM] tile: the 16-byte pad puts
                                // the 8 rows an ldmatrix phase reads in 8 distinct bank quads
#endif
#define TILE (BN * LDK)
#define DCH (HEAD_DIM / 16)     // 16-wide k-chunks of the head dim
#define DNT (HEAD_DIM / 8)      // 8-wide n-tiles of the head dim
#define NNT (BN / 8)            // 8-wide n-tiles of a 64-wide key (or query) tile
#define KCH (BN / 16)           // 16-wide k-chunks of a 64-wide key (or query) tile
#define FULL 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

extern __shared__ __align__(16) unsigned char fa_smem[];

// Every operand tile in shared memory is a row-major [64][HEAD_DIM] copy of 64 rows of q, k,
// v or dO, as cp.async lands them; element (r, c) sits at tile_at(r, c). The fragment loaders
// read a tile either way round (as [m][k] / [n][k], or as [k][n]), so nothing is transposed.
// float32: words of a row are permuted by XOR-ing column bits 3-4 with a function of the
// row's bits 0-2 that differs between rows 4u..4u+3 and between rows p, p+2, p+4, p+6
// (0, 1, 2, 3, 1, 0, 3, 2 for r % 8 = 0..7); the 64-bit reads of 4 consecutive rows and the
// 32-bit reads of every other row (see FRAGMENTS) then hit 32 distinct banks. 16-byte chunks
// (c % 4 == 0) stay whole.
__device__ __forceinline__ int tile_at(int r, int c) {
#if FA_TF32
    return r * LDK + (c ^ (((r ^ (r >> 2)) & 1 | r & 2) << 3));
#else
    return r * LDK + c;
#endif
}

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// Register fragments. A warp multiplies a 16 x 16 chunk of A (rows m, contraction index k) by
// a 16 x 8 chunk of B (k, column n) into a 16 x 8 float32 C. Lane l has g = l >> 2 (groupID)
// and t = l & 3 (threadID_in_group). From the PTX ISA, "Matrix Fragments for mma.m16n8k16
// with floating point type" and "... mma.m16n8k8" (.tf32):
//
//   C/D (both shapes), 4 floats c0..c3:  row = g (c0, c1) or g + 8 (c2, c3),
//                                         col = 2t + (i & 1).
//   m16n8k16 .f16/.bf16, A: 4 registers of 2 halves, a0..a7 (a0 in the low half of reg 0):
//        row = g for a0, a1, a4, a5 and g + 8 for a2, a3, a6, a7;
//        col = 2t + (i & 1) for i < 4 and 2t + (i & 1) + 8 for i >= 4.
//     B: 2 registers, b0..b3:  k = 2t + (i & 1) for i < 2, 2t + (i & 1) + 8 for i >= 2;
//        n = g.
//   m16n8k8 .tf32, A: a0..a3, one per register:  row = g for a0, a2 and g + 8 for a1, a3;
//        col = t for a0, a1 and t + 4 for a2, a3.
//     B: b0, b1:  k = t for b0 and t + 4 for b1;  n = g.
//
// Operand tiles are row-major (tile_at). A is read as stored, [m][k] (q, k, v, dO rows). B is
// read from a tile stored [n][k] (k tile for Q K^T, v for dO V^T, q and dO for K Q^T and
// V dO^T) or stored [k][n] (v for P V, k for dS K, dO and q for P^T dO and dS^T Q).
//
// 16-bit: `ldmatrix.m8n8.x4` loads four 8 x 8 matrices; lanes 8j..8j+7 give the addresses
// of the 8 rows of matrix j, and register j of lane l receives row l >> 2, columns
// 2(l & 3), +1 of matrix j: (row g, k 2t, 2t + 1), exactly one register of an A ([m][k])
// or B ([n][k]) fragment. With .trans it receives column l >> 2, rows 2(l & 3), +1: (k 2t,
// 2t + 1; n g) of a [k][n] matrix, the B register of a tile stored [k][n]. One x4 gives a
// whole A fragment, or the B fragments of two adjacent n-tiles.
//
// tf32: a chunk of 16 is two m16n8k8 (k = 0..7 and 8..15). Within each, the mma's k index
// kappa is mapped to the stored k by kappa = t -> 2t and kappa = t + 4 -> 2t + 1, in A and in
// B alike. A sum over k does not care about its order, and with this order a lane's two k
// are adjacent (one 64-bit load from a [m][k] or [n][k] tile; two 32-bit loads from a [k][n]
// one), and, which is the point, they are the two columns a lane holds of a C fragment:
// C -> A below needs no shuffles. (ldmatrix moves 16-bit elements only.)
//
// C -> A (FlashAttention-2's register reuse): the S (or dS) a warp computed as C tiles for
// columns 16c..16c+7 and 16c+8..16c+15 is, element for element, the A fragment of k-chunk c
// of the next product (P V, dS K, ...): for 16-bit, reg 0 = (c0, c1) of the first tile
// (row g, k 2t, 2t+1), reg 1 = (c2, c3) (row g+8), reg 2 and reg 3 the same of the second
// tile (k + 8). For tf32 sub-chunk h takes tile h as (a0, a1, a2, a3) = (c0, c2, c1, c3).
#if FA_TF32
struct FragA { unsigned r[8]; };  // two m16n8k8 A fragments: k 0..7 (r[0..3]), 8..15 (r[4..7])
struct FragB { unsigned r[4]; };  // two m16n8k8 B fragments: r[0..1], r[2..3]

__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void mma_k8(float* c, unsigned a0, unsigned a1, unsigned a2,
                                       unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c (16 x 8, float32) += A (16 x 16) B (16 x 8)
__device__ __forceinline__ void mma16(float* c, const FragA& a, const FragB& b) {
    mma_k8(c, a.r[0], a.r[1], a.r[2], a.r[3], b.r[0], b.r[1]);
    mma_k8(c, a.r[4], a.r[5], a.r[6], a.r[7], b.r[2], b.r[3]);
}

__device__ __forceinline__ float2 ld64(const real* s, int r, int c) {
    return *reinterpret_cast<const float2*>(s + tile_at(r, c));
}

// A rows r0..r0+15, k c0..c0+15 of tile s ([m][k]).
__device__ __forceinline__ FragA load_a(const real* s, int r0, int c0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    FragA a;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float2 x = ld64(s, r0 + g, c0 + 8 * h + 2 * t);
        const float2 y = ld64(s, r0 + g + 8, c0 + 8 * h + 2 * t);
        a.r[4 * h + 0] = to_tf32(x.x);  // a0: row g,     kappa t     = k 2t
        a.r[4 * h + 1] = to_tf32(y.x);  // a1: row g + 8, kappa t     = k 2t
        a.r[4 * h + 2] = to_tf32(x.y);  // a2: row g,     kappa t + 4 = k 2t + 1
        a.r[4 * h + 3] = to_tf32(y.y);  // a3: row g + 8, kappa t + 4 = k 2t + 1
    }
    return a;
}

// B of n-tiles n0..n0+7 (b[0]) and n0+8..n0+15 (b[1]), k k0..k0+15, of tile s: stored
// [n][k] (load_b2), or [k][n] (load_bt2: k k0..k0+15 are rows, n0..n0+15 columns).
template <bool KN>
__device__ __forceinline__ void load_b2_tf32(FragB (&b)[2], const real* s, int n0, int k0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int k = k0 + 8 * h + 2 * t, n = n0 + 8 * j + g;
            float2 x;
            if constexpr (KN) x = make_float2(s[tile_at(k, n)], s[tile_at(k + 1, n)]);
            else x = ld64(s, n, k);
            b[j].r[2 * h + 0] = to_tf32(x.x);  // b0: n g, kappa t     = k 2t
            b[j].r[2 * h + 1] = to_tf32(x.y);  // b1: n g, kappa t + 4 = k 2t + 1
        }
    }
}
__device__ __forceinline__ void load_b2(FragB (&b)[2], const real* s, int n0, int k0) {
    load_b2_tf32<false>(b, s, n0, k0);
}
__device__ __forceinline__ void load_bt2(FragB (&b)[2], const real* s, int k0, int n0) {
    load_b2_tf32<true>(b, s, n0, k0);
}

// The A fragment of C tiles c0 (columns 0..7 become k 0..7) and c1 (columns 8..15).
__device__ __forceinline__ FragA c_to_a(const float* c0, const float* c1) {
    FragA a;
    a.r[0] = to_tf32(c0[0]); a.r[1] = to_tf32(c0[2]); a.r[2] = to_tf32(c0[1]);
    a.r[3] = to_tf32(c0[3]);
    a.r[4] = to_tf32(c1[0]); a.r[5] = to_tf32(c1[2]); a.r[6] = to_tf32(c1[1]);
    a.r[7] = to_tf32(c1[3]);
    return a;
}

__device__ __forceinline__ void store2(real* p, float x, float y) {
    *reinterpret_cast<float2*>(p) = make_float2(x, y);
}

__device__ __forceinline__ float to_float(real x) { return x; }
// Element i of a 16-byte vector as a float, from the 32-bit word w that holds it.
__device__ __forceinline__ float word_to_float(unsigned w, int) { return __uint_as_float(w); }

#else  // float16 / bfloat16
struct FragA { unsigned r[4]; };
struct FragB { unsigned r[2]; };

#if FA_BF16
#define MMA_F16 "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#define CVT_X2 "cvt.rn.bf16x2.f32 %0, %1, %2;"
__device__ __forceinline__ float to_float(real x) { return __bfloat162float(x); }
__device__ __forceinline__ float word_to_float(unsigned w, int i) {  // (see the float32 one)
    return __uint_as_float(i & 1 ? w & 0xffff0000u : w << 16);  // bfloat16: float's top half
}
#else
#define MMA_F16 "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#define CVT_X2 "cvt.rn.f16x2.f32 %0, %1, %2;"
__device__ __forceinline__ float to_float(real x) { return __half2float(x); }
__device__ __forceinline__ float word_to_float(unsigned w, int i) {  // (see the float32 one)
    return __half2float(__ushort_as_half((unsigned short)(i & 1 ? w >> 16 : w)));
}
#endif

// Two floats rounded to the 16-bit type and packed, lo in the low half (cvt's first source
// goes to the upper half, as in cuda_fp16.hpp's __floats2half2_rn).
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned r;
    asm(CVT_X2 : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// c (16 x 8, float32) += A (16 x 16) B (16 x 8)
__device__ __forceinline__ void mma16(float* c, const FragA& a, const FragB& b) {
    asm volatile(MMA_F16
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]),
                   "r"(b.r[1]));
}

// Four 8 x 8 matrices of tile s; this lane gives the address of row l & 7 of matrix
// j = l >> 3, at tile row r0 + ((j >> rs) & 1) * 8 + (l & 7), column c0 + ((j >> cs) & 1) * 8.
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(unsigned& d0, unsigned& d1, unsigned& d2, unsigned& d3,
                                        const real* s, int r0, int c0, int rs, int cs) {
    const int lane = threadIdx.x & 31, j = lane >> 3;
    const unsigned p = smem_u32(s + tile_at(r0 + ((j >> rs) & 1) * 8 + (lane & 7),
                                            c0 + ((j >> cs) & 1) * 8));
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3) : "r"(p));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3) : "r"(p));
}

// A rows r0..r0+15, k c0..c0+15 of tile s ([m][k]): matrices (rows, k) = (0, 0), (8, 0),
// (0, 8), (8, 8) are a0a1, a2a3, a4a5, a6a7.
__device__ __forceinline__ FragA load_a(const real* s, int r0, int c0) {
    FragA a;
    ldsm_x4<false>(a.r[0], a.r[1], a.r[2], a.r[3], s, r0, c0, 0, 1);
    return a;
}

// B of n-tiles n0..n0+7 (b[0]) and n0+8..n0+15 (b[1]), k k0..k0+15, of tile s ([n][k]):
// matrices (n, k) = (0, 0), (0, 8), (8, 0), (8, 8).
__device__ __forceinline__ void load_b2(FragB (&b)[2], const real* s, int n0, int k0) {
    ldsm_x4<false>(b[0].r[0], b[0].r[1], b[1].r[0], b[1].r[1], s, n0, k0, 1, 0);
}

// The same B fragments of tile s stored [k][n], transposed by ldmatrix: matrices (k, n) =
// (0, 0), (8, 0), (0, 8), (8, 8).
__device__ __forceinline__ void load_bt2(FragB (&b)[2], const real* s, int k0, int n0) {
    ldsm_x4<true>(b[0].r[0], b[0].r[1], b[1].r[0], b[1].r[1], s, k0, n0, 0, 1);
}

// The A fragment of C tiles c0 (columns 0..7 become k 0..7) and c1 (columns 8..15).
__device__ __forceinline__ FragA c_to_a(const float* c0, const float* c1) {
    FragA a;
    a.r[0] = pack2(c0[0], c0[1]);  // row g,     k 2t, 2t + 1
    a.r[1] = pack2(c0[2], c0[3]);  // row g + 8, k 2t, 2t + 1
    a.r[2] = pack2(c1[0], c1[1]);  // row g,     k 2t + 8, 2t + 9
    a.r[3] = pack2(c1[2], c1[3]);  // row g + 8, k 2t + 8, 2t + 9
    return a;
}

__device__ __forceinline__ void store2(real* p, float x, float y) {
    *reinterpret_cast<unsigned*>(p) = pack2(x, y);
}
#endif
#include "philox.cuh"
#if FA_DROPOUT
struct Drop { unsigned step, seed, stream, thresh; };

// Element n of the flat (B, H, T, T) probabilities is kept iff word n % 4 of the block n / 4
// (counter (n/4 low, n/4 high, step, 0), key (seed, stream)), shifted to its top 24 bits,
// reaches the threshold: ops/dropout/philox.py's dropout_bits.
__device__ __forceinline__ rf_u32x4 fa_block(unsigned long long blk, const Drop& d) {
    return rf_philox4((unsigned)blk, (unsigned)(blk >> 32), d.step, 0u, d.seed, d.stream);
}

__device__ __forceinline__ bool keep1(long long n, const Drop& d) {
    return rf_dropout_bits((unsigned long long)n, d.step, d.seed, d.stream) >= d.thresh;
}

// A Philox word's keep bit.
__device__ __forceinline__ bool kept(unsigned word, const Drop& d) {
    return (word >> 8) >= d.thresh;
}

// Elements n and n + 1 (one Philox block unless n % 4 == 3).
__device__ __forceinline__ void keep2(long long n, const Drop& d, bool& k0, bool& k1) {
    const unsigned long long blk = (unsigned long long)n >> 2;
    const int w = (int)(n & 3);
    const rf_u32x4 r = fa_block(blk, d);
    k0 = kept(rf_word(r, w), d);
    if (w < 3) k1 = kept(rf_word(r, w + 1), d);
    else k1 = kept(fa_block(blk + 1, d).w[0], d);
}

// The keep bits of a lane's C elements of one n-tile in fa_fwd and fa_bwd_dq: elements n,
// n + 1 (row a) and m, m + 1 (row b). aligned (T % 4 == 0): every row starts a Philox block,
// n % 4 = 2 (t & 1), and lanes t, t ^ 1 hold the two halves of the same two blocks (one a
// row), so each draws one block and they swap halves: half the draws of keep2.
__device__ __forceinline__ void keep_rows(long long n, long long m, bool aligned,
                                          const Drop& d, bool (&kp)[4]) {
    if (aligned) {
        const bool odd = threadIdx.x & 1;  // t & 1: draws row b's block, holds words 2, 3
        const rf_u32x4 r = fa_block((unsigned long long)(odd ? m : n) >> 2, d);
        const unsigned own0 = odd ? r.w[2] : r.w[0], own1 = odd ? r.w[3] : r.w[1];
        const unsigned got0 = __shfl_xor_sync(FULL, odd ? r.w[0] : r.w[2], 1);
        const unsigned got1 = __shfl_xor_sync(FULL, odd ? r.w[1] : r.w[3], 1);
        kp[0] = kept(odd ? got0 : own0, d);
        kp[1] = kept(odd ? got1 : own1, d);
        kp[2] = kept(odd ? own0 : got0, d);
        kp[3] = kept(odd ? own1 : got1, d);
    } else {
        keep2(n, d, kp[0], kp[1]);
        keep2(m, d, kp[2], kp[3]);
    }
}

// The keep bits of a lane's C elements of one n-tile in fa_bwd_dkdv, element (key, query i)
// being n = (bh T + i) T + key: n, n + T (the next query), n + 8, n + T + 8 (key + 8).
// aligned (T % 4 == 0): n % 4 = g % 4, and lanes g = 4u..4u+3 (same t, lanes 4 apart) hold
// word g % 4 of the same 4 blocks, so each draws the block of its element j = g % 4 and
// lane g ^ x passes it word g % 4 of the block of element j ^ x: a quarter of keep1's draws.
__device__ __forceinline__ void keep_keys(long long n, int T, bool aligned, const Drop& d,
                                          bool (&kp)[4]) {
    if (aligned) {
        const int j = (threadIdx.x >> 2) & 3;
        const long long nj = n + (j & 1 ? T : 0) + (j & 2 ? 8 : 0);
        const rf_u32x4 r = fa_block((unsigned long long)nj >> 2, d);
        rf_u32x4 w;  // w.w[x]: word j of the block of element j ^ x
        w.w[0] = rf_word(r, j);
#pragma unroll
        for (int x = 1; x < 4; ++x) w.w[x] = __shfl_xor_sync(FULL, rf_word(r, j ^ x), 4 * x);
#pragma unroll
        for (int e = 0; e < 4; ++e) kp[e] = kept(rf_word(w, e ^ j), d);
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) kp[e] = keep1(n + (e & 1 ? T : 0) + (e & 2 ? 8 : 0), d);
    }
}
#endif
// Arrays are (B, H, T, HEAD_DIM) views with element strides (sb, sh, st, 1) (see the module
// docstring); the Python side guarantees that every row starts 16-byte aligned. Offsets are
// 64-bit: a view of a packed array spans more elements than it holds, and B*H*T*HEAD_DIM
// itself may pass 2^31.
// Element (b, h, 0, 0) of this block's head, blockIdx.y = b*H + h.
__device__ __forceinline__ long long head_offset(int H, long long sb, long long sh) {
    const int bh = blockIdx.y;  // < 65536: 32-bit division
    return (bh / H) * sb + (bh % H) * sh;
}

// Global -> shared copies that bypass the registers and complete asynchronously (cp.async):
// a thread's copies since its last commit form a group, and wait<n> returns once all but its
// n newest groups have landed; a barrier after it publishes them to the block. A src_bytes
// of 0 reads nothing and writes zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

// Starts copying rows row0..row0+63 of a (T, HEAD_DIM) matrix of row stride st into tile dst,
// rows past T as zeros (so that padded keys and values are 0, never garbage times 0).
// 16-byte copies, coalesced within a row; a row past T copies from row 0, which exists.
__device__ __forceinline__ void load_tile(real* dst, const real* src, int row0, int T,
                                          long long st) {
    constexpr int VEC = 16 / sizeof(real), VPR = HEAD_DIM / VEC;
#pragma unroll
    for (int idx = threadIdx.x; idx < BN * VPR; idx += NTHREADS) {
        const int r = idx / VPR, c = (idx % VPR) * VEC;
        const bool in = row0 + r < T;
        cp_async16(dst + tile_at(r, c), src + (in ? (row0 + r) * st + c : 0), in ? 16 : 0);
    }
}

// Tiles a and b (row strides sa, sb) of rows row0.. into dst and dst + TILE: one stage of
// the pipelines below.
__device__ __forceinline__ void load_tiles(real* dst, const real* a, long long sa,
                                           const real* b, long long sb, int row0, int T) {
    load_tile(dst, a, row0, T, sa);
    load_tile(dst + TILE, b, row0, T, sb);
}
// The key (fa_fwd, fa_bwd_dq) or query (fa_bwd_dkdv) tiles a block loops over are copied in
// by cp.async, into STAGES stages of shared memory. The kernel's prologue copies the first
// tile (and the block's own tiles) as one commit group. With two stages, iteration i first
// starts the copy of tile i + 1 into the other stage, which then runs under the work on
// tile i; with one, iteration i copies tile i + 1 after its work. Either way iteration i
// calls stage_ready() before its work and ends with a barrier, as the next copy overwrites
// the stage it read.
__device__ __forceinline__ void stage_ready() {
    cp_async_commit();  // possibly empty: wait<STAGES - 1> still lets only the prefetch run on
    cp_async_wait<STAGES - 1>();  // this thread's copies of the current tile have landed
    __syncthreads();              // and everyone's
}

// Sets to `fill` the elements of a warp's 16 x 64 C tiles s that the causal mask hides or
// that lie past T (lane rows row_a, row_a + 8; columns col0 + 8 nt + 0, 1): keys after the
// query (where rows are queries; KEY_ROWS: where rows are keys) and queries or keys >= T.
// Only tiles on the diagonal (and, for key rows, the last query tile) have any: the kernels
// call it there alone.
template <bool KEY_ROWS>
__device__ __forceinline__ void mask_tile(float (&s)[NNT][4], int row_a, int col0, int T,
                                          float fill) {
#pragma unroll
    for (int nt = 0; nt < NNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = e < 2 ? row_a : row_a + 8, col = col0 + nt * 8 + (e & 1);
            if (KEY_ROWS ? row > col || col >= T : col > row || col >= T) s[nt][e] = fill;
        }
    }
}

// c[0], c[1] (n-tiles n0, n0 + 8) += a times B (k k0..k0+15) read from tile s, stored [n][k]
// or, KN, [k][n].
template <bool KN>
__device__ __forceinline__ void mma2(float (*c)[4], const FragA& a, const real* s, int n0,
                                     int k0) {
    FragB b[2];
    if constexpr (KN) load_bt2(b, s, k0, n0);
    else load_b2(b, s, n0, k0);
    mma16(c[0], a, b[0]);
    mma16(c[1], a, b[1]);
}

// Where a lane of fa_fwd and fa_bwd_dq works: query tile qt (blocks run the longest rows
// first) of head bh = blockIdx.y. It holds rows row_a = qt BM + 16 warp + g (C elements 0,
// 1) and row_b = row_a + 8 (2, 3) of its warp's 16, and in each 8-wide n-tile the columns
// 2t, 2t + 1.
struct QueryLane {
    int warp, t, qt, row_a, row_b;
    long long bh;
};
__device__ __forceinline__ QueryLane query_lane() {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qt = gridDim.x - 1 - blockIdx.x, row_a = qt * BM + warp * 16 + (lane >> 2);
    return {warp, lane & 3, qt, row_a, row_a + 8, (long long)blockIdx.y};
}

// The key-tile loop of fa_fwd and fa_bwd_dq: key tiles 0..qt of a head's k and v (row
// stride st) through the stages at KV (see stage_ready), body(kt, Ks, Vs) on each.
template <typename Body>
__device__ __forceinline__ void over_key_tiles(real* KV, const real* k, const real* v,
                                               long long st, int qt, int T, Body&& body) {
    for (int kt = 0; kt <= qt; ++kt) {
        const auto copy_next = [&] {
            load_tiles(KV + (kt + 1) % STAGES * 2 * TILE, k, st, v, st, (kt + 1) * BN, T);
        };
        if (STAGES == 2 && kt < qt) copy_next();
        stage_ready();
        const real* Ks = KV + kt % STAGES * 2 * TILE;
        body(kt, Ks, Ks + TILE);
        __syncthreads();
        if (STAGES == 1 && kt < qt) copy_next();
    }
}

// Rows row_a and row_a + 8 (those < T) of a warp's 16 x HEAD_DIM C tiles acc, the lane's
// columns 2t, 2t + 1 of each n-tile, times sa and sb, into dst (row stride st).
__device__ __forceinline__ void store_rows(real* dst, long long st, const float (&acc)[DNT][4],
                                           int row_a, int t, int T, float sa, float sb) {
#pragma unroll
    for (int nt = 0; nt < DNT; ++nt) {
        const int col = nt * 8 + 2 * t;
        if (row_a < T) store2(dst + row_a * st + col, acc[nt][0] * sa, acc[nt][1] * sa);
        if (row_a + 8 < T)
            store2(dst + (row_a + 8) * st + col, acc[nt][2] * sb, acc[nt][3] * sb);
    }
}

// O and lse of query tile qt (blocks run the longest rows first) of head bh = blockIdx.y.
// A lane holds rows row_a = q0 + g (C elements 0, 1) and row_b = row_a + 8 (2, 3) of its
// warp's 16, and in each 8-wide n-tile the columns 2t, 2t + 1. q, k, v have element strides
// (qsb, qsh, qst, 1), o (osb, osh, ost, 1); lse is contiguous (B, H, T).
extern "C" __global__ void __launch_bounds__(NTHREADS)
fa_fwd(const real* __restrict__ q, const real* __restrict__ k, const real* __restrict__ v,
       real* __restrict__ o, float* __restrict__ lse, int T, int H, long long qsb,
       long long qsh, long long qst, long long osb, long long osh, long long ost, float scale,
       const int* __restrict__ step, unsigned seed, unsigned stream, unsigned thresh,
       float inv_keep) {
    const QueryLane r = query_lane();
    const long long qoff = head_offset(H, qsb, qsh), ooff = head_offset(H, osb, osh);
    real* Qs = reinterpret_cast<real*>(fa_smem);  // this block's queries
    real* KV = Qs + TILE;  // stage s: a tile of keys at KV + 2s TILE, its values after it
#if FA_DROPOUT
    const Drop dr = {(unsigned)step[0], seed, stream, thresh};
    const long long base_a = (r.bh * T + r.row_a) * (long long)T, base_b = base_a + 8LL * T;
#endif
    load_tile(Qs, q + qoff, r.qt * BM, T, qst);
    load_tiles(KV, k + qoff, qst, v + qoff, qst, 0, T);
    cp_async_commit();

    float acc[DNT][4] = {};  // O of rows a, b (unnormalised)
    float m_a = NEG_INF, m_b = NEG_INF, l_a = 0.f, l_b = 0.f;  // running max (log2), sum
    const float sl2 = scale * LOG2E;  // scores in log2 units: exp(x) = exp2(x log2 e)
    over_key_tiles(KV, k + qoff, v + qoff, qst, r.qt, T, [&](int kt, const real* Ks,
                                                          const real* Vs) {
        float s[NNT][4] = {};  // S = Q K^T: 16 rows x 64 keys per warp
#pragma unroll
        for (int c = 0; c < DCH; ++c) {
            const FragA a = load_a(Qs, r.warp * 16, 16 * c);
#pragma unroll
            for (int nt = 0; nt < NNT; nt += 2) mma2<false>(s + nt, a, Ks, nt * 8, 16 * c);
        }

        // Causal mask on the diagonal tile only (every row sees key kt * BN, so no row of a
        // tile is all -inf and the running max is finite from the first tile on).
        const int col0 = kt * BN + 2 * r.t;
#pragma unroll
        for (int nt = 0; nt < NNT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] *= sl2;
        }
        if (kt == r.qt) mask_tile<false>(s, r.row_a, col0, T, NEG_INF);
        float mx_a = NEG_INF, mx_b = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < NNT; ++nt) {
            mx_a = fmaxf(mx_a, fmaxf(s[nt][0], s[nt][1]));
            mx_b = fmaxf(mx_b, fmaxf(s[nt][2], s[nt][3]));
        }
        // a row's 64 columns are spread over the 4 lanes of a group (t = 0..3)
        mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL, mx_a, 1));
        mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL, mx_a, 2));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL, mx_b, 1));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL, mx_b, 2));
        const float new_a = fmaxf(m_a, mx_a), new_b = fmaxf(m_b, mx_b);
        const float alpha_a = exp2f(m_a - new_a), alpha_b = exp2f(m_b - new_b);  // 0 at first
        m_a = new_a;
        m_b = new_b;
        float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
        for (int nt = 0; nt < NNT; ++nt) {
            s[nt][0] = exp2f(s[nt][0] - new_a);
            s[nt][1] = exp2f(s[nt][1] - new_a);
            s[nt][2] = exp2f(s[nt][2] - new_b);
            s[nt][3] = exp2f(s[nt][3] - new_b);
            sum_a += s[nt][0] + s[nt][1];
            sum_b += s[nt][2] + s[nt][3];
        }
        l_a = l_a * alpha_a + sum_a;  // this lane's columns; summed over the group at the end
        l_b = l_b * alpha_b + sum_b;
#pragma unroll
        for (int nt = 0; nt < DNT; ++nt) {
            acc[nt][0] *= alpha_a; acc[nt][1] *= alpha_a;
            acc[nt][2] *= alpha_b; acc[nt][3] *= alpha_b;
        }
#if FA_DROPOUT
        // the normaliser above is the un-dropped one; only P V sees the mask
#pragma unroll
        for (int nt = 0; nt < NNT; ++nt) {
            bool kp[4];
            keep_rows(base_a + col0 + nt * 8, base_b + col0 + nt * 8, (T & 3) == 0, dr, kp);
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = kp[e] ? s[nt][e] * inv_keep : 0.f;
        }
#endif
        // O += P V: the C fragments of P are the A fragments of this product
#pragma unroll
        for (int kk = 0; kk < KCH; ++kk) {
            const FragA p = c_to_a(s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int nt = 0; nt < DNT; nt += 2) mma2<true>(acc + nt, p, Vs, nt * 8, 16 * kk);
        }
    });

    l_a += __shfl_xor_sync(FULL, l_a, 1);
    l_a += __shfl_xor_sync(FULL, l_a, 2);
    l_b += __shfl_xor_sync(FULL, l_b, 1);
    l_b += __shfl_xor_sync(FULL, l_b, 2);
    const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
    store_rows(o + ooff, ost, acc, r.row_a, r.t, T, inv_a, inv_b);
    if (r.t == 0) {
        if (r.row_a < T) lse[r.bh * T + r.row_a] = (m_a + log2f(l_a)) * LN2;
        if (r.row_b < T) lse[r.bh * T + r.row_b] = (m_b + log2f(l_b)) * LN2;
    }
}
// 8 consecutive elements from p (16-byte aligned) as floats.
__device__ __forceinline__ void load8(const real* p, float (&x)[8]) {
    constexpr int VEC = 16 / sizeof(real);
#pragma unroll
    for (int h = 0; h < 8 / VEC; ++h) {
        const uint4 v = *reinterpret_cast<const uint4*>(p + h * VEC);
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < VEC; ++i) x[h * VEC + i] = word_to_float(w[i * 4 / VEC], i);
    }
}

// D_i = sum_d dO[i, d] O[i, d] (float32) of head bh = blockIdx.y; o and dO have element
// strides (osb, osh, ost, 1), dd is contiguous (B, H, T). The sum is the one of a warp per
// row in which lane l adds up columns l, l + 32, ... in turn and the lanes are then summed
// by a butterfly (xor 16, 8, 4, 2, 1). Here 4 lanes share a row with 16-byte loads: lane u
// stands for the 8 lanes l = 8u..8u+7 (their columns are its loads' 8 consecutive ones), the
// butterfly's xor 16 and 8 are lanes u ^ 2 and u ^ 1, and xor 4, 2, 1 stay within a lane.
extern "C" __global__ void __launch_bounds__(NTHREADS)
fa_bwd_pre(const real* __restrict__ o, const real* __restrict__ dout, float* __restrict__ dd,
           int T, int H, long long osb, long long osh, long long ost) {
    const int row = blockIdx.x * (NTHREADS / 4) + (threadIdx.x >> 2), u = threadIdx.x & 3;
    // a row past T reads row 0 and stores nothing: every lane takes part in the shuffles
    const long long off = head_offset(H, osb, osh) + (row < T ? row : 0) * ost + 8 * u;
    float s[8] = {};  // the sums of lanes 8u..8u+7
#pragma unroll
    for (int j = 0; j < HEAD_DIM / 32; ++j) {
        float a[8], b[8];
        load8(o + off + 32 * j, a);
        load8(dout + off + 32 * j, b);
#pragma unroll
        for (int i = 0; i < 8; ++i) s[i] += a[i] * b[i];
    }
#pragma unroll
    for (int m = 2; m > 0; m >>= 1) {
#pragma unroll
        for (int i = 0; i < 8; ++i) s[i] += __shfl_xor_sync(FULL, s[i], m);
    }
#pragma unroll
    for (int m = 4; m > 0; m >>= 1) {
        float r[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) r[i] = s[i] + s[i ^ m];
#pragma unroll
        for (int i = 0; i < 8; ++i) s[i] = r[i];
    }
    if (u == 0 && row < T) dd[(long long)blockIdx.y * T + row] = s[0];
}

// dQ of query tile qt: for each key tile at or left of the diagonal, S = Q K^T and
// dP = dO V^T again, P = exp(scale S - lse), dS = P (dP * mask - D) scale, dQ += dS K.
// Rows as in fa_fwd; q, k, v, dq have element strides (qsb, qsh, qst, 1), dO (osb, osh, ost, 1).
extern "C" __global__ void __launch_bounds__(NTHREADS)
fa_bwd_dq(const real* __restrict__ q, const real* __restrict__ k, const real* __restrict__ v,
          const real* __restrict__ dout, const float* __restrict__ lse,
          const float* __restrict__ dd, real* __restrict__ dq, int T, int H, long long qsb,
          long long qsh, long long qst, long long osb, long long osh, long long ost,
          float scale, const int* __restrict__ step, unsigned seed, unsigned stream,
          unsigned thresh, float inv_keep) {
    const QueryLane r = query_lane();
    const long long qoff = head_offset(H, qsb, qsh), ooff = head_offset(H, osb, osh);
    real* Qs = reinterpret_cast<real*>(fa_smem);  // this block's queries
    real* Gs = Qs + TILE;                          // their dO
    real* KV = Gs + TILE;  // stage s: a tile of keys at KV + 2s TILE, its values after it
#if FA_DROPOUT
    const Drop dr = {(unsigned)step[0], seed, stream, thresh};
    const long long base_a = (r.bh * T + r.row_a) * (long long)T, base_b = base_a + 8LL * T;
#endif
    load_tiles(Qs, q + qoff, qst, dout + ooff, ost, r.qt * BM, T);  // Qs, Gs
    load_tiles(KV, k + qoff, qst, v + qoff, qst, 0, T);
    cp_async_commit();
    // padded rows (>= T) have Q = dO = 0; their stats are set to 0 and their dQ not stored
    const float lse_a = r.row_a < T ? lse[r.bh * T + r.row_a] * LOG2E : 0.f;
    const float lse_b = r.row_b < T ? lse[r.bh * T + r.row_b] * LOG2E : 0.f;
    const float d_a = r.row_a < T ? dd[r.bh * T + r.row_a] : 0.f;
    const float d_b = r.row_b < T ? dd[r.bh * T + r.row_b] : 0.f;

    float acc[DNT][4] = {};  // dQ of rows a, b
    const float sl2 = scale * LOG2E;
    over_key_tiles(KV, k + qoff, v + qoff, qst, r.qt, T, [&](int kt, const real* Ks,
                                                          const real* Vs) {
        float s[NNT][4] = {}, dp[NNT][4] = {};  // S = Q K^T, dP = dO V^T (16 x 64 per warp)
#pragma unroll
        for (int c = 0; c < DCH; ++c) {
            const FragA a = load_a(Qs, r.warp * 16, 16 * c), b = load_a(Gs, r.warp * 16, 16 * c);
#pragma unroll
            for (int nt = 0; nt < NNT; nt += 2) {
                mma2<false>(s + nt, a, Ks, nt * 8, 16 * c);
                mma2<false>(dp + nt, b, Vs, nt * 8, 16 * c);
            }
        }
        const int col0 = kt * BN + 2 * r.t;
#pragma unroll
        for (int nt = 0; nt < NNT; ++nt) {  // P
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s[nt][e] = exp2f(s[nt][e] * sl2 - (e < 2 ? lse_a : lse_b));
        }
        if (kt == r.qt) mask_tile<false>(s, r.row_a, col0, T, 0.f);
#pragma unroll
        for (int nt = 0; nt < NNT; ++nt) {
            bool kp[4] = {true, true, true, true};
#if FA_DROPOUT
            keep_rows(base_a + col0 + nt * 8, base_b + col0 + nt * 8, (T & 3) == 0, dr, kp);
#endif
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = s[nt][e];
                const float dpm = kp[e] ? dp[nt][e] * inv_keep : 0.f;  // dropped: dP = 0
                s[nt][e] = p * (dpm - (e < 2 ? d_a : d_b)) * scale;   // dS (0 where masked)
            }
        }
        // dQ += dS K: B element (k = key, n = d) is the key tile's (key, d)
#pragma unroll
        for (int kk = 0; kk < KCH; ++kk) {
            const FragA a = c_to_a(s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int nt = 0; nt < DNT; nt += 2) mma2<true>(acc + nt, a, Ks, nt * 8, 16 * kk);
        }
    });
    store_rows(dq + qoff, qst, acc, r.row_a, r.t, T, 1.f, 1.f);
}

// A stage of fa_bwd_dkdv: query rows row0..row0+63 of q and dO (row strides qst, ost) into
// dst and dst + TILE, and their lse and D into stats[0..63] and stats[64..127] (0 past T;
// lse, dd point at this head's T values).
__device__ __forceinline__ void load_queries(real* dst, float* stats, const real* q,
                                             long long qst, const real* dout, long long ost,
                                             const float* lse, const float* dd, int row0,
                                             int T) {
    load_tiles(dst, q, qst, dout, ost, row0, T);
    const int i = row0 + (threadIdx.x & (BM - 1));  // NTHREADS = 2 BM: one value a thread
    cp_async4(stats + threadIdx.x, (threadIdx.x < BM ? lse : dd) + (i < T ? i : 0),
              i < T ? 4 : 0);
}

// dK, dV of key tile kt = blockIdx.x (the first key tiles have the most query tiles, and
// start first): for each query tile at or below the diagonal, S^T = K Q^T and
// dP^T = V dO^T, then dV += (P * mask)^T dO and dK += dS^T Q. A lane holds keys
// key_a = k0 + g (C elements 0, 1) and key_b = key_a + 8 (2, 3); its columns are queries.
// Strides as in fa_bwd_dq (dk, dv those of q, k, v).
extern "C" __global__ void __launch_bounds__(NTHREADS, DKDV_MIN_BLOCKS)
fa_bwd_dkdv(const real* __restrict__ q, const real* __restrict__ k,
            const real* __restrict__ v, const real* __restrict__ dout,
            const float* __restrict__ lse, const float* __restrict__ dd,
            real* __restrict__ dk, real* __restrict__ dv, int T, int H, long long qsb,
            long long qsh, long long qst, long long osb, long long osh, long long ost,
            float scale, const int* __restrict__ step, unsigned seed, unsigned stream,
            unsigned thresh, float inv_keep) {
    real* Ks = reinterpret_cast<real*>(fa_smem);  // this block's keys
    real* Vs = Ks + TILE;                          // their values
    real* QG = Vs + TILE;  // stage s: a tile of queries at QG + 2s TILE, their dO after it
    float* stats = reinterpret_cast<float*>(QG + STAGES * 2 * TILE);  // s: [BM] lse, [BM] D_i
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int kt = blockIdx.x, n_qt = gridDim.x;
    const long long bh = blockIdx.y;
    const long long qoff = head_offset(H, qsb, qsh), ooff = head_offset(H, osb, osh);
    const int key_a = kt * BN + warp * 16 + (lane >> 2), key_b = key_a + 8;
#if FA_DROPOUT
    const Drop dr = {(unsigned)step[0], seed, stream, thresh};
#endif
    const float* lse_h = lse + bh * T;
    const float* dd_h = dd + bh * T;
    load_tiles(Ks, k + qoff, qst, v + qoff, qst, kt * BN, T);  // Ks, Vs
    load_queries(QG, stats, q + qoff, qst, dout + ooff, ost, lse_h, dd_h, kt * BM, T);
    cp_async_commit();

    float dk_acc[DNT][4] = {}, dv_acc[DNT][4] = {};
    const float sl2 = scale * LOG2E;
    for (int qt = kt; qt < n_qt; ++qt) {
        const int stage = (qt - kt) % STAGES, next = (qt + 1 - kt) % STAGES;
        const auto copy_next = [&] {
            load_queries(QG + next * 2 * TILE, stats + next * 2 * BM, q + qoff, qst,
                         dout + ooff, ost, lse_h, dd_h, (qt + 1) * BM, T);
        };
        if (STAGES == 2 && qt + 1 < n_qt) copy_next();
        stage_ready();
        const real* Qs = QG + stage * 2 * TILE;
        const real* Gs = Qs + TILE;
        const float* Ls = stats + stage * 2 * BM;
        const float* Ds = Ls + BM;

        float st[NNT][4] = {}, dpt[NNT][4] = {};  // S^T = K Q^T, dP^T = V dO^T (16 x 64)
#pragma unroll
        for (int c = 0; c < DCH; ++c) {
            const FragA a = load_a(Ks, warp * 16, 16 * c), b = load_a(Vs, warp * 16, 16 * c);
#pragma unroll
            for (int nt = 0; nt < NNT; nt += 2) {
                mma2<false>(st + nt, a, Qs, nt * 8, 16 * c);
                mma2<false>(dpt + nt, b, Gs, nt * 8, 16 * c);
            }
        }
#pragma unroll
        for (int nt = 0; nt < NNT; ++nt) {  // P^T
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                // lse in log2 units, rounded by itself (__fmul_rn is never fused)
                const float l2 = __fmul_rn(Ls[nt * 8 + 2 * t + (e & 1)], LOG2E);
                st[nt][e] = exp2f(st[nt][e] * sl2 - l2);
            }
        }
        if (qt == kt || (qt + 1) * BM > T) mask_tile<true>(st, key_a, qt * BM + 2 * t, T, 0.f);
#pragma unroll
        for (int nt = 0; nt < NNT; ++nt) {
            bool kp[4] = {true, true, true, true};
#if FA_DROPOUT
            keep_keys((bh * T + qt * BM + nt * 8 + 2 * t) * (long long)T + key_a, T,
                      (T & 3) == 0, dr, kp);
#endif
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int il = nt * 8 + 2 * t + (e & 1);  // the query, within the tile
                const float p = st[nt][e];
                const float dpm = kp[e] ? dpt[nt][e] * inv_keep : 0.f;
                st[nt][e] = kp[e] ? p * inv_keep : 0.f;         // (P * mask)^T
                dpt[nt][e] = p * (dpm - Ds[il]) * scale;        // dS^T
            }
        }
        // dV += (P * mask)^T dO, dK += dS^T Q: B element (k = query, n = d) is the dO /
        // query tile's (query, d)
#pragma unroll
        for (int kk = 0; kk < KCH; ++kk) {
            const FragA pa = c_to_a(st[2 * kk], st[2 * kk + 1]);
            const FragA da = c_to_a(dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
            for (int nt = 0; nt < DNT; nt += 2) {
                mma2<true>(dv_acc + nt, pa, Gs, nt * 8, 16 * kk);
                mma2<true>(dk_acc + nt, da, Qs, nt * 8, 16 * kk);
            }
        }
        __syncthreads();
        if (STAGES == 1 && qt + 1 < n_qt) copy_next();
    }
#pragma unroll
    for (int nt = 0; nt < DNT; ++nt) {
        const int col = nt * 8 + 2 * t;
        if (key_a < T) {
            store2(dk + qoff + key_a * qst + col, dk_acc[nt][0], dk_acc[nt][1]);
            store2(dv + qoff + key_a * qst + col, dv_acc[nt][0], dv_acc[nt][1]);
        }
        if (key_b < T) {
            store2(dk + qoff + key_b * qst + col, dk_acc[nt][2], dk_acc[nt][3]);
            store2(dv + qoff + key_b * qst + col, dv_acc[nt][2], dv_acc[nt][3]);
        }
    }
}
