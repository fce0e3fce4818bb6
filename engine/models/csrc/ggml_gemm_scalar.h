/* ggml_gemm.c's portable path (x86-64 without AVX2, other CPUs): the panel transpose, the f16
 * conversion and the rows, one lane at a time, with the same exact integer sums and the same
 * fmaf steps per block as the SIMD paths. For tests and CPUs nobody serves from. */

/* Lane o of out[i] = the dword at row o + off + min(i / seg_dw, nseg - 1) * stride
 * + (i % seg_dw) * 4, for i, o < 16: the 16 rows' words transposed (segments: blocks). */
static void gg_tr16(const Group *g, size_t off, size_t stride, int seg_dw, int nseg,
                    u32x16 *out) {
    for (int i = 0; i < 16; i++) {
        const int q = i / seg_dw < nseg - 1 ? i / seg_dw : nseg - 1;
        const size_t at = off + (size_t)q * stride + (size_t)(i % seg_dw) * 4;
        for (int o = 0; o < LANES; o++) out[i][o] = load32(g->row[o] + at);
    }
}

/* Block steps the rows take over a panel: none here, so nothing is prefetched ahead. */
static inline int64_t gg_block_steps(int type, int64_t rows, int64_t k) {
    (void)type; (void)rows; (void)k;
    return 1;
}

/* out[o] = the f16 in bits shift .. shift + 15 of lane o of h, as fp32. */
static void gg_f16x16(const u32x16 *h, int shift, float *out) {
    for (int o = 0; o < LANES; o++) out[o] = f16_to_f32(((*h)[o] >> shift) & 0xFFFFu);
}

static inline int32_t lane32(const uint8_t *p, int o) {
    int32_t v;
    memcpy(&v, p + 4 * o, 4);
    return v;
}

static inline float lanef(const uint8_t *p, int o) {
    float v;
    memcpy(&v, p + 4 * o, 4);
    return v;
}

/* sum q xq over k-steps s0 .. s1 - 1 of lane o (c: the block's first k-step of its group). */
static int32_t code_sum(const uint8_t *c, int o, const int8_t *x, int s0, int s1) {
    int32_t acc = 0;
    for (int s = s0; s < s1; s++)
        for (int e = 0; e < 4; e++) acc += c[CS * s + 4 * o + e] * x[4 * s + e];
    return acc;
}

/* Rows r0 .. r1 - 1 of y, outputs o0 .. o0 + lanes - 1, from the panel: the contract's steps
 * one block of 32 at a time. */
static void gg_rows(const Args *a, const uint8_t *codes, const uint8_t *meta, int lanes,
                    int64_t o0, int64_t r0, int64_t r1) {
    const int type = a->type, kq = is_k_type(type);
    const int64_t k = a->k, nb = k / 32, ns = k / 16;
    const int offset = type == Q4_0 ? 8 : type == Q5_0 ? 16 : type == Q8_0 ? 128 : 0;
    for (int64_t r = r0; r < r1; r++) {
        const int8_t *x = a->xq + r * k;
        const float *dx = a->dx + r * nb, *xs = a->xs + r * nb;
        const int16_t *s16 = a->sums + r * ns;
        float *out = a->y + r * a->ldy + o0;
        for (int lane = 0; lane < lanes; lane++) {
            const int t = lane / LANES, o = lane % LANES;
            float y = 0.0f, amin = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *c = codes + b * 8 * CS + STEP_BYTES * t;
                const int8_t *xb = x + 32 * b;
                const int j = (int)(b % 8);
                const uint8_t *m = kq ? meta + (b / 8) * MKS + MK_BYTES * t
                                      : meta + b * MBS + MB_BYTES * t;
                int32_t I;
                float S;
                if (type == Q6_K) {
                    I = lane32(m + MK_S + 64 * (2 * j), o) *
                            (code_sum(c, o, xb, 0, 4) - 32 * s16[2 * b]) +
                        lane32(m + MK_S + 64 * (2 * j + 1), o) *
                            (code_sum(c, o, xb, 4, 8) - 32 * s16[2 * b + 1]);
                    S = lanef(m + MK_D, o);
                } else if (kq) {
                    I = code_sum(c, o, xb, 0, 8);
                    S = lanef(m + MK_S + 64 * j, o);
                } else {
                    I = code_sum(c, o, xb, 0, 8) - offset * (s16[2 * b] + s16[2 * b + 1]);
                    S = lanef(m + MB_S, o);
                }
                y = fmaf((float)I, S * dx[b], y);
                if (type == Q4_1 || type == Q5_1) {
                    y = fmaf(lanef(m + MB_M, o), xs[b], y);
                } else if (type == Q4_K || type == Q5_K) {
                    amin = fmaf(lanef(m + MK_M + 64 * j, o), xs[b], amin);
                    if (j == 7) {
                        y = fmaf(amin, lanef(m + MK_D, o), y);
                        amin = 0.0f;
                    }
                }
            }
            out[lane] = a->accumulate ? out[lane] + y : y;
        }
    }
}
