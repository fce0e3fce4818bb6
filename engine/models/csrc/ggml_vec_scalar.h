/* ggml_vec.c's portable path (builds without AVX2: the tests' x86-64-v2 build): ggml_vec.c's
 * portable_outputs, the readable statement of what the SIMD paths compute, one (row, output)
 * at a time. Included by ggml_vec.c only. */

/* Quantise one block of 32 activations (docs/ggml_kernels.md, step 1). */
static void quantize_block(const float *x, int8_t *q, float *dx, float *xs, int16_t *sums) {
    float amax = 0.0f;
    int nan = 0;
    for (int i = 0; i < QK; i++) {
        const float v = fabsf(x[i]);
        nan |= v != v;
        amax = v > amax ? v : amax;
    }
    const float d = nan ? NAN : amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    int total = 0;
    for (int s = 0; s < 2; s++) {
        int sum = 0;
        for (int i = 16 * s; i < 16 * s + 16; i++) {
            /* |x * inv| <= 127 (to an ulp) unless inv overflowed to inf (max|x| < 2^-121,
             * where dx is subnormal) or is NaN; there the vector builds' conversion gives
             * INT_MIN, whose low byte is 0: so do we (and so does torch). */
            const float t = x[i] * inv;
            const int v = fabsf(t) <= 128.0f ? (int)nearbyintf(t) : 0;
            q[i] = (int8_t)v;
            sum += v;
        }
        sums[s] = (int16_t)sum;
        total += sum;
    }
    *dx = d;
    *xs = (float)total * d;
}

static void gv_outputs(const Args *a, int64_t o0, int64_t o1, int64_t r0, int nr) {
    portable_outputs(a, o0, o1, r0, nr);
}
