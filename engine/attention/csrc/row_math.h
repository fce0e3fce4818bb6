/* The arithmetic of one query row, which both attention kernels follow step for step: the
 * decode kernel (paged_cpu.c: decodes and draft verifications, a tile's keys in the lanes of a
 * vector) and the extend kernel (extend_cpu.c: prefill chunks and turn deltas, a block's rows in
 * the lanes). So a row gets the same bits whichever kernel computes it, beside whatever other
 * rows and sequences: decoded alone, verified among drafts, inside an extend of any length and
 * chunking. Each build (-march) has its own, chosen here; both kernels built alike agree.
 * (The one way out: the extend kernel's `amx` option, AMX tiles for a bf16 pool, whose sums
 * follow the tile unit.)
 *
 * Row r: fp32 query q, KV head h, the set V(r) of positions it sees (causal, a window, a tree
 * mask), head_dim D.
 *  1. qs[d] = q[d] * (scale * log2 e) in fp32 (so scores are in log2 units and weights exp2).
 *     With bf16 dot products (RG_DPBF16: an AVX512-BF16 build, a bf16 pool, D even) qs is
 *     rounded to bf16 (nearest even), as torch's bf16 flash kernel rounds q.
 *  2. Positions go in splits of split_len on the grid from 0, each split in tiles of TILE
 *     positions from its start. A split's state (m, l, acc[D]) starts at (-inf, 0, 0); a tile
 *     [p0, p0 + n), j = position - p0:
 *       s_j   = one chain over d ascending, s = fma(qs[d], k_j[d], s) from s = 0 (RG_DPBF16:
 *               s = dpbf16(s, qs pair i, k_j pair i), i ascending); -inf for j not in V(r)
 *       top   = max(m, max_j s_j), safe = top (0 while top is -inf)
 *       corr  = exp2(m - safe), p_j = exp2(s_j - safe) (rg_exp2*; RG_DPBF16: p_j's coarser)
 *       l     = fma(l, corr, sum_j p_j), the sum in the tile's lane tree (rg_sum_keys*)
 *       acc   = acc * corr, then acc = fma(p_j, v_j, acc) for j ascending (RG_DPBF16: p_j
 *               rounded to bf16, acc = dpbf16(acc, (p_2i, p_2i+1), (v_2i, v_2i+1)), i ascending)
 *       m     = top
 *     Builds without AVX2 (plain C, rg_row_tile) round the products of s and acc apart from
 *     their sums, as a CPU without FMA must, and sum the weights in key order.
 *  3. The splits merge in order into (M, L, O) from (-inf, 0, 0) (rg_merge_row).
 *  4. out = O * (1 / (L + exp2(sink * log2 e - M))) + 0 (rg_finish_row; no sink: 1 / L).
 * A position outside V(r) has weight exactly 0, so a kernel may skip it or count it: its
 * product is +-0, which changes at most the sign of a zero sum, and step 4's "+ 0" turns -0
 * into +0. (K/V rows inside a tile must be finite: the rows of positions written by this or an
 * earlier step always are; the kernels give positions they must not read a zero row.)
 *
 * The lane tree (the one part whose order follows the vector width): p_j of a tile of TILE = 64
 * keys sit in RG_VL lanes (key j in lane j % RG_VL of vector j / RG_VL); lane i first sums its
 * keys i, i + RG_VL, ... in order, then the lanes add in halves (lane i + lane i + RG_VL / 2,
 * and so on down to one). A kernel with keys in lanes does just that; one with rows in lanes
 * adds its per-key vectors in the same pattern (the same 63 adds as a plain sum).
 */
#ifndef RADIXGATE_ROW_MATH_H
#define RADIXGATE_ROW_MATH_H

#include <math.h>
#include <stdint.h>

#define TILE 64   /* positions a tile holds, at most */
#define LOG2E 1.4426950408889634f

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define RG_AVX512 1
#define RG_VL 16
#if defined(__AVX512BF16__)
#define RG_DPBF16 1
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RG_AVX2 1
#define RG_VL 8
#else
#define RG_VL 1
#endif

#ifdef RG_AVX512
/* 2^x on sixteen lanes for finite x: x = n + f with n the nearest integer and |f| <= 1/2,
 * 2^f = 1 + f q(f) with q fitted for the least relative error (p(0) = 1 exactly, so a row
 * whose max stays put keeps its sums), 2^n applied by scalef (0 below 2^-149). Degree 6
 * (relative error 8e-8, fp32's own rounding) for fp32 weights; `coarse`: degree 4 (3e-6), for
 * weights rounded to bf16 next (2^-9), two FMAs fewer in the kernels' busiest loop. */
static inline __attribute__((always_inline)) __m512 rg_exp2_16_finite(__m512 x, const int coarse) {
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n), q;
    if (coarse) {
        q = _mm512_set1_ps(9.582818485796452e-3f);
        q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(5.590637028217316e-2f));
        q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(2.4024099111557007e-1f));
        q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(6.931241750717163e-1f));
    } else {
        q = _mm512_set1_ps(1.5353341586887836e-4f);
        q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(1.3398872688412666e-3f));
        q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(9.618437848985195e-3f));
        q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(5.5503323674201965e-2f));
        q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(2.4022647738456726e-1f));
        q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(6.931471824645996e-1f));
    }
    return _mm512_scalef_ps(_mm512_fmadd_ps(q, f, _mm512_set1_ps(1.0f)), n);
}

/* rg_exp2_16_finite for any x, -inf included (0): x below -200 gives 0 either way, so the two
 * agree on every finite x. */
static inline __attribute__((always_inline)) __m512 rg_exp2_16(__m512 x, const int coarse) {
    return rg_exp2_16_finite(_mm512_max_ps(x, _mm512_set1_ps(-200.0f)), coarse);
}

/* The same 2^x for one value (a lane of the vector form, so the two agree). */
static inline float rg_exp2(float x) { return _mm512_cvtss_f32(rg_exp2_16(_mm512_set1_ps(x), 0)); }

/* The lane tree of a tile's weights, keys in lanes: p[k] holds keys 16k .. 16k + 15. */
static inline float rg_sum_keys16(const __m512 p[4]) {
    __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(p[0], p[1]), p[2]), p[3]);
    __m256 u = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    __m128 w = _mm_add_ps(v, _mm_movehl_ps(v, v));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
}

/* Transposes a 16 x 16 block of 32-bit elements held in r[0..15] (rows). Written out with
 * no inner arrays, so that once inlined the block stays in registers. */
static inline __attribute__((always_inline)) void rg_transpose16(__m512i r[16]) {
#define RG_UNPACK32(k) \
    __m512i t##k##a = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]); \
    __m512i t##k##b = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    RG_UNPACK32(0) RG_UNPACK32(1) RG_UNPACK32(2) RG_UNPACK32(3)
    RG_UNPACK32(4) RG_UNPACK32(5) RG_UNPACK32(6) RG_UNPACK32(7)
#undef RG_UNPACK32
    /* u<k><c>, 128-bit lane L: column 4L + c of rows 4k..4k+3. */
#define RG_UNPACK64(k, x, y) \
    __m512i u##k##0 = _mm512_unpacklo_epi64(t##x##a, t##y##a); \
    __m512i u##k##1 = _mm512_unpackhi_epi64(t##x##a, t##y##a); \
    __m512i u##k##2 = _mm512_unpacklo_epi64(t##x##b, t##y##b); \
    __m512i u##k##3 = _mm512_unpackhi_epi64(t##x##b, t##y##b);
    RG_UNPACK64(0, 0, 1) RG_UNPACK64(1, 2, 3) RG_UNPACK64(2, 4, 5) RG_UNPACK64(3, 6, 7)
#undef RG_UNPACK64
#define RG_LANES(c) { \
        __m512i v0 = _mm512_shuffle_i32x4(u0##c, u1##c, 0x44); \
        __m512i v1 = _mm512_shuffle_i32x4(u2##c, u3##c, 0x44); \
        __m512i w0 = _mm512_shuffle_i32x4(u0##c, u1##c, 0xEE); \
        __m512i w1 = _mm512_shuffle_i32x4(u2##c, u3##c, 0xEE); \
        r[c] = _mm512_shuffle_i32x4(v0, v1, 0x88); \
        r[4 + c] = _mm512_shuffle_i32x4(v0, v1, 0xDD); \
        r[8 + c] = _mm512_shuffle_i32x4(w0, w1, 0x88); \
        r[12 + c] = _mm512_shuffle_i32x4(w0, w1, 0xDD); }
    RG_LANES(0) RG_LANES(1) RG_LANES(2) RG_LANES(3)
#undef RG_LANES
}
#elif defined(RG_AVX2)
/* 2^x on eight lanes, exactly 0 below -126 (-inf included: a masked key weighs nothing): x =
 * n + f with n the nearest integer, 2^f by rg_exp2_16_finite's degree-6 polynomial, 2^n
 * built in the exponent bits. */
static inline __m256 rg_exp2_8(__m256 x) {
    __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-126.0f));
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n);
    __m256 q = _mm256_set1_ps(1.5353341586887836e-4f);
    q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(1.3398872688412666e-3f));
    q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(9.618437848985195e-3f));
    q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(5.5503323674201965e-2f));
    q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(2.4022647738456726e-1f));
    q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(6.931471824645996e-1f));
    __m256 p = _mm256_fmadd_ps(q, f, _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
}

static inline float rg_exp2(float x) { return _mm256_cvtss_f32(rg_exp2_8(_mm256_set1_ps(x))); }

/* The lane tree of a tile's weights, keys in lanes: p[k] holds keys 8k .. 8k + 7. */
static inline float rg_sum_keys8(const __m256 p[8]) {
    __m256 t = p[0];
    for (int k = 1; k < 8; k++) t = _mm256_add_ps(t, p[k]);
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}
#else
static inline float rg_exp2(float x) { return exp2f(x); }

/* One row through a tile in plain C (the builds without AVX2, whose lane tree is one lane: a
 * plain sum in key order), shared by both kernels. q: qs[d] at q[d * q_step]; k[j], v[j]: the
 * tile's n fp32 rows; `vis`: bit j set for the positions the row sees; acc[d] at
 * acc[d * acc_step]; p: n floats of scratch. */
static void rg_row_tile(const float *q, int64_t q_step, const float *const *k,
                        const float *const *v, int n, uint64_t vis, int64_t d_len, float *m,
                        float *l, float *acc, int64_t acc_step, float *p) {
    float top = *m;
    for (int j = 0; j < n; j++) {
        if (!((vis >> j) & 1)) {
            p[j] = -INFINITY;
            continue;
        }
        float x = 0.0f;
        for (int64_t d = 0; d < d_len; d++) x += q[d * q_step] * k[j][d];
        p[j] = x;
        top = x > top ? x : top;
    }
    if (top == -INFINITY) return; /* sees none of the tile: a no-op (corr 1, weights 0) */
    float corr = exp2f(*m - top), sum = 0.0f;
    for (int j = 0; j < n; j++) {
        p[j] = exp2f(p[j] - top);
        sum += p[j];
    }
    *l = fmaf(*l, corr, sum);
    *m = top;
    for (int64_t d = 0; d < d_len; d++) {
        float x = acc[d * acc_step] * corr;
        for (int j = 0; j < n; j++) x += p[j] * v[j][d];
        acc[d * acc_step] = x;
    }
}
#endif

/* Step 3 for one row: (M, L, O) takes in a split's (m, l, acc) (acc[d] at acc[d * acc_step],
 * O[d] at O[d * o_step]). The extend kernel's lane-wise form (rg_merge_lanes) is the same
 * arithmetic on sixteen or eight rows at once. */
static inline void rg_merge_row(float *M, float *L, float *O, int64_t o_step, float m, float l,
                                const float *acc, int64_t acc_step, int64_t d_len) {
    float top = *M > m ? *M : m, safe = top == -INFINITY ? 0.0f : top;
    float a = rg_exp2(*M - safe), b = rg_exp2(m - safe);
    *L = fmaf(l, b, *L * a);
    for (int64_t d = 0; d < d_len; d++)
        O[d * o_step] = fmaf(acc[d * acc_step], b, O[d * o_step] * a);
    *M = top;
}

#if defined(RG_AVX512)
/* rg_merge_row's factors for sixteen rows in lanes: updates M and L (from m and l), returns in
 * *a and *b what O and acc take (O = fma(acc, b, O * a)). */
static inline __attribute__((always_inline)) void rg_merge_weights16(float *M, float *L,
                                                                     const float *m,
                                                                     const float *l, __m512 *a,
                                                                     __m512 *b) {
    __m512 big = _mm512_loadu_ps(M), small = _mm512_loadu_ps(m);
    __m512 top = _mm512_max_ps(big, small); /* a > b ? a : b, as rg_merge_row's */
    __m512 safe = _mm512_mask_mov_ps(
        top, _mm512_cmp_ps_mask(top, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), _mm512_setzero_ps());
    *a = rg_exp2_16(_mm512_sub_ps(big, safe), 0);
    *b = rg_exp2_16(_mm512_sub_ps(small, safe), 0);
    _mm512_storeu_ps(L, _mm512_fmadd_ps(_mm512_loadu_ps(l), *b, _mm512_mul_ps(_mm512_loadu_ps(L), *a)));
    _mm512_storeu_ps(M, top);
}
#elif defined(RG_AVX2)
/* rg_merge_weights16 on eight rows. */
static inline __attribute__((always_inline)) void rg_merge_weights8(float *M, float *L,
                                                                    const float *m,
                                                                    const float *l, __m256 *a,
                                                                    __m256 *b) {
    __m256 big = _mm256_loadu_ps(M), small = _mm256_loadu_ps(m);
    __m256 top = _mm256_max_ps(big, small);
    __m256 safe = _mm256_andnot_ps(_mm256_cmp_ps(top, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ), top);
    *a = rg_exp2_8(_mm256_sub_ps(big, safe));
    *b = rg_exp2_8(_mm256_sub_ps(small, safe));
    _mm256_storeu_ps(L, _mm256_fmadd_ps(_mm256_loadu_ps(l), *b, _mm256_mul_ps(_mm256_loadu_ps(L), *a)));
    _mm256_storeu_ps(M, top);
}
#endif

/* rg_merge_row on rows [0, rows) in lanes (rows a multiple of RG_VL): M, L, m, l hold a value
 * per row, O and acc (d_len, stride) a row per dim. */
static inline void rg_merge_lanes(float *M, float *L, float *O, const float *m, const float *l,
                                  const float *acc, int64_t d_len, int64_t stride, int64_t rows) {
#if defined(RG_AVX512)
    for (int64_t r = 0; r < rows; r += 16) {
        __m512 a, b;
        rg_merge_weights16(M + r, L + r, m + r, l + r, &a, &b);
        for (int64_t d = 0; d < d_len; d++) {
            float *o = O + d * stride + r;
            _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_loadu_ps(acc + d * stride + r), b,
                                                _mm512_mul_ps(_mm512_loadu_ps(o), a)));
        }
    }
#elif defined(RG_AVX2)
    for (int64_t r = 0; r < rows; r += 8) {
        __m256 a, b;
        rg_merge_weights8(M + r, L + r, m + r, l + r, &a, &b);
        for (int64_t d = 0; d < d_len; d++) {
            float *o = O + d * stride + r;
            _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(acc + d * stride + r), b,
                                                _mm256_mul_ps(_mm256_loadu_ps(o), a)));
        }
    }
#else
    for (int64_t r = 0; r < rows; r++)
        rg_merge_row(M + r, L + r, O + r, stride, m[r], l[r], acc + r, stride, d_len);
#endif
}

/* Step 4 for one row into out[0 .. d_len); `sink` in log2 units (-inf: none). */
static inline void rg_finish_row(float M, float L, const float *O, int64_t o_step, float sink,
                                 float *out, int64_t d_len) {
    if (sink != -INFINITY) L += rg_exp2(sink - (M == -INFINITY ? 0.0f : M));
    float inv = 1.0f / L;
    for (int64_t d = 0; d < d_len; d++) out[d] = O[d * o_step] * inv + 0.0f;
}

#endif
