/* AVX-512 micro-block of the extend attention kernel (extend_cpu.c): one or two vectors of 16
 * query rows (lanes) through one tile of keys, each lane row_math.h's steps for its row. Scores take eight keys at a time: 16 FMAs per
 * dim from two q^T loads and eight broadcast K elements, no horizontal sum. The output takes
 * eight dims at a time over all the tile's keys, its sixteen accumulators in registers.
 * Included only under __AVX512F__ && __AVX512DQ__.
 */
#ifndef RADIXGATE_EXTEND_AVX512_H
#define RADIXGATE_EXTEND_AVX512_H

#include <immintrin.h>

#define JN 8  /* keys a score pass takes together */
#define DN 8  /* dims an output pass takes together */

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
        rg_transpose16(r);
        for (int i = 0; i < 16; i++) _mm512_store_si512(it->qt + (d0 + i) * it->stride + r0, r[i]);
    }
    for (; d0 < d_len; d0++)
        for (int i = 0; i < 16; i++) it->qt[d0 * it->stride + r0 + i] = q[i][d0] * mul[i];
}

/* s[j][u] = q^T rows of vectors v0 + u (u < NV) . k[j], for the NK keys from j0; top[u] takes
 * their max. */
static inline __attribute__((always_inline)) void ex_scores(const Item *it, int64_t d_len,
                                                            int64_t v0, const int NV,
                                                            const float *const *k, int j0,
                                                            const int NK, __m512 *top) {
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
        for (int u = 0; u < NV; u++) {
            _mm512_store_ps(it->s + (j0 + i) * MB * LANES + u * LANES, acc[i][u]);
            top[u] = _mm512_max_ps(top[u], acc[i][u]);
        }
}

/* The online softmax step (row_math.h step 2) for vector v0 + u over the tile's n scores
 * (masked: keys outside a row's span become -inf; else `top` is the rows' old max and the
 * scores' already): updates m and l, turns the scores into weights, returns the factor the
 * row's earlier output takes. The weights' sum follows row_math.h's lane tree of 16 lanes:
 * sixteen partial sums, t[i] of keys i, i + 16, i + 32, i + 48, then halves. */
static inline __attribute__((always_inline)) __m512 ex_softmax(const Item *it, int64_t v0,
                                                               int u, int64_t p0, int n,
                                                               int masked, const int coarse,
                                                               __m512 top) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    int64_t row = (v0 + u) * LANES;
    __m512 m_old = _mm512_load_ps(it->m + row);
    float *s = it->s + u * LANES;
    if (masked) {
        __m512i pos = _mm512_load_si512(it->pos + row), lo = _mm512_load_si512(it->lo + row);
        top = m_old;
        for (int j = 0; j < n; j++) {
            __m512 x = _mm512_load_ps(s + j * MB * LANES);
            __m512i key = _mm512_set1_epi32((int32_t)(p0 + j));
            __mmask16 seen = _mm512_cmp_epi32_mask(key, pos, _MM_CMPINT_LE) &
                             _mm512_cmp_epi32_mask(key, lo, _MM_CMPINT_NLT);
            x = _mm512_mask_mov_ps(neg_inf, seen, x);
            _mm512_store_ps(s + j * MB * LANES, x);
            top = _mm512_max_ps(top, x);
        }
    }
    /* A row that has seen nothing yet keeps m = -inf; it shifts by 0 so that -inf - -inf is
     * never formed. */
    __m512 safe = _mm512_mask_mov_ps(top, _mm512_cmp_ps_mask(top, neg_inf, _CMP_EQ_OQ),
                                     _mm512_setzero_ps());
    __m512 corr = rg_exp2_16(_mm512_sub_ps(m_old, safe), 0), t[16];
    if (masked)
        for (int j = 0; j < n; j++) {
            __m512 x = _mm512_sub_ps(_mm512_load_ps(s + j * MB * LANES), safe);
            _mm512_store_ps(s + j * MB * LANES, rg_exp2_16(x, coarse));
        }
    else /* every score finite: the exp without its clamp, the same bits */
        for (int j = 0; j < n; j++) {
            __m512 x = _mm512_sub_ps(_mm512_load_ps(s + j * MB * LANES), safe);
            _mm512_store_ps(s + j * MB * LANES, rg_exp2_16_finite(x, coarse));
        }
    /* The tree from the stored weights (a key past n adds nothing): sixteen accumulators
     * across the exp loop would spill its constants. */
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        t[i] = i < n ? _mm512_load_ps(s + i * MB * LANES) : _mm512_setzero_ps();
        for (int j = i + 16; j < n; j += 16)
            t[i] = _mm512_add_ps(t[i], _mm512_load_ps(s + j * MB * LANES));
    }
    for (int h = 8; h >= 1; h /= 2)
        for (int i = 0; i < h; i++) t[i] = _mm512_add_ps(t[i], t[i + h]);
    _mm512_store_ps(it->l + row, _mm512_fmadd_ps(_mm512_load_ps(it->l + row), corr, t[0]));
    _mm512_store_ps(it->m + row, top);
    return corr;
}

/* acc^T rows of vectors v0 + u = acc * corr[u] + sum_j s[j][u] v[j], eight dims at a time
 * (acc as 0 in its split's first tile; in its last, merged into O with factors a, b instead of
 * stored: row_math.h step 3 fused, the same arithmetic as rg_merge_lanes). */
static inline __attribute__((always_inline)) void ex_output(const Item *it, int64_t d_len,
                                                            int64_t v0, const int NV,
                                                            const __m512 *corr, const __m512 *a,
                                                            const __m512 *b,
                                                            const float *const *v, int n,
                                                            const int first, const int last) {
    float *acc = it->acc + v0 * LANES, *big = it->big_o + v0 * LANES;
    for (int64_t d0 = 0; d0 < d_len; d0 += DN) {
        __m512 o[DN][MB];
        for (int i = 0; i < DN; i++)
            for (int u = 0; u < NV; u++)
                o[i][u] = first ? _mm512_setzero_ps()
                                    : _mm512_mul_ps(_mm512_load_ps(acc + (d0 + i) * it->stride
                                                                   + u * LANES), corr[u]);
        for (int j = 0; j < n; j++) {
            __m512 p[MB];
            for (int u = 0; u < NV; u++) p[u] = _mm512_load_ps(it->s + j * MB * LANES + u * LANES);
            const float *vj = v[j] + d0;
            for (int i = 0; i < DN; i++) {
                __m512 bv = _mm512_set1_ps(vj[i]);
                for (int u = 0; u < NV; u++) o[i][u] = _mm512_fmadd_ps(p[u], bv, o[i][u]);
            }
        }
        for (int i = 0; i < DN; i++)
            for (int u = 0; u < NV; u++) {
                int64_t at = (d0 + i) * it->stride + u * LANES;
                if (last)
                    _mm512_store_ps(big + at, _mm512_fmadd_ps(o[i][u], b[u],
                                                              _mm512_mul_ps(_mm512_load_ps(big + at), a[u])));
                else
                    _mm512_store_ps(acc + at, o[i][u]);
            }
    }
}

/* The softmax step of vectors v0 .. v0 + NV - 1 (ex_softmax), and in a split's last tile the
 * merge's factors for them. */
static inline __attribute__((always_inline)) void ex_weights(const Item *it, int64_t v0,
                                                             const int NV, int64_t p0, int n,
                                                             int masked, const int coarse,
                                                             const __m512 *top, __m512 *corr,
                                                             __m512 *a, __m512 *b) {
    for (int u = 0; u < NV; u++) {
        corr[u] = ex_softmax(it, v0, u, p0, n, masked, coarse, top[u]);
        if (it->last) {
            int64_t row = (v0 + u) * LANES;
            rg_merge_weights16(it->big_m + row, it->big_l + row, it->m + row, it->l + row,
                               &a[u], &b[u]);
        }
    }
}

static inline __attribute__((always_inline)) void ex_block(const Item *it, int64_t d_len,
                                                           int64_t v0, const int NV,
                                                           const float *const *k,
                                                           const float *const *v, int64_t p0,
                                                           int n, int masked) {
    __m512 top[MB];
    for (int u = 0; u < NV; u++) top[u] = _mm512_load_ps(it->m + (v0 + u) * LANES);
    int j = 0;
    for (; j + JN <= n; j += JN) ex_scores(it, d_len, v0, NV, k, j, JN, top);
    for (; j < n; j++) ex_scores(it, d_len, v0, NV, k, j, 1, top);
    __m512 corr[MB], a[MB] = {0}, b[MB] = {0};
    ex_weights(it, v0, NV, p0, n, masked, 0, top, corr, a, b);
#define OUT(F, L) ex_output(it, d_len, v0, NV, corr, a, b, v, n, F, L)
    if (it->first) { if (it->last) OUT(1, 1); else OUT(1, 0); }
    else { if (it->last) OUT(0, 1); else OUT(0, 0); }
#undef OUT
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
