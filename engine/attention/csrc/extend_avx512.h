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
#include "extend_bf16.h"
#endif

#endif
