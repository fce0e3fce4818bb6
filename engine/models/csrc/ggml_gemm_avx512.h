/* ggml_gemm.c's AVX512-VNNI path: a 512-bit vector is one k-step of a group (16 outputs x 4
 * k), vpdpbusd multiplies it by 4 activation bytes broadcast from one row and adds the four
 * products into each output's int32 lane: 64 multiply-adds an instruction. A register tile is
 * RT rows of x by a panel's 32 outputs (two vectors), so that each broadcast feeds two
 * vpdpbusd: on Zen 5, broadcast operands held a 12-row tile of one vector to 4.7 G vpdpbusd/s,
 * against 6.6 G/s for 6 rows of two (the loop alone runs 7.5 G/s, two a cycle). Measured on
 * Zen 5 beside a loop of vpdpbusd: vmulps, vfmadd, vpmulld and vpdpwssd each take a vpdpbusd's
 * slot; vcvtdq2ps, vaddps, vpaddd, zeroing and broadcast loads do not. So a block of 32 costs
 * a (row, vector) 8 vpdpbusd and, in that pipe, the product S_b dx_b and the FMA (80% of
 * peak), one FMA more for an offset (Q4_1, Q5_1) or a min (Q4_K, Q5_K: 73%), and Q6_K's two
 * scale products (67%). Zen 4 runs one 512-bit vpdpbusd a cycle, with the same pipe shares
 * (measured beside a loop of vpdpbusd); there the tiles reach about 95% of those bounds over a
 * panel that stays in cache (Q4_K 68-70% of the vpdpbusd peak, Q6_K 64-66%), so what is left
 * is in the per-block float steps the contract fixes, not in the loads or the tiling. */

#define RT 6 /* rows a tile: acc and I (or y) for two vectors a row take 24 of the 32 registers */
/* Q6_K's tiles: its two halves' sums take 4 registers a row; 4 rows ran 1.05x faster than 6
 * on Zen 4 (512 rows of ffn_down, 1536 x 8960) and the same at 16 and 64. */
#define RT_Q6 4

/* Lane o of out[i] = the dword at row o + off + min(i / seg_dw, nseg - 1) * stride
 * + (i % seg_dw) * 4 (seg_dw 4, 8 or 16: one, two or four blocks' words a row): 16 rows of 16
 * dwords transposed. Each vector is built from 16-byte chunks of four rows (o, o + 4, o + 8,
 * o + 12 in its four 128-bit lanes: the loads insert them), so only a 4 x 4 transpose within
 * 128-bit lanes remains: 32 in-lane unpacks, against 64 shuffles (half of them across lanes)
 * for a transpose of whole rows. */
static inline __attribute__((always_inline)) void gg_tr16(const Group *g, size_t off,
                                                          size_t stride, const int seg_dw,
                                                          int nseg, u32x16 *out) {
    size_t at[4];
    for (int q = 0; q < 4; q++) at[q] = off + (size_t)(q < nseg - 1 ? q : nseg - 1) * stride;
    for (int c = 0; c < 4; c++) { /* dwords 4 c .. 4 c + 3 of every row */
        const size_t cc = seg_dw == 16 ? off + 16 * c
                          : seg_dw == 8 ? at[c / 2] + 16 * (c % 2) : at[c];
        __m512i v[4]; /* v[q], 128-bit lane L: row 4 L + q */
        for (int q = 0; q < 4; q++) {
            v[q] = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(g->row[q] + cc)));
            for (int L = 1; L < 4; L++)
                v[q] = _mm512_inserti32x4(
                    v[q], _mm_loadu_si128((const __m128i *)(g->row[4 * L + q] + cc)), L);
        }
        const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]);
        const __m512i t1 = _mm512_unpackhi_epi32(v[0], v[1]);
        const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]);
        const __m512i t3 = _mm512_unpackhi_epi32(v[2], v[3]);
        out[4 * c] = (u32x16)_mm512_unpacklo_epi64(t0, t2);
        out[4 * c + 1] = (u32x16)_mm512_unpackhi_epi64(t0, t2);
        out[4 * c + 2] = (u32x16)_mm512_unpacklo_epi64(t1, t3);
        out[4 * c + 3] = (u32x16)_mm512_unpackhi_epi64(t1, t3);
    }
}

/* *codes |= bit 4 of byte e = bit at + e of *qh, for e < 4, in every lane: the byte holding the
 * four bits copied to the lane's four bytes (vpshufb indexes within 128-bit lanes), byte e
 * tested against its bit (at % 4 == 0). */
static inline __attribute__((always_inline)) void gg_fifth_bits(u32x16 *codes,
                                                                const u32x16 *qh, const int at) {
    const __m512i pick = _mm512_add_epi32(
        _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0),
        _mm512_set1_epi32((at / 8) * 0x01010101));
    const __m512i bits = _mm512_set1_epi32((at % 8 == 0 ? 0x08040201 : (int)0x80402010));
    const __mmask64 set = _mm512_test_epi8_mask(_mm512_shuffle_epi8((__m512i)*qh, pick), bits);
    *codes = (u32x16)_mm512_mask_add_epi8((__m512i)*codes, set, (__m512i)*codes,
                                          _mm512_set1_epi8(16));
}

static inline void gg_f16x16(const u32x16 *h, int shift, float *out) {
    const __m512i v = _mm512_srli_epi32((__m512i)*h, (unsigned)shift);
    _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)));
}

static inline __m512i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Stores (or adds) R rows of the panel's 32 lanes, `lanes` of them valid. */
static inline __attribute__((always_inline)) void store_rows(const Args *a, __m512 y[][NT],
                                                             const int R, int lanes,
                                                             int64_t o0, int64_t r0) {
    for (int t = 0; t < NT; t++) {
        const int valid = lanes - LANES * t;
        if (valid <= 0) break;
        const __mmask16 mask = (__mmask16)(valid >= 16 ? 0xFFFFu : (1u << valid) - 1u);
        for (int r = 0; r < R; r++) {
            float *out = a->y + (r0 + r) * a->ldy + o0 + LANES * t;
            __m512 v = y[r][t];
            if (a->accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), v);
            _mm512_mask_storeu_ps(out, mask, v);
        }
    }
}

/* Asks for the lines of y that store_rows writes at the tile's end (R rows of the panel's
 * valid lanes), for writing: a large output's rows are far apart (gate_up's 70 KB) and not in
 * cache, and stores that miss at the end of every tile held the micro-kernel up (measured on
 * Zen 4, 512 rows of a 17920-wide output: 1.07x faster with the lines asked for at the tile's
 * start, a tile's block steps ahead of the stores). */
static inline __attribute__((always_inline)) void prefetch_out(const Args *a, const int R,
                                                               int lanes, int64_t o0,
                                                               int64_t r0) {
    for (int r = 0; r < R; r++) {
        const float *out = a->y + (r0 + r) * a->ldy + o0;
        __builtin_prefetch(out, 1, 3);
        __builtin_prefetch(out + lanes - 1, 1, 3);
    }
}

/* Block steps (AHEAD_TICKs) the tiles of `rows` rows take over a panel. */
static inline int64_t gg_block_steps(int type, int64_t rows, int64_t k) {
    const int64_t most = type == Q6_K ? RT_Q6 : RT;
    return (rows + most - 1) / most * (k / 32);
}

/* The per-block step of one row and group: y = fmaf((float)I, S * dx, y). */
static inline __attribute__((always_inline)) __m512 block_fma(__m512i I, __m512 S, float dx,
                                                              __m512 y) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(S, _mm512_set1_ps(dx)), y);
}

/* Q4_K, Q5_K: rows r0 .. r0 + R - 1 by the panel's 32 outputs, y in registers. Per
 * super-block, first the mins' sums a (their own chain: into a buffer, 12 FMAs a block beside
 * 96 vpdpbusd), then per block of 32 the codes' sum I and its step, then y's step by a. */
static inline __attribute__((always_inline)) void tile_k4(const Args *a, const uint8_t *codes,
                                                          const uint8_t *meta, int lanes,
                                                          int64_t o0, int64_t r0, const int R,
                                                          const int on) {
    const int64_t k = a->k, nb = k / QK_K, nb32 = k / 32;
    AHEAD_START(on);
    prefetch_out(a, R, lanes, o0, r0);
    const int8_t *x = a->xq + r0 * k;
    const float *dx = a->dx + r0 * nb32, *xs = a->xs + r0 * nb32;
    __m512 y[RT][NT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) y[r][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *m = meta + b * MKS;
        _Alignas(64) float abuf[RT][NT][16];
        for (int t = 0; t < NT; t++) {
            __m512 acc[RT];
            for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
            for (int j = 0; j < 8; j++) {
                const __m512 mj = _mm512_load_ps(m + MK_BYTES * t + MK_M + 64 * j);
                for (int r = 0; r < R; r++)
                    acc[r] = _mm512_fmadd_ps(mj, _mm512_set1_ps(xs[r * nb32 + 8 * b + j]), acc[r]);
            }
            for (int r = 0; r < R; r++) _mm512_store_ps(abuf[r][t], acc[r]);
        }
        for (int j = 0; j < 8; j++) {
            AHEAD_TICK(on);
            const uint8_t *cj = codes + (8 * b + j) * 8 * CS;
            const int8_t *xj = x + 32 * (8 * b + j);
            __m512i acc[RT][NT];
            for (int r = 0; r < R; r++)
                for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int s = 0; s < 8; s++) {
                __m512i w[NT];
                for (int t = 0; t < NT; t++) w[t] = _mm512_load_si512(cj + CS * s + STEP_BYTES * t);
                for (int r = 0; r < R; r++) {
                    const __m512i xv = bcast32(xj + r * k + 4 * s);
                    for (int t = 0; t < NT; t++)
                        acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], w[t], xv);
                }
            }
            for (int t = 0; t < NT; t++) {
                const __m512 S = _mm512_load_ps(m + MK_BYTES * t + MK_S + 64 * j);
                for (int r = 0; r < R; r++)
                    y[r][t] = block_fma(acc[r][t], S, dx[r * nb32 + 8 * b + j], y[r][t]);
            }
        }
        for (int t = 0; t < NT; t++) {
            const __m512 nd = _mm512_load_ps(m + MK_BYTES * t + MK_D);
            for (int r = 0; r < R; r++)
                y[r][t] = _mm512_fmadd_ps(_mm512_load_ps(abuf[r][t]), nd, y[r][t]);
        }
    }
    AHEAD_END(on);
    store_rows(a, y, R, lanes, o0, r0);
}

/* Q6_K: each half of a block (16 k) sums from - 32 S16 (Args.aux), times its int8 scale in
 * int32 (exact); y waits in memory (the registers hold both halves' sums: 4 R of 32; at
 * R = 4, y in registers ran no faster). */
static inline __attribute__((always_inline)) void tile_q6(const Args *a, const uint8_t *codes,
                                                          const uint8_t *meta, int lanes,
                                                          int64_t o0, int64_t r0, const int R,
                                                          const int on) {
    const int64_t k = a->k, nb32 = k / 32, ns = k / 16;
    AHEAD_START(on);
    prefetch_out(a, R, lanes, o0, r0);
    const int8_t *x = a->xq + r0 * k;
    const float *dx = a->dx + r0 * nb32;
    const int32_t *off = a->aux + r0 * ns;
    _Alignas(64) float ybuf[RT][NT][16];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) _mm512_store_ps(ybuf[r][t], _mm512_setzero_ps());
    for (int64_t b = 0; b < nb32; b++) {
        const uint8_t *c = codes + b * 8 * CS, *m = meta + (b / 8) * MKS;
        const int8_t *xb = x + 32 * b;
        const int j = (int)(b % 8);
        AHEAD_TICK(on);
        __m512i acc[2][RT][NT];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            for (int r = 0; r < R; r++)
                for (int t = 0; t < NT; t++) acc[h][r][t] = _mm512_set1_epi32(off[r * ns + 2 * b + h]);
#pragma GCC unroll 4
            for (int s = 4 * h; s < 4 * h + 4; s++) {
                __m512i w[NT];
                for (int t = 0; t < NT; t++) w[t] = _mm512_load_si512(c + CS * s + STEP_BYTES * t);
                for (int r = 0; r < R; r++) {
                    const __m512i xv = bcast32(xb + r * k + 4 * s);
                    for (int t = 0; t < NT; t++)
                        acc[h][r][t] = _mm512_dpbusd_epi32(acc[h][r][t], w[t], xv);
                }
            }
        }
        for (int t = 0; t < NT; t++) {
            const uint8_t *mt = m + MK_BYTES * t;
            const __m512i s0 = _mm512_load_si512(mt + MK_S + 64 * (2 * j));
            const __m512i s1 = _mm512_load_si512(mt + MK_S + 64 * (2 * j + 1));
            const __m512 d = _mm512_load_ps(mt + MK_D);
            for (int r = 0; r < R; r++) {
                const __m512i I = _mm512_add_epi32(_mm512_mullo_epi32(acc[0][r][t], s0),
                                                   _mm512_mullo_epi32(acc[1][r][t], s1));
                _mm512_store_ps(ybuf[r][t], block_fma(I, d, dx[r * nb32 + b],
                                                      _mm512_load_ps(ybuf[r][t])));
            }
        }
    }
    __m512 y[RT][NT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) y[r][t] = _mm512_load_ps(ybuf[r][t]);
    AHEAD_END(on);
    store_rows(a, y, R, lanes, o0, r0);
}

/* 32-weight blocks: I starts at - c S (Args.aux) or 0; y stays in registers. */
static inline __attribute__((always_inline)) void tile_32(const Args *a, const uint8_t *codes,
                                                          const uint8_t *meta, int lanes,
                                                          int64_t o0, int64_t r0, const int R,
                                                          const int type, const int on) {
    const int64_t k = a->k, nb = k / 32;
    AHEAD_START(on);
    prefetch_out(a, R, lanes, o0, r0);
    const int second = type == Q4_1 || type == Q5_1;
    const int8_t *x = a->xq + r0 * k;
    const float *dx = a->dx + r0 * nb, *xs = a->xs + r0 * nb;
    const int32_t *off = a->aux + r0 * nb;
    __m512 y[RT][NT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) y[r][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c = codes + b * 8 * CS, *m = meta + b * MBS;
        const int8_t *xb = x + b * 32;
        AHEAD_TICK(on);
        __m512i acc[RT][NT];
        for (int r = 0; r < R; r++) {
            const __m512i init =
                second ? _mm512_setzero_si512() : _mm512_set1_epi32(off[r * nb + b]);
            for (int t = 0; t < NT; t++) acc[r][t] = init;
        }
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            __m512i w[NT];
            for (int t = 0; t < NT; t++) w[t] = _mm512_load_si512(c + CS * s + STEP_BYTES * t);
            for (int r = 0; r < R; r++) {
                const __m512i xv = bcast32(xb + r * k + 4 * s);
                for (int t = 0; t < NT; t++) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], w[t], xv);
            }
        }
        for (int t = 0; t < NT; t++) {
            const uint8_t *mt = m + MB_BYTES * t;
            const __m512 S = _mm512_load_ps(mt + MB_S);
            for (int r = 0; r < R; r++) {
                y[r][t] = block_fma(acc[r][t], S, dx[r * nb + b], y[r][t]);
                if (second)
                    y[r][t] = _mm512_fmadd_ps(_mm512_load_ps(mt + MB_M),
                                              _mm512_set1_ps(xs[r * nb + b]), y[r][t]);
            }
        }
    }
    AHEAD_END(on);
    store_rows(a, y, R, lanes, o0, r0);
}

/* The K-quant tiles with the 32-weight tiles' signature (the type is in the codes' layout). */
#define tile_k4_t(a, c, m, lanes, o0, r0, R, type, on) tile_k4(a, c, m, lanes, o0, r0, R, on)
#define tile_q6_t(a, c, m, lanes, o0, r0, R, type, on) tile_q6(a, c, m, lanes, o0, r0, R, on)

/* One function per type, its tiles specialised by row count (TR at most), with and without the
 * prefetch ahead (`on`). */
#define GG_TILES(name, tile, type, TR)                                                          \
    static inline __attribute__((always_inline)) void name##_tiles(                          \
        const Args *a, const uint8_t *c, const uint8_t *m, int lanes, int64_t o0,            \
        int64_t r0, int64_t r1, const int on) {                                              \
        for (int64_t r = r0; r < r1;) {                                                      \
            const int64_t left = r1 - r;                                                     \
            if (left >= TR) { tile(a, c, m, lanes, o0, r, TR, type, on); r += TR; }          \
            else if (left >= 4) { tile(a, c, m, lanes, o0, r, 4, type, on); r += 4; }        \
            else if (left >= 2) { tile(a, c, m, lanes, o0, r, 2, type, on); r += 2; }        \
            else { tile(a, c, m, lanes, o0, r, 1, type, on); r += 1; }                       \
        }                                                                                    \
    }                                                                                        \
    static __attribute__((noinline)) void name(const Args *a, const uint8_t *c,             \
                                               const uint8_t *m, int lanes, int64_t o0,     \
                                               int64_t r0, int64_t r1, int on) {            \
        if (on) name##_tiles(a, c, m, lanes, o0, r0, r1, 1);                                 \
        else name##_tiles(a, c, m, lanes, o0, r0, r1, 0);                                    \
    }
GG_TILES(rows_q4_0, tile_32, Q4_0, RT)
GG_TILES(rows_q4_1, tile_32, Q4_1, RT)
GG_TILES(rows_q5_0, tile_32, Q5_0, RT)
GG_TILES(rows_q5_1, tile_32, Q5_1, RT)
GG_TILES(rows_q8_0, tile_32, Q8_0, RT)
GG_TILES(rows_q4_k, tile_k4_t, Q4_K, RT)
GG_TILES(rows_q5_k, tile_k4_t, Q5_K, RT)
GG_TILES(rows_q6_k, tile_q6_t, Q6_K, RT_Q6)

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
