/* Paged decode and verify attention for the CPU, read straight from the KV pool.
 *
 * Each sequence has T query rows (1 for a decode, 1 + k for a draft verification) at the end of
 * a context of C tokens whose K/V sit in pages of the pool; query row t, at position
 * p = C - T + t, sees positions [0, p], or (p - W, p] with a sliding window of W keys; under a
 * tree mask (a draft tree's verification, no window) it sees [0, C - T) and the step's row j,
 * at C - T + j, iff bit j of its mask. Work items are (sequence, KV head, split of the
 * context): every K and V byte of a sequence is read once per step, by one item, which scores
 * all the query heads of its group and all T rows against it while it is in L1 (flash
 * decoding). The torch path it replaces gathered each sequence's K/V into a new tensor first
 * (one more read and one write of every byte).
 *
 * Each row follows row_math.h's arithmetic, which the extend kernel (extend_cpu.c) follows too:
 * the splits are its splits, each item's tiles of TILE positions from the split's start; a
 * tile's keys sit in the lanes of a vector (K^T built once per tile for all the item's rows);
 * the splits merge in order. So a row gets the same bits decoded alone, verified among drafts
 * (a tree row: the positions it does not see weigh 0; a chain mask is the causal row), or
 * computed inside any extend.
 *
 * The contract and its reference: engine/attention/cpu_paged.py, tests/engine/attention.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
/* setup.py's flags take in Python's CFLAGS, whose -fwrapv (signed overflow wraps, which
 * CPython's own code needs) costs these kernels' loops up to 10% under GCC 12 (a decode on Zen
 * 5); nothing from here on relies on wrapping. After Python.h, whose inline functions keep it. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-wrapv")
#endif
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16.h"
#include "paged_rows.h"
#include "row_math.h"

#define MAX_HEAD_DIM 256

/* How a tile's K and V are read: an fp32 pool; a bf16 pool widened to fp32; a bf16 pool in
 * bf16 pairs for the dot products (RG_DPBF16 builds, head_dim even). */
enum { PA_F32, PA_WIDE, PA_PAIRS };

typedef struct {
    const void *k, *v;    /* a layer of the pool: (num_slots, num_kv_heads, head_dim) */
    int bf16;             /* pool dtype: 0 fp32, 1 bf16 */
    const float *q;       /* (num_rows, num_heads, head_dim), rows q_stride floats apart */
    float *out;           /* (num_rows, num_heads, head_dim) */
    const int64_t *pages; /* page ids of all sequences, concatenated */
    const int64_t *page_starts, *context_lens, *row_starts; /* per sequence (+1 for rows) */
    int64_t num_seqs, num_heads, num_kv_heads, head_dim, page_size, split_len, q_stride;
    float scale;
    int64_t window;       /* keys a row sees, itself included; 0: all of [0, p] */
    const float *sinks;   /* (num_heads,) logits that join the softmax with no value, or NULL */
    const uint64_t *masks; /* (num_rows,) tree masks, 0 for a causal row; NULL: all causal */
} Args;

/* A tile of positions [p0, p0 + n) as the item's rows read it. */
typedef struct {
    int n, skip;                  /* rows [skip, n) are read; positions before skip weigh 0 */
    const void **k;               /* (TILE): the pool's K rows of positions [skip, n) (SIMD
                                   * builds: a zero row at the others) */
    ptrdiff_t v_off;              /* bytes from a position's K row to its V row */
    uint32_t *kt;                 /* K^T: (head_dim, TILE) fp32, or (head_dim / 2, TILE) pairs */
    uint32_t *vp;                 /* (TILE / 2, head_dim) V pairs (PA_PAIRS) */
    const float *kf[TILE], *vf[TILE]; /* fp32 rows, a zero row before skip (plain C) */
} Tile;

/* A thread's buffers, for the largest item. */
typedef struct {
    float *qs;       /* (rows, head_dim): q scaled by scale * log2 e */
    uint32_t *qp;    /* (rows, head_dim / 2): qs in bf16 pairs (PA_PAIRS) */
    uint32_t *kt, *vp;
    float *kbuf, *vbuf, *zero; /* plain C: (TILE, head_dim) fp32 rows (kbuf + TILE floats of
                                * scratch); a zero row (head_dim) */
} Work;

static int tile_mode(const Args *a) {
    if (!a->bf16) return PA_F32;
#ifdef RG_DPBF16
    if (a->head_dim % 2 == 0) return PA_PAIRS;
#endif
    return PA_WIDE;
}

/* The first position that row t of sequence s sees. Row 0's is the first that any row sees:
 * nothing before it is read, so the pages wholly before it may be invalid ids. */
static int64_t row_start(const Args *a, int64_t s, int64_t t) {
    int64_t t_len = a->row_starts[s + 1] - a->row_starts[s];
    int64_t start = a->context_lens[s] - t_len + t - a->window + 1;
    return a->window > 0 && start > 0 ? start : 0;
}

/* Splits lie on a grid of split_len positions from 0 whatever the window (so do the tiles in
 * them), as row_math.h says. Sequence s's work items take the splits from the one holding
 * row_start(s, 0) to its end. */
static int64_t first_split(const Args *a, int64_t s) { return row_start(a, s, 0) / a->split_len; }

static int64_t num_splits(const Args *a, int64_t s) {
    return (a->context_lens[s] + a->split_len - 1) / a->split_len - first_split(a, s);
}

/* [*j0, *j1): the positions of the tile [p0, p0 + n) that row t of sequence s sees (empty
 * when *j1 <= *j0): causal among the new rows, and within the row's window. */
static void row_span(const Args *a, int64_t s, int64_t t, int64_t p0, int n, int *j0, int *j1) {
    int64_t t_len = a->row_starts[s + 1] - a->row_starts[s];
    int64_t end = a->context_lens[s] - t_len + t + 1 - p0, start = row_start(a, s, t) - p0;
    *j1 = (int)(end < n ? end : n);
    *j0 = (int)(start <= 0 ? 0 : start < n ? start : n);
}

/* Bit j set where row t of sequence s sees position p0 + j of the tile, j in [j0, j1) (its
 * row_span): under a tree mask, a position of the step's rows only where its bit is set. */
static uint64_t row_vis(const Args *a, int64_t s, int64_t t, int64_t p0, int j0, int j1) {
    uint64_t vis = (j1 >= 64 ? ~0ull : (1ull << j1) - 1) & ~((1ull << j0) - 1);
    int64_t row0 = a->row_starts[s], prefix = a->context_lens[s] - (a->row_starts[s + 1] - row0);
    uint64_t bits = a->masks ? a->masks[row0 + t] : 0;
    if (!bits || p0 + j1 <= prefix) return vis;
    for (int j = j0; j < j1; j++) {
        int64_t i = p0 + j - prefix; /* the step's row at this position; < 0: the prefix */
        if (i >= 0 && (i >= 64 || !((bits >> i) & 1))) vis &= ~(1ull << j);
    }
    return vis;
}

/* rows[j]: where the K or V row of KV head `h` at position p0 + j of a sequence (its page ids
 * `pages`) lies in the pool, j < n <= TILE. */
static void tile_rows(const Args *a, const void *base, const int64_t *pages, int64_t h,
                      int64_t p0, int n, const void **rows) {
    rg_paged_rows(base, a->bf16 ? 2 : 4, a->page_size, a->num_kv_heads, a->head_dim, pages, h,
                  p0, n, rows);
}

/* Asks the cache for the K and V rows at `rows[0 .. n)` (K rows; V rows lie v_off bytes on):
 * the tile after the one being computed, whose pages are anywhere in the pool (no hardware
 * prefetcher can follow a page table). */
static void prefetch_rows(const Args *a, const void *const *rows, int n, ptrdiff_t v_off) {
    int64_t row_bytes = a->head_dim * (a->bf16 ? 2 : 4);
    for (int64_t j = 0; j < n; j++)
        for (int64_t b = 0; b < row_bytes; b += 64) {
            __builtin_prefetch((const char *)rows[j] + b);
            __builtin_prefetch((const char *)rows[j] + v_off + b);
        }
}

#if RG_VL == 1
/* rows[j] for j < n: the fp32 row of `raw[j]` (a bf16 pool's widened into `buf`), `zero`
 * before skip. */
static void fp32_rows(const Args *a, const void *const *raw, int skip, int n, float *buf,
                      const float *zero, const float **rows) {
    for (int j = 0; j < n; j++) {
        if (j < skip) {
            rows[j] = zero;
        } else if (!a->bf16) {
            rows[j] = (const float *)raw[j];
        } else {
            const uint16_t *src = (const uint16_t *)raw[j];
            uint32_t *dst = (uint32_t *)(buf + j * a->head_dim);
            for (int64_t d = 0; d < a->head_dim; d++) dst[d] = (uint32_t)src[d] << 16;
            rows[j] = buf + j * a->head_dim;
        }
    }
}
#endif

#if defined(RG_AVX512)
#include "paged_avx512.h"
#elif defined(RG_AVX2)
#define R_MAX 4 /* rows a pass takes together */

/* Transposes an 8 x 8 block of floats held in r[0..7] (rows), written out so that once
 * inlined the block stays in registers. */
static inline __attribute__((always_inline)) void pa_transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* Eight elements of a K or V row from element d0: fp32, or bf16 widened in the register. */
static inline __attribute__((always_inline)) __m256 pa_load8(const void *row, int64_t d0,
                                                             const int wide) {
    if (wide)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
            _mm_loadu_si128((const __m128i *)((const uint16_t *)row + d0))), 16));
    return _mm256_loadu_ps((const float *)row + d0);
}

/* K^T of the tile, fp32: kt[d * TILE + j]; tl->k[j] is a zero row where the tile reads none. */
static void pa_build_kt(const Tile *tl, int64_t d_len, const int wide, uint32_t *kt_bits) {
    float *kt = (float *)kt_bits;
    int64_t full = d_len / 8 * 8;
    for (int64_t kb = 0; kb < TILE; kb += 8) {
        for (int64_t c0 = 0; c0 < full; c0 += 8) {
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) r[i] = pa_load8(tl->k[kb + i], c0, wide);
            pa_transpose8(r);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) _mm256_store_ps(kt + (c0 + i) * TILE + kb, r[i]);
        }
        for (int64_t d = full; d < d_len; d++)
            for (int i = 0; i < 8; i++) {
                const void *row = tl->k[kb + i];
                kt[d * TILE + kb + i] = wide ? rg_from_bf16(((const uint16_t *)row)[d])
                                             : ((const float *)row)[d];
            }
    }
}

/* Scores of keys kb .. kb + 8 KV - 1 for nr rows into p[r] (KV 8-key vectors: 2 nr KV
 * chains of FMAs over the dims). */
static inline __attribute__((always_inline)) void pa_scores8(const float *kt, const int nr,
                                                             const int KV, int kb,
                                                             const float *const *qs,
                                                             int64_t d_len, float (*p)[TILE]) {
    __m256 x[R_MAX][4];
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < KV; i++) x[r][i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < d_len; d++) {
        __m256 k[4];
        for (int i = 0; i < KV; i++) k[i] = _mm256_load_ps(kt + d * TILE + kb + 8 * i);
        for (int r = 0; r < nr; r++) {
            __m256 qb = _mm256_broadcast_ss(qs[r] + d);
            for (int i = 0; i < KV; i++) x[r][i] = _mm256_fmadd_ps(qb, k[i], x[r][i]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < KV; i++) _mm256_store_ps(p[r] + kb + 8 * i, x[r][i]);
}

/* Dims d0 .. d0 + 8 NV - 1 of the nr rows' output: acc * corr, then each visible position's
 * weighted V row in order. */
static inline __attribute__((always_inline)) void pa_out8(const Tile *tl, const int nr,
                                                          const int NV, int64_t d0,
                                                          float (*p)[TILE], const float *corr,
                                                          int j0, int j1, float *const *acc,
                                                          const int wide) {
    __m256 o[R_MAX][4];
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < NV; v++)
            o[r][v] = _mm256_mul_ps(_mm256_loadu_ps(acc[r] + d0 + 8 * v), _mm256_set1_ps(corr[r]));
    for (int64_t j = j0; j < j1; j++) {
        const void *row = (const char *)tl->k[j] + tl->v_off;
        __m256 vv[4];
        for (int v = 0; v < NV; v++) vv[v] = pa_load8(row, d0 + 8 * v, wide);
        for (int r = 0; r < nr; r++) {
            __m256 pb = _mm256_broadcast_ss(p[r] + j);
            for (int v = 0; v < NV; v++) o[r][v] = _mm256_fmadd_ps(pb, vv[v], o[r][v]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < NV; v++) _mm256_storeu_ps(acc[r] + d0 + 8 * v, o[r][v]);
}

/* nr rows through the tile, as paged_avx512.h's pa_pass on eight lanes: keys 8i .. 8i + 7 in
 * one vector; the passes hold at most 12 accumulators (16 ymm registers), at least 8 chains
 * where the rows allow. */
static inline __attribute__((always_inline)) void pa_pass(
    const Tile *tl, const int nr, const float *const *qs, const uint64_t *vis, int j0, int j1,
    float *const *acc, float *const *m, float *const *l, int64_t d_len, const int wide) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const float *kt = (const float *)tl->kt;
    const int per = nr <= 2 ? 4 : nr == 3 ? 3 : 2; /* vectors a pass takes per row */
    float p[R_MAX][TILE] __attribute__((aligned(32))), corr[R_MAX];
    int kb = 0;
    for (; kb + 8 * per <= TILE; kb += 8 * per) pa_scores8(kt, nr, per, kb, qs, d_len, p);
    if (kb + 16 <= TILE) { pa_scores8(kt, nr, 2, kb, qs, d_len, p); kb += 16; }
    if (kb < TILE) pa_scores8(kt, nr, 1, kb, qs, d_len, p);
    for (int r = 0; r < nr; r++) {
        __m256 most = neg_inf, s[8];
        for (int i = 0; i < 8; i++) {
            __m256i bits = _mm256_set1_epi32((int)((vis[r] >> (8 * i)) & 0xFF));
            __m256 seen = _mm256_castsi256_ps(
                _mm256_cmpeq_epi32(_mm256_and_si256(bits, bit), bit));
            s[i] = _mm256_blendv_ps(neg_inf, _mm256_load_ps(p[r] + 8 * i), seen);
            most = _mm256_max_ps(most, s[i]);
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(most), _mm256_extractf128_ps(most, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        float top = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
        top = *m[r] > top ? *m[r] : top;
        float safe = top == -INFINITY ? 0.0f : top;
        __m256 w[8], shift = _mm256_set1_ps(safe);
        for (int i = 0; i < 8; i++) {
            w[i] = rg_exp2_8(_mm256_sub_ps(s[i], shift));
            _mm256_store_ps(p[r] + 8 * i, w[i]);
        }
        corr[r] = rg_exp2(*m[r] - safe);
        *l[r] = fmaf(*l[r], corr[r], rg_sum_keys8(w));
        *m[r] = top;
    }
    int64_t full = d_len / 8 * 8, d0 = 0;
    for (; d0 + 8 * per <= full; d0 += 8 * per)
        pa_out8(tl, nr, per, d0, p, corr, j0, j1, acc, wide);
    for (; d0 + 16 <= full; d0 += 16) pa_out8(tl, nr, 2, d0, p, corr, j0, j1, acc, wide);
    for (; d0 < full; d0 += 8) pa_out8(tl, nr, 1, d0, p, corr, j0, j1, acc, wide);
    for (int64_t d = full; d < d_len; d++) /* a head_dim the extend kernel does not take */
        for (int r = 0; r < nr; r++) {
            float y = acc[r][d] * corr[r];
            for (int j = j0; j < j1; j++) {
                const void *row = (const char *)tl->k[j] + tl->v_off;
                float v = wide ? rg_from_bf16(((const uint16_t *)row)[d]) : ((const float *)row)[d];
                y = fmaf(p[r][j], v, y);
            }
            acc[r][d] = y;
        }
}
#endif

/* The item's rows' scaled q (row_math.h step 1), row r = g * t_len + t. */
static void scale_rows(const Args *a, Work *w, int64_t s, int64_t h, int mode) {
    int64_t group = a->num_heads / a->num_kv_heads, d_len = a->head_dim;
    int64_t row0 = a->row_starts[s], t_len = a->row_starts[s + 1] - row0;
    float mul = a->scale * LOG2E;
    for (int64_t r = 0; r < group * t_len; r++) {
        int64_t g = r / t_len, t = r % t_len;
        const float *q = a->q + (row0 + t) * a->q_stride + (h * group + g) * d_len;
        float *qs = w->qs + r * d_len;
        for (int64_t d = 0; d < d_len; d++) qs[d] = q[d] * mul;
#ifdef RG_DPBF16
        /* Rounded as the extend kernel rounds its q^T (the same instruction: it flushes
         * subnormals, which a plain rounding would not). */
        if (mode != PA_PAIRS) continue;
        for (int64_t d = 0; d < d_len; d += 32) {
            int64_t left = d_len - d;
            __mmask16 lo = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
            __mmask16 hi = left >= 32 ? 0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
            __m512 x = _mm512_maskz_loadu_ps(lo, qs + d), y = _mm512_maskz_loadu_ps(hi, qs + d + 16);
            int64_t pairs = left >= 32 ? 16 : left / 2;
            _mm512_mask_storeu_epi32(w->qp + r * (d_len / 2) + d / 2,
                                     (__mmask16)((1u << pairs) - 1),
                                     (__m512i)_mm512_cvtne2ps_pbh(y, x));
        }
#else
        (void)mode;
#endif
    }
}

/* Readies a tile whose K rows `tl->k` are set (a zero row at the positions no row reads, on
 * the SIMD builds): K^T (and V pairs), or the plain C build's fp32 rows. */
static void prepare_tile(const Args *a, Work *w, Tile *tl, int mode) {
    int64_t d_len = a->head_dim;
#if defined(RG_AVX512) || defined(RG_AVX2)
    if (tl->skip > 0 || tl->n < TILE)
        for (int j = 0; j < TILE; j++)
            if (j < tl->skip || j >= tl->n) tl->k[j] = w->zero;
#if defined(RG_AVX512)
    pa_build_kt(tl, d_len, mode, w->kt);
    if (mode == PA_PAIRS) pa_pack_v(tl, d_len, w->vp);
#else
    pa_build_kt(tl, d_len, mode == PA_WIDE, w->kt);
#endif
#else
    (void)mode;
    const void *vraw[TILE];
    for (int j = tl->skip; j < tl->n; j++) vraw[j] = (const char *)tl->k[j] + tl->v_off;
    fp32_rows(a, tl->k, tl->skip, tl->n, w->kbuf, w->zero, tl->kf);
    fp32_rows(a, vraw, tl->skip, tl->n, w->vbuf, w->zero, tl->vf);
#endif
}

/* Row t (all the group's heads) of the item over a readied tile: the positions `vis` of
 * [j0, j1). */
static void pass_row(const Args *a, Work *w, Tile *tl, int64_t t, int64_t t_len, int j0, int j1,
                     uint64_t vis, int mode, float *m, float *l, float *acc) {
    int64_t d_len = a->head_dim, group = a->num_heads / a->num_kv_heads;
#if RG_VL == 1
    (void)mode;
    (void)j0;
    for (int64_t g = 0; g < group; g++) {
        int64_t r = g * t_len + t;
        rg_row_tile(w->qs + r * d_len, 1, tl->kf, tl->vf, tl->n, vis, d_len, m + r, l + r,
                    acc + r * d_len, 1, w->kbuf + TILE * d_len);
    }
    (void)j1;
#else
    for (int64_t g0 = 0; g0 < group; g0 += R_MAX) {
        int nr = (int)(group - g0 < R_MAX ? group - g0 : R_MAX);
        const float *qs[R_MAX];
        const uint32_t *qp[R_MAX];
        uint64_t vr[R_MAX];
        float *ar[R_MAX], *mr[R_MAX], *lr[R_MAX];
        for (int i = 0; i < nr; i++) {
            int64_t r = (g0 + i) * t_len + t;
            qs[i] = w->qs + r * d_len;
            qp[i] = w->qp + r * (d_len / 2);
            vr[i] = vis;
            ar[i] = acc + r * d_len;
            mr[i] = m + r;
            lr[i] = l + r;
        }
#if defined(RG_AVX512)
#define PASS(NR, MODE) pa_pass(tl, NR, qs, qp, vr, j0, j1, ar, mr, lr, d_len, MODE)
#define PASSES(MODE) \
    if (nr == 1) PASS(1, MODE); else if (nr == 2) PASS(2, MODE); \
    else if (nr == 3) PASS(3, MODE); else PASS(4, MODE)
        if (mode == PA_F32) { PASSES(PA_F32); }
        else if (mode == PA_WIDE) { PASSES(PA_WIDE); }
        else { PASSES(PA_PAIRS); }
#undef PASSES
#undef PASS
#else
        (void)qp;
#define PASS(NR, W) pa_pass(tl, NR, qs, vr, j0, j1, ar, mr, lr, d_len, W)
#define PASSES(W) \
    if (nr == 1) PASS(1, W); else if (nr == 2) PASS(2, W); \
    else if (nr == 3) PASS(3, W); else PASS(4, W)
        if (mode == PA_WIDE) { PASSES(1); } else { PASSES(0); }
#undef PASSES
#undef PASS
#endif
    }
#endif
}

/* Whether sequence s's rows carry a tree mask (a draft tree, not a chain). */
static int is_tree(const Args *a, int64_t s) {
    if (!a->masks) return 0;
    for (int64_t r = a->row_starts[s]; r < a->row_starts[s + 1]; r++)
        if (a->masks[r]) return 1;
    return 0;
}

/* Tree row t over the tile [p0, p0 + n) that holds step positions, as a decode of that row
 * would read it: the prefix's positions where they are, then the step rows the row sees (its
 * mask's bits, itself the last; a causal row: rows 0..t) packed at the positions after the
 * prefix, as if the row's ancestors were the context before it. So a tree row gets the bits
 * of the same token decoded after its accepted ancestors (row_math.h's grid and lane tree
 * follow positions). `base` holds the tile's K rows by real position. */
static void tree_row_tile(const Args *a, Work *w, Tile *tl, const void *const *base,
                          const int64_t *pages, int64_t s, int64_t h, int64_t t, int64_t p0,
                          int n, int skip, int mode, float *m, float *l, float *acc) {
    int64_t row0 = a->row_starts[s], t_len = a->row_starts[s + 1] - row0;
    int64_t prefix = a->context_lens[s] - t_len;
    uint64_t bits = a->masks[row0 + t];
    const void *rows[TILE];
    int seen = 0;
    for (int j = 0; j < n; j++) {
        int64_t p = p0 + j;
        if (p < prefix) { rows[j] = base[j]; continue; }
        int64_t k = p - prefix; /* the k-th step row this row sees, if any */
        int64_t i = -1;
        if (bits) {
            for (int64_t b = 0, c = 0; b < 64 && b < t_len; b++)
                if ((bits >> b) & 1) { if (c == k) { i = b; break; } c++; }
        } else if (k <= t) {
            i = k;
        }
        /* A position the row does not see keeps its own (written, finite) row: its weight
         * is 0, and the SIMD passes read a row's V at its K row + v_off. */
        if (i < 0) { rows[j] = base[j]; continue; }
        tile_rows(a, a->k, pages, h, prefix + i, 1, rows + j);
        seen = j + 1;
    }
    /* The row's virtual position: the last step row it sees. */
    int j1 = seen, j0 = skip;
    if (j1 <= j0 && p0 + n > prefix) {
        /* sees no step row in this tile: the prefix part only */
        j1 = (int)(prefix - p0 < n ? prefix - p0 : n);
    }
    if (j1 <= j0) return;
    tl->n = n;
    tl->skip = skip;
    tl->k = rows;
    prepare_tile(a, w, tl, mode);
    uint64_t vis = (j1 >= 64 ? ~0ull : (1ull << j1) - 1) & ~((1ull << j0) - 1);
    pass_row(a, w, tl, t, t_len, j0, j1, vis, mode, m, l, acc);
}

/* One work item: query rows r = (g, t) of KV head `h` of sequence `s` over the split
 * [lo, hi). Writes per row its max `m`, sum `l` (0 when it saw nothing) and unnormalised
 * output `acc` (head_dim): row_math.h's split state. */
static void attend_split(const Args *a, Work *w, int64_t s, int64_t h, int64_t lo, int64_t hi,
                         float *m, float *l, float *acc) {
    int64_t d_len = a->head_dim, group = a->num_heads / a->num_kv_heads;
    int64_t row0 = a->row_starts[s], t_len = a->row_starts[s + 1] - row0;
    int64_t num_r = group * t_len, first = row_start(a, s, 0);
    int64_t prefix = a->context_lens[s] - t_len;
    const int64_t *pages = a->pages + a->page_starts[s];
    int mode = tile_mode(a), tree = is_tree(a, s);
    for (int64_t r = 0; r < num_r; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        memset(acc + r * d_len, 0, (size_t)d_len * sizeof(float));
    }
    scale_rows(a, w, s, h, mode);
    Tile tl;
    tl.kt = w->kt;
    tl.vp = w->vp;
    tl.v_off = (const char *)a->v - (const char *)a->k;
    /* K rows of this tile and the next (computed when the next is prefetched). */
    const void *rows[2][TILE];
    int cur = 0;
    /* Tiles stay on the split's grid, from the one holding `first`, of which only rows
     * [skip, n) are read: no position before `first` is. */
    int64_t p0 = first > lo ? lo + (first - lo) / TILE * TILE : lo;
    if (p0 < hi) {
        int n = (int)(hi - p0 < TILE ? hi - p0 : TILE), skip = (int)(first > p0 ? first - p0 : 0);
        tile_rows(a, a->k, pages, h, p0 + skip, n - skip, rows[0] + skip);
    }
    for (; p0 < hi; p0 += TILE, cur ^= 1) {
        int n = (int)(hi - p0 < TILE ? hi - p0 : TILE), skip = (int)(first > p0 ? first - p0 : 0);
        if (p0 + n < hi) {
            int next = (int)(hi - p0 - n < TILE ? hi - p0 - n : TILE);
            tile_rows(a, a->k, pages, h, p0 + n, next, rows[cur ^ 1]);
            prefetch_rows(a, rows[cur ^ 1], next, tl.v_off);
        }
        if (tree && p0 + n > prefix) {
            for (int64_t t = 0; t < t_len; t++)
                tree_row_tile(a, w, &tl, rows[cur], pages, s, h, t, p0, n, skip, mode, m, l,
                              acc);
            continue;
        }
        tl.n = n;
        tl.skip = skip;
        tl.k = rows[cur];
        prepare_tile(a, w, &tl, mode);
        for (int64_t t = 0; t < t_len; t++) {
            int j0, j1;
            row_span(a, s, t, p0, n, &j0, &j1);
            if (j1 <= j0) continue;
            uint64_t vis = row_vis(a, s, t, p0, j0, j1);
            if (!vis) continue; /* sees none of the tile: a no-op for the row */
            pass_row(a, w, &tl, t, t_len, j0, j1, vis, mode, m, l, acc);
        }
    }
}

static void *zalloc(size_t bytes) {
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}

/* Runs every work item, then merges each row's splits into `out` (row_math.h steps 3 and 4).
 * Returns 0, or -1 when out of memory. */
static int run(const Args *a, int num_threads) {
    int64_t group = a->num_heads / a->num_kv_heads, d_len = a->head_dim;
    int64_t num_items = 0, num_state = 0, max_rows = 1;
    int64_t *item_start = malloc((size_t)(a->num_seqs + 1) * sizeof(int64_t));
    int64_t *state_start = malloc((size_t)(a->num_seqs + 1) * sizeof(int64_t));
    if (!item_start || !state_start) { free(item_start); free(state_start); return -1; }
    for (int64_t s = 0; s < a->num_seqs; s++) {
        int64_t splits = num_splits(a, s), t_len = a->row_starts[s + 1] - a->row_starts[s];
        item_start[s] = num_items;
        state_start[s] = num_state;
        num_items += a->num_kv_heads * splits;
        num_state += a->num_kv_heads * splits * group * t_len;
        max_rows = group * t_len > max_rows ? group * t_len : max_rows;
    }
    item_start[a->num_seqs] = num_items;
    state_start[a->num_seqs] = num_state;
    /* Per state row: m, l, then acc (head_dim). */
    float *state = malloc((size_t)num_state * (size_t)(d_len + 2) * sizeof(float));
    if (!state) { free(item_start); free(state_start); return -1; }
    int failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
        Work w;
        w.qs = zalloc((size_t)(max_rows * d_len) * sizeof(float));
        w.qp = zalloc((size_t)(max_rows * (d_len / 2 + 1)) * sizeof(uint32_t));
        w.kt = zalloc((size_t)(TILE * d_len) * sizeof(uint32_t));
        w.vp = zalloc((size_t)(TILE / 2 * d_len) * sizeof(uint32_t));
        w.kbuf = zalloc((size_t)(TILE * d_len + TILE) * sizeof(float));
        w.vbuf = zalloc((size_t)(TILE * d_len) * sizeof(float));
        w.zero = zalloc((size_t)d_len * sizeof(float));
        int ok = w.qs && w.qp && w.kt && w.vp && w.kbuf && w.vbuf && w.zero;
        if (ok) memset(w.zero, 0, (size_t)d_len * sizeof(float));
        else {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_items; item++) {
            if (!ok) continue;
            int64_t s = 0;
            while (item_start[s + 1] <= item) s++;
            int64_t splits = num_splits(a, s);
            int64_t local = item - item_start[s], h = local / splits, sp = local % splits;
            int64_t rows = group * (a->row_starts[s + 1] - a->row_starts[s]);
            float *base = state + (state_start[s] + local * rows) * (d_len + 2);
            int64_t lo = (first_split(a, s) + sp) * a->split_len, hi = lo + a->split_len;
            hi = hi < a->context_lens[s] ? hi : a->context_lens[s];
            attend_split(a, &w, s, h, lo, hi, base, base + rows, base + 2 * rows);
        }
        free(w.qs); free(w.qp); free(w.kt); free(w.vp); free(w.kbuf); free(w.vbuf);
        free(w.zero);
    }
    if (failed) { free(state); free(item_start); free(state_start); return -1; }
#pragma omp parallel for num_threads(num_threads)
    for (int64_t s = 0; s < a->num_seqs; s++) {
        int64_t splits = num_splits(a, s), row0 = a->row_starts[s];
        int64_t t_len = a->row_starts[s + 1] - row0, rows = group * t_len;
        float big_o[MAX_HEAD_DIM];
        for (int64_t h = 0; h < a->num_kv_heads; h++) {
            for (int64_t r = 0; r < rows; r++) {
                int64_t g = r / t_len, t = r % t_len, head = h * group + g;
                float big_m = -INFINITY, big_l = 0.0f;
                memset(big_o, 0, (size_t)d_len * sizeof(float));
                for (int64_t sp = 0; sp < splits; sp++) {
                    float *base = state + (state_start[s] + (h * splits + sp) * rows) * (d_len + 2);
                    rg_merge_row(&big_m, &big_l, big_o, 1, base[r], base[rows + r],
                                 base + 2 * rows + r * d_len, 1, d_len);
                }
                rg_finish_row(big_m, big_l, big_o, 1,
                              a->sinks ? a->sinks[head] * LOG2E : -INFINITY,
                              a->out + ((row0 + t) * a->num_heads + head) * d_len, d_len);
            }
        }
    }
    free(state);
    free(item_start);
    free(state_start);
    return 0;
}

static void rows_to_bf16(uint16_t *dst, const float *src, size_t n) {
#pragma omp simd
    for (size_t d = 0; d < n; d++) dst[d] = rg_to_bf16(src[d]);
}

/* Writes the new tokens' K and V rows (num_new rows, `new_stride` elements apart, the pool's
 * dtype, or fp32 into a bf16 pool when `new_fp32`) into their slots of one layer. */
static void store_new(const Args *a, const void *new_k, const void *new_v, int64_t new_stride,
                      int new_fp32, const int64_t *slots, int64_t num_new) {
    size_t elem = a->bf16 ? 2 : 4, row = (size_t)(a->num_kv_heads * a->head_dim);
    for (int64_t i = 0; i < num_new; i++) {
        size_t dst = (size_t)slots[i] * row * elem, src = (size_t)(i * new_stride);
        if (new_fp32 && a->bf16) {
            rows_to_bf16((uint16_t *)((char *)a->k + dst), (const float *)new_k + src, row);
            rows_to_bf16((uint16_t *)((char *)a->v + dst), (const float *)new_v + src, row);
            continue;
        }
        memcpy((char *)a->k + dst, (const char *)new_k + src * elem, row * elem);
        memcpy((char *)a->v + dst, (const char *)new_v + src * elem, row * elem);
    }
}

static PyObject *paged_attention(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long q, k, v, out, pages, page_starts, context_lens, row_starts;
    unsigned long long new_k, new_v, slots, sinks, masks;
    long long num_seqs, num_heads, num_kv_heads, head_dim, page_size, split_len, q_stride;
    long long new_stride, num_new, window;
    int bf16, num_threads, new_fp32;
    float scale;
    if (!PyArg_ParseTuple(args, "KKKKKKKKLLLLLLpfiLKKKLpLLKK", &q, &k, &v, &out, &pages,
                          &page_starts, &context_lens, &row_starts, &num_seqs, &num_heads,
                          &num_kv_heads, &head_dim, &page_size, &split_len, &bf16, &scale,
                          &num_threads, &q_stride, &new_k, &new_v, &slots, &new_stride,
                          &new_fp32, &num_new, &window, &sinks, &masks))
        return NULL;
    if (head_dim > MAX_HEAD_DIM || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 ||
        page_size <= 0 || split_len <= 0 || num_threads <= 0 || num_new < 0 || window < 0) {
        PyErr_SetString(PyExc_ValueError, "paged_attention: unsupported shape");
        return NULL;
    }
    if (masks && window) { /* a tree node's window would count along its path: not written */
        PyErr_SetString(PyExc_ValueError, "paged_attention: tree masks with a sliding window");
        return NULL;
    }
    Args a = {(const void *)k, (const void *)v, bf16, (const float *)q, (float *)out,
              (const int64_t *)pages, (const int64_t *)page_starts,
              (const int64_t *)context_lens, (const int64_t *)row_starts, num_seqs, num_heads,
              num_kv_heads, head_dim, page_size, split_len, q_stride, scale, window,
              (const float *)sinks, (const uint64_t *)masks};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    store_new(&a, (const void *)new_k, (const void *)new_v, new_stride, new_fp32,
              (const int64_t *)slots, num_new);
    rc = run(&a, num_threads);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* The SIMD path this build compiled (it follows -march at build time). */
static PyObject *simd(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
#if defined(RG_AVX512)
    return PyUnicode_FromString("avx512");
#elif defined(RG_AVX2)
    return PyUnicode_FromString("avx2");
#else
    return PyUnicode_FromString("scalar");
#endif
}

static PyMethodDef methods[] = {
    {"simd", simd, METH_NOARGS, "simd() -> the SIMD path this build compiled"},
    {"paged_attention", paged_attention, METH_VARARGS,
     "paged_attention(q, k, v, out, pages, page_starts, context_lens, row_starts, num_seqs, "
     "num_heads, num_kv_heads, head_dim, page_size, split_len, bf16, scale, num_threads, "
     "q_stride, new_k, new_v, slots, new_stride, new_fp32, num_new, window, sinks, masks): "
     "data pointers of CPU buffers (sinks 0: none; window 0: none; masks 0: all rows causal, "
     "else one uint64 tree mask per q row, 0 for a causal row, not with a window); "
     "new_k/new_v rows (fp32 into a bf16 pool when new_fp32) are stored into their slots "
     "first; see cpu_paged.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_paged_cpu", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__paged_cpu(void) { return PyModule_Create(&module); }
