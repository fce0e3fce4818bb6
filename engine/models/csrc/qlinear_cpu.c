/* y = x @ W.T for a few rows of x, with W kept as the GGUF file's own quantised codes.
 *
 * A decode step reads every weight once to produce one row, so its time is the bytes of the
 * weights it reads. The GGUF blocks are 4.5-8.5 bits a weight; the fp32 tensors dequantised from
 * them are 32. The weights here are exactly those the fp32 path uses, computed in fp32 from the
 * same codes and scales, so the two paths differ only in summation order.
 *
 * Layout (engine/models/quant.py repacks ggml's Q4_0, Q4_1 and Q8_0 blocks into it, exactly):
 * 32 weights a block, `nb = k / 32` blocks a row of W,
 *   Q4: codes (n, nb, 16) bytes, weight j of a block in the low nibble of byte j, weight j + 16
 *       in the high one; d, m (n, nb) fp32; w = d * q + m
 *   Q8: codes (n, nb, 32) int8; d (n, nb) fp32; w = d * q
 * The codes of a block are unpacked to fp32 once and used for up to ROWS rows of x held in L1.
 * AVX-512 forms the block's weights, d * q + m, and takes each row's dot product with them. The
 * AVX2 and scalar paths use sum_j x_j w_j = d * sum_j x_j q_j + m * sum_j x_j, the m terms as
 * one dot product per row of W with the block sums of x, computed at the end. Either way the
 * summation order of a row's outputs does not depend on the other rows: a decode row and the
 * same row among a draft verification's get the same bits. Output features are split between
 * threads in chunks.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define QL_AVX2 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
/* 16 lanes: a block is two vectors, half the unpacking and FMA instructions of AVX2's four. */
#define QL_AVX512 1
#endif

#define QK 32    /* weights a block */
#define ROWS 8   /* rows of x per pass over a block */
#define CHUNK 16 /* output features a thread takes at a time */
#define PREFETCH_AHEAD 8 /* features between a prefetch and its use */
#define X_L1_BYTES 24576 /* rows of x a group keeps in L1 */

enum { FMT_Q4 = 4, FMT_Q8 = 8 };

typedef struct {
    const float *x;       /* (num_rows, k) */
    const float *xsum;    /* (num_rows, nb): block sums of x, for Q4's offsets */
    const uint8_t *codes; /* see the layout above */
    const float *d, *m;   /* (n, nb); m only for Q4 */
    float *y;             /* (num_rows, n) */
    int64_t num_rows, n, k;
    int fmt;
    int accumulate; /* 1: y += x @ W.T (a residual add for free) */
} Args;

static int code_bytes(int fmt) { return fmt == FMT_Q4 ? QK / 2 : fmt == FMT_Q8 ? QK : 0; }

#ifdef QL_AVX2
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* A block's codes as four vectors of 8 fp32: weights 0-7, 8-15, 16-23, 24-31. */
static inline __attribute__((always_inline)) void unpack(const int fmt, const uint8_t *c,
                                                         __m256 q[4]) {
    if (fmt == FMT_Q8) {
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i *)(c + 8 * i))));
        return;
    }
    __m128i raw = _mm_loadu_si128((const __m128i *)c), mask = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(lo, lo)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(hi, hi)));
}

/* sum_j x_j q_j over one block: two independent chains, for latency. */
static inline __m256 block_dot(const __m256 q[4], const float *x) {
    __m256 t0 = _mm256_mul_ps(q[0], _mm256_loadu_ps(x));
    __m256 t1 = _mm256_mul_ps(q[1], _mm256_loadu_ps(x + 8));
    t0 = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x + 16), t0);
    t1 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x + 24), t1);
    return _mm256_add_ps(t0, t1);
}
#endif

#ifdef QL_AVX512
/* A block's codes as two vectors of 16 fp32: weights 0-15 and 16-31. */
static inline __attribute__((always_inline)) void unpack16(const int fmt, const uint8_t *c,
                                                           __m512 q[2]) {
    if (fmt == FMT_Q8) {
        q[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)c)));
        q[1] = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(c + 16))));
        return;
    }
    __m128i raw = _mm_loadu_si128((const __m128i *)c), mask = _mm_set1_epi8(0x0f);
    q[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, mask)));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    q[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi));
}
#endif

/* sum_b m_b * xsum_b over one row of W. */
static float offset_dot(const float *m, const float *xsum, int64_t nb) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t b = 0; b < nb; b++) s += m[b] * xsum[b];
    return s;
}

/* Output features [n0, n1) for rows [r0, r0 + nr); inlined for each constant nr <= ROWS, so
 * the accumulators stay in registers. */
static inline __attribute__((always_inline)) void rows_block(const Args *a, int64_t r0,
                                                              const int nr, int64_t n0,
                                                              int64_t n1) {
    const int fmt = a->fmt;
    const int64_t nb = a->k / QK, cb = code_bytes(fmt);
    const float *x = a->x + r0 * a->k;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *codes = a->codes + n * nb * cb;
        const float *d = a->d + n * nb;
        /* The weights stream from memory once per step: ask for a later feature's codes and
         * scales now (a few KB ahead), so the loads overlap the arithmetic. */
        if (n + PREFETCH_AHEAD < a->n) {
            const char *next = (const char *)(codes + PREFETCH_AHEAD * nb * cb);
            for (int64_t off = 0; off < nb * cb; off += 64) __builtin_prefetch(next + off);
            __builtin_prefetch(d + PREFETCH_AHEAD * nb);
            if (a->m) __builtin_prefetch(a->m + (n + PREFETCH_AHEAD) * nb);
        }
        float dot[ROWS];
#if defined(QL_AVX512)
        /* The block's scale goes into its codes once (d * q, as the dense weights hold it),
         * so each row costs two FMAs a block, into two chains. */
        __m512 acc0[ROWS], acc1[ROWS];
        for (int r = 0; r < nr; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            __m512 q[2];
            if (fmt == FMT_Q4) unpack16(FMT_Q4, codes + b * cb, q);
            else unpack16(FMT_Q8, codes + b * cb, q);
            /* Q4's offset goes in too (w = d * q + m, one FMA): no per-row offset dots. */
            __m512 db = _mm512_set1_ps(d[b]);
            __m512 mb = fmt == FMT_Q4 ? _mm512_set1_ps(a->m[n * nb + b]) : _mm512_setzero_ps();
            __m512 w0 = _mm512_fmadd_ps(q[0], db, mb), w1 = _mm512_fmadd_ps(q[1], db, mb);
            for (int r = 0; r < nr; r++) {
                const float *xb = x + r * a->k + b * QK;
                acc0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb), acc0[r]);
                acc1[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + 16), acc1[r]);
            }
        }
        for (int r = 0; r < nr; r++) dot[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
#elif defined(QL_AVX2)
        __m256 acc[ROWS];
        for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            __m256 q[4];
            if (fmt == FMT_Q4) unpack(FMT_Q4, codes + b * cb, q);
            else unpack(FMT_Q8, codes + b * cb, q);
            __m256 db = _mm256_broadcast_ss(d + b);
            for (int r = 0; r < nr; r++)
                acc[r] = _mm256_fmadd_ps(block_dot(q, x + r * a->k + b * QK), db, acc[r]);
        }
        for (int r = 0; r < nr; r++) dot[r] = hsum(acc[r]);
#else
        for (int r = 0; r < nr; r++) dot[r] = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *c = codes + b * cb;
            float q[QK];
            for (int j = 0; j < QK; j++)
                q[j] = fmt == FMT_Q8 ? (float)(int8_t)c[j]
                                     : (float)(j < QK / 2 ? c[j] & 0x0f : c[j - QK / 2] >> 4);
            for (int r = 0; r < nr; r++) {
                const float *xr = x + r * a->k + b * QK;
                float t = 0.0f;
                for (int j = 0; j < QK; j++) t += q[j] * xr[j];
                dot[r] += t * d[b];
            }
        }
#endif
        for (int r = 0; r < nr; r++) {
#if defined(QL_AVX512)
            const float off = 0.0f; /* in the weights above */
#else
            float off = fmt == FMT_Q4 ? offset_dot(a->m + n * nb, a->xsum + (r0 + r) * nb, nb)
                                      : 0.0f;
#endif
            float *y = a->y + (r0 + r) * a->n + n;
            *y = a->accumulate ? *y + (dot[r] + off) : dot[r] + off;
        }
    }
}

_Static_assert(ROWS == 8, "rows_any has a case for each row count 1..ROWS");

static void rows_any(const Args *a, int64_t r0, int nr, int64_t n0, int64_t n1) {
    switch (nr) {
    case 1: rows_block(a, r0, 1, n0, n1); break;
    case 2: rows_block(a, r0, 2, n0, n1); break;
    case 3: rows_block(a, r0, 3, n0, n1); break;
    case 4: rows_block(a, r0, 4, n0, n1); break;
    case 5: rows_block(a, r0, 5, n0, n1); break;
    case 6: rows_block(a, r0, 6, n0, n1); break;
    case 7: rows_block(a, r0, 7, n0, n1); break;
    default: rows_block(a, r0, ROWS, n0, n1); break;
    }
}

static void run(const Args *a, int num_threads) {
    int64_t num_chunks = (a->n + CHUNK - 1) / CHUNK;
    /* Rows a group reads for every feature stay in L1 (32 KB on the CPUs we target), beside
     * the codes: 8 rows of k = 576 do, 8 of k = 1536 (48 KB) do not, and run 1.4x slower. */
    int64_t group_rows = X_L1_BYTES / (a->k * (int64_t)sizeof(float));
    group_rows = group_rows < 1 ? 1 : group_rows > ROWS ? ROWS : group_rows;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t c = 0; c < num_chunks; c++) {
        int64_t n0 = c * CHUNK, n1 = n0 + CHUNK < a->n ? n0 + CHUNK : a->n;
        /* Every row group over the same CHUNK features: their codes stay in L1 between. The
         * groups are of near-equal size (9 rows: 5 + 4, not 8 + 1): each unpacks the codes
         * again, which a group of one row hardly repays. A row's sums do not depend on its
         * group, so neither do its outputs. */
        int64_t num_groups = (a->num_rows + group_rows - 1) / group_rows;
        for (int64_t g = 0, r0 = 0; g < num_groups; g++) {
            int nr = (int)((a->num_rows - r0 + (num_groups - g) - 1) / (num_groups - g));
            rows_any(a, r0, nr, n0, n1);
            r0 += nr;
        }
    }
}

static PyObject *qlinear(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, codes, d, m, y;
    long long num_rows, n, k;
    int fmt, num_threads, accumulate;
    if (!PyArg_ParseTuple(args, "iKKKKKLLLip", &fmt, &x, &codes, &d, &m, &y, &num_rows, &n, &k,
                          &num_threads, &accumulate))
        return NULL;
    if (code_bytes(fmt) == 0 || k % QK != 0 || num_rows < 0 || n < 0 || num_threads <= 0) {
        PyErr_SetString(PyExc_ValueError, "qlinear: unsupported format or shape");
        return NULL;
    }
    int64_t nb = k / QK;
    float *xsum = NULL;
#if defined(QL_AVX512)
    const int need_xsum = 0; /* the AVX-512 path folds Q4's offsets into the weights */
#else
    const int need_xsum = 1;
#endif
    if (need_xsum && fmt == FMT_Q4 && num_rows > 0) {
        xsum = malloc((size_t)(num_rows * nb) * sizeof(float));
        if (!xsum) return PyErr_NoMemory();
        for (int64_t i = 0; i < num_rows * nb; i++) {
            const float *xb = (const float *)x + i * QK;
            float s = 0.0f;
            for (int j = 0; j < QK; j++) s += xb[j];
            xsum[i] = s;
        }
    }
    Args a = {(const float *)x, xsum, (const uint8_t *)codes, (const float *)d,
              (const float *)m, (float *)y, num_rows, n, k, fmt, accumulate};
    Py_BEGIN_ALLOW_THREADS
    run(&a, num_threads);
    Py_END_ALLOW_THREADS
    free(xsum);
    Py_RETURN_NONE;
}

static PyObject *simd(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
#if defined(QL_AVX512)
    return PyUnicode_FromString("avx512");
#elif defined(QL_AVX2)
    return PyUnicode_FromString("avx2");
#else
    return PyUnicode_FromString("scalar");
#endif
}

static PyMethodDef methods[] = {
    {"qlinear", qlinear, METH_VARARGS,
     "qlinear(fmt, x, codes, d, m, y, num_rows, n, k, num_threads, accumulate): y = x @ W.T "
     "(y += x @ W.T when accumulate) with W as codes and scales (fmt 4: Q4, 8: Q8); data "
     "pointers of contiguous CPU buffers, x, d, m and y fp32; see engine/models/quant.py"},
    {"simd", simd, METH_NOARGS, "the instruction set the kernel was built for"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qlinear_cpu", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__qlinear_cpu(void) { return PyModule_Create(&module); }
