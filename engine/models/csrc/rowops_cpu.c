/* The elementwise steps of a CPU forward, one call each instead of 5-12 torch ops.
 *
 * A decode step of a 30-layer model runs ~40 torch ops a layer on a handful of rows; on a small
 * CPU each op costs more in dispatch than in arithmetic, and on the hundreds of rows of an
 * extend each op's separate pass over memory costs. These kernels do the same math in fp32:
 *   rms_norm:  out = x / sqrt(mean(x^2) + eps) * w                    (per row)
 *   rotary:    the "rotate half" rotation of the q and k heads of a fused qkv row, in place
 *   silu_mul:  out = silu(gate) * up for a fused [gate | up] row
 * Rows may be bf16 (a mixed-precision extend: rms_norm's output, rotary's and silu_mul's
 * rows), read into fp32 and rounded back once. The contract and the torch reference they are
 * tested against: engine/models/rowops.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#include "bf16.h"

#if defined(__AVX2__) && defined(__FMA__)
#include "simd_exp.h"
#define RO_AVX2 1
#endif

/* Rows a call needs before its loop is split over OpenMP threads: a decode step's few rows
 * cost less than waking the team. */
#define PARALLEL_ROWS 32

static void rms_norm_rows(const float *x, const float *w, void *out, int out_bf16,
                          int64_t num_rows, int64_t hidden, float eps) {
#pragma omp parallel for if (num_rows >= PARALLEL_ROWS) schedule(static)
    for (int64_t r = 0; r < num_rows; r++) {
        const float *xr = x + r * hidden;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < hidden; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)hidden + eps);
        if (out_bf16) {
            uint16_t *o = (uint16_t *)out + r * hidden;
#pragma omp simd
            for (int64_t i = 0; i < hidden; i++) o[i] = rg_to_bf16(xr[i] * inv * w[i]);
        } else {
            float *o = (float *)out + r * hidden;
#pragma omp simd
            for (int64_t i = 0; i < hidden; i++) o[i] = xr[i] * inv * w[i];
        }
    }
}

/* Rotates heads [0, num_heads) of each row (head_dim values each, `row_stride` values between
 * rows, fp32 or bf16) by the angles of the row's position: x1' = x1 cos - x2 sin,
 * x2' = x2 cos + x1 sin over the two halves, with cos/sin the (max_positions, head_dim) tables. */
static void rotate_rows(void *x, int bf16, int64_t row_stride, int64_t num_rows,
                        int64_t num_heads, int64_t head_dim, const float *cos_t,
                        const float *sin_t, const int64_t *positions) {
    int64_t half = head_dim / 2;
#pragma omp parallel for if (num_rows >= PARALLEL_ROWS) schedule(static)
    for (int64_t r = 0; r < num_rows; r++) {
        const float *c = cos_t + positions[r] * head_dim, *s = sin_t + positions[r] * head_dim;
        for (int64_t h = 0; h < num_heads; h++) {
            int64_t off = r * row_stride + h * head_dim;
            if (bf16) {
                uint16_t *v = (uint16_t *)x + off;
#pragma omp simd
                for (int64_t i = 0; i < half; i++) {
                    float a = rg_from_bf16(v[i]), b = rg_from_bf16(v[i + half]);
                    v[i] = rg_to_bf16(a * c[i] - b * s[i]);
                    v[i + half] = rg_to_bf16(b * c[i + half] + a * s[i + half]);
                }
                continue;
            }
            float *v = (float *)x + off;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
    }
}

/* o[i] = silu(g[i]) * u[i] for n fp32 values. */
static void silu_mul_span(const float *g, const float *u, float *o, int64_t n) {
    int64_t i = 0;
#ifdef RO_AVX2
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = rg_exp8(_mm256_sub_ps(zero, gv));
        __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* bf16 rows go through fp32 spans of this many values (on the stack). */
#define SPAN 256

static void silu_mul_rows(const void *gate_up, void *out, int bf16, int64_t num_rows,
                          int64_t inter) {
#pragma omp parallel for if (num_rows >= PARALLEL_ROWS) schedule(static)
    for (int64_t r = 0; r < num_rows; r++) {
        if (!bf16) {
            const float *g = (const float *)gate_up + r * 2 * inter;
            silu_mul_span(g, g + inter, (float *)out + r * inter, inter);
            continue;
        }
        const uint16_t *g = (const uint16_t *)gate_up + r * 2 * inter, *u = g + inter;
        uint16_t *o = (uint16_t *)out + r * inter;
        float gf[SPAN], uf[SPAN], of[SPAN];
        for (int64_t i0 = 0; i0 < inter; i0 += SPAN) {
            int64_t n = inter - i0 < SPAN ? inter - i0 : SPAN;
#pragma omp simd
            for (int64_t i = 0; i < n; i++) {
                gf[i] = rg_from_bf16(g[i0 + i]);
                uf[i] = rg_from_bf16(u[i0 + i]);
            }
            silu_mul_span(gf, uf, of, n);
#pragma omp simd
            for (int64_t i = 0; i < n; i++) o[i0 + i] = rg_to_bf16(of[i]);
        }
    }
}

static PyObject *rms_norm(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, w, out;
    long long num_rows, hidden;
    float eps;
    int out_bf16;
    if (!PyArg_ParseTuple(args, "KKKpLLf", &x, &w, &out, &out_bf16, &num_rows, &hidden, &eps))
        return NULL;
    rms_norm_rows((const float *)x, (const float *)w, (void *)out, out_bf16, num_rows, hidden,
                  eps);
    Py_RETURN_NONE;
}

static PyObject *rotary(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, cos_t, sin_t, positions;
    long long row_stride, num_rows, num_heads, head_dim, max_positions;
    int bf16;
    if (!PyArg_ParseTuple(args, "KpLLLLKKKL", &x, &bf16, &row_stride, &num_rows, &num_heads,
                          &head_dim, &cos_t, &sin_t, &positions, &max_positions))
        return NULL;
    if (head_dim % 2 != 0) {
        PyErr_SetString(PyExc_ValueError, "rotary: head_dim must be even");
        return NULL;
    }
    for (int64_t r = 0; r < num_rows; r++) {
        int64_t p = ((const int64_t *)positions)[r];
        if (p < 0 || p >= max_positions) {
            PyErr_Format(PyExc_IndexError, "rotary: position %lld is outside the table of %lld",
                         (long long)p, max_positions);
            return NULL;
        }
    }
    rotate_rows((void *)x, bf16, row_stride, num_rows, num_heads, head_dim,
                (const float *)cos_t, (const float *)sin_t, (const int64_t *)positions);
    Py_RETURN_NONE;
}

static PyObject *silu_mul(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long gate_up, out;
    long long num_rows, inter;
    int bf16;
    if (!PyArg_ParseTuple(args, "KKpLL", &gate_up, &out, &bf16, &num_rows, &inter)) return NULL;
    silu_mul_rows((const void *)gate_up, (void *)out, bf16, num_rows, inter);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rms_norm", rms_norm, METH_VARARGS, "rms_norm(x, w, out, out_bf16, num_rows, hidden, eps)"},
    {"rotary", rotary, METH_VARARGS,
     "rotary(x, bf16, row_stride, num_rows, num_heads, head_dim, cos, sin, positions, "
     "max_positions): in place"},
    {"silu_mul", silu_mul, METH_VARARGS, "silu_mul(gate_up, out, bf16, num_rows, intermediate)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rowops_cpu", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__rowops_cpu(void) { return PyModule_Create(&module); }
