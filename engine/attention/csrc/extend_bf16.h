/* extend_avx512.h's path for a bf16 pool with bf16 dot products (vdpbf16ps: two products per
 * lane, fp32 sums). q^T and the softmax weights are rounded to bf16 as torch's bf16 flash kernel
 * rounds them, and each instruction does the work of two FMAs. q^T is stored as pairs of dims
 * (qtb: (head_dim / 2, stride) pairs), each K row's pairs are broadcast straight from the pool,
 * and the tile's V rows are interleaved once into pairs of positions (vp: (KT / 2, head_dim)
 * pairs) for all the item's rows. Included by extend_avx512.h only under __AVX512BF16__.
 */
#ifndef RADIXGATE_EXTEND_BF16_H
#define RADIXGATE_EXTEND_BF16_H

#define EX_BF16 1
/* A pair of bf16 read as one float, so that its broadcast is a load (vbroadcastss from memory)
 * and not a move from a general register plus a shuffle on an FMA port. */
typedef float ex_pair __attribute__((may_alias));

static inline __m512bh ex_bcast_pair(const void *pair) {
    return (__m512bh)_mm512_set1_ps(*(const ex_pair *)pair);
}

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
                                                                 int j0, const int NK,
                                                                 __m512 *top) {
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
        for (int u = 0; u < NV; u++) {
            _mm512_store_ps(it->s + (j0 + i) * MB * LANES + u * LANES, acc[i][u]);
            top[u] = _mm512_max_ps(top[u], acc[i][u]);
        }
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
 * the weights are interleaved into pairs once (sb), then eight dims at a time; acc as 0 in the
 * split's first tile, merged into O in its last (as ex_output). */
static inline __attribute__((always_inline)) void ex_output_bf16(const Item *it, int64_t d_len,
                                                                 int64_t v0, const int NV,
                                                                 const __m512 *corr,
                                                                 const __m512 *a,
                                                                 const __m512 *b, int n,
                                                                 const int first,
                                                                 const int last) {
    int num_pairs = (n + 1) / 2;
    ex_pack_p(it, NV, n, num_pairs);
    float *acc = it->acc + v0 * LANES, *big = it->big_o + v0 * LANES;
    for (int64_t d0 = 0; d0 < d_len; d0 += DN) {
        __m512 o[DN][MB];
        for (int i = 0; i < DN; i++)
            for (int u = 0; u < NV; u++)
                o[i][u] = first ? _mm512_setzero_ps()
                                    : _mm512_mul_ps(_mm512_load_ps(acc + (d0 + i) * it->stride
                                                                   + u * LANES), corr[u]);
        for (int jp = 0; jp < num_pairs; jp++) {
            __m512bh p[MB];
            for (int u = 0; u < NV; u++)
                p[u] = (__m512bh)_mm512_load_si512(it->sb + (jp * MB + u) * LANES);
            const uint32_t *vj = it->vp + jp * d_len + d0;
            for (int i = 0; i < DN; i++) {
                __m512bh bv = ex_bcast_pair(vj + i);
                for (int u = 0; u < NV; u++) o[i][u] = _mm512_dpbf16_ps(o[i][u], p[u], bv);
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

static inline __attribute__((always_inline)) void ex_block_bf16(const Item *it, int64_t d_len,
                                                                int64_t v0, const int NV,
                                                                const uint16_t *const *k,
                                                                int64_t p0, int n, int masked) {
    __m512 top[MB];
    for (int u = 0; u < NV; u++) top[u] = _mm512_load_ps(it->m + (v0 + u) * LANES);
    int j = 0;
    for (; j + JN <= n; j += JN) ex_scores_bf16(it, d_len, v0, NV, k, j, JN, top);
    for (; j < n; j++) ex_scores_bf16(it, d_len, v0, NV, k, j, 1, top);
    __m512 corr[MB], a[MB] = {0}, b[MB] = {0};
    ex_weights(it, v0, NV, p0, n, masked, 1, top, corr, a, b);
#define OUT(F, L) ex_output_bf16(it, d_len, v0, NV, corr, a, b, n, F, L)
    if (it->first) { if (it->last) OUT(1, 1); else OUT(1, 0); }
    else { if (it->last) OUT(0, 1); else OUT(0, 0); }
#undef OUT
}

static void micro_block_bf16(const Item *it, int64_t d_len, int64_t v0, int nv,
                             const uint16_t *const *k, int64_t p0, int n, int masked) {
    if (nv == MB)
        ex_block_bf16(it, d_len, v0, MB, k, p0, n, masked);
    else
        ex_block_bf16(it, d_len, v0, 1, k, p0, n, masked);
}

#endif
