/* The AVX-512 path of ggml_f32.c (AVX512F + FMA + F16C): 16 lanes. Included by ggml_f32.c after
 * its shared helpers; defines what ggml_f32_scalar.h lists, and for the fused kernel the block
 * steps blk_setup / blk_part and the vector macros. Each dequantiser performs gguf's fp32
 * operations in its order (ggml_f32.c's header comment), 16 weights a vector: codes widened to
 * int32 lanes, then either looked up in a table of the block's possible weights (computed by
 * gguf's operations) or converted exactly and put through the block's operations (an fma where
 * ggml_f32.c's FMA_EXACT shows it gives the same bits).
 */
#include <immintrin.h>

#define GF_SIMD "avx512"
#define VL 16
#define TR 4 /* a tile: 4 rows x 6 outputs = 24 accumulators, 6 weight vectors, 1 of x */
#define TO 6
#define HSUM(v) hsum16(v)

typedef __m512 vec;
#define VZERO() _mm512_setzero_ps()
#define VLOADU(p) _mm512_loadu_ps(p)
#define VSTOREU(p, v) _mm512_storeu_ps(p, v)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define FUSED_ROWS 4                     /* rows the fused kernel takes at once */
#define FUSED_O(R) ((R) == 1 ? 8 : 4)    /* its outputs at once: accumulator chains */
#define PART_W(type) ((type) >= GGML_Q4_K ? 64 : 32) /* weights of a part: 4 or 2 vectors */

/* Most types dequantise by table: a block's (or sub-block's) 16 or 32 possible weights are
 * computed once with gguf's operations on the codes 0..15 (0..31), exactly the values its codes
 * produce, and each vector of 16 codes picks its weights with one permute instead of a convert,
 * a multiply and a subtract. */

static inline __m512 iota16(void) {
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

/* 16 bytes at p -> 16 int32 lanes. */
static inline __m512i bytes16(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

/* What a block's parts share, computed once a block by blk_setup: tables (a, b), the fifth
 * bits (h) or the scales (s). */
typedef struct {
    __m512 a, b;
    uint32_t h;
    float s[16];
} BState;

static inline __attribute__((always_inline)) void blk_setup(const int type, const uint8_t *b,
                                                            BState *st) {
    const __m512 iota = iota16();
    switch (type) {
    case GGML_Q4_0: /* d * (q - 8) */
        st->a = _mm512_mul_ps(_mm512_set1_ps(f16_to_f32(b)),
                              _mm512_sub_ps(iota, _mm512_set1_ps(8.0f)));
        break;
    case GGML_Q4_1: /* (d * q) + m, as one fma: see ggml_f32.c on FMA_EXACT */
        st->a = _mm512_fmadd_ps(_mm512_set1_ps(f16_to_f32(b)), iota,
                                _mm512_set1_ps(f16_to_f32(b + 2)));
        break;
    case GGML_Q5_0: { /* d * (q - 16): codes 0..15 in a, 16..31 in b */
        const __m512 d = _mm512_set1_ps(f16_to_f32(b));
        st->a = _mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(16.0f)));
        st->b = _mm512_mul_ps(d, iota);
        st->h = le32(b + 2);
        break;
    }
    case GGML_Q5_1: { /* (d * q) + m */
        const __m512 d = _mm512_set1_ps(f16_to_f32(b)), m = _mm512_set1_ps(f16_to_f32(b + 2));
        st->a = _mm512_fmadd_ps(d, iota, m);
        st->b = _mm512_fmadd_ps(d, _mm512_add_ps(iota, _mm512_set1_ps(16.0f)), m);
        st->h = le32(b + 4);
        break;
    }
    case GGML_Q8_0:
        st->a = _mm512_set1_ps(f16_to_f32(b));
        break;
    case GGML_Q4_K:
    case GGML_Q5_K: { /* s[0..7] = d * sc, s[8..15] = dmin * m */
        uint8_t sm[16];
        k_sc_m(b, sm);
        const __m512 dd = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(f16_to_f32(b)),
                                               _mm512_set1_ps(f16_to_f32(b + 2)));
        _mm512_storeu_ps(st->s, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                                      _mm_loadu_si128((const __m128i *)sm)))));
        break;
    }
    default: /* GGML_Q6_K: s[j] = d * sc[j], sc int8 */
        _mm512_storeu_ps(st->s, _mm512_mul_ps(_mm512_set1_ps(f16_to_f32(b + 208)),
                                              _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                  _mm_loadu_si128((const __m128i *)(b + 192))))));
        break;
    }
}

/* Weights of the sub-block of 32 codes q (bytes) -> scale * q - off (one fma: see ggml_f32.c
 * on FMA_EXACT), two vectors. */
static inline void k_sub(__m256i q, float scale, float off, __m512 *w) {
    const __m512 sv = _mm512_set1_ps(scale), ov = _mm512_set1_ps(-off);
    w[0] = _mm512_fmadd_ps(sv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q))),
                           ov);
    w[1] = _mm512_fmadd_ps(sv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                   _mm256_extracti128_si256(q, 1))), ov);
}

/* Q6_K: 32 codes q (bytes, 0..63), 16 per scale -> scale * (q - 32), two vectors. */
static inline void q6_sub(__m256i q, float s0, float s1, __m512 *w) {
    const __m512i bias = _mm512_set1_epi32(32);
    w[0] = _mm512_mul_ps(_mm512_set1_ps(s0), _mm512_cvtepi32_ps(_mm512_sub_epi32(
                                                 _mm512_cvtepu8_epi32(_mm256_castsi256_si128(q)), bias)));
    w[1] = _mm512_mul_ps(_mm512_set1_ps(s1), _mm512_cvtepi32_ps(_mm512_sub_epi32(
                                                 _mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1)), bias)));
}

/* The weights of part p of the block at b, in ascending order: PART_W(type) / 16 vectors. */
static inline __attribute__((always_inline)) void blk_part(const int type, const uint8_t *b,
                                                           const BState *st, const int p,
                                                           __m512 *w) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    switch (type) {
    case GGML_Q4_0:
    case GGML_Q4_1: { /* weight j in the low nibble of byte j, j + 16 in the high one;
                       * permutexvar reads an index's low 4 bits: no mask needed */
        const __m512i q = bytes16(b + (type == GGML_Q4_0 ? 2 : 4));
        w[0] = _mm512_permutexvar_ps(q, st->a);
        w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), st->a);
        break;
    }
    case GGML_Q5_0:
    case GGML_Q5_1: { /* as Q4 with weight j's fifth bit in bit j of h, picking table b */
        const __m512i q = bytes16(b + (type == GGML_Q5_0 ? 6 : 8)), sixteen = _mm512_set1_epi32(16);
        __m512i i0 = _mm512_and_si512(q, _mm512_set1_epi32(15)), i1 = _mm512_srli_epi32(q, 4);
        i0 = _mm512_mask_or_epi32(i0, (__mmask16)(st->h & 0xffff), i0, sixteen);
        i1 = _mm512_mask_or_epi32(i1, (__mmask16)(st->h >> 16), i1, sixteen);
        w[0] = _mm512_permutex2var_ps(st->a, i0, st->b);
        w[1] = _mm512_permutex2var_ps(st->a, i1, st->b);
        break;
    }
    case GGML_Q8_0: /* q * d */
        w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                 _mm_loadu_si128((const __m128i *)(b + 2)))), st->a);
        w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                 _mm_loadu_si128((const __m128i *)(b + 18)))), st->a);
        break;
    case GGML_Q4_K: { /* sub-blocks 2p (low nibbles of 32 bytes) and 2p + 1 (high), by table:
                       * (d * sc) * q - (dmin * m) for q = 0..15 */
        const __m512 iota = iota16();
        const __m512 t0 = _mm512_fmadd_ps(_mm512_set1_ps(st->s[2 * p]), iota,
                                          _mm512_set1_ps(-st->s[8 + 2 * p]));
        const __m512 t1 = _mm512_fmadd_ps(_mm512_set1_ps(st->s[2 * p + 1]), iota,
                                          _mm512_set1_ps(-st->s[9 + 2 * p]));
        const __m512i q0 = bytes16(b + 16 + 32 * p), q1 = bytes16(b + 32 + 32 * p);
        w[0] = _mm512_permutexvar_ps(q0, t0);
        w[1] = _mm512_permutexvar_ps(q1, t0);
        w[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(q0, 4), t1);
        w[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(q1, 4), t1);
        break;
    }
    case GGML_Q5_K: { /* as Q4_K with bit s of byte l of qh the fifth bit of weight l of
                       * sub-block s; the 16-bit shifts move it to bit 0 (then 4) of its byte */
        const __m256i one = _mm256_set1_epi8(1);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * p));
        const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), one);
        const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * p + 1), one);
        k_sub(_mm256_or_si256(_mm256_and_si256(raw, m4), _mm256_slli_epi16(h0, 4)), st->s[2 * p],
              st->s[8 + 2 * p], w);
        k_sub(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                              _mm256_slli_epi16(h1, 4)),
              st->s[2 * p + 1], st->s[9 + 2 * p], w + 2);
        break;
    }
    default: { /* GGML_Q6_K: half h = p / 2 of 128 weights, quarters j = 0, 1 (p even) or 2, 3:
                * the low (high) nibbles of ql's bytes 0-31 and 32-63 with bits 2j, 2j + 1 of
                * qh moved to bits 4, 5 (the 16-bit shifts' spill is masked off) */
        const int h = p / 2, high = p % 2;
        const __m256i m2 = _mm256_set1_epi8(0x30);
        __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
        __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        __m256i h0, h1;
        if (high) {
            ql0 = _mm256_srli_epi16(ql0, 4);
            ql1 = _mm256_srli_epi16(ql1, 4);
            h0 = _mm256_and_si256(qh, m2);
            h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2);
        } else {
            h0 = _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2);
            h1 = _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2);
        }
        const float *s = st->s + 8 * h + 4 * high;
        q6_sub(_mm256_or_si256(_mm256_and_si256(ql0, m4), h0), s[0], s[1], w);
        q6_sub(_mm256_or_si256(_mm256_and_si256(ql1, m4), h1), s[2], s[3], w + 2);
        break;
    }
    }
}

/* Lane l + l+8, then + 4, + 2, + 1: the tree every path uses. */
static inline float hsum16(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

/* acc[r][o] (16 lanes) += w[o][i..i+16) * x[r][i..i+16) for i over the chunk, one FMA each; the
 * lane sums start at +0.0 (first) or from acc, and end in acc or, reduced, in y (last). */
static inline __attribute__((always_inline)) void tile(const int R, const float *x, int64_t ldx,
                                                       const float *w, int64_t ldw, int64_t kn,
                                                       float *acc, int first, int last, float *y,
                                                       int64_t ldy, int accumulate, int nout) {
    __m512 a[TR][TO];
    for (int r = 0; r < R; r++)
        for (int o = 0; o < TO; o++)
            a[r][o] = first ? _mm512_setzero_ps() : _mm512_load_ps(acc + (r * TO + o) * VL);
    for (int64_t i = 0; i < kn; i += VL) {
        __m512 wv[TO];
        for (int o = 0; o < TO; o++) wv[o] = _mm512_load_ps(w + o * ldw + i);
        for (int r = 0; r < R; r++) {
            const __m512 xv = _mm512_loadu_ps(x + r * ldx + i);
            for (int o = 0; o < TO; o++) a[r][o] = _mm512_fmadd_ps(wv[o], xv, a[r][o]);
        }
    }
    if (!last) {
        for (int r = 0; r < R; r++)
            for (int o = 0; o < TO; o++) _mm512_store_ps(acc + (r * TO + o) * VL, a[r][o]);
        return;
    }
    for (int r = 0; r < R; r++)
        for (int o = 0; o < nout; o++) {
            const float s = hsum16(a[r][o]);
            float *out = y + r * ldy + o;
            *out = accumulate ? *out + s : s;
        }
}
