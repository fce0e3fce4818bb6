/* Paged decode and verify attention for the CPU, read straight from the KV pool.
 *
 * Each sequence has T query rows (1 for a decode, 1 + k for a draft verification) at the end of
 * a context of C tokens whose K/V sit in pages of the pool; query row t, at position
 * p = C - T + t, sees positions [0, p], or (p - W, p] with a sliding window of W keys; under a
 * tree mask (a draft tree's verification, no window) it sees [0, C - T) and the step's row j,
 * at C - T + j, iff bit j of its mask, which compacts the tile positions it sees. Work
 * items are (sequence, KV head, split of the context): every K and V byte of a sequence is
 * read once per step, by one item, which scores all the query heads of its group and all T
 * rows against it while it is in L1 (flash decoding). Partial results merge by their running
 * max and sum; a query head's attention sink (a logit with no value) joins that merge. The
 * torch path it replaces gathered each sequence's K/V into a new tensor first (one more read
 * and one write of every byte).
 *
 * The contract and its reference: engine/attention/cpu_paged.py, tests/engine/attention.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16.h"
#include "paged_rows.h"

#define TILE 64         /* positions scored at a time */
#define MAX_HEAD_DIM 256

/* e^x for x <= 0 in a form the compiler vectorizes (glibc's expf does not): 2^(x log2 e) split
 * into an integer power (exponent bits) and 2^f, f in [0, 1), by a degree-7 Taylor series of
 * e^(f ln 2) (relative error below 2e-7, under fp32 rounding of the scores themselves). */
static inline float exp_nonpos(float x) {
    x = x < -87.0f ? -87.0f : x;
    float t = x * 1.4426950408889634f;
    float fi = floorf(t);
    float y = (t - fi) * 0.6931471805599453f;
    float p = 1.0f + y * (1.0f + y * (0.5f + y * (1.6666667e-1f + y * (4.1666667e-2f +
              y * (8.3333333e-3f + y * (1.3888889e-3f + y * 1.9841270e-4f))))));
    int32_t bits = ((int32_t)fi + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

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

/* The first position that row t of sequence s sees. Row 0's is the first that any row sees:
 * nothing before it is read, so the pages wholly before it may be invalid ids. */
static int64_t row_start(const Args *a, int64_t s, int64_t t) {
    int64_t t_len = a->row_starts[s + 1] - a->row_starts[s];
    int64_t start = a->context_lens[s] - t_len + t - a->window + 1;
    return a->window > 0 && start > 0 ? start : 0;
}

/* Splits lie on a grid of split_len positions from 0 whatever the window (so do the tiles in
 * them): a row gets the same tiles, and so the same bits, in a decode and in a verification.
 * Sequence s's work items take the splits from the one holding row_start(s, 0) to its end. */
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

/* Row t of sequence s under its tree mask: of the tile positions [j0, j1) that row_span gave
 * (at most up to the row itself), the ones it sees, in order, into idx; returns how many, or -1
 * when it sees every one (no mask, a 0 entry, a tile before the step's rows, or every bit set):
 * then the row runs exactly as a causal one, so a chain mask gives the causal bits. */
static int tree_span(const Args *a, int64_t s, int64_t t, int64_t p0, int j0, int j1, int *idx) {
    int64_t row0 = a->row_starts[s], prefix = a->context_lens[s] - (a->row_starts[s + 1] - row0);
    uint64_t bits = a->masks ? a->masks[row0 + t] : 0;
    if (!bits || p0 + j1 <= prefix) return -1;
    int count = 0;
    for (int j = j0; j < j1; j++) {
        int64_t i = p0 + j - prefix; /* the step's row at this position; < 0: the prefix */
        if (i < 0 || (i < 64 && (bits >> i) & 1)) idx[count++] = j;
    }
    return count == j1 - j0 ? -1 : count;
}

/* rows[j]: where the K or V row of KV head `h` at position p0 + j of a sequence (its page ids
 * `pages`) lies in the pool, j < n <= TILE. */
static void tile_rows(const Args *a, const void *base, const int64_t *pages, int64_t h,
                      int64_t p0, int n, const void **rows) {
    rg_paged_rows(base, a->bf16 ? 2 : 4, a->page_size, a->num_kv_heads, a->head_dim, pages, h,
                  p0, n, rows);
}

/* rows[j]: the fp32 K or V row at position p0 + j (as tile_rows): the pool's own row for fp32,
 * else the row converted into `buf`. */
static void kv_tile(const Args *a, const void *base, const int64_t *pages, int64_t h, int64_t p0,
                    int n, float *buf, const float **rows) {
    int64_t d_len = a->head_dim;
    const void *at[TILE];
    tile_rows(a, base, pages, h, p0, n, at);
    for (int j = 0; j < n; j++) {
        if (!a->bf16) {
            rows[j] = (const float *)at[j];
            continue;
        }
        const uint16_t *src = (const uint16_t *)at[j];
        uint32_t *dst = (uint32_t *)(buf + j * d_len);
#pragma omp simd
        for (int64_t d = 0; d < d_len; d++) dst[d] = (uint32_t)src[d] << 16;
        rows[j] = buf + j * d_len;
    }
}

/* Asks the cache for the K and V rows of KV head `h` at positions [p0, p0 + n): the tile after
 * the one being computed, whose pages are anywhere in the pool (no hardware prefetcher can
 * follow a page table). */
static void prefetch_tile(const Args *a, const int64_t *pages, int64_t h, int64_t p0, int n) {
    int64_t row_bytes = a->head_dim * (a->bf16 ? 2 : 4);
    const void *rows[TILE];
    tile_rows(a, a->k, pages, h, p0, n, rows);
    for (int j = 0; j < n; j++) {
        /* K and V share the pool's layout: the same offset in each. */
        int64_t off = (const char *)rows[j] - (const char *)a->k;
        for (int64_t b = 0; b < row_bytes; b += 64) {
            __builtin_prefetch((const char *)a->k + off + b);
            __builtin_prefetch((const char *)a->v + off + b);
        }
    }
}

#if defined(__AVX2__) && defined(__FMA__)
#include "simd_exp.h"
#define PA_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define PA_AVX512 1
#include "paged_avx512.h"
#endif

/* [sum(a[0]), .., sum(a[7])]: eight horizontal sums at once. */
static inline __m256 sum8(const __m256 a[8]) {
    __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}


#endif

/* p[j] = e^(p[j] - top) for j < n; returns their sum. */
static float exp_shifted(float *p, int n, float top) {
    int j = 0;
    float sum = 0.0f;
#ifdef PA_AVX2
    __m256 vsum = _mm256_setzero_ps(), vtop = _mm256_set1_ps(top);
    for (; j + 8 <= n; j += 8) {
        __m256 e = rg_exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), vtop));
        _mm256_storeu_ps(p + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vsum);
    for (int i = 0; i < 8; i++) sum += lanes[i];
#endif
    for (; j < n; j++) {
        p[j] = exp_nonpos(p[j] - top);
        sum += p[j];
    }
    return sum;
}

/* s[j] = q . k[j] for j < n (d_len floats each). Eight positions at a time accumulate in eight
 * vectors that one transpose-add reduces (no horizontal sum per position). */
static void scores(const float *q, const float *const *k, int n, int64_t d_len, float *s) {
    int j = 0;
#ifdef PA_AVX2
    if (d_len % 8 == 0) {
        for (; j + 8 <= n; j += 8) {
            __m256 acc[8];
            const float *kj[8];
            for (int i = 0; i < 8; i++) {
                acc[i] = _mm256_setzero_ps();
                kj[i] = k[j + i];
            }
            for (int64_t d = 0; d < d_len; d += 8) {
                __m256 qv = _mm256_loadu_ps(q + d);
                for (int i = 0; i < 8; i++)
                    acc[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kj[i] + d), acc[i]);
            }
            _mm256_storeu_ps(s + j, sum8(acc));
        }
    }
#endif
    for (; j < n; j++) {
        const float *kr = k[j];
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < d_len; d++) dot += q[d] * kr[d];
        s[j] = dot;
    }
}

/* acc = acc * corr + sum_j p[j] v[j] over n positions. 64 floats of acc at a time stay in
 * eight registers across all the positions: eight independent FMA chains, not one. */
static void accumulate(float *acc, float corr, const float *p, const float *const *v, int n,
                       int64_t d_len) {
    int64_t d = 0;
#ifdef PA_AVX2
    __m256 c = _mm256_set1_ps(corr);
    for (; d + 64 <= d_len; d += 64) {
        __m256 x[8];
        for (int i = 0; i < 8; i++) x[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8 * i), c);
        for (int j = 0; j < n; j++) {
            __m256 pj = _mm256_set1_ps(p[j]);
            const float *vj = v[j] + d;
            for (int i = 0; i < 8; i++) x[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * i), x[i]);
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(acc + d + 8 * i, x[i]);
    }
    for (; d + 8 <= d_len; d += 8) {
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(acc + d), c);
        for (int j = 0; j < n; j++)
            x = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v[j] + d), x);
        _mm256_storeu_ps(acc + d, x);
    }
#endif
    for (; d < d_len; d++) {
        float x = acc[d] * corr;
        for (int j = 0; j < n; j++) x += p[j] * v[j][d];
        acc[d] = x;
    }
}

/* p[j] *= scale for j < n; returns the largest of them and `top`. */
static float scale_max(float *p, int n, float scale, float top) {
    int j = 0;
#ifdef PA_AVX2
    __m256 vs = _mm256_set1_ps(scale), vtop = _mm256_set1_ps(top);
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(p + j), vs);
        _mm256_storeu_ps(p + j, x);
        vtop = _mm256_max_ps(vtop, x);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vtop);
    for (int i = 0; i < 8; i++) top = lanes[i] > top ? lanes[i] : top;
#endif
    for (; j < n; j++) {
        p[j] *= scale;
        top = p[j] > top ? p[j] : top;
    }
    return top;
}

#ifdef PA_AVX512
/* Rows (g0 + i, t), i < nr, of KV head `h` over the tile's first nv positions (64 dims): one
 * pass over the K and V rows for all of them. State as in attend_split. */
static inline __attribute__((always_inline)) void group_pass(
    const Args *a, int64_t h, int64_t row0, int64_t t, int64_t t_len, int64_t g0, const int nr,
    const void *const *krows, const void *const *vrows, const int bf16, int nv, float *m,
    float *l, float *acc) {
    int64_t group = a->num_heads / a->num_kv_heads;
    const float *qs[G_MAX];
    float *accs[G_MAX], corr[G_MAX], ps[G_MAX][TILE];
    for (int i = 0; i < nr; i++) {
        qs[i] = a->q + (row0 + t) * a->q_stride + (h * group + g0 + i) * 64;
        accs[i] = acc + ((g0 + i) * t_len + t) * 64;
    }
    scores64(qs, nr, krows, bf16, nv, ps);
    for (int i = 0; i < nr; i++) {
        int64_t r = (g0 + i) * t_len + t;
        float top = scale_max(ps[i], nv, a->scale, m[r]);
        corr[i] = exp_nonpos(m[r] - top);
        l[r] = l[r] * corr[i] + exp_shifted(ps[i], nv, top);
        m[r] = top;
    }
    accumulate64(accs, nr, corr, ps, vrows, bf16, nv);
}
#endif

/* One work item: query rows r = (g, t) of KV head `h` of sequence `s` over the split
 * [lo, hi). Writes per row its max `m`, sum `l` (0 when it saw nothing) and unnormalised
 * output `acc` (head_dim). */
static void attend_split(const Args *a, int64_t s, int64_t h, int64_t lo, int64_t hi,
                         float *m, float *l, float *acc) {
    int64_t d_len = a->head_dim, group = a->num_heads / a->num_kv_heads;
    int64_t row0 = a->row_starts[s], t_len = a->row_starts[s + 1] - row0;
    int64_t num_r = group * t_len, first = row_start(a, s, 0);
    const int64_t *pages = a->pages + a->page_starts[s];
    float kbuf[TILE * MAX_HEAD_DIM], vbuf[TILE * MAX_HEAD_DIM], p[TILE];
    const float *krows[TILE], *vrows[TILE];
    for (int64_t r = 0; r < num_r; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        memset(acc + r * d_len, 0, (size_t)d_len * sizeof(float));
    }
    /* Tiles stay on the split's grid, from the one holding `first`, of which only rows
     * [skip, n) are loaded: no position before `first` is read. */
    for (int64_t p0 = first > lo ? lo + (first - lo) / TILE * TILE : lo; p0 < hi; p0 += TILE) {
        int n = (int)(hi - p0 < TILE ? hi - p0 : TILE), skip = (int)(first > p0 ? first - p0 : 0);
        int j0, j1;
        if (p0 + n < hi) prefetch_tile(a, pages, h, p0 + n, (int)(hi - p0 - n < TILE ? hi - p0 - n : TILE));
#ifdef PA_AVX512
        if (d_len == 64) {
            /* One row per token (a decode): read the rows in place, bf16 widened in registers.
             * Several (a verification): bf16 rows are widened once into the staging tile,
             * not once per token. */
            const void *kr[TILE], *vr[TILE];
            int widen = a->bf16 && t_len == 1;
            if (a->bf16 && !widen) {
                kv_tile(a, a->k, pages, h, p0 + skip, n - skip, kbuf, krows + skip);
                kv_tile(a, a->v, pages, h, p0 + skip, n - skip, vbuf, vrows + skip);
                for (int j = skip; j < n; j++) {
                    kr[j] = krows[j];
                    vr[j] = vrows[j];
                }
            } else {
                tile_rows(a, a->k, pages, h, p0 + skip, n - skip, kr + skip);
                tile_rows(a, a->v, pages, h, p0 + skip, n - skip, vr + skip);
            }
            for (int64_t t = 0; t < t_len; t++) {
                row_span(a, s, t, p0, n, &j0, &j1);
                const void *const *kt = kr + j0, *const *vt = vr + j0;
                const void *kc[TILE], *vc[TILE];
                int nv = j1 - j0, idx[TILE];
                int seen = nv > 0 ? tree_span(a, s, t, p0, j0, j1, idx) : -1;
                if (seen >= 0) { /* a tree row: only the positions it sees, compacted */
                    for (int i = 0; i < seen; i++) {
                        kc[i] = kr[idx[i]];
                        vc[i] = vr[idx[i]];
                    }
                    kt = kc;
                    vt = vc;
                    nv = seen;
                }
                for (int64_t g0 = 0; g0 < group && nv > 0; g0 += G_MAX) {
                    int64_t left = group - g0, nr = left < G_MAX ? left : G_MAX;
#define PASS(NR, BF) \
    group_pass(a, h, row0, t, t_len, g0, NR, kt, vt, BF, nv, m, l, acc)
                    if (widen) {
                        if (nr == 1) PASS(1, 1); else if (nr == 2) PASS(2, 1);
                        else if (nr == 3) PASS(3, 1); else PASS(4, 1);
                    } else {
                        if (nr == 1) PASS(1, 0); else if (nr == 2) PASS(2, 0);
                        else if (nr == 3) PASS(3, 0); else PASS(4, 0);
                    }
#undef PASS
                }
            }
            continue;
        }
#endif
        kv_tile(a, a->k, pages, h, p0 + skip, n - skip, kbuf, krows + skip);
        kv_tile(a, a->v, pages, h, p0 + skip, n - skip, vbuf, vrows + skip);
        for (int64_t t = 0; t < t_len; t++) {
            row_span(a, s, t, p0, n, &j0, &j1);
            int nv = j1 - j0, idx[TILE];
            if (nv <= 0) continue;
            const float *const *kt = krows + j0, *const *vt = vrows + j0;
            const float *kc[TILE], *vc[TILE];
            int seen = tree_span(a, s, t, p0, j0, j1, idx);
            if (seen >= 0) { /* a tree row: only the positions it sees, compacted */
                for (int i = 0; i < seen; i++) {
                    kc[i] = krows[idx[i]];
                    vc[i] = vrows[idx[i]];
                }
                kt = kc;
                vt = vc;
                nv = seen;
                if (nv == 0) continue;
            }
            for (int64_t g = 0; g < group; g++) {
                int64_t r = g * t_len + t;
                const float *qr = a->q + (row0 + t) * a->q_stride + (h * group + g) * d_len;
                scores(qr, kt, nv, d_len, p);
                float top = scale_max(p, nv, a->scale, m[r]);
                float corr = exp_nonpos(m[r] - top), sum = exp_shifted(p, nv, top);
                l[r] = l[r] * corr + sum;
                m[r] = top;
                accumulate(acc + r * d_len, corr, p, vt, nv, d_len);
            }
        }
    }
}

/* Runs every work item, then merges each row's splits into `out`. Returns 0, or -1 when
 * out of memory. */
static int run(const Args *a, int num_threads) {
    int64_t group = a->num_heads / a->num_kv_heads, d_len = a->head_dim;
    int64_t num_items = 0, num_state = 0;
    int64_t *item_start = malloc((size_t)(a->num_seqs + 1) * sizeof(int64_t));
    int64_t *state_start = malloc((size_t)(a->num_seqs + 1) * sizeof(int64_t));
    if (!item_start || !state_start) { free(item_start); free(state_start); return -1; }
    for (int64_t s = 0; s < a->num_seqs; s++) {
        int64_t splits = num_splits(a, s), t_len = a->row_starts[s + 1] - a->row_starts[s];
        item_start[s] = num_items;
        state_start[s] = num_state;
        num_items += a->num_kv_heads * splits;
        num_state += a->num_kv_heads * splits * group * t_len;
    }
    item_start[a->num_seqs] = num_items;
    state_start[a->num_seqs] = num_state;
    /* Per state row: m, l, then acc (head_dim). */
    float *state = malloc((size_t)num_state * (size_t)(d_len + 2) * sizeof(float));
    if (!state) { free(item_start); free(state_start); return -1; }
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t item = 0; item < num_items; item++) {
        int64_t s = 0;
        while (item_start[s + 1] <= item) s++;
        int64_t splits = num_splits(a, s);
        int64_t local = item - item_start[s], h = local / splits, sp = local % splits;
        int64_t rows = group * (a->row_starts[s + 1] - a->row_starts[s]);
        float *base = state + (state_start[s] + local * rows) * (d_len + 2);
        int64_t lo = (first_split(a, s) + sp) * a->split_len, hi = lo + a->split_len;
        hi = hi < a->context_lens[s] ? hi : a->context_lens[s];
        attend_split(a, s, h, lo, hi, base, base + rows, base + 2 * rows);
    }
#pragma omp parallel for num_threads(num_threads)
    for (int64_t s = 0; s < a->num_seqs; s++) {
        int64_t splits = num_splits(a, s), row0 = a->row_starts[s];
        int64_t t_len = a->row_starts[s + 1] - row0, rows = group * t_len;
        for (int64_t h = 0; h < a->num_kv_heads; h++) {
            for (int64_t r = 0; r < rows; r++) {
                int64_t g = r / t_len, t = r % t_len;
                float *o = a->out + ((row0 + t) * a->num_heads + h * group + g) * d_len;
                /* The sink is one more logit in the max and the sum, with no value. */
                float sink = a->sinks ? a->sinks[h * group + g] : -INFINITY, top = sink;
                for (int64_t sp = 0; sp < splits; sp++) {
                    float *base = state + (state_start[s] + (h * splits + sp) * rows) * (d_len + 2);
                    top = base[r] > top ? base[r] : top;
                }
                float total = a->sinks ? exp_nonpos(sink - top) : 0.0f;
                memset(o, 0, (size_t)d_len * sizeof(float));
                for (int64_t sp = 0; sp < splits; sp++) {
                    float *base = state + (state_start[s] + (h * splits + sp) * rows) * (d_len + 2);
                    if (base[rows + r] == 0.0f) continue; /* the row saw none of the split */
                    float w = exp_nonpos(base[r] - top);
                    const float *ar = base + 2 * rows + r * d_len;
                    total += w * base[rows + r];
#pragma omp simd
                    for (int64_t d = 0; d < d_len; d++) o[d] += w * ar[d];
                }
                float inv = 1.0f / total;
#pragma omp simd
                for (int64_t d = 0; d < d_len; d++) o[d] *= inv;
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
#if defined(PA_AVX512)
    return PyUnicode_FromString("avx512");
#elif defined(PA_AVX2)
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
