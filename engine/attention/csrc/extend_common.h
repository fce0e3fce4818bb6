/* What the extend attention kernel's parts share (extend_cpu.c, extend_avx512.h, extend_bf16.h,
 * extend_amx.h, extend_avx2.h): the call's arguments, a work item's buffers, the paged rows of a
 * tile of keys, and the portable micro-block the SIMD headers replace.
 */
#ifndef RADIXGATE_EXTEND_COMMON_H
#define RADIXGATE_EXTEND_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "paged_rows.h"

#define KT 64      /* keys per tile */
#define LANES 16   /* query rows per vector */
#define QB_MAX 64  /* tokens per work item, at most: more rows share each tile's K/V packing */
#define QB_MIN 16
#define MB 2       /* vectors of rows a micro-block takes through a tile */
#define LOG2E 1.4426950408889634f

typedef struct {
    const void *k, *v;    /* a layer of the pool: (num_slots, num_kv_heads, head_dim) */
    int bf16;             /* pool dtype: 0 fp32, 1 bf16 */
    const float *q;       /* rows q_stride floats apart, (num_heads, head_dim) each */
    float *out;           /* (rows, num_heads, head_dim) */
    const int64_t *pages; /* page ids of all sequences, concatenated */
    const int64_t *page_starts, *context_lens, *row_starts, *extend_lens; /* per sequence */
    int64_t num_seqs, num_heads, num_kv_heads, head_dim, page_size, q_stride, window;
    float scale;
    const float *sinks;   /* (num_heads,) logits that join the softmax with no value, or NULL */
} Args;

/* One work item's buffers and rows: num_vec vectors of LANES rows, row r = token * group + g
 * (padding rows repeat the last real one and are never written). */
typedef struct {
    int64_t num_vec, stride;  /* stride = num_vec * LANES floats between dims of qt and acc */
    int32_t *pos, *lo;        /* per row: its position and the first it sees */
    float *qt, *acc;          /* (head_dim, stride): q^T scaled, the unnormalised out^T */
    float *m, *l;             /* (stride): running max and sum, log2 units */
    float *kbuf, *vbuf;       /* (KT, head_dim) fp32: a bf16 pool's tile widened */
    float *s;                 /* (KT, MB * LANES): a micro-block's scores, then weights */
    uint32_t *qtb, *vp, *sb;  /* bf16 pairs (extend_avx512.h's bf16 path): q^T, V, weights */
    uint16_t *kc;             /* (KT, head_dim) bf16: the tile's K rows contiguous (AMX) */
    uint32_t *vt;             /* (head_dim, KT / 2) bf16 pairs: the tile's V^T (AMX) */
    float *ob;                /* (64, LANES): out^T of a tile's 64 dims (AMX) */
    float *zero;              /* (head_dim): the row of positions a tile does not read */
    int amx;                  /* 1: a bf16 pool's tiles go through extend_amx.h */
} Item;

/* rows[j]: where the K or V row of KV head `h` at position p0 + j of a sequence (its page ids
 * `pages`) lies in the pool, j < n; `zero` (a row of zeros) for j < skip, positions that are
 * not read. */
static void tile_rows(const Args *a, const void *base, const int64_t *pages, int64_t h,
                      int64_t p0, int skip, int n, const void *zero, const void **rows) {
    for (int j = 0; j < skip; j++) rows[j] = zero;
    rg_paged_rows(base, a->bf16 ? 2 : 4, a->page_size, a->num_kv_heads, a->head_dim, pages, h,
                  p0 + skip, n - skip, rows + skip);
}

/* rows[j]: the fp32 K or V row at position p0 + j, as tile_rows: the pool's own row for fp32,
 * else the row widened into `buf`. */
static void kv_tile(const Args *a, const void *base, const int64_t *pages, int64_t h, int64_t p0,
                    int skip, int n, const float *zero, float *buf, const float **rows) {
    const void *at[KT];
    tile_rows(a, base, pages, h, p0, skip, n, zero, at);
    for (int j = 0; j < n; j++) {
        if (j < skip) {
            rows[j] = zero;
            continue;
        }
        if (!a->bf16) {
            rows[j] = (const float *)at[j];
            continue;
        }
        const uint16_t *src = (const uint16_t *)at[j];
        uint32_t *dst = (uint32_t *)(buf + j * a->head_dim);
#pragma omp simd
        for (int64_t d = 0; d < a->head_dim; d++) dst[d] = (uint32_t)src[d] << 16;
        rows[j] = buf + j * a->head_dim;
    }
}

/* The portable micro-block: the same steps as extend_avx512.h's, one lane at a time. */
static __attribute__((unused)) void micro_block_portable(
    const Item *it, int64_t d_len, int64_t v0, int nv, const float *const *k,
    const float *const *v, int64_t p0, int n, int masked) {
    float corr[MB * LANES];
    for (int r = 0; r < nv * LANES; r++) {
        int64_t row = v0 * LANES + r;
        float top = it->m[row];
        for (int j = 0; j < n; j++) {
            float x = 0.0f;
            for (int64_t d = 0; d < d_len; d++) x += it->qt[d * it->stride + row] * k[j][d];
            if (masked && (p0 + j > it->pos[row] || p0 + j < it->lo[row])) x = -INFINITY;
            it->s[j * MB * LANES + r] = x;
            top = x > top ? x : top;
        }
        float safe = top == -INFINITY ? 0.0f : top, sum = 0.0f;
        corr[r] = exp2f(it->m[row] - safe);
        for (int j = 0; j < n; j++) {
            float p = exp2f(it->s[j * MB * LANES + r] - safe);
            it->s[j * MB * LANES + r] = p;
            sum += p;
        }
        it->l[row] = it->l[row] * corr[r] + sum;
        it->m[row] = top;
        for (int64_t d = 0; d < d_len; d++) {
            float x = it->acc[d * it->stride + row] * corr[r];
            for (int j = 0; j < n; j++) x += it->s[j * MB * LANES + r] * v[j][d];
            it->acc[d * it->stride + row] = x;
        }
    }
}

#endif
