/* Flash attention for extends (prefill chunks, turn deltas) on the CPU, read straight from the
 * paged KV pool.
 *
 * A sequence has T new query rows at the end of a context of C tokens whose K/V (the new rows'
 * included) already sit in pages of the pool; row t, at position p = C - T + t, sees positions
 * [0, p], or (p - W, p] with a sliding window of W keys. A work item is (sequence, KV head,
 * block of tokens): the block's tokens times the query heads of the KV group are its rows,
 * sixteen to a vector, so every K and V row loaded feeds all of them. Rows sit in the vector's
 * lanes, transposed once per item, which turns both products into broadcast FMAs with no
 * horizontal sums: scores s[j] (16 rows) += q^T[d] * k[j][d], and out^T[d] += p[j] * v[j][d];
 * the row max and sum of the online softmax are lane-wise too.
 *
 * Each lane follows row_math.h's arithmetic for its row, which the decode kernel (paged_cpu.c)
 * follows too: splits of split_len positions on the grid from 0, tiles of TILE from each
 * split's start, a split's state merged into the row's total in order. So a row gets the same
 * bits here, in any block of any extend, as in a decode or a verification. The one exception
 * is `amx` (a bf16 pool on a Xeon with AMX tiles): their sums follow the tile unit's order,
 * not row_math.h's.
 *
 * torch's flash kernel, which this replaces, needs each sequence's K/V gathered out of the pages
 * into a new tensor first (a read and a write of every byte per layer) and the grouped heads'
 * K/V expanded for the new block.
 *
 * The contract and its reference: engine/attention/cpu_extend.py, tests/engine/attention.
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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16.h"
#include "extend_common.h"

#if defined(RG_AVX512)
#define EX_AVX512 1
#include "extend_avx512.h"
#if defined(EX_BF16) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define EX_AMX 1
#include "extend_amx.h"
#endif
#elif defined(RG_AVX2)
#define EX_AVX2 1
#include "extend_avx2.h"
#endif

/* Fills the item's rows for tokens [t0, t0 + num_tok) of sequence s, KV head h. */
static void load_rows(const Args *a, Item *it, int64_t s, int64_t h, int64_t t0, int64_t num_tok) {
    int64_t group = a->num_heads / a->num_kv_heads, d_len = a->head_dim;
    int64_t num_rows = num_tok * group, start = a->context_lens[s] - a->extend_lens[s];
    memset(it->big_o, 0, (size_t)(d_len * it->stride) * sizeof(float));
    for (int64_t r0 = 0; r0 < it->stride; r0 += LANES) {
        const float *qr[LANES];
        float mul[LANES];
        for (int64_t i = 0; i < LANES; i++) {
            int64_t r = r0 + i, real = r < num_rows ? r : num_rows - 1;
            int64_t t = t0 + real / group, g = real % group;
            int64_t pos = start + t, lo = a->window > 0 ? pos - a->window + 1 : 0;
            it->pos[r] = (int32_t)pos;
            it->lo[r] = (int32_t)(lo > 0 ? lo : 0);
            it->big_m[r] = -INFINITY;
            it->big_l[r] = 0.0f;
            qr[i] = a->q + (a->row_starts[s] + t) * a->q_stride + (h * group + g) * d_len;
            mul[i] = r < num_rows ? a->scale * LOG2E : 0.0f;
        }
#ifdef EX_AVX512
        ex_load_q(it, qr, mul, d_len, r0);
#else
        for (int64_t d = 0; d < d_len; d++)
            for (int64_t i = 0; i < LANES; i++) it->qt[d * it->stride + r0 + i] = qr[i][d] * mul[i];
#endif
#ifdef EX_BF16
        if (a->bf16) ex_pair_q(it, d_len, r0);
#endif
    }
}

/* row_math.h step 4 for the item's real rows, into `out`. */
static void store_rows(const Args *a, const Item *it, int64_t s, int64_t h, int64_t t0,
                       int64_t num_tok) {
    int64_t group = a->num_heads / a->num_kv_heads, d_len = a->head_dim;
    for (int64_t r = 0; r < num_tok * group; r++) {
        int64_t t = t0 + r / group, head = h * group + r % group;
        float sink = a->sinks ? a->sinks[head] * LOG2E : -INFINITY;
        rg_finish_row(it->big_m[r], it->big_l[r], it->big_o + r, it->stride, sink,
                      a->out + ((a->row_starts[s] + t) * a->num_heads + head) * d_len, d_len);
    }
}

/* The tile [lo, hi) (positions before `first` read as zero rows) through every row of the
 * item: updates each row's split state. */
static void attend_tile(const Args *a, Item *it, const int64_t *pages, int64_t h, int64_t lo,
                        int64_t hi, int64_t first) {
    int64_t d_len = a->head_dim, num_rows = it->num_rows;
    int n = (int)(hi - lo), skip = first > lo ? (int)(first - lo) : 0;
    /* Some row does not see the whole tile: its keys past the row or before its window are
     * masked. */
    int masked = hi - 1 > it->pos[0] || lo < it->lo[num_rows - 1];
    const float *krows[KT], *vrows[KT];
#ifdef EX_BF16
    if (a->bf16) {
        const void *kraw[KT], *vraw[KT];
        tile_rows(a, a->k, pages, h, lo, skip, n, it->zero, kraw);
        tile_rows(a, a->v, pages, h, lo, skip, n, it->zero, vraw);
        ex_pack_v(it, d_len, (const uint16_t *const *)vraw, n);
#ifdef EX_AMX
        if (it->amx) {
            ex_pack_amx(it, d_len, (const uint16_t *const *)kraw, n);
            for (int64_t v0 = 0; v0 < it->num_vec; v0 += MB) {
                int nv = it->num_vec - v0 < MB ? (int)(it->num_vec - v0) : MB;
                micro_block_amx(it, d_len, v0, nv, lo, n, masked);
            }
            return;
        }
#endif
        for (int64_t v0 = 0; v0 < it->num_vec; v0 += MB) {
            int nv = it->num_vec - v0 < MB ? (int)(it->num_vec - v0) : MB;
            micro_block_bf16(it, d_len, v0, nv, (const uint16_t *const *)kraw, lo, n, masked);
        }
        return;
    }
#endif
    kv_tile(a, a->k, pages, h, lo, skip, n, it->zero, it->kbuf, krows);
    kv_tile(a, a->v, pages, h, lo, skip, n, it->zero, it->vbuf, vrows);
    for (int64_t v0 = 0; v0 < it->num_vec; v0 += MB) {
        int nv = it->num_vec - v0 < MB ? (int)(it->num_vec - v0) : MB;
        micro_block(it, d_len, v0, nv, krows, vrows, lo, n, masked);
    }
}

/* One work item: tokens [t0, t0 + num_tok) of sequence s against KV head h. */
static void run_item(const Args *a, Item *it, int64_t s, int64_t h, int64_t t0, int64_t num_tok) {
    int64_t d_len = a->head_dim, split_len = a->split_len;
    const int64_t *pages = a->pages + a->page_starts[s];
    it->num_rows = num_tok * (a->num_heads / a->num_kv_heads);
    load_rows(a, it, s, h, t0, num_tok);
    /* Positions before `first` are never read (a window's pages before it may be invalid
     * ids): they take a zero row, masked for every row. */
    int64_t first = it->lo[0], end = (int64_t)it->pos[it->num_rows - 1] + 1;
    /* The SIMD micro-blocks merge a split into O in its last tile and start the next from 0;
     * AMX tiles and the plain C rows keep a split's acc whole and merge it after. */
    int fused = RG_VL > 1 && !it->amx;
    for (int64_t lo_split = first / split_len * split_len; lo_split < end; lo_split += split_len) {
        int64_t hi_split = lo_split + split_len < end ? lo_split + split_len : end;
        for (int64_t r = 0; r < it->stride; r++) {
            it->m[r] = -INFINITY;
            it->l[r] = 0.0f;
        }
        if (!fused) memset(it->acc, 0, (size_t)(d_len * it->stride) * sizeof(float));
        /* Tiles on the split's grid, from the one holding `first`. */
        int64_t lo = first > lo_split ? lo_split + (first - lo_split) / KT * KT : lo_split;
        for (it->first = fused; lo < hi_split; lo += KT, it->first = 0) {
            it->last = fused && lo + KT >= hi_split;
            attend_tile(a, it, pages, h, lo, lo + KT < hi_split ? lo + KT : hi_split, first);
        }
        if (!fused)
            rg_merge_lanes(it->big_m, it->big_l, it->big_o, it->m, it->l, it->acc, d_len,
                           it->stride, it->stride);
    }
    store_rows(a, it, s, h, t0, num_tok);
}

static void *zalloc(size_t bytes) {
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}

/* Blocks of at most qb tokens in sequence s. */
static int64_t num_blocks(const Args *a, int64_t s, int64_t qb) {
    return (a->extend_lens[s] + qb - 1) / qb;
}

static int64_t count_items(const Args *a, int64_t qb) {
    int64_t num_items = 0;
    for (int64_t s = 0; s < a->num_seqs; s++) num_items += a->num_kv_heads * num_blocks(a, s, qb);
    return num_items;
}

/* Returns 0, or -1 when out of memory. */
static int run(const Args *a, int num_threads) {
    int64_t group = a->num_heads / a->num_kv_heads, d_len = a->head_dim, num_items = 0;
    /* The largest blocks that still give every thread four items. A row's bits do not depend
     * on its block: its lanes are its own (row_math.h). */
    int64_t qb = QB_MAX;
    while (qb > QB_MIN && count_items(a, qb) < 4 * (int64_t)num_threads) qb /= 2;
    int64_t *item_start = malloc((size_t)(a->num_seqs + 1) * sizeof(int64_t));
    if (!item_start) return -1;
    for (int64_t s = 0; s < a->num_seqs; s++) {
        item_start[s] = num_items;
        num_items += a->num_kv_heads * num_blocks(a, s, qb);
    }
    item_start[a->num_seqs] = num_items;
    int64_t max_vec = (qb * group + LANES - 1) / LANES, stride = max_vec * LANES;
    int failed = 0, use_amx = 0;
#ifdef EX_AMX
    use_amx = a->amx && a->bf16 && d_len % 32 == 0 && amx_permitted();
#endif
#pragma omp parallel num_threads(num_threads)
    {
        /* Per thread: buffers for the largest item. */
        Item it;
        it.pos = zalloc((size_t)stride * sizeof(int32_t));
        it.lo = zalloc((size_t)stride * sizeof(int32_t));
        it.qt = zalloc((size_t)(d_len * stride) * sizeof(float));
        it.acc = zalloc((size_t)(d_len * stride) * sizeof(float));
        it.m = zalloc((size_t)stride * sizeof(float));
        it.l = zalloc((size_t)stride * sizeof(float));
        it.big_m = zalloc((size_t)stride * sizeof(float));
        it.big_l = zalloc((size_t)stride * sizeof(float));
        it.big_o = zalloc((size_t)(d_len * stride) * sizeof(float));
        it.kbuf = zalloc((size_t)(KT * d_len) * sizeof(float));
        it.vbuf = zalloc((size_t)(KT * d_len) * sizeof(float));
        it.s = zalloc((size_t)(KT * MB * LANES) * sizeof(float));
        it.qtb = zalloc((size_t)(d_len / 2 * stride) * sizeof(uint32_t));
        it.vp = zalloc((size_t)(KT / 2 * d_len) * sizeof(uint32_t));
        it.sb = zalloc((size_t)(KT / 2 * MB * LANES) * sizeof(uint32_t));
        it.kc = zalloc((size_t)(KT * d_len) * sizeof(uint16_t));
        it.vt = zalloc((size_t)(d_len * KT / 2) * sizeof(uint32_t));
        it.ob = zalloc((size_t)(64 * LANES) * sizeof(float));
        it.zero = zalloc((size_t)d_len * sizeof(float));
        if (it.zero) memset(it.zero, 0, (size_t)d_len * sizeof(float));
        it.amx = use_amx;
        int ok = it.pos && it.lo && it.qt && it.acc && it.m && it.l && it.big_m && it.big_l
                 && it.big_o && it.kbuf && it.vbuf && it.s
                 && it.qtb && it.vp && it.sb && it.kc && it.vt && it.ob && it.zero;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#ifdef EX_AMX
        if (use_amx) amx_configure();
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_items; item++) {
            if (!ok) continue;
            int64_t s = 0;
            while (item_start[s + 1] <= item) s++;
            int64_t blocks = num_blocks(a, s, qb), local = item - item_start[s];
            /* Later blocks first: they see the most keys. */
            int64_t h = local % a->num_kv_heads, b = blocks - 1 - local / a->num_kv_heads;
            int64_t t0 = b * qb, num_tok = a->extend_lens[s] - t0 < qb ? a->extend_lens[s] - t0 : qb;
            it.num_vec = (num_tok * group + LANES - 1) / LANES;
            it.stride = it.num_vec * LANES;
            run_item(a, &it, s, h, t0, num_tok);
        }
#ifdef EX_AMX
        if (use_amx) _tile_release();
#endif
        free(it.pos); free(it.lo); free(it.qt); free(it.acc); free(it.m); free(it.l);
        free(it.big_m); free(it.big_l); free(it.big_o);
        free(it.kbuf); free(it.vbuf); free(it.s); free(it.qtb); free(it.vp); free(it.sb);
        free(it.kc); free(it.vt); free(it.ob); free(it.zero);
    }
    free(item_start);
    return failed ? -1 : 0;
}

static PyObject *extend_attention(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long q, k, v, out, pages, page_starts, context_lens, row_starts, extend_lens;
    unsigned long long sinks;
    long long num_seqs, num_heads, num_kv_heads, head_dim, page_size, q_stride, window, split_len;
    int bf16, num_threads, amx;
    float scale;
    if (!PyArg_ParseTuple(args, "KKKKKKKKKLLLLLpfiLLKLp", &q, &k, &v, &out, &pages, &page_starts,
                          &context_lens, &row_starts, &extend_lens, &num_seqs, &num_heads,
                          &num_kv_heads, &head_dim, &page_size, &bf16, &scale, &num_threads,
                          &q_stride, &window, &sinks, &split_len, &amx))
        return NULL;
    if (head_dim <= 0 || head_dim % 8 != 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0
        || page_size <= 0 || num_threads <= 0 || window < 0 || num_seqs < 0 || split_len <= 0) {
        PyErr_SetString(PyExc_ValueError, "extend_attention: unsupported shape");
        return NULL;
    }
    Args a = {(const void *)k, (const void *)v, bf16, (const float *)q, (float *)out,
              (const int64_t *)pages, (const int64_t *)page_starts,
              (const int64_t *)context_lens, (const int64_t *)row_starts,
              (const int64_t *)extend_lens, num_seqs, num_heads, num_kv_heads, head_dim,
              page_size, q_stride, window, split_len, scale, (const float *)sinks, amx};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run(&a, num_threads);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* The SIMD path this build compiled (it follows -march at build time). */
static PyObject *simd(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
#if defined(EX_AMX)
    return PyUnicode_FromString("amx");
#elif defined(EX_BF16)
    return PyUnicode_FromString("avx512_bf16");
#elif defined(EX_AVX512)
    return PyUnicode_FromString("avx512");
#elif defined(EX_AVX2)
    return PyUnicode_FromString("avx2");
#else
    return PyUnicode_FromString("portable");
#endif
}

static PyMethodDef methods[] = {
    {"simd", simd, METH_NOARGS, "simd() -> the SIMD path this build compiled"},
    {"extend_attention", extend_attention, METH_VARARGS,
     "extend_attention(q, k, v, out, pages, page_starts, context_lens, row_starts, extend_lens, "
     "num_seqs, num_heads, num_kv_heads, head_dim, page_size, bf16, scale, num_threads, "
     "q_stride, window, sinks, split_len, amx): data pointers of CPU buffers (sinks 0: none; "
     "window 0: none; amx: a bf16 pool may take AMX tiles, not row_math.h's bits); "
     "see cpu_extend.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_extend_cpu", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__extend_cpu(void) { return PyModule_Create(&module); }
