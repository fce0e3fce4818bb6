/* ggml_gemm.c's 256-bit paths: AVX2 (AMD Zen 3) and AVX-VNNI (256-bit vpdpbusd: Intel since
 * Alder Lake and its E-core Xeons, AMD since Zen 5). A group's k-step (16 outputs x 4 k, 64
 * bytes) is two vectors of 8 outputs; a register tile is RT2 rows by one group.
 *
 * Without VNNI, vpmaddubsw multiplies the u8 codes by the s8 activations and adds adjacent
 * pairs into int16 lanes, exactly: a pair is at most 2 * 63 * 127 < 2^15 (the 6-bit codes of
 * Q6_K; Q8_0's signed codes take the sign trick, |w| times sign(x, w), at most 2 * 128 * 127).
 * The int16 lanes then add LIM k-steps (as many as stay below 2^15: 8 for 4-bit codes, 4 for
 * 5-bit, 2 for 6-bit, 1 for Q8_0), and vpmaddwd widens them to int32, multiplied by ones or
 * by Q6_K's scale as an int16 pair (sc, sc): that scale costs nothing extra. */

#define RT2 3 /* rows a tile: two sums of 2 vectors a row, 12 of the 16 registers */

/* 8 rows of 8 dwords -> vector i holding dword i of each row. */
static inline __attribute__((always_inline)) void transpose8(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x20);
        r[4 + i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x31);
    }
}

/* Lane o of out[i] = the dword at row o + off + min(i / seg_dw, nseg - 1) * stride
 * + (i % seg_dw) * 4 (seg_dw 4, 8 or 16), as four 8 x 8 transposes. */
static inline __attribute__((always_inline)) void gg_tr16(const Group *g, size_t off,
                                                          size_t stride, const int seg_dw,
                                                          int nseg, u32x16 *out) {
    size_t at[4];
    for (int q = 0; q < 4; q++) at[q] = off + (size_t)(q < nseg - 1 ? q : nseg - 1) * stride;
    for (int rh = 0; rh < 2; rh++)
        for (int dh = 0; dh < 2; dh++) {
            __m256i r[8];
            for (int j = 0; j < 8; j++) {
                const uint8_t *p = g->row[8 * rh + j];
                if (seg_dw == 16)
                    r[j] = _mm256_loadu_si256((const __m256i *)(p + off + 32 * dh));
                else if (seg_dw == 8)
                    r[j] = _mm256_loadu_si256((const __m256i *)(p + at[dh]));
                else
                    r[j] = _mm256_inserti128_si256(
                        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + at[2 * dh]))),
                        _mm_loadu_si128((const __m128i *)(p + at[2 * dh + 1])), 1);
            }
            transpose8(r);
            for (int i = 0; i < 8; i++)
                _mm256_store_si256((__m256i *)(void *)&out[8 * dh + i] + rh, r[i]);
        }
}

static inline void gg_f16x16(const u32x16 *h, int shift, float *out) {
    const __m128i count = _mm_cvtsi32_si128(shift);
    for (int half = 0; half < 2; half++) {
        __m256i v = _mm256_load_si256((const __m256i *)(const void *)h + half);
        v = _mm256_and_si256(_mm256_srl_epi32(v, count), _mm256_set1_epi32(0xFFFF));
        const __m128i halves = _mm_packus_epi32(_mm256_castsi256_si128(v),
                                                _mm256_extracti128_si256(v, 1));
        _mm256_storeu_ps(out + 8 * half, _mm256_cvtph_ps(halves));
    }
}

static inline __m256i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Stores (or adds) R rows of one group, `valid` of its 16 lanes. */
static inline __attribute__((always_inline)) void store_rows2(const Args *a, float y[][16],
                                                              const int R, int valid,
                                                              int64_t o0, int64_t r0) {
    for (int r = 0; r < R; r++) {
        float *out = a->y + (r0 + r) * a->ldy + o0;
        if (valid == 16) {
            for (int h = 0; h < 2; h++) {
                __m256 v = _mm256_load_ps(y[r] + 8 * h);
                if (a->accumulate) v = _mm256_add_ps(_mm256_loadu_ps(out + 8 * h), v);
                _mm256_storeu_ps(out + 8 * h, v);
            }
        } else {
            for (int o = 0; o < valid; o++) out[o] = a->accumulate ? out[o] + y[r][o] : y[r][o];
        }
    }
}

/* Keeps an accumulator's adds in program order: left free, GCC regroups the int16 adds into
 * a tree of all the products first, which does not fit the 16 registers. No instruction. */
#define KEEP_CHAIN(v) __asm__("" : "+x"(v))

#ifdef GG_VNNI256
#define DOT4(acc, w, x) _mm256_dpbusd_avx_epi32(acc, w, x)
#define DOT2W(acc, p, q) _mm256_dpwssd_avx_epi32(acc, p, q)
#else
#define DOT2W(acc, p, q) _mm256_add_epi32(acc, _mm256_madd_epi16(p, q))
#endif

/* int16 k-steps a vpmaddubsw accumulator holds (see the top). */
static inline int steps_i16(int type) {
    if (type == Q6_K) return 2;
    if (type == Q8_0) return 1;
    return type == Q5_0 || type == Q5_1 || type == Q5_K ? 4 : 8;
}

/* Block steps (AHEAD_TICKs) the tiles of `rows` rows take over a panel. */
static inline int64_t gg_block_steps(int type, int64_t rows, int64_t k) {
    (void)type;
    return NT * ((rows + RT2 - 1) / RT2) * (k / 32);
}

/* The per-block step of one row and half group: y = fmaf((float)I, S * dx, y). */
static inline __attribute__((always_inline)) __m256 block_fma(__m256i I, __m256 S, float dx,
                                                              __m256 y) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(S, _mm256_set1_ps(dx)), y);
}

/* I of one block of 32 for R rows by a group, from 0 (c: its first k-step, x: the rows'
 * activations of it): vpdpbusd, or vpmaddubsw over as many k-steps as int16 holds, widened
 * by vpmaddwd with ones. */
static inline __attribute__((always_inline)) void block_codes(const uint8_t *c, const int8_t *x,
                                                              int64_t k, const int R,
                                                              const int type,
                                                              __m256i I[RT2][2]) {
    for (int r = 0; r < R; r++) I[r][0] = I[r][1] = _mm256_setzero_si256();
#ifdef GG_VNNI256
    (void)type;
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) {
        const __m256i w0 = _mm256_load_si256((const __m256i *)(c + CS * s));
        const __m256i w1 = _mm256_load_si256((const __m256i *)(c + CS * s + 32));
        for (int r = 0; r < R; r++) {
            const __m256i xv = bcast32(x + r * k + 4 * s);
            I[r][0] = DOT4(I[r][0], w0, xv);
            I[r][1] = DOT4(I[r][1], w1, xv);
        }
    }
#else
    const __m256i ones = _mm256_set1_epi16(1);
    const int lim = steps_i16(type);
    for (int s0 = 0; s0 < 8; s0 += lim) {
        __m256i acc[RT2][2];
#pragma GCC unroll 8
        for (int s = s0; s < s0 + lim; s++) {
            const __m256i w0 = _mm256_load_si256((const __m256i *)(c + CS * s));
            const __m256i w1 = _mm256_load_si256((const __m256i *)(c + CS * s + 32));
            for (int r = 0; r < R; r++) {
                const __m256i xv = bcast32(x + r * k + 4 * s);
                const __m256i p0 = _mm256_maddubs_epi16(w0, xv);
                const __m256i p1 = _mm256_maddubs_epi16(w1, xv);
                acc[r][0] = s == s0 ? p0 : _mm256_add_epi16(acc[r][0], p0);
                acc[r][1] = s == s0 ? p1 : _mm256_add_epi16(acc[r][1], p1);
                KEEP_CHAIN(acc[r][0]);
                KEEP_CHAIN(acc[r][1]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int h = 0; h < 2; h++)
                I[r][h] = _mm256_add_epi32(I[r][h], _mm256_madd_epi16(acc[r][h], ones));
    }
#endif
}

/* Q4_K, Q5_K: rows r0 .. r0 + R - 1 by group t of the panel (outputs o0 .. o0 + 15). Per
 * super-block the mins' sums a first (their own chain), then the blocks, then y's step by a;
 * y waits in memory (16 registers). */
static inline __attribute__((always_inline)) void tile_k4(const Args *a, const uint8_t *codes,
                                                          const uint8_t *meta, int t, int valid,
                                                          int64_t o0, int64_t r0, const int R,
                                                          const int type, const int on) {
    const int64_t k = a->k, nb = k / QK_K, nb32 = k / 32;
    AHEAD_START(on);
    const int8_t *x = a->xq + r0 * k;
    const float *dx = a->dx + r0 * nb32, *xs = a->xs + r0 * nb32;
    _Alignas(32) float ybuf[RT2][16];
    for (int r = 0; r < R; r++)
        for (int h = 0; h < 2; h++) _mm256_store_ps(ybuf[r] + 8 * h, _mm256_setzero_ps());
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *m = meta + b * MKS + MK_BYTES * t;
        _Alignas(32) float abuf[RT2][16];
        for (int h = 0; h < 2; h++) {
            __m256 acc[RT2];
            for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
            for (int j = 0; j < 8; j++) {
                const __m256 mj = _mm256_load_ps((const float *)(m + MK_M + 64 * j) + 8 * h);
                for (int r = 0; r < R; r++)
                    acc[r] = _mm256_fmadd_ps(mj, _mm256_set1_ps(xs[r * nb32 + 8 * b + j]), acc[r]);
            }
            for (int r = 0; r < R; r++) _mm256_store_ps(abuf[r] + 8 * h, acc[r]);
        }
        for (int j = 0; j < 8; j++) {
            AHEAD_TICK(on);
            __m256i I[RT2][2];
            block_codes(codes + (8 * b + j) * 8 * CS + STEP_BYTES * t, x + 32 * (8 * b + j), k,
                        R, type, I);
            for (int h = 0; h < 2; h++) {
                const __m256 S = _mm256_load_ps((const float *)(m + MK_S + 64 * j) + 8 * h);
                for (int r = 0; r < R; r++)
                    _mm256_store_ps(ybuf[r] + 8 * h,
                                    block_fma(I[r][h], S, dx[r * nb32 + 8 * b + j],
                                              _mm256_load_ps(ybuf[r] + 8 * h)));
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 nd = _mm256_load_ps((const float *)(m + MK_D) + 8 * h);
            for (int r = 0; r < R; r++)
                _mm256_store_ps(ybuf[r] + 8 * h,
                                _mm256_fmadd_ps(_mm256_load_ps(abuf[r] + 8 * h), nd,
                                                _mm256_load_ps(ybuf[r] + 8 * h)));
        }
    }
    AHEAD_END(on);
    store_rows2(a, ybuf, R, valid, o0, r0);
}

/* Q6_K: I = sc_0 (sum_0 - 32 S16_0) + sc_1 (sum_1 - 32 S16_1) per block. With VNNI each half
 * sums from - 32 S16 (Args.aux) and takes its scale by vpmulld; with vpmaddubsw, vpmaddwd takes
 * the scale as an int16 pair (sc, sc) and one more the offsets as (-32 sc_0, -32 sc_1) by the
 * int16 pair (S16_0, S16_1) of `sums`. */
static inline __attribute__((always_inline)) void tile_q6(const Args *a, const uint8_t *codes,
                                                          const uint8_t *meta, int t, int valid,
                                                          int64_t o0, int64_t r0, const int R,
                                                          const int type, const int on) {
    (void)type;
    const int64_t k = a->k, nb32 = k / 32, ns = k / 16;
    AHEAD_START(on);
    const int8_t *x = a->xq + r0 * k;
    const float *dx = a->dx + r0 * nb32;
#ifdef GG_VNNI256
    const int32_t *off = a->aux + r0 * ns;
#else
    const int16_t *s16 = a->sums + r0 * ns;
#endif
    _Alignas(32) float ybuf[RT2][16];
    for (int r = 0; r < R; r++)
        for (int h = 0; h < 2; h++) _mm256_store_ps(ybuf[r] + 8 * h, _mm256_setzero_ps());
    for (int64_t b = 0; b < nb32; b++) {
        const uint8_t *c = codes + b * 8 * CS + STEP_BYTES * t;
        const uint8_t *m = meta + (b / 8) * MKS + MK_BYTES * t;
        const int8_t *xb = x + 32 * b;
        const int j = (int)(b % 8);
        AHEAD_TICK(on);
        __m256i I[RT2][2];
        for (int r = 0; r < R; r++) I[r][0] = I[r][1] = _mm256_setzero_si256();
        for (int half = 0; half < 2; half++) {
            __m256i sc[2];
            for (int h = 0; h < 2; h++)
                sc[h] = _mm256_load_si256((const __m256i *)(m + MK_S + 64 * (2 * j + half)) + h);
#ifdef GG_VNNI256
            __m256i acc[RT2][2];
            for (int r = 0; r < R; r++)
                acc[r][0] = acc[r][1] = _mm256_set1_epi32(off[r * ns + 2 * b + half]);
#pragma GCC unroll 4
            for (int s = 4 * half; s < 4 * half + 4; s++) {
                const __m256i w0 = _mm256_load_si256((const __m256i *)(c + CS * s));
                const __m256i w1 = _mm256_load_si256((const __m256i *)(c + CS * s + 32));
                for (int r = 0; r < R; r++) {
                    const __m256i xv = bcast32(xb + r * k + 4 * s);
                    acc[r][0] = DOT4(acc[r][0], w0, xv);
                    acc[r][1] = DOT4(acc[r][1], w1, xv);
                }
            }
            for (int r = 0; r < R; r++)
                for (int h = 0; h < 2; h++)
                    I[r][h] = _mm256_add_epi32(I[r][h], _mm256_mullo_epi32(acc[r][h], sc[h]));
#else
            for (int s0 = 4 * half; s0 < 4 * half + 4; s0 += 2) {
                __m256i acc[RT2][2];
#pragma GCC unroll 2
                for (int s = s0; s < s0 + 2; s++) {
                    const __m256i w0 = _mm256_load_si256((const __m256i *)(c + CS * s));
                    const __m256i w1 = _mm256_load_si256((const __m256i *)(c + CS * s + 32));
                    for (int r = 0; r < R; r++) {
                        const __m256i xv = bcast32(xb + r * k + 4 * s);
                        const __m256i p0 = _mm256_maddubs_epi16(w0, xv);
                        const __m256i p1 = _mm256_maddubs_epi16(w1, xv);
                        acc[r][0] = s == s0 ? p0 : _mm256_add_epi16(acc[r][0], p0);
                        acc[r][1] = s == s0 ? p1 : _mm256_add_epi16(acc[r][1], p1);
                        KEEP_CHAIN(acc[r][0]);
                        KEEP_CHAIN(acc[r][1]);
                    }
                }
                for (int r = 0; r < R; r++)
                    for (int h = 0; h < 2; h++)
                        I[r][h] = _mm256_add_epi32(I[r][h], _mm256_madd_epi16(acc[r][h], sc[h]));
            }
#endif
        }
#ifndef GG_VNNI256
        for (int h = 0; h < 2; h++) {
            const __m256i op = _mm256_load_si256((const __m256i *)(m + MK_M + 64 * j) + h);
            for (int r = 0; r < R; r++)
                I[r][h] = DOT2W(I[r][h], op, bcast32(s16 + r * ns + 2 * b));
        }
#endif
        for (int h = 0; h < 2; h++) {
            const __m256 d = _mm256_load_ps((const float *)(m + MK_D) + 8 * h);
            for (int r = 0; r < R; r++)
                _mm256_store_ps(ybuf[r] + 8 * h, block_fma(I[r][h], d, dx[r * nb32 + b],
                                                           _mm256_load_ps(ybuf[r] + 8 * h)));
        }
    }
    AHEAD_END(on);
    store_rows2(a, ybuf, R, valid, o0, r0);
}

/* 32-weight blocks: I starts at - c S (Args.aux; none for the signed Q8_0 codes here, whose
 * sum needs no offset, nor for Q4_1, Q5_1). */
static inline __attribute__((always_inline)) void tile_32(const Args *a, const uint8_t *codes,
                                                          const uint8_t *meta, int t, int valid,
                                                          int64_t o0, int64_t r0, const int R,
                                                          const int type, const int on) {
    const int64_t k = a->k, nb = k / 32;
    AHEAD_START(on);
    const int second = type == Q4_1 || type == Q5_1;
#ifdef GG_Q8_SIGNED
    const int offsets = type == Q4_0 || type == Q5_0;
#else
    const int offsets = type == Q4_0 || type == Q5_0 || type == Q8_0;
#endif
    const int8_t *x = a->xq + r0 * k;
    const float *dx = a->dx + r0 * nb, *xs = a->xs + r0 * nb;
    const int32_t *off = a->aux + r0 * nb;
    _Alignas(32) float ybuf[RT2][16];
    for (int r = 0; r < R; r++)
        for (int h = 0; h < 2; h++) _mm256_store_ps(ybuf[r] + 8 * h, _mm256_setzero_ps());
#ifndef GG_VNNI256
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c = codes + b * 8 * CS + STEP_BYTES * t, *m = meta + b * MBS + MB_BYTES * t;
        const int8_t *xb = x + b * 32;
        AHEAD_TICK(on);
        __m256i I[RT2][2];
        for (int r = 0; r < R; r++)
            I[r][0] = I[r][1] =
                offsets ? _mm256_set1_epi32(off[r * nb + b]) : _mm256_setzero_si256();
#ifdef GG_VNNI256
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            const __m256i w0 = _mm256_load_si256((const __m256i *)(c + CS * s));
            const __m256i w1 = _mm256_load_si256((const __m256i *)(c + CS * s + 32));
            for (int r = 0; r < R; r++) {
                const __m256i xv = bcast32(xb + r * k + 4 * s);
                I[r][0] = DOT4(I[r][0], w0, xv);
                I[r][1] = DOT4(I[r][1], w1, xv);
            }
        }
#else
        const int lim = steps_i16(type);
        for (int s0 = 0; s0 < 8; s0 += lim) {
            __m256i acc[RT2][2];
#pragma GCC unroll 8
            for (int s = s0; s < s0 + lim; s++) {
                const __m256i w0 = _mm256_load_si256((const __m256i *)(c + CS * s));
                const __m256i w1 = _mm256_load_si256((const __m256i *)(c + CS * s + 32));
                /* Q8_0: |w| (u8, at most 128) times x with w's sign */
                const __m256i u0 = type == Q8_0 ? _mm256_abs_epi8(w0) : w0;
                const __m256i u1 = type == Q8_0 ? _mm256_abs_epi8(w1) : w1;
                for (int r = 0; r < R; r++) {
                    const __m256i xv = bcast32(xb + r * k + 4 * s);
                    const __m256i x0 = type == Q8_0 ? _mm256_sign_epi8(xv, w0) : xv;
                    const __m256i x1 = type == Q8_0 ? _mm256_sign_epi8(xv, w1) : xv;
                    const __m256i p0 = _mm256_maddubs_epi16(u0, x0);
                    const __m256i p1 = _mm256_maddubs_epi16(u1, x1);
                    acc[r][0] = s == s0 ? p0 : _mm256_add_epi16(acc[r][0], p0);
                    acc[r][1] = s == s0 ? p1 : _mm256_add_epi16(acc[r][1], p1);
                    KEEP_CHAIN(acc[r][0]);
                    KEEP_CHAIN(acc[r][1]);
                }
            }
            for (int r = 0; r < R; r++)
                for (int h = 0; h < 2; h++)
                    I[r][h] = _mm256_add_epi32(I[r][h], _mm256_madd_epi16(acc[r][h], ones));
        }
#endif
        for (int h = 0; h < 2; h++) {
            const __m256 S = _mm256_load_ps((const float *)(m + MB_S) + 8 * h);
            for (int r = 0; r < R; r++) {
                __m256 yr = block_fma(I[r][h], S, dx[r * nb + b], _mm256_load_ps(ybuf[r] + 8 * h));
                if (second)
                    yr = _mm256_fmadd_ps(_mm256_load_ps((const float *)(m + MB_M) + 8 * h),
                                         _mm256_set1_ps(xs[r * nb + b]), yr);
                _mm256_store_ps(ybuf[r] + 8 * h, yr);
            }
        }
    }
    AHEAD_END(on);
    store_rows2(a, ybuf, R, valid, o0, r0);
}

/* One function per type: each group of the panel, its tiles specialised by row count, with
 * and without the prefetch ahead (`on`). */
#define GG_TILES(name, tile, type)                                                          \
    static inline __attribute__((always_inline)) void name##_tiles(                          \
        const Args *a, const uint8_t *c, const uint8_t *m, int lanes, int64_t o0,            \
        int64_t r0, int64_t r1, const int on) {                                              \
        for (int t = 0; t < NT && lanes > LANES * t; t++) {                                  \
            const int valid = lanes - LANES * t < LANES ? lanes - LANES * t : LANES;         \
            const int64_t ot = o0 + LANES * t;                                               \
            for (int64_t r = r0; r < r1;) {                                                  \
                const int64_t left = r1 - r;                                                 \
                if (left >= RT2) { tile(a, c, m, t, valid, ot, r, RT2, type, on); r += RT2; } \
                else if (left >= 2) { tile(a, c, m, t, valid, ot, r, 2, type, on); r += 2; } \
                else { tile(a, c, m, t, valid, ot, r, 1, type, on); r += 1; }                \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
    static __attribute__((noinline)) void name(const Args *a, const uint8_t *c,             \
                                               const uint8_t *m, int lanes, int64_t o0,     \
                                               int64_t r0, int64_t r1, int on) {            \
        if (on) name##_tiles(a, c, m, lanes, o0, r0, r1, 1);                                 \
        else name##_tiles(a, c, m, lanes, o0, r0, r1, 0);                                    \
    }
GG_TILES(rows_q4_0, tile_32, Q4_0)
GG_TILES(rows_q4_1, tile_32, Q4_1)
GG_TILES(rows_q5_0, tile_32, Q5_0)
GG_TILES(rows_q5_1, tile_32, Q5_1)
GG_TILES(rows_q8_0, tile_32, Q8_0)
GG_TILES(rows_q4_k, tile_k4, Q4_K)
GG_TILES(rows_q5_k, tile_k4, Q5_K)
GG_TILES(rows_q6_k, tile_q6, Q6_K)

static void gg_rows(const Args *a, const uint8_t *codes, const uint8_t *meta, int lanes,
                    int64_t o0, int64_t r0, int64_t r1) {
    const int on = a->ahead != NULL && a->ahead->at < a->ahead->end;
    switch (a->type) {
    case Q4_0: rows_q4_0(a, codes, meta, lanes, o0, r0, r1, on); break;
    case Q4_1: rows_q4_1(a, codes, meta, lanes, o0, r0, r1, on); break;
    case Q5_0: rows_q5_0(a, codes, meta, lanes, o0, r0, r1, on); break;
    case Q5_1: rows_q5_1(a, codes, meta, lanes, o0, r0, r1, on); break;
    case Q8_0: rows_q8_0(a, codes, meta, lanes, o0, r0, r1, on); break;
    case Q4_K: rows_q4_k(a, codes, meta, lanes, o0, r0, r1, on); break;
    case Q5_K: rows_q5_k(a, codes, meta, lanes, o0, r0, r1, on); break;
    default: rows_q6_k(a, codes, meta, lanes, o0, r0, r1, on); break;
    }
}
