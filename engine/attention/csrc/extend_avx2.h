/* AVX2 micro-block of the extend attention kernel (extend_cpu.c), as Zen 3 runs it: the AVX-512
 * path's steps (extend_avx512.h) on 8-lane vectors, a vector of 16 rows taken as two halves.
 * Scores take four keys at a time (eight FMAs per dim from two q^T loads and four broadcast K
 * elements); the output four dims at a time. Sixteen ymm registers bound both. Included only
 * under __AVX2__ && __FMA__ without AVX-512.
 */
#ifndef RADIXGATE_EXTEND_AVX2_H
#define RADIXGATE_EXTEND_AVX2_H

#include <immintrin.h>

#define JN2 4  /* keys a score pass takes together */
#define DN2 4  /* dims an output pass takes together (head_dim is a multiple of 8) */

/* s[j][half h] = q^T rows of the 16-row vector at `row0` . k[j] for NK keys from j0; top[h]
 * takes their max. */
static inline __attribute__((always_inline)) void ex2_scores(const Item *it, int64_t d_len,
                                                             int64_t row0, int u,
                                                             const float *const *k, int j0,
                                                             const int NK, __m256 *top) {
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
        top[0] = _mm256_max_ps(top[0], acc[i][0]);
        top[1] = _mm256_max_ps(top[1], acc[i][1]);
    }
}

/* The online softmax step for 8 rows (half `h` of vector u) over the tile's n scores, as
 * extend_avx512.h's ex_softmax (unmasked: `top` is the rows' old max and the scores' already),
 * the weights' sum in row_math.h's lane tree of 8 lanes (t[i] of keys i, i + 8, .., i + 56,
 * then halves); returns the factor the rows' earlier output takes. */
static __m256 ex2_softmax(const Item *it, int64_t row0, int u, int h, int64_t p0, int n,
                          int masked, __m256 top) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    int64_t row = row0 + 8 * h;
    __m256 m_old = _mm256_load_ps(it->m + row);
    float *s = it->s + u * LANES + 8 * h;
    if (masked) {
        __m256i pos = _mm256_load_si256((const __m256i *)(it->pos + row));
        __m256i lo = _mm256_load_si256((const __m256i *)(it->lo + row));
        top = m_old;
        for (int j = 0; j < n; j++) {
            __m256 x = _mm256_load_ps(s + j * MB * LANES);
            __m256i key = _mm256_set1_epi32((int32_t)(p0 + j));
            /* seen: key <= pos and key >= lo, i.e. not (key > pos) and not (lo > key). */
            __m256i hidden = _mm256_or_si256(_mm256_cmpgt_epi32(key, pos),
                                             _mm256_cmpgt_epi32(lo, key));
            x = _mm256_blendv_ps(x, neg_inf, _mm256_castsi256_ps(hidden));
            _mm256_store_ps(s + j * MB * LANES, x);
            top = _mm256_max_ps(top, x);
        }
    }
    __m256 none = _mm256_cmp_ps(top, neg_inf, _CMP_EQ_OQ);
    __m256 safe = _mm256_andnot_ps(none, top);
    __m256 corr = rg_exp2_8(_mm256_sub_ps(m_old, safe)), t[8];
    for (int j = 0; j < n; j++) {
        __m256 p = rg_exp2_8(_mm256_sub_ps(_mm256_load_ps(s + j * MB * LANES), safe));
        _mm256_store_ps(s + j * MB * LANES, p);
    }
    /* The tree from the stored weights (a key past n adds nothing). */
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[i] = i < n ? _mm256_load_ps(s + i * MB * LANES) : _mm256_setzero_ps();
        for (int j = i + 8; j < n; j += 8)
            t[i] = _mm256_add_ps(t[i], _mm256_load_ps(s + j * MB * LANES));
    }
    for (int w = 4; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) t[i] = _mm256_add_ps(t[i], t[i + w]);
    _mm256_store_ps(it->l + row, _mm256_fmadd_ps(_mm256_load_ps(it->l + row), corr, t[0]));
    _mm256_store_ps(it->m + row, top);
    return corr;
}

/* acc^T rows of the vector at row0 = acc * corr + sum_j s[j] v[j], DN2 dims at a time (acc as
 * 0 in the split's first tile; in its last, merged into O with factors a, b instead of stored,
 * as extend_avx512.h's ex_output). */
static inline __attribute__((always_inline)) void ex2_output(
    const Item *it, int64_t d_len, int64_t row0, int u, const __m256 corr[2], const __m256 a[2],
    const __m256 b[2], const float *const *v, int n, const int first, const int last) {
    float *acc = it->acc + row0, *big = it->big_o + row0;
    for (int64_t d0 = 0; d0 < d_len; d0 += DN2) {
        __m256 o[DN2][2];
        for (int i = 0; i < DN2; i++)
            for (int h = 0; h < 2; h++)
                o[i][h] = first ? _mm256_setzero_ps()
                                    : _mm256_mul_ps(_mm256_load_ps(acc + (d0 + i) * it->stride
                                                                   + 8 * h), corr[h]);
        for (int j = 0; j < n; j++) {
            const float *pj = it->s + j * MB * LANES + u * LANES;
            __m256 p0 = _mm256_load_ps(pj), p1 = _mm256_load_ps(pj + 8);
            const float *vj = v[j] + d0;
            for (int i = 0; i < DN2; i++) {
                __m256 bv = _mm256_broadcast_ss(vj + i);
                o[i][0] = _mm256_fmadd_ps(p0, bv, o[i][0]);
                o[i][1] = _mm256_fmadd_ps(p1, bv, o[i][1]);
            }
        }
        for (int i = 0; i < DN2; i++)
            for (int h = 0; h < 2; h++) {
                int64_t at = (d0 + i) * it->stride + 8 * h;
                if (last)
                    _mm256_store_ps(big + at, _mm256_fmadd_ps(o[i][h], b[h],
                                                              _mm256_mul_ps(_mm256_load_ps(big + at), a[h])));
                else
                    _mm256_store_ps(acc + at, o[i][h]);
            }
    }
}

static void micro_block(const Item *it, int64_t d_len, int64_t v0, int nv, const float *const *k,
                        const float *const *v, int64_t p0, int n, int masked) {
    for (int u = 0; u < nv; u++) {
        int64_t row0 = (v0 + u) * LANES;
        __m256 top[2] = {_mm256_load_ps(it->m + row0), _mm256_load_ps(it->m + row0 + 8)};
        int j = 0;
        for (; j + JN2 <= n; j += JN2) ex2_scores(it, d_len, row0, u, k, j, JN2, top);
        for (; j < n; j++) ex2_scores(it, d_len, row0, u, k, j, 1, top);
        __m256 corr[2] = {ex2_softmax(it, row0, u, 0, p0, n, masked, top[0]),
                          ex2_softmax(it, row0, u, 1, p0, n, masked, top[1])};
        __m256 a[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, b[2] = {a[0], a[1]};
        if (it->last)
            for (int h = 0; h < 2; h++)
                rg_merge_weights8(it->big_m + row0 + 8 * h, it->big_l + row0 + 8 * h,
                                  it->m + row0 + 8 * h, it->l + row0 + 8 * h, &a[h], &b[h]);
#define OUT(F, L) ex2_output(it, d_len, row0, u, corr, a, b, v, n, F, L)
        if (it->first) { if (it->last) OUT(1, 1); else OUT(1, 0); }
        else { if (it->last) OUT(0, 1); else OUT(0, 0); }
#undef OUT
    }
}

#endif
