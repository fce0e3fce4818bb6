/* AVX-512 micro-block of the extend attention kernel (extend_cpu.c): one or two vectors of 16
 * query rows (lanes) through one tile of keys. Scores take eight keys at a time: 16 FMAs per
 * dim from two q^T loads and eight broadcast K elements, no horizontal sum. The output takes
 * eight dims at a time over all the tile's keys, its sixteen accumulators in registers.
 * Included only under __AVX512F__ && __AVX512DQ__.
 */
#ifndef RADIXGATE_EXTEND_AVX512_H
#define RADIXGATE_EXTEND_AVX512_H

#include <immintrin.h>

#define JN 8  /* keys a score pass takes together */
#define DN 8  /* dims an output pass takes together */

/* 2^x for x <= 0 on sixteen lanes, 0 for x <= -200 (-inf included): x = n + f with n the
 * nearest integer, 2^f = e^(f ln 2) by its Taylor series (|f ln 2| <= 0.35) and 2^n applied by
 * scalef. Degree 7 (relative error ~1e-8) for fp32 weights; `coarse`: degree 5 (~3e-6), for
 * weights rounded to bf16 next (2^-9), two FMAs fewer in the kernel's busiest loop. */
static inline __attribute__((always_inline)) __m512 ex_exp2(__m512 x, const int coarse) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-200.0f));
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 y = _mm512_mul_ps(_mm512_sub_ps(x, n), _mm512_set1_ps(0.6931471805599453f));
    __m512 p = _mm512_set1_ps(8.3333333e-3f);
    if (!coarse) {
        p = _mm512_set1_ps(1.9841270e-4f);
        p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.3888889e-3f));
        p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(8.3333333e-3f));
    }
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(4.1666667e-2f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.6666667e-1f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Transposes a 16 x 16 block of 32-bit elements held in r[0..15] (rows). */
static inline void ex_transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    /* u[4k + c], 128-bit lane L: column 4L + c of rows 4k..4k+3. */
    for (int k = 0; k < 4; k++) {
        u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    for (int c = 0; c < 4; c++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
        __m512i v1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
        __m512i w0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        __m512i w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_i32x4(v0, v1, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(v0, v1, 0xDD);
        r[8 + c] = _mm512_shuffle_i32x4(w0, w1, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(w0, w1, 0xDD);
    }
}

/* q^T rows r0 .. r0 + 15 (qt[d][r0 + i] = q[i][d] * mul[i]) from the 16 rows' q, in 16 x 16
 * blocks; dims past the last multiple of 16 one by one. */
static void ex_load_q(const Item *it, const float *const *q, const float *mul, int64_t d_len,
                      int64_t r0) {
    int64_t d0 = 0;
    for (; d0 + 16 <= d_len; d0 += 16) {
        __m512i r[16];
        for (int i = 0; i < 16; i++)
            r[i] = _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(q[i] + d0),
                                                     _mm512_set1_ps(mul[i])));
        ex_transpose16(r);
        for (int i = 0; i < 16; i++) _mm512_store_si512(it->qt + (d0 + i) * it->stride + r0, r[i]);
    }
    for (; d0 < d_len; d0++)
        for (int i = 0; i < 16; i++) it->qt[d0 * it->stride + r0 + i] = q[i][d0] * mul[i];
}

/* s[j][u] = q^T rows of vectors v0 + u (u < NV) . k[j], for the NK keys from j0. */
static inline __attribute__((always_inline)) void ex_scores(const Item *it, int64_t d_len,
                                                            int64_t v0, const int NV,
                                                            const float *const *k, int j0,
                                                            const int NK) {
    __m512 acc[JN][MB];
    const float *kj[JN];
    for (int i = 0; i < NK; i++) {
        kj[i] = k[j0 + i];
        for (int u = 0; u < NV; u++) acc[i][u] = _mm512_setzero_ps();
    }
    const float *qt = it->qt + v0 * LANES;
    for (int64_t d = 0; d < d_len; d++) {
        __m512 q[MB];
        for (int u = 0; u < NV; u++) q[u] = _mm512_load_ps(qt + d * it->stride + u * LANES);
        for (int i = 0; i < NK; i++) {
            __m512 b = _mm512_set1_ps(kj[i][d]);
            for (int u = 0; u < NV; u++) acc[i][u] = _mm512_fmadd_ps(q[u], b, acc[i][u]);
        }
    }
    for (int i = 0; i < NK; i++)
        for (int u = 0; u < NV; u++)
            _mm512_store_ps(it->s + (j0 + i) * MB * LANES + u * LANES, acc[i][u]);
}

/* The online softmax step for vector v0 + u over the tile's n scores (masked: keys outside a
 * row's span become -inf): updates m and l, turns the scores into weights, returns the factor
 * the row's earlier output takes. */
static inline __attribute__((always_inline)) __m512 ex_softmax(const Item *it, int64_t v0,
                                                               int u, int64_t p0, int n,
                                                               int masked, const int coarse) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    int64_t row = (v0 + u) * LANES;
    __m512 m_old = _mm512_load_ps(it->m + row), top = m_old;
    __m512i pos = _mm512_load_si512(it->pos + row), lo = _mm512_load_si512(it->lo + row);
    float *s = it->s + u * LANES;
    for (int j = 0; j < n; j++) {
        __m512 x = _mm512_load_ps(s + j * MB * LANES);
        if (masked) {
            __m512i key = _mm512_set1_epi32((int32_t)(p0 + j));
            __mmask16 seen = _mm512_cmp_epi32_mask(key, pos, _MM_CMPINT_LE) &
                             _mm512_cmp_epi32_mask(key, lo, _MM_CMPINT_NLT);
            x = _mm512_mask_mov_ps(neg_inf, seen, x);
            _mm512_store_ps(s + j * MB * LANES, x);
        }
        top = _mm512_max_ps(top, x);
    }
    /* A row that has seen nothing yet keeps m = -inf; it shifts by 0 so that -inf - -inf is
     * never formed. */
    __m512 safe = _mm512_mask_mov_ps(top, _mm512_cmp_ps_mask(top, neg_inf, _CMP_EQ_OQ),
                                     _mm512_setzero_ps());
    __m512 corr = ex_exp2(_mm512_sub_ps(m_old, safe), 0), sum = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        __m512 p = ex_exp2(_mm512_sub_ps(_mm512_load_ps(s + j * MB * LANES), safe), coarse);
        _mm512_store_ps(s + j * MB * LANES, p);
        sum = _mm512_add_ps(sum, p);
    }
    _mm512_store_ps(it->l + row, _mm512_fmadd_ps(_mm512_load_ps(it->l + row), corr, sum));
    _mm512_store_ps(it->m + row, top);
    return corr;
}

/* acc^T rows of vectors v0 + u = acc * corr[u] + sum_j s[j][u] v[j], eight dims at a time. */
static inline __attribute__((always_inline)) void ex_output(const Item *it, int64_t d_len,
                                                            int64_t v0, const int NV,
                                                            const __m512 *corr,
                                                            const float *const *v, int n) {
    float *acc = it->acc + v0 * LANES;
    for (int64_t d0 = 0; d0 < d_len; d0 += DN) {
        __m512 o[DN][MB];
        for (int i = 0; i < DN; i++)
            for (int u = 0; u < NV; u++)
                o[i][u] = _mm512_mul_ps(_mm512_load_ps(acc + (d0 + i) * it->stride + u * LANES),
                                        corr[u]);
        for (int j = 0; j < n; j++) {
            __m512 p[MB];
            for (int u = 0; u < NV; u++) p[u] = _mm512_load_ps(it->s + j * MB * LANES + u * LANES);
            const float *vj = v[j] + d0;
            for (int i = 0; i < DN; i++) {
                __m512 b = _mm512_set1_ps(vj[i]);
                for (int u = 0; u < NV; u++) o[i][u] = _mm512_fmadd_ps(p[u], b, o[i][u]);
            }
        }
        for (int i = 0; i < DN; i++)
            for (int u = 0; u < NV; u++)
                _mm512_store_ps(acc + (d0 + i) * it->stride + u * LANES, o[i][u]);
    }
}

static inline __attribute__((always_inline)) void ex_block(const Item *it, int64_t d_len,
                                                           int64_t v0, const int NV,
                                                           const float *const *k,
                                                           const float *const *v, int64_t p0,
                                                           int n, int masked) {
    int j = 0;
    for (; j + JN <= n; j += JN) ex_scores(it, d_len, v0, NV, k, j, JN);
    for (; j < n; j++) ex_scores(it, d_len, v0, NV, k, j, 1);
    __m512 corr[MB];
    for (int u = 0; u < NV; u++) corr[u] = ex_softmax(it, v0, u, p0, n, masked, 0);
    ex_output(it, d_len, v0, NV, corr, v, n);
}

static void micro_block(const Item *it, int64_t d_len, int64_t v0, int nv, const float *const *k,
                        const float *const *v, int64_t p0, int n, int masked) {
    if (nv == MB)
        ex_block(it, d_len, v0, MB, k, v, p0, n, masked);
    else
        ex_block(it, d_len, v0, 1, k, v, p0, n, masked);
}

#ifdef __AVX512BF16__
#define EX_BF16 1
/* A pair of bf16 read as one float, so that its broadcast is a load (vbroadcastss from memory)
 * and not a move from a general register plus a shuffle on an FMA port. */
typedef float ex_pair __attribute__((may_alias));

static inline __m512bh ex_bcast_pair(const void *pair) {
    return (__m512bh)_mm512_set1_ps(*(const ex_pair *)pair);
}

/* A bf16 pool with bf16 dot products (vdpbf16ps: two products per lane, fp32 sums): q^T and
 * the softmax weights are rounded to bf16 as torch's bf16 flash kernel rounds them, and each
 * instruction does the work of two FMAs. q^T is stored as pairs of dims (qtb: (head_dim / 2,
 * stride) pairs), each K row's pairs are broadcast straight from the pool, and the tile's V
 * rows are interleaved once into pairs of positions (vp: (KT / 2, head_dim) pairs) for all the
 * item's rows. */

/* qtb[d / 2][r] = (qt[d][r], qt[d + 1][r]) rounded to bf16, for 16 rows from r0. */
static void ex_pair_q(const Item *it, int64_t d_len, int64_t r0) {
    const __m512i pair_idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,
                                              9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                              17, 1, 16, 0);
    for (int64_t d = 0; d < d_len; d += 2) {
        __m512 lo = _mm512_load_ps(it->qt + d * it->stride + r0);
        __m512 hi = _mm512_load_ps(it->qt + (d + 1) * it->stride + r0);
        _mm512_store_si512(it->qtb + d / 2 * it->stride + r0,
                           _mm512_permutexvar_epi16(pair_idx,
                                                    (__m512i)_mm512_cvtne2ps_pbh(hi, lo)));
    }
}

/* vp[j / 2][d] = (v[j][d], v[j + 1][d]) for the tile's n rows (a zero row after an odd n). */
static void ex_pack_v(const Item *it, int64_t d_len, const uint16_t *const *v, int n) {
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                            40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33,
                                            1, 32, 0);
    const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
    for (int j = 0; j < n; j += 2) {
        uint32_t *dst = it->vp + (j / 2) * d_len;
        int64_t d = 0;
        for (; d + 32 <= d_len; d += 32) {
            __m512i x = _mm512_loadu_si512(v[j] + d);
            __m512i y = j + 1 < n ? _mm512_loadu_si512(v[j + 1] + d) : _mm512_setzero_si512();
            _mm512_storeu_si512(dst + d, _mm512_permutex2var_epi16(x, lo_idx, y));
            _mm512_storeu_si512(dst + d + 16, _mm512_permutex2var_epi16(x, hi_idx, y));
        }
        for (; d < d_len; d++)
            dst[d] = (uint32_t)v[j][d] | (j + 1 < n ? (uint32_t)v[j + 1][d] << 16 : 0u);
    }
}

/* Scores of the NK bf16 K rows from j0 against vectors v0 + u, as ex_scores. */
static inline __attribute__((always_inline)) void ex_scores_bf16(const Item *it, int64_t d_len,
                                                                 int64_t v0, const int NV,
                                                                 const uint16_t *const *k,
                                                                 int j0, const int NK) {
    __m512 acc[JN][MB];
    const uint32_t *kj[JN];
    for (int i = 0; i < NK; i++) {
        kj[i] = (const uint32_t *)k[j0 + i];
        for (int u = 0; u < NV; u++) acc[i][u] = _mm512_setzero_ps();
    }
    const uint32_t *qt = it->qtb + v0 * LANES;
    for (int64_t d2 = 0; d2 < d_len / 2; d2++) {
        __m512bh q[MB];
        for (int u = 0; u < NV; u++)
            q[u] = (__m512bh)_mm512_load_si512(qt + d2 * it->stride + u * LANES);
        for (int i = 0; i < NK; i++) {
            __m512bh b = ex_bcast_pair(kj[i] + d2);
            for (int u = 0; u < NV; u++) acc[i][u] = _mm512_dpbf16_ps(acc[i][u], q[u], b);
        }
    }
    for (int i = 0; i < NK; i++)
        for (int u = 0; u < NV; u++)
            _mm512_store_ps(it->s + (j0 + i) * MB * LANES + u * LANES, acc[i][u]);
}

/* sb[jp][u] = the weights of positions 2 jp and 2 jp + 1 of vector v0 + u as bf16 pairs, for
 * jp < (n + 1) / 2, then zero pairs up to `num_pairs`. */
static void ex_pack_p(const Item *it, int nv, int n, int num_pairs) {
    const __m512i pair_idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,
                                              9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                              17, 1, 16, 0);
    for (int jp = 0; jp < num_pairs; jp++)
        for (int u = 0; u < nv; u++) {
            __m512i both = _mm512_setzero_si512();
            if (2 * jp < n) {
                const float *p = it->s + u * LANES;
                __m512 p0 = _mm512_load_ps(p + 2 * jp * MB * LANES);
                __m512 p1 = 2 * jp + 1 < n ? _mm512_load_ps(p + (2 * jp + 1) * MB * LANES)
                                           : _mm512_setzero_ps();
                both = _mm512_permutexvar_epi16(pair_idx, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
            }
            _mm512_store_si512(it->sb + (jp * MB + u) * LANES, both);
        }
}

/* acc^T rows of vectors v0 + u = acc * corr[u] + sum_j s[j][u] v[j] on pairs of positions:
 * the weights are interleaved into pairs once (sb), then eight dims at a time. */
static inline __attribute__((always_inline)) void ex_output_bf16(const Item *it, int64_t d_len,
                                                                 int64_t v0, const int NV,
                                                                 const __m512 *corr, int n) {
    int num_pairs = (n + 1) / 2;
    ex_pack_p(it, NV, n, num_pairs);
    float *acc = it->acc + v0 * LANES;
    for (int64_t d0 = 0; d0 < d_len; d0 += DN) {
        __m512 o[DN][MB];
        for (int i = 0; i < DN; i++)
            for (int u = 0; u < NV; u++)
                o[i][u] = _mm512_mul_ps(_mm512_load_ps(acc + (d0 + i) * it->stride + u * LANES),
                                        corr[u]);
        for (int jp = 0; jp < num_pairs; jp++) {
            __m512bh p[MB];
            for (int u = 0; u < NV; u++)
                p[u] = (__m512bh)_mm512_load_si512(it->sb + (jp * MB + u) * LANES);
            const uint32_t *vj = it->vp + jp * d_len + d0;
            for (int i = 0; i < DN; i++) {
                __m512bh b = ex_bcast_pair(vj + i);
                for (int u = 0; u < NV; u++) o[i][u] = _mm512_dpbf16_ps(o[i][u], p[u], b);
            }
        }
        for (int i = 0; i < DN; i++)
            for (int u = 0; u < NV; u++)
                _mm512_store_ps(acc + (d0 + i) * it->stride + u * LANES, o[i][u]);
    }
}

static inline __attribute__((always_inline)) void ex_block_bf16(const Item *it, int64_t d_len,
                                                                int64_t v0, const int NV,
                                                                const uint16_t *const *k,
                                                                int64_t p0, int n, int masked) {
    int j = 0;
    for (; j + JN <= n; j += JN) ex_scores_bf16(it, d_len, v0, NV, k, j, JN);
    for (; j < n; j++) ex_scores_bf16(it, d_len, v0, NV, k, j, 1);
    __m512 corr[MB];
    for (int u = 0; u < NV; u++) corr[u] = ex_softmax(it, v0, u, p0, n, masked, 1);
    ex_output_bf16(it, d_len, v0, NV, corr, n);
}

static void micro_block_bf16(const Item *it, int64_t d_len, int64_t v0, int nv,
                             const uint16_t *const *k, int64_t p0, int n, int masked) {
    if (nv == MB)
        ex_block_bf16(it, d_len, v0, MB, k, p0, n, masked);
    else
        ex_block_bf16(it, d_len, v0, 1, k, p0, n, masked);
}
#endif

#endif
