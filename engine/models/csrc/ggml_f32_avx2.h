/* The AVX2 path of ggml_f32.c (AVX2 + FMA + F16C, e.g. AMD Zen 3): 8 lanes. Included by
 * ggml_f32.c after its shared helpers; defines what ggml_f32_avx512.h does (the block steps
 * blk_setup / blk_part, the vector macros, tile), with gguf's fp32 operations in its order
 * (ggml_f32.c's header comment), 8 weights a vector: codes widened to int32, converted exactly,
 * then put through the block's operations (an fma where ggml_f32.c's FMA_EXACT shows it gives
 * the same bits).
 */
#include <immintrin.h>

#define GF_SIMD "avx2"
#define VL 8
#define TR 4 /* a tile: 4 rows x 3 outputs = 12 accumulators, 3 weight vectors, 1 of x */
#define TO 3

typedef __m256 vec;
#define VZERO() _mm256_setzero_ps()
#define VLOADU(p) _mm256_loadu_ps(p)
#define VSTOREU(p, v) _mm256_storeu_ps(p, v)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define HSUM(v) hsum8(v)
#define FUSED_ROWS 4                  /* rows the fused kernel takes at once */
#define FUSED_O(R) ((R) == 1 ? 4 : 2) /* its outputs at once (16 registers) */
#define PART_W(type) 32               /* weights of a part: 4 vectors */

/* The low 8 bytes of v, unsigned -> 8 fp32 (exact). */
static inline __m256 u8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
static inline __m128i high8(__m128i v) { return _mm_unpackhi_epi64(v, v); }

/* What a block's parts share, computed once a block by blk_setup: d and m broadcast (a, b), the
 * fifth bits (h) or the scales (s). */
typedef struct {
    __m256 a, b;
    uint32_t h;
    float s[16];
} BState;

static inline __attribute__((always_inline)) void blk_setup(const int type, const uint8_t *b,
                                                            BState *st) {
    switch (type) {
    case GGML_Q4_0:
    case GGML_Q5_0:
    case GGML_Q8_0:
        st->a = _mm256_set1_ps(f16_to_f32(b));
        st->h = type == GGML_Q5_0 ? le32(b + 2) : 0;
        break;
    case GGML_Q4_1:
    case GGML_Q5_1:
        st->a = _mm256_set1_ps(f16_to_f32(b));
        st->b = _mm256_set1_ps(f16_to_f32(b + 2));
        st->h = type == GGML_Q5_1 ? le32(b + 4) : 0;
        break;
    case GGML_Q4_K:
    case GGML_Q5_K: { /* s[0..7] = d * sc, s[8..15] = dmin * m */
        uint8_t sm[16];
        k_sc_m(b, sm);
        const __m128i v = _mm_loadu_si128((const __m128i *)sm);
        _mm256_storeu_ps(st->s, _mm256_mul_ps(_mm256_set1_ps(f16_to_f32(b)), u8_ps(v)));
        _mm256_storeu_ps(st->s + 8, _mm256_mul_ps(_mm256_set1_ps(f16_to_f32(b + 2)), u8_ps(high8(v))));
        break;
    }
    default: { /* GGML_Q6_K: s[j] = d * sc[j], sc int8 */
        const __m256 d = _mm256_set1_ps(f16_to_f32(b + 208));
        const __m128i sc = _mm_loadu_si128((const __m128i *)(b + 192));
        _mm256_storeu_ps(st->s, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
        _mm256_storeu_ps(st->s + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(
                                                         _mm256_cvtepi8_epi32(high8(sc)))));
        break;
    }
    }
}

/* The 32 codes of a 32-weight block (weight j in the low nibble of byte j of qs, j + 16 in the
 * high one; Q5: the fifth bit in bit j of h) as int32, four vectors of 8. */
static inline __attribute__((always_inline)) void q4_codes(const uint8_t *qs, int five, uint32_t h,
                                                           __m256i q[4]) {
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    __m128i lo = _mm_and_si128(raw, m4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    if (five) { /* bit j of h -> 16 in byte j: byte j of the broadcast word's byte j / 8, tested
                 * against its bit j % 8 */
        const __m256i spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32((int)h),
            _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                               0x0303030303030303));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        const __m256i fifth = _mm256_and_si256(set, _mm256_set1_epi8(16));
        lo = _mm_or_si128(lo, _mm256_castsi256_si128(fifth));
        hi = _mm_or_si128(hi, _mm256_extracti128_si256(fifth, 1));
    }
    q[0] = _mm256_cvtepu8_epi32(lo);
    q[1] = _mm256_cvtepu8_epi32(high8(lo));
    q[2] = _mm256_cvtepu8_epi32(hi);
    q[3] = _mm256_cvtepu8_epi32(high8(hi));
}

/* The weights of part p of the block at b (32 of them, ascending), four vectors. */
static inline __attribute__((always_inline)) void blk_part(const int type, const uint8_t *b,
                                                           const BState *st, const int p,
                                                           __m256 *w) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    switch (type) {
    case GGML_Q4_0:
    case GGML_Q5_0: { /* d * (q - 8), d * (q - 16) */
        __m256i q[4];
        const int five = type == GGML_Q5_0;
        q4_codes(b + (five ? 6 : 2), five, st->h, q);
        const __m256 bias = _mm256_set1_ps(five ? 16.0f : 8.0f);
        for (int v = 0; v < 4; v++)
            w[v] = _mm256_mul_ps(st->a, _mm256_sub_ps(_mm256_cvtepi32_ps(q[v]), bias));
        break;
    }
    case GGML_Q4_1:
    case GGML_Q5_1: { /* (d * q) + m */
        __m256i q[4];
        const int five = type == GGML_Q5_1;
        q4_codes(b + (five ? 8 : 4), five, st->h, q);
        for (int v = 0; v < 4; v++) /* fma: see ggml_f32.c on FMA_EXACT */
            w[v] = _mm256_fmadd_ps(st->a, _mm256_cvtepi32_ps(q[v]), st->b);
        break;
    }
    case GGML_Q8_0: /* q * d */
        for (int v = 0; v < 4; v++)
            w[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                     _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * v)))), st->a);
        break;
    case GGML_Q4_K:
    case GGML_Q5_K: { /* sub-block p: (d * sc) * q - (dmin * m); its codes the low (p even) or
                       * high nibbles of bytes 32 (p / 2) .. +31, and for Q5_K bit p of qh's
                       * bytes (the 16-bit shift's spill is masked off) */
        const int q5 = type == GGML_Q5_K;
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(b + (q5 ? 48 : 16) + 32 * (p / 2)));
        __m256i q = _mm256_and_si256(p % 2 ? _mm256_srli_epi16(raw, 4) : raw, m4);
        if (q5) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
            const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, p), _mm256_set1_epi8(1));
            q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
        }
        const __m256 sv = _mm256_set1_ps(st->s[p]), ov = _mm256_set1_ps(-st->s[8 + p]);
        const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        const __m128i parts[4] = {lo, high8(lo), hi, high8(hi)};
        for (int v = 0; v < 4; v++) /* fma: see ggml_f32.c on FMA_EXACT */
            w[v] = _mm256_fmadd_ps(sv, u8_ps(parts[v]), ov);
        break;
    }
    default: { /* GGML_Q6_K: quarter j = p % 4 of half h = p / 4 of 128 weights: the low (j < 2)
                * or high nibbles of ql's bytes 64h + 32 (j % 2) .. +31, with bits 2j, 2j + 1 of
                * qh's bytes 32h .. +31 as bits 4, 5; (d * sc) * (q - 32), sc per 16 */
        const int h = p / 4, j = p % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (j % 2)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        const __m256i bits = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), _mm256_set1_epi8(3));
        const __m256i q = _mm256_or_si256(_mm256_and_si256(j < 2 ? ql : _mm256_srli_epi16(ql, 4), m4),
                                          _mm256_slli_epi16(bits, 4));
        const __m256i bias = _mm256_set1_epi32(32);
        const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        const __m128i parts[4] = {lo, high8(lo), hi, high8(hi)};
        const float *s = st->s + 8 * h + 2 * j;
        for (int v = 0; v < 4; v++)
            w[v] = _mm256_mul_ps(_mm256_set1_ps(s[v / 2]), _mm256_cvtepi32_ps(_mm256_sub_epi32(
                                                               _mm256_cvtepu8_epi32(parts[v]), bias)));
        break;
    }
    }
}

/* Lane l + l+4, then + 2, + 1: the tree every path uses. */
static inline float hsum8(__m256 v) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

/* See ggml_f32_avx512.h's tile: the same with 8 lanes. */
static inline __attribute__((always_inline)) void tile(const int R, const float *x, int64_t ldx,
                                                       const float *w, int64_t ldw, int64_t kn,
                                                       float *acc, int first, int last, float *y,
                                                       int64_t ldy, int accumulate, int nout) {
    __m256 a[TR][TO];
    for (int r = 0; r < R; r++)
        for (int o = 0; o < TO; o++)
            a[r][o] = first ? _mm256_setzero_ps() : _mm256_load_ps(acc + (r * TO + o) * VL);
    for (int64_t i = 0; i < kn; i += VL) {
        __m256 wv[TO];
        for (int o = 0; o < TO; o++) wv[o] = _mm256_load_ps(w + o * ldw + i);
        for (int r = 0; r < R; r++) {
            const __m256 xv = _mm256_loadu_ps(x + r * ldx + i);
            for (int o = 0; o < TO; o++) a[r][o] = _mm256_fmadd_ps(wv[o], xv, a[r][o]);
        }
    }
    if (!last) {
        for (int r = 0; r < R; r++)
            for (int o = 0; o < TO; o++) _mm256_store_ps(acc + (r * TO + o) * VL, a[r][o]);
        return;
    }
    for (int r = 0; r < R; r++)
        for (int o = 0; o < nout; o++) {
            const float s = hsum8(a[r][o]);
            float *out = y + r * ldy + o;
            *out = accumulate ? *out + s : s;
        }
}
