/* Paged decode and verify attention for the CPU, read straight from the KV pool.
 *
 * Each sequence has T query rows (1 for a decode, 1 + k for a draft verification) at the end of
 * a context of C tokens whose K/V sit in pages of the pool; query row t sees positions
 * [0, C - T + t]. Work items are (sequence, KV head, split of the context): every K and V byte
 * of a sequence is read once per step, by one item, which scores all the query heads of its
 * group and all T rows against it while it is in L1 (flash decoding). Partial results merge
 * by their running max and sum. The torch path it replaces gathered each sequence's K/V into a
 * new tensor first (one more read and one write of every byte).
 *
 * The contract and its reference: engine/attention/cpu_paged.py, tests/engine/attention.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TILE 16         /* positions scored at a time */
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
    const float *q;       /* (num_rows, num_heads, head_dim) */
    float *out;           /* (num_rows, num_heads, head_dim) */
    const int64_t *pages; /* page ids of all sequences, concatenated */
    const int64_t *page_starts, *context_lens, *row_starts; /* per sequence (+1 for rows) */
    int64_t num_seqs, num_heads, num_kv_heads, head_dim, page_size, split_len;
    float scale;
} Args;

/* Rows [0, n) of one KV head from `slot` on, as fp32 rows `*stride` floats apart: the pool
 * itself for fp32, else converted into `buf`. */
static const float *kv_rows(const Args *a, const void *base, int64_t slot, int64_t h, int n,
                            float *buf, int64_t *stride) {
    int64_t d_len = a->head_dim, off = (slot * a->num_kv_heads + h) * d_len;
    int64_t pool_stride = a->num_kv_heads * d_len;
    if (!a->bf16) {
        *stride = pool_stride;
        return (const float *)base + off;
    }
    for (int j = 0; j < n; j++) {
        const uint16_t *src = (const uint16_t *)base + off + j * pool_stride;
        uint32_t *dst = (uint32_t *)(buf + j * d_len);
#pragma omp simd
        for (int64_t d = 0; d < d_len; d++) dst[d] = (uint32_t)src[d] << 16;
    }
    *stride = d_len;
    return buf;
}

/* One work item: query rows r = (g, t) of KV head `h` of sequence `s` over positions
 * [lo, hi). Writes per row its max `m`, sum `l` and unnormalised output `acc` (head_dim). */
static void attend_split(const Args *a, int64_t s, int64_t h, int64_t lo, int64_t hi,
                         float *m, float *l, float *acc) {
    int64_t d_len = a->head_dim, group = a->num_heads / a->num_kv_heads;
    int64_t row0 = a->row_starts[s], t_len = a->row_starts[s + 1] - row0;
    int64_t ctx = a->context_lens[s], num_r = group * t_len;
    const int64_t *pages = a->pages + a->page_starts[s];
    float kbuf[TILE * MAX_HEAD_DIM], vbuf[TILE * MAX_HEAD_DIM], p[TILE];
    for (int64_t r = 0; r < num_r; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        memset(acc + r * d_len, 0, (size_t)d_len * sizeof(float));
    }
    for (int64_t p0 = lo; p0 < hi;) {
        /* A tile never crosses a page, so its slots are contiguous. */
        int64_t room = a->page_size - p0 % a->page_size, left = hi - p0;
        int n = (int)(left < room ? left : room);
        n = n < TILE ? n : TILE;
        int64_t slot = pages[p0 / a->page_size] * a->page_size + p0 % a->page_size;
        int64_t ks, vs;
        const float *kt = kv_rows(a, a->k, slot, h, n, kbuf, &ks);
        const float *vt = kv_rows(a, a->v, slot, h, n, vbuf, &vs);
        for (int64_t r = 0; r < num_r; r++) {
            int64_t g = r / t_len, t = r % t_len;
            /* Row t sees positions < ctx - t_len + t + 1 (causal among the new rows). */
            int64_t visible = ctx - t_len + t + 1 - p0;
            int nv = (int)(visible < n ? visible : n);
            if (nv <= 0) continue;
            const float *qr = a->q + ((row0 + t) * a->num_heads + h * group + g) * d_len;
            float top = m[r];
            for (int j = 0; j < nv; j++) {
                const float *kr = kt + j * ks;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < d_len; d++) dot += qr[d] * kr[d];
                p[j] = dot * a->scale;
                top = p[j] > top ? p[j] : top;
            }
            float corr = exp_nonpos(m[r] - top), sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < nv; j++) {
                p[j] = exp_nonpos(p[j] - top);
                sum += p[j];
            }
            float *ar = acc + r * d_len;
            l[r] = l[r] * corr + sum;
            m[r] = top;
#pragma omp simd
            for (int64_t d = 0; d < d_len; d++) ar[d] *= corr;
            for (int j = 0; j < nv; j++) {
                const float *vr = vt + j * vs;
                float pj = p[j];
#pragma omp simd
                for (int64_t d = 0; d < d_len; d++) ar[d] += pj * vr[d];
            }
        }
        p0 += n;
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
        int64_t splits = (a->context_lens[s] + a->split_len - 1) / a->split_len;
        int64_t t_len = a->row_starts[s + 1] - a->row_starts[s];
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
        int64_t splits = (a->context_lens[s] + a->split_len - 1) / a->split_len;
        int64_t local = item - item_start[s], h = local / splits, sp = local % splits;
        int64_t rows = group * (a->row_starts[s + 1] - a->row_starts[s]);
        float *base = state + (state_start[s] + local * rows) * (d_len + 2);
        int64_t lo = sp * a->split_len, hi = lo + a->split_len;
        hi = hi < a->context_lens[s] ? hi : a->context_lens[s];
        attend_split(a, s, h, lo, hi, base, base + rows, base + 2 * rows);
    }
#pragma omp parallel for num_threads(num_threads)
    for (int64_t s = 0; s < a->num_seqs; s++) {
        int64_t splits = (a->context_lens[s] + a->split_len - 1) / a->split_len;
        int64_t row0 = a->row_starts[s], t_len = a->row_starts[s + 1] - row0;
        int64_t rows = group * t_len;
        for (int64_t h = 0; h < a->num_kv_heads; h++) {
            for (int64_t r = 0; r < rows; r++) {
                int64_t g = r / t_len, t = r % t_len;
                float *o = a->out + ((row0 + t) * a->num_heads + h * group + g) * d_len;
                float top = -INFINITY, total = 0.0f;
                for (int64_t sp = 0; sp < splits; sp++) {
                    float *base = state + (state_start[s] + (h * splits + sp) * rows) * (d_len + 2);
                    top = base[r] > top ? base[r] : top;
                }
                memset(o, 0, (size_t)d_len * sizeof(float));
                for (int64_t sp = 0; sp < splits; sp++) {
                    float *base = state + (state_start[s] + (h * splits + sp) * rows) * (d_len + 2);
                    if (base[rows + r] == 0.0f) continue; /* the split is after this row */
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

static PyObject *paged_attention(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long q, k, v, out, pages, page_starts, context_lens, row_starts;
    long long num_seqs, num_heads, num_kv_heads, head_dim, page_size, split_len;
    int bf16, num_threads;
    float scale;
    if (!PyArg_ParseTuple(args, "KKKKKKKKLLLLLLpfi", &q, &k, &v, &out, &pages, &page_starts,
                          &context_lens, &row_starts, &num_seqs, &num_heads, &num_kv_heads,
                          &head_dim, &page_size, &split_len, &bf16, &scale, &num_threads))
        return NULL;
    if (head_dim > MAX_HEAD_DIM || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 ||
        page_size <= 0 || split_len <= 0 || num_threads <= 0) {
        PyErr_SetString(PyExc_ValueError, "paged_attention: unsupported shape");
        return NULL;
    }
    Args a = {(const void *)k, (const void *)v, bf16, (const float *)q, (float *)out,
              (const int64_t *)pages, (const int64_t *)page_starts,
              (const int64_t *)context_lens, (const int64_t *)row_starts, num_seqs, num_heads,
              num_kv_heads, head_dim, page_size, split_len, scale};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run(&a, num_threads);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"paged_attention", paged_attention, METH_VARARGS,
     "paged_attention(q, k, v, out, pages, page_starts, context_lens, row_starts, num_seqs, "
     "num_heads, num_kv_heads, head_dim, page_size, split_len, bf16, scale, num_threads): "
     "data pointers of contiguous CPU buffers; see engine/attention/cpu_paged.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_paged_cpu", NULL, -1, methods};

PyMODINIT_FUNC PyInit__paged_cpu(void) { return PyModule_Create(&module); }
