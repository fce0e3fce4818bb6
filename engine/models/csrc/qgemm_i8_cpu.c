/* y = x @ W.T for many rows of x (prefill chunks, agent-turn deltas), as int8 dot products with
 * int32 sums, from the GGUF file's own codes.
 *
 * An extend is compute-bound: each weight serves hundreds of rows. An fp32 FMA does 16 multiply-
 * adds a 512-bit instruction; VNNI's vpdpbusd does 64 (u8 x s8, four products summed into each
 * int32 lane). The weights are already integers times a per-block scale (Q8_0, Q4_0, Q4_1, Q4_K
 * sub-blocks: 32 weights a block); the activations are quantised here, per row and per block
 * of 32, dynamically, as llama.cpp does (Q8_0-style: d = max|x| / 127, q = round-to-even(x / d)).
 * So per (row r, output o, block b), with exact int32 sums:
 *   Q4 (w = dw * (c - 8) + mw, c in 0..15): sum x w ~ dw * dx * (sum(c * xq) - 8 sum(xq))
 *       + mw * sum(x). Centring the codes makes the activations' rounding errors multiply
 *       c - 8, not c (whose mean of 7.5 would add the errors up: twice the drift on Q4_1).
 *   Q8 (w = dw * c, c in -127..127): the unsigned operand is xq + 128, so
 *       sum x w ~ dw * dx * sum(c * (xq + 128)) + (-128 * dw * sum(c)) * dx
 * The second term's weight factor is `mw` (the offset, or -128 dw sum(c) precomputed) and its
 * row factor is `xs2` (the exact fp32 block sum of x, or dx). Blocks are added in order with
 * fused multiply-adds, so the AVX512-VNNI, AVX-VNNI and portable paths give the same bits.
 *
 * Layouts (engine/models/int8_gemm.py builds them), nb = k / 32 blocks a row of W, n % 16 == 0:
 *   W: (n / 16, nb, 8, 16, 4) bytes: 16 outputs x 4 consecutive k per 64-byte vector, the
 *      layout vpdpbusd reads (u8 codes for Q4, s8 for Q8);
 *   dw, mw: (n / 16, nb, 16) fp32;
 *   xq: (rows, k) bytes (s8 for Q4, u8 = xq + 128 for Q8); dx, xs2: (rows, nb) fp32;
 *   xsub: (rows, nb) int32, 8 sum(xq) for Q4 (0 for Q8).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define QG_VNNI512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__AVXVNNI__)
/* AVX-VNNI: vpdpbusd on 256-bit vectors, without AVX-512 (Intel's E-core Xeons such as Sierra
 * Forest, client cores since Alder Lake). */
#include <immintrin.h>
#define QG_VNNI256 1
#endif

#define QK 32       /* k a block */
#define TILE 16     /* outputs a vector */
#define TILE_BYTES (QK * TILE)
#define MR 4        /* rows of x a register tile */
#define NT 2        /* 16-output vectors a register tile */

enum { FMT_Q4 = 4, FMT_Q8 = 8 };

typedef struct {
    const uint8_t *xq;
    const float *dx, *xs2;
    const int32_t *xsub;
    const uint8_t *w;
    const float *dw, *mw;
    float *y;
    int64_t num_rows, n, k;
    int fmt, accumulate;
} Args;

/* ---- activation quantisation ---------------------------------------------------------- */

/* The block sum of 32 floats in one fixed order (the vector path's: lanes i and i + 16, then
 * a halving tree), so both builds give the same bits. */
static inline float block_sum(const float *s16) {
    float t[8];
    for (int i = 0; i < 8; i++) t[i] = s16[i] + s16[i + 8];
    for (int i = 0; i < 4; i++) t[i] += t[i + 4];
    for (int i = 0; i < 2; i++) t[i] += t[i + 2];
    return t[0] + t[1];
}

static void quantize_block(int fmt, const float *x, uint8_t *q, float *dx, float *xs2,
                           int32_t *xsub) {
    float s16[16], amax = 0.0f;
#ifdef QG_VNNI512
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    _mm512_storeu_ps(s16, _mm512_add_ps(a, b));
    amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
#else
    for (int i = 0; i < 16; i++) s16[i] = x[i] + x[i + 16];
    for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(x[i]));
#endif
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const int offset = fmt == FMT_Q8 ? 128 : 0;
#ifdef QG_VNNI512
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i off = _mm512_set1_epi32(offset);
    __m512i qa = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a, vid)), off);
    __m512i qb = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(b, vid)), off);
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(qb));
    const int32_t isum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb)) - QK * offset;
#else
    int32_t isum = 0;
    for (int i = 0; i < QK; i++) {
        const int v = (int)nearbyintf(x[i] * id);
        isum += v;
        q[i] = (uint8_t)(v + offset);
    }
#endif
    *xsub = fmt == FMT_Q4 ? 8 * isum : 0;
    *dx = d;
    *xs2 = fmt == FMT_Q8 ? d : block_sum(s16);
}

static void quantize(int fmt, const float *x, int64_t num_rows, int64_t k, uint8_t *xq,
                     float *dx, float *xs2, int32_t *xsub, int num_threads) {
    const int64_t nb = k / QK, total = num_rows * nb;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t i = 0; i < total; i++) {
        const int64_t r = i / nb, b = i % nb;
        quantize_block(fmt, x + r * k + b * QK, xq + r * k + b * QK, dx + i, xs2 + i,
                       xsub + i);
    }
}

/* ---- the GEMM --------------------------------------------------------------------------- */

#ifdef QG_VNNI512
/* Rows r0..r0+R-1 by outputs 16*t0 .. 16*(t0+T)-1, over every block. */
static inline __attribute__((always_inline)) void tile(const Args *a, int64_t r0, const int R,
                                                       int64_t t0, const int T) {
    const int64_t nb = a->k / QK, k = a->k;
    __m512 f[MR][NT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) f[r][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i acc[MR][NT];
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_si512();
        const uint8_t *wb[NT];
        for (int t = 0; t < T; t++) wb[t] = a->w + ((t0 + t) * nb + b) * TILE_BYTES;
        const uint8_t *xb = a->xq + r0 * k + b * QK;
        for (int s = 0; s < QK / 4; s++) {
            __m512i wv[NT];
            for (int t = 0; t < T; t++) wv[t] = _mm512_loadu_si512(wb[t] + s * 64);
            for (int r = 0; r < R; r++) {
                int32_t four;
                memcpy(&four, xb + r * k + s * 4, 4);
                const __m512i xv = _mm512_set1_epi32(four);
                for (int t = 0; t < T; t++)
                    acc[r][t] = a->fmt == FMT_Q4 ? _mm512_dpbusd_epi32(acc[r][t], wv[t], xv)
                                                 : _mm512_dpbusd_epi32(acc[r][t], xv, wv[t]);
            }
        }
        for (int t = 0; t < T; t++) {
            const __m512 dwv = _mm512_loadu_ps(a->dw + ((t0 + t) * nb + b) * TILE);
            const __m512 mwv = _mm512_loadu_ps(a->mw + ((t0 + t) * nb + b) * TILE);
            for (int r = 0; r < R; r++) {
                const int64_t rb = (r0 + r) * nb + b;
                const __m512 scale = _mm512_mul_ps(dwv, _mm512_set1_ps(a->dx[rb]));
                const __m512i dot = _mm512_sub_epi32(acc[r][t], _mm512_set1_epi32(a->xsub[rb]));
                f[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, f[r][t]);
                f[r][t] = _mm512_fmadd_ps(mwv, _mm512_set1_ps(a->xs2[rb]), f[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float *y = a->y + (r0 + r) * a->n + (t0 + t) * TILE;
            const __m512 v = a->accumulate ? _mm512_add_ps(_mm512_loadu_ps(y), f[r][t]) : f[r][t];
            _mm512_storeu_ps(y, v);
        }
}

static void tile_any(const Args *a, int64_t r0, int R, int64_t t0, int T) {
    /* Constant R and T: the compiler keeps the accumulators in registers. */
    if (T == NT) {
        switch (R) {
        case 4: tile(a, r0, 4, t0, NT); return;
        case 3: tile(a, r0, 3, t0, NT); return;
        case 2: tile(a, r0, 2, t0, NT); return;
        default: tile(a, r0, 1, t0, NT); return;
        }
    }
    switch (R) {
    case 4: tile(a, r0, 4, t0, 1); return;
    case 3: tile(a, r0, 3, t0, 1); return;
    case 2: tile(a, r0, 2, t0, 1); return;
    default: tile(a, r0, 1, t0, 1); return;
    }
}
#elif defined(QG_VNNI256)
/* Rows r0..r0+R-1 by the 16 outputs of tile t (two 8-lane halves of each 64-byte W vector),
 * over every block: the AVX512-VNNI tile's sums, 256 bits at a time. */
static inline __attribute__((always_inline)) void tile256(const Args *a, int64_t r0, const int R,
                                                          int64_t t) {
    const int64_t nb = a->k / QK, k = a->k;
    __m256 f[MR][2];
    for (int r = 0; r < R; r++) f[r][0] = f[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i acc[MR][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
        const uint8_t *wb = a->w + (t * nb + b) * TILE_BYTES;
        const uint8_t *xb = a->xq + r0 * k + b * QK;
        for (int s = 0; s < QK / 4; s++) {
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wb + s * 64));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wb + s * 64 + 32));
            for (int r = 0; r < R; r++) {
                int32_t four;
                memcpy(&four, xb + r * k + s * 4, 4);
                const __m256i xv = _mm256_set1_epi32(four);
                if (a->fmt == FMT_Q4) {
                    acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], w0, xv);
                    acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], w1, xv);
                } else {
                    acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], xv, w0);
                    acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], xv, w1);
                }
            }
        }
        const float *dw = a->dw + (t * nb + b) * TILE, *mw = a->mw + (t * nb + b) * TILE;
        for (int h = 0; h < 2; h++) {
            const __m256 dwv = _mm256_loadu_ps(dw + 8 * h), mwv = _mm256_loadu_ps(mw + 8 * h);
            for (int r = 0; r < R; r++) {
                const int64_t rb = (r0 + r) * nb + b;
                const __m256 scale = _mm256_mul_ps(dwv, _mm256_set1_ps(a->dx[rb]));
                const __m256i dot = _mm256_sub_epi32(acc[r][h], _mm256_set1_epi32(a->xsub[rb]));
                f[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, f[r][h]);
                f[r][h] = _mm256_fmadd_ps(mwv, _mm256_set1_ps(a->xs2[rb]), f[r][h]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int h = 0; h < 2; h++) {
            float *y = a->y + (r0 + r) * a->n + t * TILE + 8 * h;
            const __m256 v = a->accumulate ? _mm256_add_ps(_mm256_loadu_ps(y), f[r][h])
                                           : f[r][h];
            _mm256_storeu_ps(y, v);
        }
}

static void tile_any(const Args *a, int64_t r0, int R, int64_t t0, int T) {
    for (int64_t t = t0; t < t0 + T; t++) {
        switch (R) {
        case 4: tile256(a, r0, 4, t); break;
        case 3: tile256(a, r0, 3, t); break;
        case 2: tile256(a, r0, 2, t); break;
        default: tile256(a, r0, 1, t); break;
        }
    }
}
#else
/* The portable path: the same sums in the same order. */
static void tile_any(const Args *a, int64_t r0, int R, int64_t t0, int T) {
    const int64_t nb = a->k / QK, k = a->k;
    for (int r = 0; r < R; r++)
        for (int64_t t = t0; t < t0 + T; t++)
            for (int o = 0; o < TILE; o++) {
                float f = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    const uint8_t *wb = a->w + (t * nb + b) * TILE_BYTES;
                    const uint8_t *xb = a->xq + (r0 + r) * k + b * QK;
                    int32_t acc = 0;
                    for (int j = 0; j < QK; j++) {
                        const int wj = wb[(j / 4) * 64 + o * 4 + j % 4];
                        acc += a->fmt == FMT_Q4 ? wj * (int8_t)xb[j] : (int8_t)wj * xb[j];
                    }
                    const int64_t rb = (r0 + r) * nb + b, ob = (t * nb + b) * TILE + o;
                    f = fmaf((float)(acc - a->xsub[rb]), a->dw[ob] * a->dx[rb], f);
                    f = fmaf(a->mw[ob], a->xs2[rb], f);
                }
                float *y = a->y + (r0 + r) * a->n + t * TILE + o;
                *y = a->accumulate ? *y + f : f;
            }
}
#endif

static void gemm(const Args *a, int num_threads) {
    const int64_t num_tiles = a->n / TILE, num_pairs = (num_tiles + NT - 1) / NT;
    /* Threads split the outputs; each walks every row over its weights, which stay in L2. */
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t p = 0; p < num_pairs; p++) {
        const int64_t t0 = p * NT;
        const int T = (int)(num_tiles - t0 < NT ? num_tiles - t0 : NT);
        for (int64_t r0 = 0; r0 < a->num_rows; r0 += MR) {
            const int R = (int)(a->num_rows - r0 < MR ? a->num_rows - r0 : MR);
            tile_any(a, r0, R, t0, T);
        }
    }
}

/* ---- Python bindings ----------------------------------------------------------------------- */

static int check_fmt(int fmt) {
    if (fmt == FMT_Q4 || fmt == FMT_Q8) return 1;
    PyErr_Format(PyExc_ValueError, "int8 gemm: unknown format %d", fmt);
    return 0;
}

/* quantize(fmt, x, num_rows, k, xq, dx, xs2, xsub, num_threads): pointers to contiguous
 * buffers. */
static PyObject *py_quantize(PyObject *self, PyObject *args) {
    int fmt, num_threads;
    unsigned long long x, xq, dx, xs2, xsub;
    long long num_rows, k;
    if (!PyArg_ParseTuple(args, "iKLLKKKKi", &fmt, &x, &num_rows, &k, &xq, &dx, &xs2, &xsub,
                          &num_threads))
        return NULL;
    if (!check_fmt(fmt)) return NULL;
    if (k % QK != 0 || num_rows < 0) {
        PyErr_SetString(PyExc_ValueError, "int8 quantize: k must be a multiple of 32");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    quantize(fmt, (const float *)x, num_rows, k, (uint8_t *)xq, (float *)dx, (float *)xs2,
             (int32_t *)xsub, num_threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* gemm(fmt, xq, dx, xs2, xsub, num_rows, w, dw, mw, n, k, y, num_threads, accumulate). */
static PyObject *py_gemm(PyObject *self, PyObject *args) {
    int fmt, num_threads, accumulate;
    unsigned long long xq, dx, xs2, xsub, w, dw, mw, y;
    long long num_rows, n, k;
    if (!PyArg_ParseTuple(args, "iKKKKLKKKLLKip", &fmt, &xq, &dx, &xs2, &xsub, &num_rows, &w,
                          &dw, &mw, &n, &k, &y, &num_threads, &accumulate))
        return NULL;
    if (!check_fmt(fmt)) return NULL;
    if (k % QK != 0 || n % TILE != 0 || num_rows < 0) {
        PyErr_SetString(PyExc_ValueError, "int8 gemm: k must be a multiple of 32, n of 16");
        return NULL;
    }
    Args a = {(const uint8_t *)xq, (const float *)dx, (const float *)xs2,
              (const int32_t *)xsub, (const uint8_t *)w, (const float *)dw, (const float *)mw,
              (float *)y, num_rows, n, k, fmt, accumulate};
    Py_BEGIN_ALLOW_THREADS
    gemm(&a, num_threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_simd(PyObject *self, PyObject *args) {
#if defined(QG_VNNI512)
    return PyUnicode_FromString("avx512_vnni");
#elif defined(QG_VNNI256)
    return PyUnicode_FromString("avx_vnni");
#else
    return PyUnicode_FromString("portable");
#endif
}

static PyMethodDef methods[] = {
    {"quantize", py_quantize, METH_VARARGS, "Quantise fp32 rows to int8 blocks of 32."},
    {"gemm", py_gemm, METH_VARARGS, "y (+)= x @ W.T from int8 rows and int8 weight blocks."},
    {"simd", py_simd, METH_NOARGS, "The SIMD path this build compiled."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qgemm_i8_cpu", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__qgemm_i8_cpu(void) { return PyModule_Create(&module); }
