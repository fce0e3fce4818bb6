/* ggml_vec.c's 256-bit paths: AVX-VNNI (vpdpbusd on 256 bits without AVX-512:
 * Intel's E-core Xeons, client cores since Alder Lake) and AVX2 + FMA (AMD Zen 2/3, Intel
 * Haswell to Comet Lake). Included by ggml_vec.c only.
 *
 * ggml_vec_avx512.h's structure on 256-bit vectors: outputs in tiles of OT = 8, output t in
 * lane t; each block's codes are loaded transposed (t8x4, t8x8), so that code vector c holds
 * weights 4c..4c+3 of every output as unsigned bytes, and per row of x the products with x's
 * dword c, broadcast, add up to the block's I_b of the 8 outputs in one vector. The per-output
 * scalars come transposed the same way from the blocks' heads.
 *
 * The byte products: AVX-VNNI's vpdpbusd; or AVX2's vpmaddubsw (u8 x s8 pairs into saturating
 * int16) then vpmaddwd by ones. vpmaddubsw never saturates here: a pair is at most 2 * 63 * 127
 * (Q6_K's codes), and the pairs of several code vectors are added in int16 first as far as
 * their codes allow (8 vectors of 4-bit codes: 8 * 2 * 15 * 127 < 2^15; 4 of 5-bit; 2 of
 * 6-bit). Q8_0's signed codes: |w| times the activations with w's signs (AVX2, where w + 128
 * would saturate vpmaddubsw), or w + 128 less 128 * the activations' sum (AVX-VNNI). Q6_K's
 * signed scales per 16 weights multiply the halves' sums: vpmulld (AVX-VNNI), or vpmaddwd of
 * the pair sums by the scale (AVX2).
 */

#define OT 8 /* outputs a tile: one vector */

#if defined(__AVXVNNI__)
#define GV_VNNI 1
#else
#define GV_VNNI 0
#endif

/* The weights stream from memory once. A tile reads its OT rows (contiguous) a block at a time
 * each, an order the hardware prefetchers do not follow; so each block asks for its share of
 * the next tile's bytes, in order: they arrive while this tile's arithmetic runs. (Past the end
 * of W a prefetch does nothing.) always_inline: GCC 12 drops the prefetches of an out-of-line
 * copy. */
static inline __attribute__((always_inline)) void prefetch_next(const Args *a, int64_t o0,
                                                                int64_t step, int64_t steps) {
    const int64_t per = (OT * a->row_bytes + steps - 1) / steps;
    const char *next = (const char *)(a->w + (o0 + OT) * a->row_bytes + step * per);
    for (int64_t i = 0; i < per; i += 64) _mm_prefetch(next + i, _MM_HINT_T0);
}

/* p, hidden from the optimiser: a tile's OT rows are addressed from one pointer and the row
 * stride (p + t * rb), which GCC would otherwise strength-reduce into OT pointers of their own,
 * more than the registers, spilled and reloaded for every load. */
static inline const uint8_t *opaque(const uint8_t *p) {
    __asm__("" : "+r"(p));
    return p;
}

/* Four vectors whose 128-bit lane L holds rows 4L + j (j = 0..3 for a[j]) -> v[i]: dword i of
 * every row, row t in lane t. */
static inline __attribute__((always_inline)) void transpose4(const __m256i a[4], __m256i v[4]) {
    const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    v[0] = _mm256_unpacklo_epi64(t0, t2);
    v[1] = _mm256_unpackhi_epi64(t0, t2);
    v[2] = _mm256_unpacklo_epi64(t1, t3);
    v[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* v[i] (i = 0..3): dword i of the 16 bytes at p + t * rb, row t in lane t. */
static inline __attribute__((always_inline)) void t8x4(const uint8_t *p, int64_t rb,
                                                       __m256i v[4]) {
    __m256i a[4];
    p = opaque(p);
    for (int j = 0; j < 4; j++)
        a[j] = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + j * rb))),
            _mm_loadu_si128((const __m128i *)(p + (j + 4) * rb)), 1);
    transpose4(a, v);
}

/* v[i] (i = 0..7): dword i of the 32 bytes at p + t * rb, row t in lane t. */
static inline __attribute__((always_inline)) void t8x8(const uint8_t *p, int64_t rb,
                                                       __m256i v[8]) {
    __m256i a[4], b[4];
    p = opaque(p);
    for (int j = 0; j < 4; j++) {
        const __m256i lo = _mm256_loadu_si256((const __m256i *)(p + j * rb));
        const __m256i hi = _mm256_loadu_si256((const __m256i *)(p + (j + 4) * rb));
        a[j] = _mm256_permute2x128_si256(lo, hi, 0x20); /* dwords 0-3 of rows j, j + 4 */
        b[j] = _mm256_permute2x128_si256(lo, hi, 0x31); /* dwords 4-7 */
    }
    transpose4(a, v);
    transpose4(b, v + 4);
}

/* x's dword at p in every lane. */
static inline __m256i bcast4(const int8_t *p) { return _mm256_set1_epi32((int)load_u32(p)); }

/* init + the sum over c of the u8 x s8 products of code vector c and x's dword c. AVX-VNNI: in
 * `chains` chains (two for one row: eight dependent vpdpbusd are long; one where other rows'
 * chains interleave). AVX2: `span` code vectors' vpmaddubsw pairs are added in int16 first
 * (see the top). */
static inline __attribute__((always_inline)) __m256i dot32(const __m256i codes[8],
                                                           const int8_t *x, __m256i init,
                                                           const int span, const int chains) {
#if GV_VNNI
    (void)span;
    if (chains == 1) {
        for (int c = 0; c < 8; c++)
            init = _mm256_dpbusd_avx_epi32(init, codes[c], bcast4(x + 4 * c));
        return init;
    }
    __m256i s0 = init, s1 = _mm256_setzero_si256();
    for (int c = 0; c < 8; c += 2) {
        s0 = _mm256_dpbusd_avx_epi32(s0, codes[c], bcast4(x + 4 * c));
        s1 = _mm256_dpbusd_avx_epi32(s1, codes[c + 1], bcast4(x + 4 * c + 4));
    }
    return _mm256_add_epi32(s0, s1);
#else
    (void)chains;
    __m256i total = init;
    for (int g = 0; g < 8; g += span) {
        __m256i p = _mm256_maddubs_epi16(codes[g], bcast4(x + 4 * g));
        for (int c = g + 1; c < g + span; c++)
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(codes[c], bcast4(x + 4 * c)));
        total = _mm256_add_epi32(total, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    }
    return total;
#endif
}

/* Row r's outputs o0 + lo .. o0 + OT - 1 stored, or added with accumulate (a ragged last tile
 * overlaps the one before it and stores only its own lanes). */
static inline __attribute__((always_inline)) void put(const Args *a, int64_t r, int64_t o0,
                                                      int lo, __m256 y) {
    float *p = a->y + r * a->ldy + o0;
    if (lo == 0) {
        if (a->accumulate) y = _mm256_add_ps(_mm256_loadu_ps(p), y);
        _mm256_storeu_ps(p, y);
        return;
    }
    const __m256i m = _mm256_cmpgt_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                         _mm256_set1_epi32(lo - 1));
    if (a->accumulate) y = _mm256_add_ps(_mm256_maskload_ps(p, m), y);
    _mm256_maskstore_ps(p, m, y);
}

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline int hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* ---- activation quantisation ----------------------------------------------------------- */

static void quantize_block(const float *x, int8_t *q, float *dx, float *xs, int16_t *sums) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    int nan = 0;
    for (int i = 0; i < QK; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
        nan |= _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    const float d = nan ? NAN : hmax8(amax) / 127.0f;
    const __m256 inv = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    const __m256i int_min = _mm256_set1_epi32(INT32_MIN);
    int total = 0;
    for (int s = 0; s < 2; s++) {
        /* round to nearest even (MXCSR's mode); inf and NaN give INT_MIN, which AVX-512's
         * truncating narrowing makes 0: so here */
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * s), inv));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * s + 8), inv));
        a = _mm256_andnot_si256(_mm256_cmpeq_epi32(a, int_min), a);
        b = _mm256_andnot_si256(_mm256_cmpeq_epi32(b, int_min), b);
        const __m128i a16 = _mm_packs_epi32(_mm256_castsi256_si128(a),
                                            _mm256_extracti128_si256(a, 1));
        const __m128i b16 = _mm_packs_epi32(_mm256_castsi256_si128(b),
                                            _mm256_extracti128_si256(b, 1));
        _mm_storeu_si128((__m128i *)(q + 16 * s), _mm_packs_epi16(a16, b16));
        const int sum = hsum8(_mm256_add_epi32(a, b));
        sums[s] = (int16_t)sum;
        total += sum;
    }
    *dx = d;
    *xs = (float)total * d;
}

/* ---- the 32-weight types ----------------------------------------------------------------- */

/* Q8_0: codes as w + 128 (AVX-VNNI), or |w| with the activations' signs flipped per row. */
#define Q8_OFFSET GV_VNNI

/* A tile's outputs o0 .. o0 + OT - 1 (lanes lo.. stored) for rows r0 .. r0 + nr, a 32-weight
 * type. */
static inline __attribute__((always_inline)) void q32_tile(const Args *a, const int type,
                                                           int64_t o0, int lo, int64_t r0,
                                                           const int nr) {
    const int bsz = block_bytes(type), has_m = type == T_Q4_1 || type == T_Q5_1;
    const int five = type == T_Q5_0 || type == T_Q5_1;
    const int qs = type == T_Q8_0 ? 2 : 2 + 2 * has_m + 4 * five;
    /* I = sum (c - offset) x = sum c x - offset * sum x, the sum from the two int16 sums */
    const int offset = type == T_Q4_0 ? 8 : type == T_Q5_0 ? 16
                                          : type == T_Q8_0 && Q8_OFFSET ? 128 : 0;
    const int sign_trick = type == T_Q8_0 && !Q8_OFFSET;
    const int span = sign_trick ? 1 : five ? 4 : 8;
    const __m256i neg_offset = _mm256_set1_epi16((short)-offset), m4 = _mm256_set1_epi8(0x0f);
    const int64_t nb = a->k / QK, k16 = a->k / 16;
    const int64_t rb = a->row_bytes;
    const uint8_t *w = a->w + o0 * rb; /* the tile's first row; row t at w + t * rb */
    __m256 acc[RG];
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_next(a, o0, b, nb);
        const int64_t at = b * bsz;
        /* each output's d (and m, qh): dwords 0 and 1 of the block, loaded transposed like the
         * codes (a gather is slow on some CPUs, and stores to the stack reloaded as a vector
         * wait for the stores) */
        __m256i head[4];
        t8x4(w + at, rb, head);
        /* Q5_0's qh: bytes 2-5 (dword 0's high half, dword 1's low); Q5_1's: dword 1 */
        const __m256i qh = has_m ? head[1] : _mm256_or_si256(_mm256_srli_epi32(head[0], 16),
                                                             _mm256_slli_epi32(head[1], 16));
        const __m256i dm = head[0];
        /* d in 16-bit lanes 0-3 and 8-11, m in 4-7 and 12-15; then d of all 8, m of all 8 */
        const __m256i dd = _mm256_permute4x64_epi64(
            _mm256_packus_epi32(_mm256_and_si256(dm, _mm256_set1_epi32(0xffff)),
                                _mm256_srli_epi32(dm, 16)), 0xd8);
        const __m256 D = _mm256_cvtph_ps(_mm256_castsi256_si128(dd));
        const __m256 M = has_m ? _mm256_cvtph_ps(_mm256_extracti128_si256(dd, 1))
                               : _mm256_setzero_ps();
        __m256i codes[8], sgn[8];
        if (type == T_Q8_0) {
            t8x8(w + at + qs, rb, sgn);
            for (int c = 0; c < 8; c++)
                codes[c] = Q8_OFFSET ? _mm256_xor_si256(sgn[c], _mm256_set1_epi8((char)0x80))
                                     : _mm256_abs_epi8(sgn[c]);
        } else {
            __m256i p[4]; /* dword c: low nibbles weights 4c.., high 16 + 4c.. */
            t8x4(w + at + qs, rb, p);
            for (int c = 0; c < 4; c++) {
                codes[c] = _mm256_and_si256(p[c], m4);
                codes[c + 4] = _mm256_and_si256(_mm256_srli_epi32(p[c], 4), m4);
            }
            if (five) { /* qh: bit i is weight i's fifth; code vector c's byte m takes bit
                         * 4c + m, of qh's byte c / 2 */
                for (int c = 0; c < 8; c++) {
                    const char q = (char)(c / 2);
                    const __m256i rep = _mm256_shuffle_epi8(qh, _mm256_setr_epi8(
                        q, q, q, q, q + 4, q + 4, q + 4, q + 4, q + 8, q + 8, q + 8, q + 8, q + 12,
                        q + 12, q + 12, q + 12, q, q, q, q, q + 4, q + 4, q + 4, q + 4, q + 8,
                        q + 8, q + 8, q + 8, q + 12, q + 12, q + 12, q + 12));
                    /* byte m: bit 4 (c % 2) + m */
                    const __m256i lanes = _mm256_set1_epi32(c % 2 ? (int)0x80402010 : 0x08040201);
                    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(rep, lanes), lanes);
                    codes[c] = _mm256_or_si256(codes[c],
                                               _mm256_and_si256(set, _mm256_set1_epi8(16)));
                }
            }
        }
        for (int r = 0; r < nr; r++) {
            const int64_t rr = r0 + r;
            const int8_t *x = a->xq + rr * a->k + b * QK;
            const __m256i init = offset ? _mm256_madd_epi16(
                _mm256_set1_epi32((int)load_u32(a->sums + rr * k16 + 2 * b)), neg_offset)
                                        : _mm256_setzero_si256();
            __m256i I;
            if (sign_trick) {
                I = init;
                for (int c = 0; c < 8; c++)
                    I = _mm256_add_epi32(I, _mm256_madd_epi16(
                        _mm256_maddubs_epi16(codes[c], _mm256_sign_epi8(bcast4(x + 4 * c),
                                                                        sgn[c])),
                        _mm256_set1_epi16(1)));
            } else {
                I = dot32(codes, x, init, span, nr == 1 ? 2 : 1);
            }
            const __m256 dxv = _mm256_set1_ps(a->dx[rr * nb + b]);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(D, dxv), acc[r]);
            if (has_m) acc[r] = _mm256_fmadd_ps(M, _mm256_set1_ps(a->xs[rr * nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) put(a, r0 + r, o0, lo, acc[r]);
}

/* ---- the K-quants ------------------------------------------------------------------------ */

/* A tile's outputs for rows r0 .. r0 + nr, Q4_K or Q5_K. */
static inline __attribute__((always_inline)) void k45_tile(const Args *a, const int type,
                                                           int64_t o0, int lo, int64_t r0,
                                                           const int nr) {
    const int bsz = block_bytes(type), qs = type == T_Q5_K ? 48 : 16;
    const int64_t nsb = a->k / QKK, nb = a->k / QK;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m6 = _mm256_set1_epi8(0x3f);
    const __m256i m30 = _mm256_set1_epi8(0x30), lo8 = _mm256_set1_epi32(0xff);
    const int64_t rb = a->row_bytes;
    const uint8_t *w = a->w + o0 * rb; /* the tile's first row; row t at w + t * rb */
    __m256 acc[RG], mins[RG];
    __m256i q[8] = {0}; /* sub-blocks j & ~1 (low nibbles), j | 1 (high) */
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const int64_t at = s * bsz;
        /* d | dmin, then the 12 bytes of 6-bit scales and mins (kquant.k_scale_min), as dwords
         * h[1..3] over the outputs: bytes j of sc_lo / mn_lo are sub-block j's scale / min,
         * those of sc_hi / mn_hi sub-block 4 + j's */
        __m256i h[4];
        t8x4(w + at, rb, h);
        const __m256i dd = _mm256_packus_epi32( /* d in 16-bit lanes 0-3, 8-11; dmin 4-7, 12-15 */
            _mm256_and_si256(h[0], _mm256_set1_epi32(0xffff)), _mm256_srli_epi32(h[0], 16));
        const __m256i dq = _mm256_permute4x64_epi64(dd, 0xd8); /* d of all 8, then dmin */
        const __m256 D = _mm256_cvtph_ps(_mm256_castsi256_si128(dq));
        const __m256 NDMIN = _mm256_xor_ps(_mm256_set1_ps(-0.0f),
                                           _mm256_cvtph_ps(_mm256_extracti128_si256(dq, 1)));
        const __m256i sc_lo = _mm256_and_si256(h[1], m6), mn_lo = _mm256_and_si256(h[2], m6);
        const __m256i sc_hi = _mm256_or_si256(
            _mm256_and_si256(h[3], m4), _mm256_and_si256(_mm256_srli_epi32(h[1], 2), m30));
        const __m256i mn_hi = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi32(h[3], 4), m4),
            _mm256_and_si256(_mm256_srli_epi32(h[2], 2), m30));
        __m256i qh[8];
        if (type == T_Q5_K) t8x8(w + at + 16, rb, qh); /* bit j of byte l: sub-block j, weight l */
        for (int r = 0; r < nr; r++) mins[r] = _mm256_setzero_ps();
        for (int j = 0; j < 8; j++) {
            if (j % 2 == 0) t8x8(w + at + qs + 16 * j, rb, q);
            prefetch_next(a, o0, 8 * s + j, 8 * nsb);
            const int sh = 8 * (j % 4);
            const __m256 scf = _mm256_cvtepi32_ps(
                _mm256_and_si256(_mm256_srli_epi32(j < 4 ? sc_lo : sc_hi, sh), lo8));
            const __m256 mf = _mm256_cvtepi32_ps(
                _mm256_and_si256(_mm256_srli_epi32(j < 4 ? mn_lo : mn_hi, sh), lo8));
            const __m256 S = _mm256_mul_ps(D, scf); /* exact: 11 significant bits times 6 */
            __m256i codes[8];
            for (int c = 0; c < 8; c++) {
                codes[c] = _mm256_and_si256(j % 2 ? _mm256_srli_epi32(q[c], 4) : q[c], m4);
                if (type == T_Q5_K) { /* bit j of each byte to bit 4 */
                    const __m256i b = j < 4 ? _mm256_slli_epi32(qh[c], 4 - j)
                                            : _mm256_srli_epi32(qh[c], j - 4);
                    codes[c] = _mm256_or_si256(codes[c],
                                               _mm256_and_si256(b, _mm256_set1_epi8(0x10)));
                }
            }
            for (int r = 0; r < nr; r++) {
                const int64_t rr = r0 + r, blk = 8 * s + j;
                const __m256i I = dot32(codes, a->xq + rr * a->k + blk * QK,
                                        _mm256_setzero_si256(), type == T_Q5_K ? 4 : 8,
                                        nr == 1 ? 2 : 1);
                const __m256 dxv = _mm256_set1_ps(a->dx[rr * nb + blk]);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(S, dxv), acc[r]);
                mins[r] = _mm256_fmadd_ps(mf, _mm256_set1_ps(a->xs[rr * nb + blk]), mins[r]);
            }
        }
        for (int r = 0; r < nr; r++) acc[r] = _mm256_fmadd_ps(mins[r], NDMIN, acc[r]);
    }
    for (int r = 0; r < nr; r++) put(a, r0 + r, o0, lo, acc[r]);
}

/* A tile's outputs for rows r0 .. r0 + nr, Q6_K. Block b = 4h + p of a super-block: weight l
 * is nibble p / 2 of ql[64 h + 32 (p % 2) + l] and bits 2p, 2p + 1 of qh[32 h + l]. */
static inline __attribute__((always_inline)) void q6k_tile(const Args *a, int64_t o0, int lo,
                                                           int64_t r0, const int nr) {
    const int64_t nsb = a->k / QKK, nb = a->k / QK, k16 = a->k / 16;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    const int64_t rb = a->row_bytes;
    const uint8_t *w = a->w + o0 * rb; /* the tile's first row; row t at w + t * rb */
    __m256 acc[RG];
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const int64_t at = s * 210;
        __m256i tail[4]; /* bytes 194-209: d is dword 3's high half (see q32_tile) */
        t8x4(w + at + 194, rb, tail);
        const __m256i d32 = _mm256_srli_epi32(tail[3], 16);
        const __m256 D = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(d32),
                                                          _mm256_extracti128_si256(d32, 1)));
        __m256i sc[4]; /* dword i: the signed scales of weights 64 i .. 64 i + 63, a byte per 16 */
        t8x4(w + at + 192, rb, sc);
        for (int h = 0; h < 2; h++) {
            __m256i ql0[8], ql1[8], qh[8];
            t8x8(w + at + 64 * h, rb, ql0);
            t8x8(w + at + 64 * h + 32, rb, ql1);
            t8x8(w + at + 128 + 32 * h, rb, qh);
            for (int p = 0; p < 4; p++) {
                const int j = 4 * h + p;
                prefetch_next(a, o0, 8 * s + j, 8 * nsb);
                /* the scales of weights 0-15 and 16-31 of block j, sign-extended */
                const __m256i sc0 = _mm256_srai_epi32(
                    _mm256_slli_epi32(sc[j / 2], 24 - 16 * (j % 2)), 24);
                const __m256i sc1 = _mm256_srai_epi32(
                    _mm256_slli_epi32(sc[j / 2], 16 - 16 * (j % 2)), 24);
                __m256i codes[8];
                for (int c = 0; c < 8; c++) {
                    const __m256i l = p % 2 ? ql1[c] : ql0[c];
                    const __m256i hb = p < 3 ? _mm256_slli_epi32(qh[c], 4 - 2 * p)
                                             : _mm256_srli_epi32(qh[c], 2);
                    codes[c] = _mm256_or_si256(
                        _mm256_and_si256(p / 2 ? _mm256_srli_epi32(l, 4) : l, m4),
                        _mm256_and_si256(hb, m30));
                }
                /* int16 (32 sc0, 32 sc1) a lane: the offsets' factors (|32 sc| <= 4096) */
                const __m256i sc32 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_slli_epi32(sc0, 5), lo16), _mm256_slli_epi32(sc1, 21));
#if !GV_VNNI
                /* int16 (sc0, sc0) and (sc1, sc1) a lane, for vpmaddwd */
                const __m256i s00 = _mm256_or_si256(_mm256_and_si256(sc0, lo16),
                                                    _mm256_slli_epi32(sc0, 16));
                const __m256i s11 = _mm256_or_si256(_mm256_and_si256(sc1, lo16),
                                                    _mm256_slli_epi32(sc1, 16));
#endif
                for (int r = 0; r < nr; r++) {
                    const int64_t rr = r0 + r, blk = 8 * s + j;
                    const int8_t *x = a->xq + rr * a->k + blk * QK;
                    /* the sums of x 0-15 and 16-31, int16: less 32 (sc0 S0 + sc1 S1) */
                    const __m256i off = _mm256_madd_epi16(
                        _mm256_set1_epi32((int)load_u32(a->sums + rr * k16 + 2 * blk)), sc32);
#if GV_VNNI
                    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
                    for (int c = 0; c < 4; c++) {
                        s0 = _mm256_dpbusd_avx_epi32(s0, codes[c], bcast4(x + 4 * c));
                        s1 = _mm256_dpbusd_avx_epi32(s1, codes[c + 4], bcast4(x + 16 + 4 * c));
                    }
                    const __m256i I = _mm256_sub_epi32(
                        _mm256_add_epi32(_mm256_mullo_epi32(s0, sc0), _mm256_mullo_epi32(s1, sc1)),
                        off);
#else
                    __m256i I = _mm256_sub_epi32(_mm256_setzero_si256(), off);
                    for (int c = 0; c < 8; c += 2) {
                        const __m256i p2 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(codes[c], bcast4(x + 4 * c)),
                            _mm256_maddubs_epi16(codes[c + 1], bcast4(x + 4 * c + 4)));
                        I = _mm256_add_epi32(I, _mm256_madd_epi16(p2, c < 4 ? s00 : s11));
                    }
#endif
                    const __m256 dxv = _mm256_set1_ps(a->dx[rr * nb + blk]);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(D, dxv),
                                             acc[r]);
                }
            }
        }
    }
    for (int r = 0; r < nr; r++) put(a, r0 + r, o0, lo, acc[r]);
}

#define q6k_tile_typed(a, type, o0, lo, r0, nr) q6k_tile(a, o0, lo, r0, nr)

/* Each type's tiles with its type a constant, and the row count too for 1 to 4 rows (a decode
 * step, a short draft): the loops over the rows unroll and their sums stay in registers. A
 * ragged last tile is computed at o1 - OT, overlapping the one before, and stores its own
 * lanes only; fewer outputs than a tile in all (never in a model) go the portable way. */
#define GV_TILES(TILE_FN, T)                                                                   \
    static void TILE_FN##_##T(const Args *a, int64_t o0, int64_t o1, int64_t r0, int nr) {     \
        if (a->n < OT) {                                                                       \
            portable_outputs(a, o0, o1, r0, nr);                                               \
            return;                                                                            \
        }                                                                                      \
        for (int64_t o = o0; o < o1; o += OT) {                                                \
            const int64_t at = o + OT <= o1 ? o : o1 - OT;                                     \
            const int lo = (int)(o - at);                                                      \
            if (nr == 1)                                                                       \
                TILE_FN(a, T, at, lo, r0, 1);                                                  \
            else if (nr == 2)                                                                  \
                TILE_FN(a, T, at, lo, r0, 2);                                                  \
            else if (nr == 3)                                                                  \
                TILE_FN(a, T, at, lo, r0, 3);                                                  \
            else if (nr == 4)                                                                  \
                TILE_FN(a, T, at, lo, r0, 4);                                                  \
            else                                                                               \
                TILE_FN(a, T, at, lo, r0, nr);                                                 \
        }                                                                                      \
    }
GV_TILES(q32_tile, T_Q4_0)
GV_TILES(q32_tile, T_Q4_1)
GV_TILES(q32_tile, T_Q5_0)
GV_TILES(q32_tile, T_Q5_1)
GV_TILES(q32_tile, T_Q8_0)
GV_TILES(k45_tile, T_Q4_K)
GV_TILES(k45_tile, T_Q5_K)
GV_TILES(q6k_tile_typed, T_Q6_K)

static void gv_outputs(const Args *a, int64_t o0, int64_t o1, int64_t r0, int nr) {
    switch (a->type) {
    case T_Q4_0: q32_tile_T_Q4_0(a, o0, o1, r0, nr); break;
    case T_Q4_1: q32_tile_T_Q4_1(a, o0, o1, r0, nr); break;
    case T_Q5_0: q32_tile_T_Q5_0(a, o0, o1, r0, nr); break;
    case T_Q5_1: q32_tile_T_Q5_1(a, o0, o1, r0, nr); break;
    case T_Q8_0: q32_tile_T_Q8_0(a, o0, o1, r0, nr); break;
    case T_Q4_K: k45_tile_T_Q4_K(a, o0, o1, r0, nr); break;
    case T_Q5_K: k45_tile_T_Q5_K(a, o0, o1, r0, nr); break;
    case T_Q6_K: q6k_tile_typed_T_Q6_K(a, o0, o1, r0, nr); break;
    }
}
