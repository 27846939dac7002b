// Philox4x32-10, the counter-based generator behind dropout masks: the CUDA C twin of
// ops/dropout/philox.py (tests hold the two to each other and to the published vectors).
struct rf_u32x4 { unsigned int w[4]; };
__device__ __forceinline__ rf_u32x4 rf_philox4(
        unsigned int c0, unsigned int c1, unsigned int c2, unsigned int c3,
        unsigned int k0, unsigned int k1) {
#pragma unroll
    for (int r = 0; r < 10; r++) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    }
    rf_u32x4 out = {{c0, c1, c2, c3}};
    return out;
}
// Word k of a block, selected in registers (an indexed load could go through local memory).
__device__ __forceinline__ unsigned int rf_word(const rf_u32x4& r, int k) {
    return k == 0 ? r.w[0] : k == 1 ? r.w[1] : k == 2 ? r.w[2] : r.w[3];
}
// The 24-bit draw of element i at (step, seed, site): word i % 4 of block i / 4.
__device__ __forceinline__ unsigned int rf_dropout_bits(
        unsigned long long i, unsigned int step, unsigned int seed, unsigned int site) {
    unsigned long long j = i >> 2;
    return rf_word(rf_philox4((unsigned int)j, (unsigned int)(j >> 32), step, 0u, seed, site),
                   (int)(i & 3)) >> 8;
}
