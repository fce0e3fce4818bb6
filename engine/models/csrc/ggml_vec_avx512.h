/* ggml_vec.c's AVX512-VNNI path (AVX512F/BW/DQ/VL + VNNI: Cascade Lake and later, Zen 4 and
 * later; no VBMI or GFNI assumed). Included by ggml_vec.c only.
 *
 * Outputs go in tiles of OT = 16, output t in lane t of every vector; a tile's rows of W are
 * addressed as w + t * row_bytes. For each 32-weight block the tile's 16 rows give their bytes
 * to a transposing load (t16x4, t16x8: a 128- or 256-bit load a row, then dword unpacks), so
 * that vector c holds dword c of every row; unpacked to unsigned bytes, code vector c is
 * weights 4c..4c+3 of the block for all 16 outputs. Per row of x, vpdpbusd of each code
 * vector with x's dword c broadcast sums the block's products into one vector of the 16
 * outputs' I_b, with no horizontal sums; the fp32 steps follow on the same lanes. The
 * per-output scalars (d, m, dmin, Q5's fifth bits, the K-quants' scales) are transposed the
 * same way from the blocks' heads.
 *
 * The codes' offsets (Q4_0's 8, Q5_0's 16, Q8_0's signed codes taken as w + 128, Q6_K's 32)
 * come off as offset * (the activations' sum), from the int16 sums per 16. Q6_K's signed scales
 * per 16 weights multiply the two halves' sums (vpmulld).
 *
 * Costs (Zen 5, one core): a row adds its eight vpdpbusd (and their broadcasts of x) and the
 * fp32 steps per block and 16 outputs; the unpacking is a tile's, shared by every row. */

#define OT 16 /* outputs a tile: one vector */

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

#ifdef GV_WARM
/* The first tile of a thread's range has no tile before it to prefetch it: ask for the first
 * lines of each of its rows. */
static void warm_first(const Args *a, int64_t o0) {
    if (o0 + OT > a->n) return;
    const char *p = (const char *)(a->w + o0 * a->row_bytes);
    const int64_t len = a->row_bytes < GV_WARM ? a->row_bytes : GV_WARM;
    for (int t = 0; t < OT; t++)
        for (int64_t i = 0; i < len; i += 64) _mm_prefetch(p + t * a->row_bytes + i, _MM_HINT_T0);
}
#endif

/* p, hidden from the optimiser: a tile's OT rows are addressed from one pointer and the row
 * stride (p + t * rb), which GCC would otherwise strength-reduce into OT pointers of their own,
 * more than the registers, spilled and reloaded for every load. */
static inline const uint8_t *opaque(const uint8_t *p) {
    __asm__("" : "+r"(p));
    return p;
}

/* Four vectors whose 128-bit lane L holds rows 4L + j (j = 0..3 for a[j]) -> v[i]: dword i of
 * every row, row t in lane t (a 4 x 4 dword transpose in each 128-bit lane). */
static inline __attribute__((always_inline)) void transpose4(const __m512i a[4], __m512i v[4]) {
    const __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
    v[0] = _mm512_unpacklo_epi64(t0, t2);
    v[1] = _mm512_unpackhi_epi64(t0, t2);
    v[2] = _mm512_unpacklo_epi64(t1, t3);
    v[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* v[i] (i = 0..3): dword i of the 16 bytes at p + t * rb, row t in lane t. */
static inline __attribute__((always_inline)) void t16x4(const uint8_t *p, int64_t rb,
                                                        __m512i v[4]) {
    __m512i a[4];
    p = opaque(p);
    for (int j = 0; j < 4; j++) {
        const uint8_t *q = p + j * rb;
        __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)q));
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(q + 4 * rb)), 1);
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(q + 8 * rb)), 2);
        a[j] = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(q + 12 * rb)), 3);
    }
    transpose4(a, v);
}

/* v[i] (i = 0..7): dword i of the 32 bytes at p + t * rb, row t in lane t. */
static inline __attribute__((always_inline)) void t16x8(const uint8_t *p, int64_t rb,
                                                        __m512i v[8]) {
    __m512i lo[4], hi[4], a[4], b[4];
    p = opaque(p);
    for (int j = 0; j < 4; j++) { /* rows j | j + 4, and j + 8 | j + 12 */
        const uint8_t *q = p + j * rb;
        lo[j] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)q)),
                                   _mm256_loadu_si256((const __m256i *)(q + 4 * rb)), 1);
        hi[j] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(q + 8 * rb))),
            _mm256_loadu_si256((const __m256i *)(q + 12 * rb)), 1);
    }
    for (int j = 0; j < 4; j++) { /* dwords 0-3 (a), 4-7 (b) of rows j, j + 4, j + 8, j + 12 */
        a[j] = _mm512_shuffle_i32x4(lo[j], hi[j], 0x88);
        b[j] = _mm512_shuffle_i32x4(lo[j], hi[j], 0xdd);
    }
    transpose4(a, v);
    transpose4(b, v + 4);
}

/* x's dword at p in every lane. */
static inline __m512i bcast4(const int8_t *p) { return _mm512_set1_epi32((int)load_u32(p)); }

/* The sum over c of the u8 x s8 products of code vector c and x's dword c, plus `init`, in two
 * chains (eight dependent vpdpbusd are long). */
static inline __attribute__((always_inline)) __m512i dot32(const __m512i codes[8],
                                                           const int8_t *x, __m512i init) {
    __m512i s0 = init, s1 = _mm512_setzero_si512();
    for (int c = 0; c < 8; c += 2) {
        s0 = _mm512_dpbusd_epi32(s0, codes[c], bcast4(x + 4 * c));
        s1 = _mm512_dpbusd_epi32(s1, codes[c + 1], bcast4(x + 4 * c + 4));
    }
    return _mm512_add_epi32(s0, s1);
}

/* Row r's outputs o0 + lo .. o0 + OT - 1 stored, or added with accumulate (a ragged last tile
 * overlaps the one before it and stores only its own lanes). */
static inline __attribute__((always_inline)) void put(const Args *a, int64_t r, int64_t o0,
                                                      int lo, __m512 y) {
    float *p = a->y + r * a->ldy + o0;
    const __mmask16 m = (__mmask16)(0xffffu << lo);
    if (a->accumulate) y = _mm512_add_ps(_mm512_maskz_loadu_ps(m, p), y);
    _mm512_mask_storeu_ps(p, m, y);
}

/* ---- activation quantisation ----------------------------------------------------------- */

static void quantize_block(const float *x, int8_t *q, float *dx, float *xs, int16_t *sums) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q)
                          | _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = nan ? NAN : amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    /* round to nearest even (MXCSR's mode); inf and NaN give INT_MIN, truncated to 0 */
    const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));
    const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
    const __m128i q0 = _mm512_cvtepi32_epi8(i0), q1 = _mm512_cvtepi32_epi8(i1);
    _mm_storeu_si128((__m128i *)q, q0);
    _mm_storeu_si128((__m128i *)(q + 16), q1);
    /* the sums of the bytes as stored (INT_MIN's lanes count 0) */
    const int s0 = _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(q0));
    const int s1 = _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(q1));
    sums[0] = (int16_t)s0;
    sums[1] = (int16_t)s1;
    *dx = d;
    *xs = (float)(s0 + s1) * d;
}

/* ---- the 32-weight types ----------------------------------------------------------------- */

/* Lane n: byte m is 16 where bit m of n is set (Q5's fifth bits, four weights a dword). */
static inline __m512i fifth_table(void) {
    return _mm512_setr_epi32(0, 0x10, 0x1000, 0x1010, 0x100000, 0x100010, 0x101000, 0x101010,
                             0x10000000, 0x10000010, 0x10001000, 0x10001010, 0x10100000,
                             0x10100010, 0x10101000, 0x10101010);
}

/* Block b's codes of a tile (row t at w + t * rb) for a 32-weight type: code vector c holds
 * weights 4c..4c+3 of every output as unsigned bytes; D, M: each output's d and m. */
static inline __attribute__((always_inline)) void q32_unpack(const int type, const uint8_t *w,
                                                             int64_t rb, int64_t b,
                                                             __m512i codes[8], __m512 *D,
                                                             __m512 *M) {
    const int bsz = block_bytes(type), has_m = type == T_Q4_1 || type == T_Q5_1;
    const int five = type == T_Q5_0 || type == T_Q5_1;
    const int qs = type == T_Q8_0 ? 2 : 2 + 2 * has_m + 4 * five;
    const int64_t at = b * bsz;
    /* each output's d (and m, qh): dwords 0 and 1 of the block, loaded transposed like the
     * codes (a gather is slow on some CPUs, and stores to the stack reloaded as a vector wait
     * for the stores) */
    __m512i head[4];
    t16x4(w + at, rb, head);
    *D = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head[0]));
    *M = has_m ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head[0], 16)))
               : _mm512_setzero_ps();
    if (type == T_Q8_0) {
        t16x8(w + at + qs, rb, codes);
        for (int c = 0; c < 8; c++) /* w + 128 */
            codes[c] = _mm512_xor_si512(codes[c], _mm512_set1_epi8((char)0x80));
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i p[4]; /* dword c: low nibbles weights 4c.., high 16 + 4c.. */
    t16x4(w + at + qs, rb, p);
    for (int c = 0; c < 4; c++) {
        codes[c] = _mm512_and_si512(p[c], m4);
        codes[c + 4] = _mm512_and_si512(_mm512_srli_epi32(p[c], 4), m4);
    }
    if (five) { /* qh: bit i is weight i's fifth (Q5_0's: bytes 2-5, dword 0's high half and
                 * dword 1's low; Q5_1's: dword 1); vpermd reads an index's low 4 bits */
        const __m512i qh = has_m ? head[1] : _mm512_or_si512(_mm512_srli_epi32(head[0], 16),
                                                             _mm512_slli_epi32(head[1], 16));
        const __m512i table = fifth_table();
        for (int c = 0; c < 8; c++)
            codes[c] = _mm512_or_si512(
                codes[c], _mm512_permutexvar_epi32(_mm512_srli_epi32(qh, 4 * c), table));
    }
}

/* A tile's outputs o0 .. o0 + OT - 1 (lanes lo.. stored) for rows r0 .. r0 + nr, a 32-weight
 * type. The next block's codes are unpacked before this block's rows run: with many rows a
 * block's work fills the out-of-order window, and the loads and shuffles of the next would
 * otherwise start only after it. */
static inline __attribute__((always_inline)) void q32_tile(const Args *a, const int type,
                                                           int64_t o0, int lo, int64_t r0,
                                                           const int nr) {
    const int has_m = type == T_Q4_1 || type == T_Q5_1;
    /* I = sum (c - offset) x = sum c x - offset * sum x, the sum from the two int16 sums */
    const int offset = type == T_Q4_0 ? 8 : type == T_Q5_0 ? 16 : type == T_Q8_0 ? 128 : 0;
    const __m512i neg_offset = _mm512_set1_epi16((short)-offset);
    const int64_t nb = a->k / QK, k16 = a->k / 16;
    const int64_t rb = a->row_bytes;
    const uint8_t *w = a->w + o0 * rb; /* the tile's first row; row t at w + t * rb */
    __m512 acc[RG];
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    __m512i codes[8];
    __m512 D, M;
    q32_unpack(type, w, rb, 0, codes, &D, &M);
    for (int64_t b = 0; b < nb; b++) {
        prefetch_next(a, o0, b, nb);
        __m512i next[8];
        __m512 Dn = D, Mn = M;
        if (b + 1 < nb) q32_unpack(type, w, rb, b + 1, next, &Dn, &Mn);
        for (int r = 0; r < nr; r++) {
            const int64_t rr = r0 + r;
            const int8_t *x = a->xq + rr * a->k + b * QK;
            const __m512i init = offset ? _mm512_madd_epi16(
                _mm512_set1_epi32((int)load_u32(a->sums + rr * k16 + 2 * b)), neg_offset)
                                        : _mm512_setzero_si512();
            const __m512i I = dot32(codes, x, init);
            const __m512 dxv = _mm512_set1_ps(a->dx[rr * nb + b]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(D, dxv), acc[r]);
            if (has_m) acc[r] = _mm512_fmadd_ps(M, _mm512_set1_ps(a->xs[rr * nb + b]), acc[r]);
        }
        if (b + 1 < nb) {
            for (int c = 0; c < 8; c++) codes[c] = next[c];
            D = Dn;
            M = Mn;
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
    const __m512i m4 = _mm512_set1_epi8(0x0f), m6 = _mm512_set1_epi8(0x3f);
    const __m512i m30 = _mm512_set1_epi8(0x30), lo8 = _mm512_set1_epi32(0xff);
    const int64_t rb = a->row_bytes;
    const uint8_t *w = a->w + o0 * rb; /* the tile's first row; row t at w + t * rb */
    __m512 acc[RG], mins[RG];
    __m512i q[8] = {0}; /* sub-blocks j & ~1 (low nibbles), j | 1 (high) */
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const int64_t at = s * bsz;
        /* d | dmin, then the 12 bytes of 6-bit scales and mins (kquant.k_scale_min), as dwords
         * h[1..3] over the outputs: bytes j of sc_lo / mn_lo are sub-block j's scale / min,
         * those of sc_hi / mn_hi sub-block 4 + j's */
        __m512i h[4];
        t16x4(w + at, rb, h);
        const __m512 D = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0]));
        const __m512 NDMIN = _mm512_xor_ps(
            _mm512_set1_ps(-0.0f), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16))));
        const __m512i sc_lo = _mm512_and_si512(h[1], m6), mn_lo = _mm512_and_si512(h[2], m6);
        const __m512i sc_hi = _mm512_ternarylogic_epi32(h[3], m4,
            _mm512_and_si512(_mm512_srli_epi32(h[1], 2), m30), 0xea); /* a & b | c */
        const __m512i mn_hi = _mm512_ternarylogic_epi32(_mm512_srli_epi32(h[3], 4), m4,
            _mm512_and_si512(_mm512_srli_epi32(h[2], 2), m30), 0xea);
        __m512i qh[8];
        if (type == T_Q5_K) t16x8(w + at + 16, rb, qh); /* bit j of byte l: sub-block j, weight l */
        for (int r = 0; r < nr; r++) mins[r] = _mm512_setzero_ps();
        for (int j = 0; j < 8; j++) {
            if (j % 2 == 0) t16x8(w + at + qs + 16 * j, rb, q);
            prefetch_next(a, o0, 8 * s + j, 8 * nsb);
            const int sh = 8 * (j % 4);
            const __m512 scf = _mm512_cvtepi32_ps(
                _mm512_and_si512(_mm512_srli_epi32(j < 4 ? sc_lo : sc_hi, sh), lo8));
            const __m512 mf = _mm512_cvtepi32_ps(
                _mm512_and_si512(_mm512_srli_epi32(j < 4 ? mn_lo : mn_hi, sh), lo8));
            const __m512 S = _mm512_mul_ps(D, scf); /* exact: 11 significant bits times 6 */
            __m512i codes[8];
            for (int c = 0; c < 8; c++) {
                codes[c] = _mm512_and_si512(j % 2 ? _mm512_srli_epi32(q[c], 4) : q[c], m4);
                if (type == T_Q5_K) { /* bit j of each byte to bit 4 */
                    const __m512i b = j < 4 ? _mm512_slli_epi32(qh[c], 4 - j)
                                            : _mm512_srli_epi32(qh[c], j - 4);
                    codes[c] = _mm512_ternarylogic_epi32(b, _mm512_set1_epi8(0x10), codes[c],
                                                         0xea);
                }
            }
            for (int r = 0; r < nr; r++) {
                const int64_t rr = r0 + r, blk = 8 * s + j;
                const __m512i I = dot32(codes, a->xq + rr * a->k + blk * QK,
                                        _mm512_setzero_si512());
                const __m512 dxv = _mm512_set1_ps(a->dx[rr * nb + blk]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(S, dxv), acc[r]);
                mins[r] = _mm512_fmadd_ps(mf, _mm512_set1_ps(a->xs[rr * nb + blk]), mins[r]);
            }
        }
        for (int r = 0; r < nr; r++) acc[r] = _mm512_fmadd_ps(mins[r], NDMIN, acc[r]);
    }
    for (int r = 0; r < nr; r++) put(a, r0 + r, o0, lo, acc[r]);
}

/* A tile's outputs for rows r0 .. r0 + nr, Q6_K. Block b = 4h + p of a super-block: weight l
 * is nibble p / 2 of ql[64 h + 32 (p % 2) + l] and bits 2p, 2p + 1 of qh[32 h + l]. */
static inline __attribute__((always_inline)) void q6k_tile(const Args *a, int64_t o0, int lo,
                                                           int64_t r0, const int nr) {
    const int64_t nsb = a->k / QKK, nb = a->k / QK, k16 = a->k / 16;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const int64_t rb = a->row_bytes;
    const uint8_t *w = a->w + o0 * rb; /* the tile's first row; row t at w + t * rb */
    __m512 acc[RG];
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const int64_t at = s * 210;
        __m512i tail[4]; /* bytes 194-209: d is dword 3's high half (see q32_tile) */
        t16x4(w + at + 194, rb, tail);
        const __m512 D = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(tail[3], 16)));
        __m512i sc[4]; /* dword i: the signed scales of weights 64 i .. 64 i + 63, a byte per 16 */
        t16x4(w + at + 192, rb, sc);
        for (int h = 0; h < 2; h++) {
            __m512i ql0[8], ql1[8], qh[8];
            t16x8(w + at + 64 * h, rb, ql0);
            t16x8(w + at + 64 * h + 32, rb, ql1);
            t16x8(w + at + 128 + 32 * h, rb, qh);
            for (int p = 0; p < 4; p++) {
                const int j = 4 * h + p;
                prefetch_next(a, o0, 8 * s + j, 8 * nsb);
                /* the scales of weights 0-15 and 16-31 of block j, sign-extended */
                const __m512i sc0 = _mm512_srai_epi32(
                    _mm512_slli_epi32(sc[j / 2], 24 - 16 * (j % 2)), 24);
                const __m512i sc1 = _mm512_srai_epi32(
                    _mm512_slli_epi32(sc[j / 2], 16 - 16 * (j % 2)), 24);
                /* int16 (32 sc0, 32 sc1) a lane: the offsets' factors (|32 sc| <= 4096) */
                const __m512i sc32 = _mm512_or_si512(
                    _mm512_and_si512(_mm512_slli_epi32(sc0, 5), _mm512_set1_epi32(0xffff)),
                    _mm512_slli_epi32(sc1, 21));
                __m512i codes[8];
                for (int c = 0; c < 8; c++) {
                    const __m512i l = p % 2 ? ql1[c] : ql0[c];
                    const __m512i hb = p < 3 ? _mm512_slli_epi32(qh[c], 4 - 2 * p)
                                             : _mm512_srli_epi32(qh[c], 2);
                    codes[c] = _mm512_ternarylogic_epi32(p / 2 ? _mm512_srli_epi32(l, 4) : l, m4,
                                                         _mm512_and_si512(hb, m30), 0xea);
                }
                for (int r = 0; r < nr; r++) {
                    const int64_t rr = r0 + r, blk = 8 * s + j;
                    const int8_t *x = a->xq + rr * a->k + blk * QK;
                    /* the sums of x 0-15 and 16-31, int16 */
                    const __m512i pair = _mm512_set1_epi32((int)load_u32(a->sums + rr * k16
                                                                         + 2 * blk));
                    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
                    for (int c = 0; c < 4; c++) {
                        s0 = _mm512_dpbusd_epi32(s0, codes[c], bcast4(x + 4 * c));
                        s1 = _mm512_dpbusd_epi32(s1, codes[c + 4], bcast4(x + 16 + 4 * c));
                    }
                    /* sc0 (D0 - 32 S0) + sc1 (D1 - 32 S1) */
                    const __m512i I = _mm512_sub_epi32(
                        _mm512_add_epi32(_mm512_mullo_epi32(s0, sc0), _mm512_mullo_epi32(s1, sc1)),
                        _mm512_madd_epi16(pair, sc32));
                    const __m512 dxv = _mm512_set1_ps(a->dx[rr * nb + blk]);
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(D, dxv),
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
