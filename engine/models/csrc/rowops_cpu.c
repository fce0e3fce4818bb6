/* The elementwise steps of a CPU fp32 forward, one call each instead of 5-12 torch ops.
 *
 * A decode step of a 30-layer model runs ~40 torch ops a layer on a handful of rows; on a small
 * CPU each op costs more in dispatch than in arithmetic, and on the hundreds of rows of an
 * extend each op's separate pass over memory costs. These kernels do the same fp32 math:
 *   rms_norm:  out = x / sqrt(mean(x^2) + eps) * w                    (per row)
 *   rotary:    the "rotate half" rotation of the q and k heads of a fused qkv row, in place
 *   silu_mul:  out = silu(gate) * up for a fused [gate | up] row
 * The contract and the torch reference they are tested against: engine/models/rowops.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#if defined(__AVX2__) && defined(__FMA__)
#include "simd_exp.h"
#define RO_AVX2 1
#endif

/* Rows a call needs before its loop is split over OpenMP threads: a decode step's few rows
 * cost less than waking the team. */
#define PARALLEL_ROWS 32

static void rms_norm_rows(const float *x, const float *w, float *out, int64_t num_rows,
                          int64_t hidden, float eps) {
#pragma omp parallel for if (num_rows >= PARALLEL_ROWS) schedule(static)
    for (int64_t r = 0; r < num_rows; r++) {
        const float *xr = x + r * hidden;
        float *o = out + r * hidden;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < hidden; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)hidden + eps);
#pragma omp simd
        for (int64_t i = 0; i < hidden; i++) o[i] = xr[i] * inv * w[i];
    }
}

/* Rotates heads [0, num_heads) of each row (head_dim floats each, `row_stride` floats between
 * rows) by the angles of the row's position: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin over
 * the two halves, with cos/sin the (max_positions, head_dim) tables. */
static void rotate_rows(float *x, int64_t row_stride, int64_t num_rows, int64_t num_heads,
                        int64_t head_dim, const float *cos_t, const float *sin_t,
                        const int64_t *positions) {
    int64_t half = head_dim / 2;
#pragma omp parallel for if (num_rows >= PARALLEL_ROWS) schedule(static)
    for (int64_t r = 0; r < num_rows; r++) {
        const float *c = cos_t + positions[r] * head_dim, *s = sin_t + positions[r] * head_dim;
        for (int64_t h = 0; h < num_heads; h++) {
            float *v = x + r * row_stride + h * head_dim;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
    }
}

static void silu_mul_rows(const float *gate_up, float *out, int64_t num_rows, int64_t inter) {
#pragma omp parallel for if (num_rows >= PARALLEL_ROWS) schedule(static)
    for (int64_t r = 0; r < num_rows; r++) {
        const float *g = gate_up + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        int64_t i = 0;
#ifdef RO_AVX2
        const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
        for (; i + 8 <= inter; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i);
            __m256 e = rg_exp8(_mm256_sub_ps(zero, gv));
            __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < inter; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

static PyObject *rms_norm(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, w, out;
    long long num_rows, hidden;
    float eps;
    if (!PyArg_ParseTuple(args, "KKKLLf", &x, &w, &out, &num_rows, &hidden, &eps)) return NULL;
    rms_norm_rows((const float *)x, (const float *)w, (float *)out, num_rows, hidden, eps);
    Py_RETURN_NONE;
}

static PyObject *rotary(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, cos_t, sin_t, positions;
    long long row_stride, num_rows, num_heads, head_dim, max_positions;
    if (!PyArg_ParseTuple(args, "KLLLLKKKL", &x, &row_stride, &num_rows, &num_heads, &head_dim,
                          &cos_t, &sin_t, &positions, &max_positions))
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
    rotate_rows((float *)x, row_stride, num_rows, num_heads, head_dim, (const float *)cos_t,
                (const float *)sin_t, (const int64_t *)positions);
    Py_RETURN_NONE;
}

static PyObject *silu_mul(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long gate_up, out;
    long long num_rows, inter;
    if (!PyArg_ParseTuple(args, "KKLL", &gate_up, &out, &num_rows, &inter)) return NULL;
    silu_mul_rows((const float *)gate_up, (float *)out, num_rows, inter);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rms_norm", rms_norm, METH_VARARGS, "rms_norm(x, w, out, num_rows, hidden, eps)"},
    {"rotary", rotary, METH_VARARGS,
     "rotary(x, row_stride, num_rows, num_heads, head_dim, cos, sin, positions, "
     "max_positions): in place"},
    {"silu_mul", silu_mul, METH_VARARGS, "silu_mul(gate_up, out, num_rows, intermediate)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rowops_cpu", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__rowops_cpu(void) { return PyModule_Create(&module); }
