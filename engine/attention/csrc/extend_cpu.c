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
 * the row max and sum of the online softmax are lane-wise too. Keys go in tiles of KT on a grid
 * of absolute positions, in order, and scores are in log2 units (q is scaled by log2 e once), so
 * the softmax is one exp2 per score.
 *
 * torch's flash kernel, which this replaces where it is faster, needs each sequence's K/V
 * gathered out of the pages into a new tensor first (a read and a write of every byte per layer)
 * and the grouped heads' K/V expanded for the new block.
 *
 * The contract and its reference: engine/attention/cpu_extend.py, tests/engine/attention.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16.h"
#include "extend_common.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define EX_AVX512 1
#include "extend_avx512.h"
#if defined(EX_BF16) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define EX_AMX 1
#include "extend_amx.h"
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#define EX_AVX2 1
#include "extend_avx2.h"
#else
#define micro_block micro_block_portable
#endif

/* Fills the item's rows for tokens [t0, t0 + num_tok) of sequence s, KV head h. */
static void load_rows(const Args *a, Item *it, int64_t s, int64_t h, int64_t t0, int64_t num_tok) {
    int64_t group = a->num_heads / a->num_kv_heads, d_len = a->head_dim;
    int64_t num_rows = num_tok * group, start = a->context_lens[s] - a->extend_lens[s];
    memset(it->acc, 0, (size_t)(d_len * it->stride) * sizeof(float));
    for (int64_t r0 = 0; r0 < it->stride; r0 += LANES) {
        const float *qr[LANES];
        float mul[LANES];
        for (int64_t i = 0; i < LANES; i++) {
            int64_t r = r0 + i, real = r < num_rows ? r : num_rows - 1;
            int64_t t = t0 + real / group, g = real % group;
            int64_t pos = start + t, lo = a->window > 0 ? pos - a->window + 1 : 0;
            it->pos[r] = (int32_t)pos;
            it->lo[r] = (int32_t)(lo > 0 ? lo : 0);
            it->m[r] = -INFINITY;
            it->l[r] = 0.0f;
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

/* Normalises the item's real rows into `out`; a sink joins each row's sum with no value. */
static void store_rows(const Args *a, const Item *it, int64_t s, int64_t h, int64_t t0,
                       int64_t num_tok) {
    int64_t group = a->num_heads / a->num_kv_heads, d_len = a->head_dim;
    for (int64_t r = 0; r < num_tok * group; r++) {
        int64_t t = t0 + r / group, head = h * group + r % group;
        /* acc and l are relative to 2^m; a sink far above m makes l infinite and the row 0,
         * its limit. */
        float l = it->l[r];
        if (a->sinks) l += exp2f(a->sinks[head] * LOG2E - it->m[r]);
        float inv = 1.0f / l;
        float *o = a->out + ((a->row_starts[s] + t) * a->num_heads + head) * d_len;
        for (int64_t d = 0; d < d_len; d++) o[d] = it->acc[d * it->stride + r] * inv;
    }
}

/* One work item: tokens [t0, t0 + num_tok) of sequence s against KV head h. */
static void run_item(const Args *a, Item *it, int64_t s, int64_t h, int64_t t0, int64_t num_tok) {
    int64_t d_len = a->head_dim, num_rows = num_tok * (a->num_heads / a->num_kv_heads);
    const int64_t *pages = a->pages + a->page_starts[s];
    load_rows(a, it, s, h, t0, num_tok);
    int64_t first = it->lo[0], end = (int64_t)it->pos[num_rows - 1] + 1;
    int64_t pos_min = it->pos[0], lo_max = it->lo[num_rows - 1];
    const float *krows[KT], *vrows[KT];
    /* Tiles on the grid of KT positions from 0, whole from their start: bf16 products pair
     * positions 2i and 2i + 1 (and AMX sums 32 at once), so the grouping of a row's keys must
     * not depend on where its item starts. Positions before `first` are never read (a
     * window's pages before it may be invalid ids): they take a zero row, masked for every
     * row. */
    for (int64_t lo = first / KT * KT; lo < end; lo += KT) {
        int64_t hi = lo + KT < end ? lo + KT : end;
        int n = (int)(hi - lo), skip = first > lo ? (int)(first - lo) : 0;
        int masked = hi - 1 > pos_min || lo < lo_max;
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
                continue;
            }
#endif
            for (int64_t v0 = 0; v0 < it->num_vec; v0 += MB) {
                int nv = it->num_vec - v0 < MB ? (int)(it->num_vec - v0) : MB;
                micro_block_bf16(it, d_len, v0, nv, (const uint16_t *const *)kraw, lo, n, masked);
            }
            continue;
        }
#endif
        kv_tile(a, a->k, pages, h, lo, skip, n, it->zero, it->kbuf, krows);
        kv_tile(a, a->v, pages, h, lo, skip, n, it->zero, it->vbuf, vrows);
        for (int64_t v0 = 0; v0 < it->num_vec; v0 += MB) {
            int nv = it->num_vec - v0 < MB ? (int)(it->num_vec - v0) : MB;
            micro_block(it, d_len, v0, nv, krows, vrows, lo, n, masked);
        }
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
     * on its block: its lanes are its own, and tiles sit on the grid of absolute positions. */
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
    use_amx = a->bf16 && d_len % 32 == 0 && amx_permitted();
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
        int ok = it.pos && it.lo && it.qt && it.acc && it.m && it.l && it.kbuf && it.vbuf && it.s
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
    long long num_seqs, num_heads, num_kv_heads, head_dim, page_size, q_stride, window;
    int bf16, num_threads;
    float scale;
    if (!PyArg_ParseTuple(args, "KKKKKKKKKLLLLLpfiLLK", &q, &k, &v, &out, &pages, &page_starts,
                          &context_lens, &row_starts, &extend_lens, &num_seqs, &num_heads,
                          &num_kv_heads, &head_dim, &page_size, &bf16, &scale, &num_threads,
                          &q_stride, &window, &sinks))
        return NULL;
    if (head_dim <= 0 || head_dim % 8 != 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0
        || page_size <= 0 || num_threads <= 0 || window < 0 || num_seqs < 0) {
        PyErr_SetString(PyExc_ValueError, "extend_attention: unsupported shape");
        return NULL;
    }
    Args a = {(const void *)k, (const void *)v, bf16, (const float *)q, (float *)out,
              (const int64_t *)pages, (const int64_t *)page_starts,
              (const int64_t *)context_lens, (const int64_t *)row_starts,
              (const int64_t *)extend_lens, num_seqs, num_heads, num_kv_heads, head_dim,
              page_size, q_stride, window, scale, (const float *)sinks};
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
     "q_stride, window, sinks): data pointers of CPU buffers (sinks 0: none; window 0: none); "
     "see cpu_extend.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_extend_cpu", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__extend_cpu(void) { return PyModule_Create(&module); }
