/* AVX2 micro-block of the extend attention kernel (extend_cpu.c), as Zen 3 runs it: the AVX-512
 * path's steps (extend_avx512.h) on 8-lane vectors, a vector of 16 rows taken as two halves.
 * Scores take four keys at a time (eight FMAs per dim from two q^T loads and four broadcast K
 * elements); the output four dims at a time. Sixteen ymm registers bound both. Included only
 * under __AVX2__ && __FMA__ without AVX-512.
 */
#ifndef RADIXGATE_EXTEND_AVX2_H
#define RADIXGATE_EXTEND_AVX2_H

#include <immintrin.h>
#include "simd_exp.h"

#define JN2 4  /* keys a score pass takes together */
#define DN2 4  /* dims an output pass takes together (head_dim is a multiple of 8) */

/* 2^x on eight lanes for x <= 0, exactly 0 below -126 (-inf included): simd_exp.h's e^x of
 * x ln 2, whose own clamp would leave ~1e-38 where a masked key must weigh nothing. */
static inline __m256 ex_exp2_8(__m256 x) {
    __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_GE_OQ);
    __m256 y = _mm256_mul_ps(_mm256_max_ps(x, _mm256_set1_ps(-126.0f)),
                             _mm256_set1_ps(0.6931471805599453f));
    return _mm256_and_ps(rg_exp8(y), keep);
}

/* s[j][half h] = q^T rows of the 16-row vector at `row0` . k[j] for NK keys from j0. */
static inline __attribute__((always_inline)) void ex2_scores(const Item *it, int64_t d_len,
                                                             int64_t row0, int u,
                                                             const float *const *k, int j0,
                                                             const int NK) {
    __m256 acc[JN2][2];
    const float *kj[JN2];
    for (int i = 0; i < NK; i++) {
        kj[i] = k[j0 + i];
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    }
    const float *qt = it->qt + row0;
    for (int64_t d = 0; d < d_len; d++) {
        __m256 q0 = _mm256_load_ps(qt + d * it->stride), q1 = _mm256_load_ps(qt + d * it->stride + 8);
        for (int i = 0; i < NK; i++) {
            __m256 b = _mm256_broadcast_ss(kj[i] + d);
            acc[i][0] = _mm256_fmadd_ps(q0, b, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(q1, b, acc[i][1]);
        }
    }
    for (int i = 0; i < NK; i++) {
        float *s = it->s + (j0 + i) * MB * LANES + u * LANES;
        _mm256_store_ps(s, acc[i][0]);
        _mm256_store_ps(s + 8, acc[i][1]);
    }
}

/* The online softmax step for 8 rows (half `h` of vector u) over the tile's n scores, as
 * extend_avx512.h's ex_softmax; returns the factor the rows' earlier output takes. */
static __m256 ex2_softmax(const Item *it, int64_t row0, int u, int h, int64_t p0, int n,
                          int masked) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    int64_t row = row0 + 8 * h;
    __m256 m_old = _mm256_load_ps(it->m + row), top = m_old;
    __m256i pos = _mm256_load_si256((const __m256i *)(it->pos + row));
    __m256i lo = _mm256_load_si256((const __m256i *)(it->lo + row));
    float *s = it->s + u * LANES + 8 * h;
    for (int j = 0; j < n; j++) {
        __m256 x = _mm256_load_ps(s + j * MB * LANES);
        if (masked) {
            __m256i key = _mm256_set1_epi32((int32_t)(p0 + j));
            /* seen: key <= pos and key >= lo, i.e. not (key > pos) and not (lo > key). */
            __m256i hidden = _mm256_or_si256(_mm256_cmpgt_epi32(key, pos),
                                             _mm256_cmpgt_epi32(lo, key));
            x = _mm256_blendv_ps(x, neg_inf, _mm256_castsi256_ps(hidden));
            _mm256_store_ps(s + j * MB * LANES, x);
        }
        top = _mm256_max_ps(top, x);
    }
    __m256 none = _mm256_cmp_ps(top, neg_inf, _CMP_EQ_OQ);
    __m256 safe = _mm256_andnot_ps(none, top);
    __m256 corr = ex_exp2_8(_mm256_sub_ps(m_old, safe)), sum = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        __m256 p = ex_exp2_8(_mm256_sub_ps(_mm256_load_ps(s + j * MB * LANES), safe));
        _mm256_store_ps(s + j * MB * LANES, p);
        sum = _mm256_add_ps(sum, p);
    }
    _mm256_store_ps(it->l + row, _mm256_fmadd_ps(_mm256_load_ps(it->l + row), corr, sum));
    _mm256_store_ps(it->m + row, top);
    return corr;
}

/* acc^T rows of the vector at row0 = acc * corr + sum_j s[j] v[j], DN2 dims at a time. */
static void ex2_output(const Item *it, int64_t d_len, int64_t row0, int u, const __m256 corr[2],
                       const float *const *v, int n) {
    float *acc = it->acc + row0;
    for (int64_t d0 = 0; d0 < d_len; d0 += DN2) {
        __m256 o[DN2][2];
        for (int i = 0; i < DN2; i++)
            for (int h = 0; h < 2; h++)
                o[i][h] = _mm256_mul_ps(_mm256_load_ps(acc + (d0 + i) * it->stride + 8 * h),
                                        corr[h]);
        for (int j = 0; j < n; j++) {
            const float *pj = it->s + j * MB * LANES + u * LANES;
            __m256 p0 = _mm256_load_ps(pj), p1 = _mm256_load_ps(pj + 8);
            const float *vj = v[j] + d0;
            for (int i = 0; i < DN2; i++) {
                __m256 b = _mm256_broadcast_ss(vj + i);
                o[i][0] = _mm256_fmadd_ps(p0, b, o[i][0]);
                o[i][1] = _mm256_fmadd_ps(p1, b, o[i][1]);
            }
        }
        for (int i = 0; i < DN2; i++)
            for (int h = 0; h < 2; h++)
                _mm256_store_ps(acc + (d0 + i) * it->stride + 8 * h, o[i][h]);
    }
}

static void micro_block(const Item *it, int64_t d_len, int64_t v0, int nv, const float *const *k,
                        const float *const *v, int64_t p0, int n, int masked) {
    for (int u = 0; u < nv; u++) {
        int64_t row0 = (v0 + u) * LANES;
        int j = 0;
        for (; j + JN2 <= n; j += JN2) ex2_scores(it, d_len, row0, u, k, j, JN2);
        for (; j < n; j++) ex2_scores(it, d_len, row0, u, k, j, 1);
        __m256 corr[2] = {ex2_softmax(it, row0, u, 0, p0, n, masked),
                          ex2_softmax(it, row0, u, 1, p0, n, masked)};
        ex2_output(it, d_len, row0, u, corr, v, n);
    }
}

#endif
