/* AVX-512 scoring and accumulation for the paged attention kernel (paged_cpu.c), for heads of
 * 64 dims: the query rows that share a KV head and a position range (the grouped heads of one
 * token) go through a tile together, so each K and V row is loaded once for all of them, not
 * once per row. Every row's arithmetic is the same whatever the group size (its own FMA chains
 * in a fixed order), so a decode row and the same row in a draft verification get the same
 * bits. Included only under __AVX512F__ && __AVX512DQ__.
 */
#ifndef RADIXGATE_PAGED_AVX512_H
#define RADIXGATE_PAGED_AVX512_H

#include <immintrin.h>

#define G_MAX 4   /* rows a pass takes together */
#define D64 4     /* 16-lane vectors of a 64-dim row */

/* Sixteen dims of a K or V row: fp32, or bf16 widened in the register (no staging copy). */
static inline __attribute__((always_inline)) __m512 load16(const void *row, int dv,
                                                           const int bf16) {
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)row + dv)), 16));
    return _mm512_loadu_ps((const float *)row + 16 * dv);
}

/* [sum(a), sum(b), sum(c), sum(d)] of four 16-lane vectors. */
static inline __m128 sum4x16(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m256 ta = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m256 tb = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    __m256 tc = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    __m256 td = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(ta, tb), _mm256_hadd_ps(tc, td));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* s[r][j] = q[r] . k[j] for r < nr, j < n (64 dims; k rows fp32 or bf16). */
static inline __attribute__((always_inline)) void scores64(const float *const *q, const int nr,
                                                           const void *const *k, const int bf16,
                                                           int n, float (*s)[TILE]) {
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        __m512 acc[G_MAX][4];
        for (int r = 0; r < nr; r++)
            for (int i = 0; i < 4; i++) acc[r][i] = _mm512_setzero_ps();
        for (int dv = 0; dv < D64; dv++) {
            __m512 kv[4];
            for (int i = 0; i < 4; i++) kv[i] = load16(k[j + i], dv, bf16);
            for (int r = 0; r < nr; r++) {
                __m512 qv = _mm512_loadu_ps(q[r] + 16 * dv);
                for (int i = 0; i < 4; i++) acc[r][i] = _mm512_fmadd_ps(qv, kv[i], acc[r][i]);
            }
        }
        for (int r = 0; r < nr; r++)
            _mm_storeu_ps(s[r] + j, sum4x16(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    }
    for (; j < n; j++) {
        for (int r = 0; r < nr; r++) {
            __m512 acc = _mm512_setzero_ps();
            for (int dv = 0; dv < D64; dv++)
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(q[r] + 16 * dv), load16(k[j], dv, bf16),
                                      acc);
            s[r][j] = _mm512_reduce_add_ps(acc);
        }
    }
}

/* acc[r] = acc[r] * corr[r] + sum_j p[r][j] v[j] for r < nr over n positions (64 dims; v rows
 * fp32 or bf16). */
static inline __attribute__((always_inline)) void accumulate64(float *const *acc, const int nr,
                                                               const float *corr,
                                                               float (*p)[TILE],
                                                               const void *const *v,
                                                               const int bf16, int n) {
    __m512 x[G_MAX][D64];
    for (int r = 0; r < nr; r++) {
        __m512 c = _mm512_set1_ps(corr[r]);
        for (int dv = 0; dv < D64; dv++)
            x[r][dv] = _mm512_mul_ps(_mm512_loadu_ps(acc[r] + 16 * dv), c);
    }
    for (int j = 0; j < n; j++) {
        __m512 vv[D64];
        for (int dv = 0; dv < D64; dv++) vv[dv] = load16(v[j], dv, bf16);
        for (int r = 0; r < nr; r++) {
            __m512 pr = _mm512_set1_ps(p[r][j]);
            for (int dv = 0; dv < D64; dv++) x[r][dv] = _mm512_fmadd_ps(pr, vv[dv], x[r][dv]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int dv = 0; dv < D64; dv++) _mm512_storeu_ps(acc[r] + 16 * dv, x[r][dv]);
}

#endif
