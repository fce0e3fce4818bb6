/* y = x @ W.T for many rows of x (prefill chunks, agent-turn deltas) on the int8 path, read
 * straight from a GGUF's blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) as the memory
 * map holds them. docs/ggml_kernels.md is the contract and engine/models/ggml_ref.py its torch
 * reference: per (row, output) and block b of 32 weights (and 32 activations: every type's
 * activations are quantised per 32), the exact integer I_b = sum E_i xq_i, then, from y = +0.0
 * and block after block,
 *     y = fmaf((float)I_b, S_b * dx_b, y)
 *     y = fmaf(m_b, xs_b, y)                       Q4_1, Q5_1
 *     a = fmaf((float)m_j, xs_b, a)                Q4_K, Q5_K (a from +0.0 per super-block)
 *     y = fmaf(a, -dmin, y)                        Q4_K, Q5_K, after a super-block's 8 blocks
 * one output per vector lane. Every build (AVX512-VNNI, AVX-VNNI, AVX2, scalar) gives those
 * bits, whatever rows share the call, as the few-row GEMV (ggml_vec.c) does.
 *
 * How. Outputs go in panels of 32: two groups of 16, a group being one vector of int32 lanes.
 * A thread unpacks a panel's 32 rows of W, all of k, into a buffer of its own that stays in
 * L1/L2: the codes as unsigned bytes, 4 consecutive k of each of a group's 16 outputs in 64
 * bytes (the operand of vpdpbusd; the two groups' k-steps alternate), and per block their fp32
 * factors. The unpack transposes 16 rows' raw bytes in 4-byte words (ggml_gemm_*.h: gg_tr16)
 * and decodes the words with whole-vector bit operations written once for every build (u32x16
 * below): a few instructions per 64 codes, paid once a call against `rows` multiply-adds per
 * code. Then the ISA's micro-kernel (ggml_gemm_*.h: gg_rows) runs every row of x over the
 * panel in register tiles, its integer sums exact, offsets from the activations' int16 sums.
 *
 * The codes and I_b, with S16_h the int16 sum of xq over its 16 elements h (`sums`) and
 * S = S16_0 + S16_1 the block's:
 *   Q4_0, Q5_0: codes q (u8), I = sum q xq - c S, c = 8 or 16 (the sum starts at - c S);
 *   Q8_0: codes q + 128 (u8) on the VNNI and scalar paths, I = sum (q + 128) xq - 128 S;
 *         signed codes on the AVX2 path (maddubs's sign trick), I = sum q xq;
 *   Q4_1, Q5_1, Q4_K, Q5_K: codes q, I = sum q xq (the sub-block scale is in S_b);
 *   Q6_K: codes q (0..63), I = sc_0 (sum_0 q xq - 32 S16_0) + sc_1 (sum_1 q xq - 32 S16_1),
 *         the sums over the block's two halves of 16 with their int8 scales.
 * All |intermediate| < 2^31 (docs/ggml_kernels.md, Overflow); xq must lie in [-127, 127], as
 * quantisation gives it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#define GG_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* 256-bit vectors: AVX2 (AMD Zen 3), with vpdpbusd where AVX-VNNI exists (Intel since Alder
 * Lake and its E-core Xeons, AMD since Zen 5). */
#define GG_AVX256 1
#if defined(__AVXVNNI__)
#define GG_VNNI256 1
#else
/* maddubs builds: Q6_K's scales as int16 pairs (sc, sc) for vpmaddwd; Q8_0's codes signed. */
#define GG_SC_PAIRS 1
#define GG_Q8_SIGNED 1
#endif
#else
#define GG_SCALAR 1
#endif
#if !defined(GG_SCALAR)
#include <immintrin.h>
#endif

/* ggml's type ids (GGMLQuantizationType). */
enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

#define LANES 16        /* outputs a group: one vector of int32 lanes */
#define NT 2            /* groups a panel (32 outputs), interleaved step by step */
#define STEP_BYTES 64   /* one k-step (4 k) of a group's codes */
#define CS (STEP_BYTES * NT) /* one k-step of a panel */
#define QK_K 256
/* A K-quant super-block's panel metadata, per group of 16 outputs: MK_S, 16 vectors of 16:
 * Q4_K/Q5_K's S_j = d sc_j (fp32, j < 8); Q6_K's int8 scales sc_h, h < 16 (int32, or int16
 * pairs (sc, sc) on the maddubs builds). MK_M, 8 vectors: Q4_K/Q5_K's mins m_j (fp32); Q6_K's
 * (-32 sc_2j, -32 sc_2j+1) as int16 pairs on the maddubs builds (their offset term). MK_D:
 * Q4_K/Q5_K's -dmin, Q6_K's d (fp32). */
#define MK_S 0
#define MK_M 1024
#define MK_D 1536
#define MK_BYTES 1600
/* A 32-weight block's: d, and m (Q4_1, Q5_1) [16] fp32. */
#define MB_S 0
#define MB_M 64
#define MB_BYTES 128
/* A panel's metadata: per block, the NT groups' one after the other. */
#define MKS (MK_BYTES * NT)
#define MBS (MB_BYTES * NT)

typedef struct {
    int type;
    const uint8_t *w;
    int64_t n, k, row_bytes;
    const int8_t *xq;
    const float *dx, *xs;
    const int16_t *sums;
    int64_t rows;
    float *y;
    int64_t ldy;
    int accumulate;
    /* Per row, from `sums`: the int32 the integer sums start at, - c S per block of 32 (Q4_0,
     * Q5_0, Q8_0: k / 32 a row) or - 32 S16 per 16 (Q6_K on the VNNI paths: k / 16 a row). */
    int32_t *aux;
    struct Ahead *ahead; /* the thread's prefetch of the panel it computes next */
} Args;

/* The raw bytes of the panel a thread computes next (its rows are contiguous in W), asked for a
 * few lines at a time while the micro-kernel runs the current panel (its tiles tick once a
 * block): otherwise the unpack waits on memory, and at 16-64 rows a panel's unpack is a large
 * part of the call (measured on Zen 5, weights from DRAM: 16 rows ran 1.1-1.6x faster, 64 rows
 * up to 1.3x). Only for chunks of up to GG_AHEAD_ROWS rows: with more, the activations
 * streamed between the prefetch and the unpack evict the lines first (1024 rows ran 15%
 * slower with it). */
#define GG_AHEAD_ROWS 64
typedef struct Ahead {
    const uint8_t *at, *end;
    int64_t every, countdown;
    int lines;
} Ahead;

/* Asks for the next lines; returns the block steps until the next ask. */
static inline int64_t ahead_fire(Ahead *p) {
    for (int i = 0; i < p->lines; i++, p->at += 64) __builtin_prefetch(p->at, 0, 2);
    return p->at < p->end ? p->every : INT64_MAX;
}

/* In a tile built with `on` (a constant: tiles are built with and without it, so that calls of
 * many rows pay nothing): its countdown in a register, the rest of Ahead touched only when it
 * fires. */
#define AHEAD_START(on) int64_t ahead_cd = (on) ? a->ahead->countdown : 0
#define AHEAD_TICK(on)                                                                       \
    do {                                                                                     \
        if ((on) && --ahead_cd <= 0) ahead_cd = ahead_fire(a->ahead);                        \
    } while (0)
#define AHEAD_END(on)                                                                        \
    do {                                                                                     \
        if (on) a->ahead->countdown = ahead_cd;                                              \
    } while (0)

/* One group's rows of W. */
typedef struct {
    const uint8_t *row[LANES];
} Group;

typedef struct {
    int block_weights, block_bytes;
} Format;

static int format_of(int type, Format *f) {
    switch (type) {
    case Q4_0: *f = (Format){32, 18}; return 1;
    case Q4_1: *f = (Format){32, 20}; return 1;
    case Q5_0: *f = (Format){32, 22}; return 1;
    case Q5_1: *f = (Format){32, 24}; return 1;
    case Q8_0: *f = (Format){32, 34}; return 1;
    case Q4_K: *f = (Format){256, 144}; return 1;
    case Q5_K: *f = (Format){256, 176}; return 1;
    case Q6_K: *f = (Format){256, 210}; return 1;
    default: return 0;
    }
}

static inline int is_k_type(int type) { return type >= Q4_K; }

static inline uint32_t load32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4); /* unaligned: a memory map's rows have no alignment */
    return v;
}

/* out[o] = the 4 bytes at row o + off, for the 16 rows: block headers, Q5's high bits. */
static inline void gather16(const Group *g, size_t off, uint32_t *out) {
    for (int o = 0; o < LANES; o++) out[o] = load32(g->row[o] + off);
}

/* Bytes of each row the unpack asks for ahead of the block it decodes: 16 rows read in step
 * are more streams than the hardware prefetcher follows, and a large weight (ffn_down: 8-11
 * MB) comes from memory on every call. Measured on Zen 5 with weights from DRAM: 512 (K-quants)
 * and 256 (32-weight blocks) unpacked 1.1-1.4x faster than one block ahead; 1024 and more ran
 * slower again (too many lines in flight). */
#define GG_AHEAD_K 512
#define GG_AHEAD_32 256

/* Prefetches bytes from .. to - 1 (clipped at `end`) of the 16 rows. */
static inline void prefetch_rows(const Group *g, size_t from, size_t to, size_t end) {
    if (to > end) to = end;
    for (int o = 0; o < LANES; o++)
        for (size_t at = from; at < to; at += 64) __builtin_prefetch(g->row[o] + at, 0, 3);
}

/* f16 -> fp32 exactly, as vcvtph2ps does (a NaN keeps its payload, quiet bit set). */
static inline float f16_to_f32(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, em = h & 0x7FFFu;
    uint32_t bits;
    if (em >= 0x7C00u)
        bits = sign | 0x7F800000u | ((em & 0x3FFu) << 13) | (em > 0x7C00u ? 0x00400000u : 0);
    else if (em >= 0x0400u)
        bits = sign | ((em << 13) + ((127u - 15u) << 23));
    else {
        float f = (float)em * 0x1p-24f; /* subnormal or zero: exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Whole-vector operations on 16 lanes (one 512-bit register, two 256-bit or four 128-bit ones,
 * as the build has them): the decoding is the same code on every build. */
typedef uint32_t u32x16 __attribute__((vector_size(64), aligned(64)));
typedef int32_t i32x16 __attribute__((vector_size(64), aligned(64)));
typedef float f32x16 __attribute__((vector_size(64), aligned(64)));
#define VLOAD(p) (*(const u32x16 *)(const void *)(p))
#define VSTORE(p, v) (*(u32x16 *)(void *)(p) = (v))
#define FSTORE(p, v) (*(f32x16 *)(void *)(p) = (v))
#define SPLAT(c) ((u32x16){0} + (uint32_t)(c))

#if !defined(GG_AVX512)
/* *codes |= bit 4 of byte e = bit at + e of *qh, for e < 4, in every lane: the multiply puts
 * bit e of the nibble at bit 8 e (its other copies land elsewhere, with no carry). */
static inline void gg_fifth_bits(u32x16 *codes, const u32x16 *qh, const int at) {
    *codes |= (((((*qh >> at) & 0xF) * 0x00204081u) & 0x01010101u) << 4);
}
#endif

#if defined(GG_AVX512)
#include "ggml_gemm_avx512.h"
#elif defined(GG_AVX256)
#include "ggml_gemm_avx2.h"
#else
#include "ggml_gemm_scalar.h"
#endif

/* ---- the panel: a group's codes and factors, unpacked ------------------------------------ */

/* The f16 in bits shift .. shift + 15 of each lane of h as fp32 into out[16], negated or not. */
static inline void f16_lanes(const u32x16 *h, int shift, float *out, int negate) {
    gg_f16x16(h, shift, out);
    if (negate)
        for (int o = 0; o < LANES; o++) out[o] = -out[o];
}

/* Q4_K/Q5_K's factors (h[0]: d and dmin, h[1..3]: the 12 bytes of 6-bit scales and mins, as
 * ggml's get_scale_min_k4 unpacks them) into the panel: S_j = d sc_j (exact: 11 significant
 * bits by 6), the mins m_j as fp32, -dmin. */
static inline void k4_scales(const u32x16 *h, uint8_t *meta) {
    _Alignas(64) float d[LANES];
    gg_f16x16(h, 0, d);
    f16_lanes(h, 16, (float *)(meta + MK_D), 1);
    const f32x16 dv = *(const f32x16 *)(const void *)d;
    const u32x16 sc = h[1], m = h[2], md = h[3], lo6 = SPLAT(0x3F);
    for (int i = 0; i < 4; i++) {
        const u32x16 sc_lo = (sc >> (8 * i)) & lo6, mn_lo = (m >> (8 * i)) & lo6;
        const u32x16 sc_hi = ((md >> (8 * i)) & 0x0F) | ((sc >> (8 * i + 2)) & 0x30);
        const u32x16 mn_hi = ((md >> (8 * i + 4)) & 0x0F) | ((m >> (8 * i + 2)) & 0x30);
        FSTORE(meta + MK_S + 64 * i, dv * __builtin_convertvector((i32x16)sc_lo, f32x16));
        FSTORE(meta + MK_S + 64 * (4 + i), dv * __builtin_convertvector((i32x16)sc_hi, f32x16));
        FSTORE(meta + MK_M + 64 * i, __builtin_convertvector((i32x16)mn_lo, f32x16));
        FSTORE(meta + MK_M + 64 * (4 + i), __builtin_convertvector((i32x16)mn_hi, f32x16));
    }
}

/* Q6_K's int8 scales (the 16 bytes in sc4[0..3]) and d (bits 16..31 of dw) into the panel. */
static inline void q6_scales(const u32x16 *sc4, const u32x16 *dw, uint8_t *mb) {
    for (int i = 0; i < 4; i++) {
        i32x16 sc[4];
        for (int j = 0; j < 4; j++) sc[j] = (i32x16)(sc4[i] << (24 - 8 * j)) >> 24; /* int8 */
        for (int j = 0; j < 4; j++)
#ifdef GG_SC_PAIRS
            VSTORE(mb + MK_S + 64 * (4 * i + j),
                   ((u32x16)sc[j] & 0xFFFF) | ((u32x16)sc[j] << 16));
#else
            VSTORE(mb + MK_S + 64 * (4 * i + j), (u32x16)sc[j]);
#endif
#ifdef GG_SC_PAIRS
        /* blocks 2 i, 2 i + 1: the pairs (-32 sc_2j, -32 sc_2j+1) for their two halves */
        for (int j = 0; j < 2; j++)
            VSTORE(mb + MK_M + 64 * (2 * i + j),
                   ((u32x16)(sc[2 * j] * -32) & 0xFFFF) |
                       ((u32x16)(sc[2 * j + 1] * -32) << 16));
#endif
    }
    f16_lanes(dw, 16, (float *)(mb + MK_D), 0);
}

/* A group's K-quant blocks (all nb super-blocks of its 16 rows) into the panel: codes at
 * `codes` (k-steps CS apart), metadata at `meta` (super-blocks MKS apart). */
static inline __attribute__((always_inline)) void unpack_k_type(const int type, const Group *g,
                                                                 int64_t nb, uint8_t *codes,
                                                                 uint8_t *meta) {
    const u32x16 lo4 = SPLAT(0x0F0F0F0F);
    const size_t bytes = type == Q4_K ? 144 : type == Q5_K ? 176 : 210;
    u32x16 hdr[16], qh[16], t[16];
    prefetch_rows(g, 0, GG_AHEAD_K, (size_t)nb * bytes);
    /* Four super-blocks' headers (Q6_K: its scales) a transpose: word 4 q + i is word i of
     * super-block b0 + q. */
    for (int64_t b0 = 0; b0 < nb; b0 += 4) {
        const int nq = (int)(nb - b0 < 4 ? nb - b0 : 4);
        gg_tr16(g, (size_t)b0 * bytes + (type == Q6_K ? 192 : 0), bytes, 4, nq, hdr);
        for (int q = 0; q < nq; q++) {
            const int64_t b = b0 + q;
            const size_t off = (size_t)b * bytes;
            uint8_t *c = codes + b * (QK_K / 4) * CS, *mb = meta + b * MKS;
            prefetch_rows(g, off + GG_AHEAD_K, off + bytes + GG_AHEAD_K, (size_t)nb * bytes);
            if (type == Q6_K) {
                /* k = 128 h + 32 l + 4 m + e (k-step 32 h + 8 l + m): ql byte 64 h + 32 (l % 2)
                 * + 4 m + e, its low nibble for l < 2, else its high one; qh byte
                 * 32 h + 4 m + e, bits 2 l. */
                gg_tr16(g, off + 128, 0, 16, 1, qh);
                /* unrolled: constant shifts, t and qh kept in registers (ran 1.25x faster) */
#pragma GCC unroll 2
                for (int hh = 0; hh < 2; hh++) {
                    gg_tr16(g, off + 64 * hh, 0, 16, 1, t);
#pragma GCC unroll 4
                    for (int l = 0; l < 4; l++)
#pragma GCC unroll 8
                        for (int m = 0; m < 8; m++) {
                            const u32x16 q6 = ((t[8 * (l % 2) + m] >> (4 * (l / 2))) & lo4) |
                                              (((qh[8 * hh + m] >> (2 * l)) & 0x03030303u) << 4);
                            VSTORE(c + CS * (32 * hh + 8 * l + m), q6);
                        }
                }
                _Alignas(64) uint32_t dw[LANES];
                gather16(g, off + 206, dw); /* sc[14], sc[15], d: stays inside the block */
                q6_scales(hdr + 4 * q, (const u32x16 *)(const void *)dw, mb);
                continue;
            }
            k4_scales(hdr + 4 * q, mb);
            if (type == Q5_K && q % 2 == 0) /* two super-blocks' 8 qh words a transpose */
                gg_tr16(g, off + 16, bytes, 8, nq - q < 2 ? 1 : 2, qh);
            /* qs dword i: bytes 4 i .. 4 i + 3 of pair p = i / 8: low nibbles are sub-block
             * 2 p, high ones 2 p + 1, at k-step 8 j + i % 8 of sub-block j. Q5_K's fifth bit
             * of sub-block j, weight 4 m + e: bit j of qh byte 4 m + e. */
#pragma GCC unroll 2
            for (int half = 0; half < 2; half++) {
                gg_tr16(g, off + (type == Q4_K ? 16 : 48) + 64 * half, 0, 16, 1, t);
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++) {
                    const int p = 2 * half + i / 8, m = i % 8;
                    u32x16 lo = t[i] & lo4, hi = (t[i] >> 4) & lo4;
                    if (type == Q5_K) {
                        const u32x16 h5 = qh[8 * (q % 2) + m];
                        lo |= ((h5 >> (2 * p)) & 0x01010101u) << 4;
                        hi |= ((h5 >> (2 * p + 1)) & 0x01010101u) << 4;
                    }
                    VSTORE(c + CS * (16 * p + m), lo);
                    VSTORE(c + CS * (16 * p + 8 + m), hi);
                }
            }
        }
    }
}

/* Blocks b .. b + nq - 1 of a group's 32-weight blocks into the panel (see unpack_32_type). */
static inline __attribute__((always_inline)) void unpack_32_step(const int type, const Group *g,
                                                                  int64_t nb, int64_t b,
                                                                  const int nq, uint8_t *codes,
                                                                  uint8_t *meta) {
    const u32x16 lo4 = SPLAT(0x0F0F0F0F);
    const size_t bytes = type == Q4_0 ? 18 : type == Q4_1 ? 20 : type == Q5_0 ? 22
                         : type == Q5_1 ? 24 : 34;
    const size_t qs = type == Q4_0 ? 2 : type == Q4_1 ? 4 : type == Q5_0 ? 6
                      : type == Q5_1 ? 8 : 2;
    u32x16 hd[16], t[16];
    prefetch_rows(g, (size_t)b * bytes + GG_AHEAD_32, (size_t)(b + 4) * bytes + GG_AHEAD_32,
                  (size_t)nb * bytes);
    if (type == Q4_0 || type == Q8_0)
        for (int q = 0; q < nq; q++)
            gather16(g, (size_t)(b + q) * bytes, (uint32_t *)(void *)&hd[4 * q]);
    else
        gg_tr16(g, (size_t)b * bytes, bytes, 4, nq, hd);
    for (int q = 0; q < nq; q++) {
        uint8_t *mb = meta + (b + q) * MBS;
        f16_lanes(hd + 4 * q, 0, (float *)(mb + MB_S), 0);
        if (type == Q4_1 || type == Q5_1) f16_lanes(hd + 4 * q, 16, (float *)(mb + MB_M), 0);
    }
    if (type == Q8_0) {
        for (int q0 = 0; q0 < nq; q0 += 2) {
            gg_tr16(g, (size_t)(b + q0) * bytes + qs, bytes, 8, nq - q0 < 2 ? 1 : 2, t);
            for (int i = 0; i < 16 && q0 + i / 8 < nq; i++)
#ifdef GG_Q8_SIGNED
                VSTORE(codes + CS * (8 * (b + q0) + i), t[i]);
#else
                VSTORE(codes + CS * (8 * (b + q0) + i), t[i] ^ 0x80808080u); /* q + 128 */
#endif
        }
        return;
    }
    /* word 4 q + d: block b + q, bytes 4 d .. 4 d + 3, whose low nibbles are weights
     * 4 d .. 4 d + 3 (k-step d) and high ones 16 + 4 d .. (k-step 4 + d) */
    gg_tr16(g, (size_t)b * bytes + qs, bytes, 4, nq, t);
#pragma GCC unroll 4
    for (int q = 0; q < nq; q++) {
        uint8_t *c = codes + CS * 8 * (b + q);
        /* Q5's fifth bits: Q5_0's qh at bytes 2..5, Q5_1's at 4..7 */
        const u32x16 high = type == Q5_0 ? (hd[4 * q] >> 16) | (hd[4 * q + 1] << 16)
                            : hd[4 * q + 1];
#pragma GCC unroll 4
        for (int d = 0; d < 4; d++) {
            const u32x16 v = t[4 * q + d];
            u32x16 lo = v & lo4, hi = (v >> 4) & lo4;
            if (type == Q5_0 || type == Q5_1) {
                /* bit 4 d + e of qh is bit 4 of byte e of k-step d (low nibbles) and bit
                 * 16 + 4 d + e that of k-step 4 + d */
                gg_fifth_bits(&lo, &high, 4 * d);
                gg_fifth_bits(&hi, &high, 16 + 4 * d);
            }
            VSTORE(c + CS * d, lo);
            VSTORE(c + CS * (4 + d), hi);
        }
    }
}

/* The same as unpack_k_type for the 32-weight blocks (metadata MBS apart), four blocks a step.
 * Their first 16 bytes hold d (and m: Q4_1, Q5_1) and Q5's high bits: transposed (word 4 q + i:
 * word i of block b + q) where more than d is needed, else d is read row by row (cheaper for
 * one word). Their codes come from a transpose of their quants (Q8_0: two blocks a transpose,
 * word 8 q + i). A step of four is a constant one, its decoding unrolled with constant shifts
 * (ran 1.1-1.15x faster than a step of nq blocks). */
static inline __attribute__((always_inline)) void unpack_32_type(const int type, const Group *g,
                                                                  int64_t nb, uint8_t *codes,
                                                                  uint8_t *meta) {
    const size_t bytes = type == Q4_0 ? 18 : type == Q4_1 ? 20 : type == Q5_0 ? 22
                         : type == Q5_1 ? 24 : 34;
    prefetch_rows(g, 0, GG_AHEAD_32, (size_t)nb * bytes);
    for (int64_t b = 0; b < nb; b += 4) {
        if (nb - b >= 4)
            unpack_32_step(type, g, nb, b, 4, codes, meta);
        else
            unpack_32_step(type, g, nb, b, (int)(nb - b), codes, meta);
    }
}

/* The unpacks specialised by type: with a constant type the branches fold away and the
 * decoding keeps to registers (a generic one spilled and ran 1.4x slower). */
#define GG_UNPACK(name, body, type)                                                          \
    static __attribute__((noinline)) void name(const Group *g, int64_t nb, uint8_t *c,      \
                                               uint8_t *m) {                                 \
        body(type, g, nb, c, m);                                                             \
    }
GG_UNPACK(unpack_q4_0, unpack_32_type, Q4_0)
GG_UNPACK(unpack_q4_1, unpack_32_type, Q4_1)
GG_UNPACK(unpack_q5_0, unpack_32_type, Q5_0)
GG_UNPACK(unpack_q5_1, unpack_32_type, Q5_1)
GG_UNPACK(unpack_q8_0, unpack_32_type, Q8_0)
GG_UNPACK(unpack_q4_k, unpack_k_type, Q4_K)
GG_UNPACK(unpack_q5_k, unpack_k_type, Q5_K)
GG_UNPACK(unpack_q6_k, unpack_k_type, Q6_K)

/* One group's codes and factors, all of k, into the panel (codes: its first k-step, meta: its
 * first block's metadata). */
static void unpack(int type, const Group *g, int64_t nb, uint8_t *codes, uint8_t *meta) {
    switch (type) {
    case Q4_0: unpack_q4_0(g, nb, codes, meta); break;
    case Q4_1: unpack_q4_1(g, nb, codes, meta); break;
    case Q5_0: unpack_q5_0(g, nb, codes, meta); break;
    case Q5_1: unpack_q5_1(g, nb, codes, meta); break;
    case Q8_0: unpack_q8_0(g, nb, codes, meta); break;
    case Q4_K: unpack_q4_k(g, nb, codes, meta); break;
    case Q5_K: unpack_q5_k(g, nb, codes, meta); break;
    default: unpack_q6_k(g, nb, codes, meta); break;
    }
}

/* ---- the driver ----------------------------------------------------------------------------- */

static size_t panel_bytes(const Args *a, size_t *meta_at) {
    const int64_t nb = a->k / (is_k_type(a->type) ? QK_K : 32);
    *meta_at = (size_t)a->k / 4 * CS;
    return *meta_at + (size_t)nb * (is_k_type(a->type) ? MKS : MBS);
}

/* Each thread keeps its buffer (panel, then Args.aux) between calls: the OpenMP pool's threads
 * persist, and a fresh buffer would cost a page fault per 4 KiB on every call. It holds the
 * largest call's size (a 32 x 8960 Q6_K panel: 400 KB). */
static _Thread_local uint8_t *panel_buf;
static _Thread_local size_t panel_cap;

static uint8_t *panel(size_t bytes) {
    if (bytes > panel_cap) {
        free(panel_buf);
        panel_cap = (bytes + 4095) & ~(size_t)4095;
        panel_buf = aligned_alloc(64, panel_cap);
        if (panel_buf == NULL) panel_cap = 0;
    }
    return panel_buf;
}

/* Row chunks a panel is split into when there are too few panels to keep every thread busy
 * (each chunk unpacks the panel again). */
static int64_t row_chunks(const Args *a, int64_t panels, int num_threads) {
    if (num_threads <= 1 || panels >= 4 * num_threads) return 1;
    int64_t chunks = (4 * num_threads + panels - 1) / panels;
    const int64_t most = a->rows / 32; /* at least 32 rows a chunk */
    if (chunks > most) chunks = most;
    return chunks < 1 ? 1 : chunks;
}

/* Values Args.aux holds a row (0: the type's sums need none). */
static int64_t aux_per_row(int type, int64_t k) {
#if defined(GG_SCALAR)
    (void)type; (void)k;
    return 0;
#else
    if (type == Q4_0 || type == Q5_0 || type == Q8_0) return k / 32;
#if !defined(GG_SC_PAIRS)
    if (type == Q6_K) return k / 16;
#endif
    return 0;
#endif
}

/* Args.aux (the thread's own) for rows r0 .. r1 - 1. */
static void fill_aux(const Args *a, int64_t r0, int64_t r1) {
    const int type = a->type;
    const int64_t ns = a->k / 16, per_row = aux_per_row(type, a->k);
#ifdef GG_Q8_SIGNED
    const int32_t c = type == Q4_0 ? 8 : type == Q5_0 ? 16 : 0;
#else
    const int32_t c = type == Q4_0 ? 8 : type == Q5_0 ? 16 : 128;
#endif
    for (int64_t r = r0; r < r1; r++) {
        const int16_t *s = a->sums + r * ns;
        int32_t *out = a->aux + r * per_row;
        if (type == Q6_K)
            for (int64_t h = 0; h < per_row; h++) out[h] = -32 * s[h];
        else
            for (int64_t b = 0; b < per_row; b++) out[b] = -c * (s[2 * b] + s[2 * b + 1]);
    }
}

static int run(const Args *args, int num_threads) {
    size_t meta_at;
    const size_t bytes = panel_bytes(args, &meta_at);
    const int64_t panels = (args->n + LANES * NT - 1) / (LANES * NT);
    const int64_t nb = args->k / (is_k_type(args->type) ? QK_K : 32);
    const int64_t chunks = row_chunks(args, panels, num_threads);
    const int64_t chunk_rows = (args->rows + chunks - 1) / chunks;
    const size_t aux_bytes = (size_t)args->rows * (size_t)aux_per_row(args->type, args->k) * 4;
    const int64_t items = panels * chunks;
    int64_t next_item = 0;
    int failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
        /* Each thread fills its own Args.aux (a few adds a row and block: less than a barrier
         * costs when another process holds a core), in its buffer after the panel. */
        uint8_t *buf = panel(bytes + aux_bytes);
        Args a = *args;
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        } else if (aux_bytes > 0) {
            a.aux = (int32_t *)(void *)(buf + bytes);
            fill_aux(&a, 0, a.rows);
        }
        /* Items (a panel and a chunk of rows) are claimed one ahead: the next one's raw
         * bytes are prefetched while this one computes. */
        Ahead ahead = {NULL, NULL, 1, 1, 1};
        a.ahead = &ahead;
        int64_t item;
#pragma omp atomic capture
        item = next_item++;
        while (item < items && buf != NULL) {
            int64_t next;
#pragma omp atomic capture
            next = next_item++;
            const int64_t o0 = item / chunks * LANES * NT, r0 = (item % chunks) * chunk_rows;
            const int64_t r1 = r0 + chunk_rows < a.rows ? r0 + chunk_rows : a.rows;
            const int lanes = (int)(a.n - o0 < LANES * NT ? a.n - o0 : LANES * NT);
            ahead.at = ahead.end = NULL;
            if (next < items && next / chunks != item / chunks && r0 < r1 &&
                r1 - r0 <= GG_AHEAD_ROWS) {
                const int64_t n0 = next / chunks * LANES * NT;
                const int64_t n1 = n0 + LANES * NT < a.n ? n0 + LANES * NT : a.n;
                const int64_t lines = (n1 - n0) * a.row_bytes / 64 + 1;
                /* spread over the second half of the micro-kernel's block steps: sooner, the
                 * activations streamed meanwhile would evict them */
                const int64_t steps = gg_block_steps(a.type, r1 - r0, a.k) / 2 + 1;
                ahead.at = a.w + n0 * a.row_bytes;
                ahead.end = a.w + n1 * a.row_bytes;
                ahead.lines = (int)((lines + steps - 1) / steps);
                ahead.every = steps / lines > 1 ? steps / lines : 1;
                ahead.countdown = steps;
            }
            if (r0 < r1) {
                for (int t = 0; t < NT; t++) {
                    /* a panel's missing outputs repeat the last row: computed, never stored */
                    Group g;
                    for (int o = 0; o < LANES; o++) {
                        const int64_t row =
                            o0 + LANES * t + o < a.n ? o0 + LANES * t + o : a.n - 1;
                        g.row[o] = a.w + row * a.row_bytes;
                    }
                    unpack(a.type, &g, nb, buf + STEP_BYTES * t,
                           buf + meta_at + (is_k_type(a.type) ? MK_BYTES : MB_BYTES) * t);
                }
                gg_rows(&a, buf, buf + meta_at, lanes, o0, r0, r1);
            }
            item = next;
        }
    }
    return !failed;
}

/* ---- Python bindings ------------------------------------------------------------------------ */

/* gemm(type_id, w, n, k, xq, dx, xs, sums, rows, y, ldy, accumulate, num_threads): raw pointers
 * of contiguous buffers (w: n rows of ggml blocks; xq int8 (rows, k); dx, xs fp32
 * (rows, k / 32); sums int16 (rows, k / 16); y fp32 rows of ldy). */
static PyObject *py_gemm(PyObject *self, PyObject *args) {
    int type, accumulate, num_threads;
    unsigned long long w, xq, dx, xs, sums, y;
    long long n, k, rows, ldy;
    if (!PyArg_ParseTuple(args, "iKLLKKKKLKLpi", &type, &w, &n, &k, &xq, &dx, &xs, &sums, &rows,
                          &y, &ldy, &accumulate, &num_threads))
        return NULL;
    Format f;
    if (!format_of(type, &f)) {
        PyErr_Format(PyExc_ValueError, "ggml gemm: no int8 kernel for type %d", type);
        return NULL;
    }
    if (k < 0 || k % f.block_weights != 0) {
        PyErr_Format(PyExc_ValueError, "ggml gemm: k = %lld is not a multiple of %d", k,
                     f.block_weights);
        return NULL;
    }
    if (n < 0 || rows < 0 || ldy < n) {
        PyErr_Format(PyExc_ValueError, "ggml gemm: bad shape n = %lld, rows = %lld, ldy = %lld",
                     n, rows, ldy);
        return NULL;
    }
    if (n > (1LL << 40) / (k / f.block_weights * f.block_bytes + 1)) {
        PyErr_SetString(PyExc_ValueError, "ggml gemm: weight too large");
        return NULL;
    }
    Args a = {type, (const uint8_t *)w, n, k, k / f.block_weights * f.block_bytes,
              (const int8_t *)xq, (const float *)dx, (const float *)xs, (const int16_t *)sums,
              rows, (float *)y, ldy, accumulate, NULL};
    if (n == 0 || rows == 0) Py_RETURN_NONE;
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    if (k == 0) {
        for (int64_t r = 0; r < rows; r++) /* no blocks: the sums are +0.0 */
            for (int64_t o = 0; o < n; o++)
                a.y[r * ldy + o] = accumulate ? a.y[r * ldy + o] + 0.0f : 0.0f;
    } else {
        ok = run(&a, num_threads < 1 ? 1 : num_threads);
    }
    Py_END_ALLOW_THREADS
    if (!ok) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_simd(PyObject *self, PyObject *args) {
#if defined(GG_AVX512)
    return PyUnicode_FromString("avx512_vnni");
#elif defined(GG_VNNI256)
    return PyUnicode_FromString("avx_vnni");
#elif defined(GG_AVX256)
    return PyUnicode_FromString("avx2");
#else
    return PyUnicode_FromString("scalar");
#endif
}

static PyMethodDef methods[] = {
    {"gemm", py_gemm, METH_VARARGS,
     "y (+)= x @ W.T from int8 activation rows and W's ggml blocks (docs/ggml_kernels.md)."},
    {"simd", py_simd, METH_NOARGS, "The SIMD path this build compiled."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ggml_gemm", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ggml_gemm(void) { return PyModule_Create(&module); }
