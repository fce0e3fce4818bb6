/* What the extend attention kernel's parts share (extend_cpu.c, extend_avx512.h, extend_bf16.h,
 * extend_amx.h, extend_avx2.h): the call's arguments, a work item's buffers, the paged rows of a
 * tile of keys, and the portable micro-block the SIMD headers replace. A row's arithmetic is
 * row_math.h's, which the decode kernel follows too.
 */
#ifndef RADIXGATE_EXTEND_COMMON_H
#define RADIXGATE_EXTEND_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "paged_rows.h"
#include "row_math.h"

#define KT TILE    /* keys per tile */
#define LANES 16   /* query rows per vector */
#define QB_MAX 64  /* tokens per work item, at most: more rows share each tile's K/V packing */
#define QB_MIN 16
#define MB 2       /* vectors of rows a micro-block takes through a tile */

typedef struct {
    const void *k, *v;    /* a layer of the pool: (num_slots, num_kv_heads, head_dim) */
    int bf16;             /* pool dtype: 0 fp32, 1 bf16 */
    const float *q;       /* rows q_stride floats apart, (num_heads, head_dim) each */
    float *out;           /* (rows, num_heads, head_dim) */
    const int64_t *pages; /* page ids of all sequences, concatenated */
    const int64_t *page_starts, *context_lens, *row_starts, *extend_lens; /* per sequence */
    int64_t num_seqs, num_heads, num_kv_heads, head_dim, page_size, q_stride, window;
    int64_t split_len;    /* positions per split (row_math.h step 2) */
    float scale;
    const float *sinks;   /* (num_heads,) logits that join the softmax with no value, or NULL */
    int amx;              /* 1: a bf16 pool may take AMX tiles (faster, not row_math.h's bits) */
} Args;

/* One work item's buffers and rows: num_vec vectors of LANES rows, row r = token * group + g
 * (padding rows repeat the last real one and are never written). */
typedef struct {
    int64_t num_vec, stride;  /* stride = num_vec * LANES floats between dims of qt and acc */
    int64_t num_rows;         /* the real rows, num_tok * group */
    int32_t *pos, *lo;        /* per row: its position and the first it sees */
    float *qt, *acc;          /* (head_dim, stride): q^T scaled, a split's unnormalised out^T */
    float *m, *l;             /* (stride): a split's running max and sum, log2 units */
    float *big_m, *big_l, *big_o; /* the splits merged so far: M, L (stride), O (head_dim, stride) */
    float *kbuf, *vbuf;       /* (KT, head_dim) fp32: a bf16 pool's tile widened */
    float *s;                 /* (KT, MB * LANES): a micro-block's scores, then weights */
    uint32_t *qtb, *vp, *sb;  /* bf16 pairs (extend_avx512.h's bf16 path): q^T, V, weights */
    uint16_t *kc;             /* (KT, head_dim) bf16: the tile's K rows contiguous (AMX) */
    uint32_t *vt;             /* (head_dim, KT / 2) bf16 pairs: the tile's V^T (AMX) */
    float *ob;                /* (64, LANES): out^T of a tile's 64 dims (AMX) */
    float *zero;              /* (head_dim): the row of positions a tile does not read */
    int amx;                  /* 1: a bf16 pool's tiles go through extend_amx.h */
    int first, last;          /* the tile is its split's first (acc not yet read: 0), its last
                               * (the fused micro-blocks merge acc into O, not storing it) */
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

#if RG_VL == 1
/* The portable micro-block: row_math.h's plain-C row, one lane at a time. */
static void micro_block(const Item *it, int64_t d_len, int64_t v0, int nv, const float *const *k,
                        const float *const *v, int64_t p0, int n, int masked) {
    (void)masked;
    for (int r = 0; r < nv * LANES; r++) {
        int64_t row = v0 * LANES + r;
        int64_t from = it->lo[row] - p0, to = it->pos[row] - p0 + 1; /* seen: [from, to) */
        from = from < 0 ? 0 : from;
        to = to > n ? n : to;
        if (to <= from) continue;
        uint64_t vis = (to >= 64 ? ~0ull : (1ull << to) - 1) & ~((1ull << from) - 1);
        rg_row_tile(it->qt + row, it->stride, k, v, n, vis, d_len, it->m + row, it->l + row,
                    it->acc + row, it->stride, it->s);
    }
}
#endif

#endif
