/* AVX-512 steps of the decode kernel (paged_cpu.c): a tile's keys in the lanes of four vectors
 * (K^T built once per tile, for every row of the work item), each row's output with its dims in
 * the lanes. Up to R_MAX rows go through a tile together, so each K^T and V vector loaded feeds
 * all of them. Every step is row_math.h's for each row on its own: a score is one FMA chain over
 * the dims (keys in lanes: fma(q[d], K^T[d], s) is the extend kernel's fma(q^T[d], k[d], s) in
 * another lane), and the weights' sum is the lane tree of 16 lanes. Included only under
 * RG_AVX512.
 */
#ifndef RADIXGATE_PAGED_AVX512_H
#define RADIXGATE_PAGED_AVX512_H

#define R_MAX 4 /* rows a pass takes together: 16 score accumulators */

/* Sixteen elements of a K or V row from element d0 (`mask`: the lanes read, the rest 0):
 * fp32, or bf16 widened in the register. */
static inline __attribute__((always_inline)) __m512 pa_load16(const void *row, int64_t d0,
                                                              __mmask16 mask, const int wide) {
    if (wide)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
            _mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + d0)), 16));
    return _mm512_maskz_loadu_ps(mask, (const float *)row + d0);
}

/* K^T of the tile: kt[e * TILE + j] = element e of the K row at position j (e < d_len fp32, or
 * e < d_len / 2 bf16 pairs when `pairs`); tl->k[j] is a zero row where the tile reads none. */
static void pa_build_kt(const Tile *tl, int64_t d_len, const int mode, uint32_t *kt) {
    const int wide = mode == PA_WIDE, pairs = mode == PA_PAIRS;
    int64_t cols = pairs ? d_len / 2 : d_len;
    for (int64_t kb = 0; kb < TILE; kb += 16) {
        const void *const *rows = tl->k + kb;
        int64_t c0 = 0;
        for (; c0 + 16 <= cols; c0 += 16) {
            __m512i r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = pairs ? _mm512_loadu_si512((const uint32_t *)rows[i] + c0)
                       : wide ? _mm512_castps_si512(pa_load16(rows[i], c0, 0xFFFF, 1))
                              : _mm512_castps_si512(_mm512_loadu_ps((const float *)rows[i] + c0));
            rg_transpose16(r);
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) _mm512_store_si512(kt + (c0 + i) * TILE + kb, r[i]);
        }
        if (c0 < cols) { /* the last columns: masked loads, a part of the block stored */
            __mmask16 mask = (__mmask16)((1u << (cols - c0)) - 1);
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = pairs ? _mm512_maskz_loadu_epi32(mask, (const uint32_t *)rows[i] + c0)
                             : _mm512_castps_si512(pa_load16(rows[i], c0, mask, wide));
            rg_transpose16(r);
            for (int i = 0; c0 + i < cols; i++) _mm512_store_si512(kt + (c0 + i) * TILE + kb, r[i]);
        }
    }
}

/* vp[jp * d_len + d] = (v[2 jp][d], v[2 jp + 1][d]) as a bf16 pair, for the pairs that hold a
 * position the tile reads (a zero row for a position it does not). */
static void pa_pack_v(const Tile *tl, int64_t d_len, uint32_t *vp) {
    static const uint16_t zero[32] = {0};
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                            40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33,
                                            1, 32, 0);
    const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
    for (int64_t jp = tl->skip / 2; jp < (tl->n + 1) / 2; jp++) {
        int64_t j = 2 * jp;
        const uint16_t *a = j >= tl->skip ? (const uint16_t *)((const char *)tl->k[j] + tl->v_off)
                                          : zero;
        const uint16_t *b = j + 1 < tl->n
                                ? (const uint16_t *)((const char *)tl->k[j + 1] + tl->v_off)
                                : zero;
        int a_step = a == zero ? 0 : 1, b_step = b == zero ? 0 : 1;
        uint32_t *dst = vp + jp * d_len;
        int64_t d = 0;
        for (; d + 32 <= d_len; d += 32) {
            __m512i x = _mm512_loadu_si512(a + d * a_step), y = _mm512_loadu_si512(b + d * b_step);
            _mm512_storeu_si512(dst + d, _mm512_permutex2var_epi16(x, lo_idx, y));
            _mm512_storeu_si512(dst + d + 16, _mm512_permutex2var_epi16(x, hi_idx, y));
        }
        for (; d < d_len; d++) dst[d] = (uint32_t)a[d * a_step] | (uint32_t)b[d * b_step] << 16;
    }
}

/* The output of NV vectors of dims from d0 (the last one `last` lanes wide) for the pass's nr
 * rows: acc = acc * corr, then each visible position's weighted V row in order. */
static inline __attribute__((always_inline)) void pa_out(
    const Tile *tl, const int nr, const int NV, __mmask16 last, float (*p)[TILE],
    uint32_t (*pp)[TILE / 2], const float *corr, int j0, int j1, float *const *acc, int64_t d0,
    int64_t d_len, const int mode) {
    (void)pp;
    (void)d_len;
    __m512 o[R_MAX][4];
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < NV; v++)
            o[r][v] = _mm512_mul_ps(
                _mm512_maskz_loadu_ps(v == NV - 1 ? last : 0xFFFF, acc[r] + d0 + 16 * v),
                _mm512_set1_ps(corr[r]));
    if (mode == PA_PAIRS) {
#ifdef RG_DPBF16
        for (int64_t jp = j0 / 2; jp < (j1 + 1) / 2; jp++) {
            const uint32_t *row = tl->vp + jp * d_len + d0;
            __m512bh vv[4];
            for (int v = 0; v < NV; v++)
                vv[v] = (__m512bh)_mm512_maskz_loadu_epi32(v == NV - 1 ? last : 0xFFFF,
                                                            row + 16 * v);
            for (int r = 0; r < nr; r++) {
                __m512bh pb = (__m512bh)_mm512_set1_epi32((int)pp[r][jp]);
                for (int v = 0; v < NV; v++) o[r][v] = _mm512_dpbf16_ps(o[r][v], pb, vv[v]);
            }
        }
#endif
    } else {
        for (int64_t j = j0; j < j1; j++) {
            const void *row = (const char *)tl->k[j] + tl->v_off;
            __m512 vv[4];
            for (int v = 0; v < NV; v++)
                vv[v] = pa_load16(row, d0 + 16 * v, v == NV - 1 ? last : 0xFFFF, mode == PA_WIDE);
            for (int r = 0; r < nr; r++) {
                __m512 pb = _mm512_set1_ps(p[r][j]);
                for (int v = 0; v < NV; v++) o[r][v] = _mm512_fmadd_ps(pb, vv[v], o[r][v]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < NV; v++)
            _mm512_mask_storeu_ps(acc[r] + d0 + 16 * v, v == NV - 1 ? last : 0xFFFF, o[r][v]);
}

/* nr rows through the tile (their K^T and V built): qs[r] the row's scaled q (fp32), qp[r] its
 * bf16 pairs (PA_PAIRS); `vis[r]` bit j set where the row sees position j, all within
 * [j0, j1). Updates the rows' m, l and acc (row_math.h step 2). */
static inline __attribute__((always_inline)) void pa_pass(
    const Tile *tl, const int nr, const float *const *qs, const uint32_t *const *qp,
    const uint64_t *vis, int j0, int j1, float *const *acc, float *const *m, float *const *l,
    int64_t d_len, const int mode) {
    (void)qp;
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    __m512 s[R_MAX][4];
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < 4; i++) s[r][i] = _mm512_setzero_ps();
    if (mode == PA_PAIRS) {
#ifdef RG_DPBF16
        const uint32_t *kt = tl->kt;
        for (int64_t e = 0; e < d_len / 2; e++) {
            __m512bh kv[4];
            for (int i = 0; i < 4; i++)
                kv[i] = (__m512bh)_mm512_load_si512(kt + e * TILE + 16 * i);
            for (int r = 0; r < nr; r++) {
                __m512bh qb = (__m512bh)_mm512_set1_epi32((int)qp[r][e]);
                for (int i = 0; i < 4; i++) s[r][i] = _mm512_dpbf16_ps(s[r][i], qb, kv[i]);
            }
        }
#endif
    } else {
        const float *kt = (const float *)tl->kt;
        for (int64_t d = 0; d < d_len; d++) {
            __m512 kv[4];
            for (int i = 0; i < 4; i++) kv[i] = _mm512_load_ps(kt + d * TILE + 16 * i);
            for (int r = 0; r < nr; r++) {
                __m512 qb = _mm512_set1_ps(qs[r][d]);
                for (int i = 0; i < 4; i++) s[r][i] = _mm512_fmadd_ps(qb, kv[i], s[r][i]);
            }
        }
    }
    float p[R_MAX][TILE] __attribute__((aligned(64))), corr[R_MAX];
    uint32_t pp[R_MAX][TILE / 2] __attribute__((aligned(64)));
    for (int r = 0; r < nr; r++) {
        for (int i = 0; i < 4; i++)
            s[r][i] = _mm512_mask_mov_ps(neg_inf, (__mmask16)(vis[r] >> (16 * i)), s[r][i]);
        float most = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(s[r][0], s[r][1]),
                                                        _mm512_max_ps(s[r][2], s[r][3])));
        float top = *m[r] > most ? *m[r] : most, safe = top == -INFINITY ? 0.0f : top;
        __m512 w[4], shift = _mm512_set1_ps(safe);
        if (vis[r] == ~0ull) /* no -inf among the scores: the exp without its clamp, the same bits */
            for (int i = 0; i < 4; i++)
                w[i] = rg_exp2_16_finite(_mm512_sub_ps(s[r][i], shift), mode == PA_PAIRS);
        else
            for (int i = 0; i < 4; i++)
                w[i] = rg_exp2_16(_mm512_sub_ps(s[r][i], shift), mode == PA_PAIRS);
        for (int i = 0; i < 4; i++) _mm512_store_ps(p[r] + 16 * i, w[i]);
        corr[r] = rg_exp2(*m[r] - safe);
        *l[r] = fmaf(*l[r], corr[r], rg_sum_keys16(w));
        *m[r] = top;
#ifdef RG_DPBF16
        if (mode == PA_PAIRS) {
            _mm512_store_si512(pp[r], (__m512i)_mm512_cvtne2ps_pbh(w[1], w[0]));
            _mm512_store_si512(pp[r] + 16, (__m512i)_mm512_cvtne2ps_pbh(w[3], w[2]));
        }
#endif
    }
    int64_t full = d_len / 16, d0 = 0;
    for (; d0 + 64 <= 16 * full; d0 += 64)
        pa_out(tl, nr, 4, 0xFFFF, p, pp, corr, j0, j1, acc, d0, d_len, mode);
    int rest = (int)(d_len - d0 + 15) / 16; /* vectors left, the last perhaps partial */
    __mmask16 last = d_len % 16 ? (__mmask16)((1u << (d_len % 16)) - 1) : 0xFFFF;
    if (rest == 1) pa_out(tl, nr, 1, last, p, pp, corr, j0, j1, acc, d0, d_len, mode);
    else if (rest == 2) pa_out(tl, nr, 2, last, p, pp, corr, j0, j1, acc, d0, d_len, mode);
    else if (rest == 3) pa_out(tl, nr, 3, last, p, pp, corr, j0, j1, acc, d0, d_len, mode);
    else if (rest == 4) pa_out(tl, nr, 4, last, p, pp, corr, j0, j1, acc, d0, d_len, mode);
}

#endif
