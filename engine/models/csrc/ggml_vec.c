/* The int8 path of the GGUF codes kernels for few rows (decode GEMV, draft verification):
 * activation quantisation, and y = x @ W.T with W in ggml's own block layouts, as the file's
 * memory map holds them (read-only, no alignment beyond a byte).
 *
 * The arithmetic is docs/ggml_kernels.md's contract (engine/models/ggml_ref.py in torch). The
 * activations are quantised per block of 32 for every type: xq int8, dx and xs fp32 a block
 * (xs = (float)(sum of the block's xq) * dx), sums int16 a 16. Per row r and output o, with the
 * exact integer I_b = sum E_i xq_i of each 32-weight block b, y from +0.0, blocks ascending:
 *     y = fmaf((float)I_b, S_b * dx_b, y)           every type
 *     y = fmaf(m_b, xs_b, y)                        Q4_1, Q5_1: right after
 *     a = fmaf((float)m_j, xs_b, a)                 Q4_K, Q5_K: a from +0.0 a super-block
 *     y = fmaf(a, -dmin, y)                         Q4_K, Q5_K: after the super-block's 8
 * Integer sums do not depend on their order, so every build gives the same bits, as does
 * _ggml_gemm for the same row. The builds (chosen at compile time; simd() says which):
 *   ggml_vec_avx512.h  AVX512-VNNI, 16 outputs a vector
 *   ggml_vec_avx2.h    AVX-VNNI (vpdpbusd on 256 bits) or AVX2 + FMA (vpmaddubsw), 8 a vector
 *   ggml_vec_scalar.h  portable C (the x86-64-v2 build: tests only)
 *
 * The SIMD builds keep outputs in the lanes. A tile of OT outputs (one vector of them) reads a
 * block of each of its OT rows of W and transposes the codes in registers, so that vector c
 * holds weights 4c..4c+3 of the block for every output (unpacked to unsigned bytes); then for
 * each row of x, eight vpdpbusd against x's dwords, broadcast, leave the block's I_b of all OT
 * outputs in one vector: no horizontal sums, and the fp32 steps run OT outputs a vector. The
 * codes are unpacked once a tile and serve every row (up to RG a pass), so an extra row costs
 * only its dot products and its fp32 steps. Each block prefetches its share of the next tile.
 * A ragged last tile is computed overlapping the one before and stores only its own outputs;
 * a W of fewer rows than a tile takes the portable path. Threads split the output features in
 * contiguous ranges. Nothing is allocated: x is read where quantize wrote it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

enum {
    T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14,
};

#define QK 32      /* weights a block, and activations a quantisation block */
#define QKK 256    /* weights a K-quant super-block */
#define RG 16      /* rows of x a pass over W's blocks serves */
#define OCHUNK 32  /* output features a thread takes at a time */

typedef struct {
    const uint8_t *w;    /* (n, row_bytes) ggml blocks */
    const int8_t *xq;    /* (rows, k) */
    const float *dx;     /* (rows, k / 32) */
    const float *xs;     /* (rows, k / 32) */
    const int16_t *sums; /* (rows, k / 16) */
    float *y;            /* row r at y + r * ldy */
    int64_t n, k, rows, ldy, row_bytes;
    int type, accumulate;
} Args;

/* Bytes a block (of 32 weights, 256 for the K-quants), or 0 for a type with no kernel. */
static int block_bytes(int type) {
    switch (type) {
    case T_Q4_0: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q5_1: return 24;
    case T_Q8_0: return 34;
    case T_Q4_K: return 144;
    case T_Q5_K: return 176;
    case T_Q6_K: return 210;
    default: return 0;
    }
}

static int is_k_type(int type) { return type == T_Q4_K || type == T_Q5_K || type == T_Q6_K; }

static inline uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t load_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* ---- the contract in portable C ------------------------------------------------------------ */

/* An f16's value as fp32 (exact: every f16 is an fp32). */
static inline float f16_to_f32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000 | (man << 13) | (man ? 0x00400000 : 0); /* inf; NaN made quiet */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else {
        float f = (float)man * 0x1p-24f; /* subnormal (or zero): exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* Q4_K/Q5_K's 12 bytes of 6-bit scales and mins -> sc[8], m[8] (gguf's get_scale_min). */
static inline void k_scale_min(const uint8_t *s, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 0x3f;
        m[j] = s[j + 4] & 0x3f;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
}

/* The codes E_i of 32-weight block `blk` (0.. of the row) of a row of W, and its S_b and
 * second-term factor m_b (Q4_1/Q5_1's offset, Q4_K/Q5_K's min m_j; else 0). */
static void block_codes(int type, const uint8_t *row, int64_t blk, int32_t e[QK], float *S,
                        float *m) {
    *m = 0.0f;
    switch (type) {
    case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1: {
        const uint8_t *b = row + blk * block_bytes(type);
        const int has_m = type == T_Q4_1 || type == T_Q5_1, five = type == T_Q5_0 || type == T_Q5_1;
        const uint8_t *qs = b + 2 + 2 * has_m + 4 * five;
        const uint32_t qh = five ? load_u32(b + 2 + 2 * has_m) : 0;
        const int offset = has_m ? 0 : five ? 16 : 8;
        for (int i = 0; i < QK; i++)
            e[i] = (i < 16 ? qs[i] & 0x0f : qs[i - 16] >> 4) + (int)((qh >> i) & 1) * 16 - offset;
        *S = f16_to_f32(load_u16(b));
        if (has_m) *m = f16_to_f32(load_u16(b + 2));
        return;
    }
    case T_Q8_0: {
        const uint8_t *b = row + blk * 34;
        for (int i = 0; i < QK; i++) e[i] = (int8_t)b[2 + i];
        *S = f16_to_f32(load_u16(b));
        return;
    }
    case T_Q4_K: case T_Q5_K: {
        const uint8_t *b = row + blk / 8 * block_bytes(type);
        const int j = (int)(blk % 8);
        uint8_t sc[8], mins[8];
        k_scale_min(b + 4, sc, mins);
        /* qs: 32 bytes per two sub-blocks, low nibbles (2i) then high (2i + 1); Q5_K's bit j
         * of qh[l] is sub-block j's weight l's fifth */
        const uint8_t *qh = b + 16, *qs = b + (type == T_Q5_K ? 48 : 16) + 32 * (j / 2);
        for (int l = 0; l < QK; l++) {
            e[l] = j % 2 ? qs[l] >> 4 : qs[l] & 0x0f;
            if (type == T_Q5_K) e[l] |= ((qh[l] >> j) & 1) << 4;
        }
        *S = f16_to_f32(load_u16(b)) * (float)sc[j]; /* exact */
        *m = (float)mins[j];
        return;
    }
    case T_Q6_K: {
        const uint8_t *b = row + blk / 8 * 210;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int l = 0; l < QK; l++) {
            /* weight i = 128 h + 32 p + l: ql nibble p / 2 of byte 64 h + 32 (p % 2) + l, and
             * bits 2p, 2p + 1 of qh[32 h + l] */
            const int i = (int)(blk % 8) * QK + l, h = i / 128, p = (i / 32) % 4;
            const int lo = b[64 * h + 32 * (p % 2) + l] >> (4 * (p / 2)) & 0x0f;
            const int q = lo | ((b[128 + 32 * h + l] >> (2 * p)) & 3) << 4;
            e[l] = sc[i / 16] * (q - 32);
        }
        *S = f16_to_f32(load_u16(b + 208));
        return;
    }
    }
}

/* Outputs o0 .. o1 for rows r0 .. r0 + nr, one (row, output) at a time, straight from the
 * contract: the scalar build's kernel, and the SIMD builds' for fewer outputs than a tile. */
static void portable_outputs(const Args *a, int64_t o0, int64_t o1, int64_t r0, int nr) {
    const int t = a->type, block_m = t == T_Q4_1 || t == T_Q5_1, super_m = t == T_Q4_K
                                                                            || t == T_Q5_K;
    const int64_t nb = a->k / QK;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = a->w + o * a->row_bytes;
        for (int64_t r = r0; r < r0 + nr; r++) {
            const int8_t *x = a->xq + r * a->k;
            float y = 0.0f, acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t e[QK], I = 0;
                float S = 0.0f, m = 0.0f;
                block_codes(t, row, b, e, &S, &m);
                for (int i = 0; i < QK; i++) I += e[i] * x[b * QK + i];
                const float dx = a->dx[r * nb + b], xs = a->xs[r * nb + b];
                y = fmaf((float)I, S * dx, y);
                if (block_m) y = fmaf(m, xs, y);
                if (super_m) {
                    acc = fmaf(m, xs, acc);
                    if (b % 8 == 7) { /* the super-block's -dmin */
                        y = fmaf(acc, -f16_to_f32(load_u16(row + b / 8 * block_bytes(t) + 2)), y);
                        acc = 0.0f;
                    }
                }
            }
            float *out = a->y + r * a->ldy + o;
            *out = a->accumulate ? *out + y : y;
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define GV_SIMD "avx512_vnni"
#include "ggml_vec_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#if defined(__AVXVNNI__)
#define GV_SIMD "avx_vnni"
#else
#define GV_SIMD "avx2"
#endif
#include "ggml_vec_avx2.h"
#else
#define GV_SIMD "scalar"
#include "ggml_vec_scalar.h"
#endif

/* ---- the drivers -------------------------------------------------------------------------- */

static void quantize(const float *x, int64_t rows, int64_t k, int8_t *xq, float *dx, float *xs,
                     int16_t *sums, int num_threads) {
    const int64_t total = rows * (k / QK);
    if (num_threads == 1 || rows * k <= 16384) { /* a decode step's rows: less than a fork */
        for (int64_t i = 0; i < total; i++)
            quantize_block(x + i * QK, xq + i * QK, dx + i, xs + i, sums + 2 * i);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t i = 0; i < total; i++)
        quantize_block(x + i * QK, xq + i * QK, dx + i, xs + i, sums + 2 * i);
}

static void gemv(const Args *a, int num_threads) {
    const int64_t num_chunks = (a->n + OCHUNK - 1) / OCHUNK;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
    {
        /* static contiguous ranges of chunks: each thread streams its part of W in order */
        const int threads = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t c0 = num_chunks * id / threads, c1 = num_chunks * (id + 1) / threads;
#ifdef GV_WARM
        if (c0 < c1) warm_first(a, c0 * OCHUNK);
#endif
        for (int64_t c = c0; c < c1; c++) {
            const int64_t o0 = c * OCHUNK, o1 = o0 + OCHUNK < a->n ? o0 + OCHUNK : a->n;
            /* Every row group over the same features: their blocks stay in L1/L2 between. */
            for (int64_t r0 = 0; r0 < a->rows; r0 += RG) {
                const int nr = (int)(a->rows - r0 < RG ? a->rows - r0 : RG);
                gv_outputs(a, o0, o1, r0, nr);
            }
        }
    }
}

/* ---- Python bindings ------------------------------------------------------------------- */

static PyObject *py_quantize(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, xq, dx, xs, sums;
    long long rows, k;
    int num_threads;
    if (!PyArg_ParseTuple(args, "KLLKKKKi", &x, &rows, &k, &xq, &dx, &xs, &sums, &num_threads))
        return NULL;
    if (rows < 0 || k <= 0 || k % QK != 0 || num_threads <= 0) {
        PyErr_Format(PyExc_ValueError,
                     "ggml_vec.quantize: rows %lld, k %lld (a positive multiple of %d), "
                     "threads %d", rows, k, QK, num_threads);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    quantize((const float *)x, rows, k, (int8_t *)xq, (float *)dx, (float *)xs, (int16_t *)sums,
             num_threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_gemv(PyObject *self, PyObject *args) {
    (void)self;
    int type, accumulate, num_threads;
    unsigned long long w, xq, dx, xs, sums, y;
    long long n, k, rows, ldy;
    if (!PyArg_ParseTuple(args, "iKLLKKKKLKLpi", &type, &w, &n, &k, &xq, &dx, &xs, &sums, &rows,
                          &y, &ldy, &accumulate, &num_threads))
        return NULL;
    const int bb = block_bytes(type);
    if (bb == 0) {
        PyErr_Format(PyExc_ValueError, "ggml_vec.gemv: no kernel for ggml type %d", type);
        return NULL;
    }
    const int64_t bw = is_k_type(type) ? QKK : QK;
    if (k <= 0 || k % bw != 0) {
        PyErr_Format(PyExc_ValueError, "ggml_vec.gemv: k = %lld is not a positive multiple of "
                     "the type's %lld-weight block", k, (long long)bw);
        return NULL;
    }
    if (n < 0 || rows < 0 || ldy < n || num_threads <= 0) {
        PyErr_Format(PyExc_ValueError, "ggml_vec.gemv: n %lld, rows %lld, ldy %lld (>= n), "
                     "threads %d", n, rows, ldy, num_threads);
        return NULL;
    }
    const Args a = {(const uint8_t *)w, (const int8_t *)xq, (const float *)dx,
                    (const float *)xs, (const int16_t *)sums, (float *)y, n, k, rows, ldy,
                    k / bw * bb, type, accumulate};
    if (n > 0 && rows > 0) {
        Py_BEGIN_ALLOW_THREADS
        gemv(&a, num_threads);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *py_simd(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(GV_SIMD);
}

static PyMethodDef methods[] = {
    {"quantize", py_quantize, METH_VARARGS,
     "quantize(x, rows, k, xq, dx, xs, sums, num_threads): fp32 rows x (rows, k) -> xq int8 "
     "(rows, k); dx, xs fp32 (rows, k / 32); sums int16 (rows, k / 16); data pointers of "
     "contiguous CPU buffers (docs/ggml_kernels.md)"},
    {"gemv", py_gemv, METH_VARARGS,
     "gemv(type_id, w, n, k, xq, dx, xs, sums, rows, y, ldy, accumulate, num_threads): "
     "y[r * ldy + o] (+)= x_r . W_o for W n rows of ggml blocks of type_id; data pointers"},
    {"simd", py_simd, METH_NOARGS, "the SIMD path this build compiled"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ggml_vec", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ggml_vec(void) { return PyModule_Create(&module); }
