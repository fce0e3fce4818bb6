/* The portable path of ggml_f32.c (a build without AVX2 + FMA + F16C, e.g. -march=x86-64-v2):
 * plain C that gcc vectorises with SSE. Included by ggml_f32.c after its shared helpers
 * (f16_to_f32, le32, k_scale_min, the type ids). Every path defines
 *   GF_SIMD, VL (lanes a sum is split into), TR, TO (rows and outputs of a tile) and
 *   tile(R, ...): the fp32 dot products of R rows with TO buffered weight rows;
 * this one also deq_blocks(type, src, nb, dst): nb blocks of ggml codes -> fp32, gguf's bits
 * (the SIMD paths define block steps instead, from which ggml_f32.c builds deq_blocks and the
 * fused kernel). No FMA here (x86-64-v2 has none): each lane adds a rounded product, mul then
 * add, and every dequantiser step is gguf's own.
 */

#define GF_SIMD "scalar"
#define VL 8 /* lanes of a row's sum: lane l takes the products of weights i = l (mod VL) */
#define TR 4 /* rows of a tile */
#define TO 4 /* outputs of a tile */

/* gguf's fp32 operations, in its order, one block at a time (ggml_f32.c's header comment lists
 * them per type). */
static void deq_blocks(int type, const uint8_t *b, int64_t nb, float *o) {
    for (int64_t blk = 0; blk < nb; blk++) {
        switch (type) {
        case GGML_Q4_0: {
            const float d = f16_to_f32(b);
            for (int j = 0; j < 16; j++) {
                o[j] = d * (float)((b[2 + j] & 15) - 8);
                o[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
            }
            break;
        }
        case GGML_Q4_1: {
            const float d = f16_to_f32(b), m = f16_to_f32(b + 2);
            for (int j = 0; j < 16; j++) {
                o[j] = d * (float)(b[4 + j] & 15) + m;
                o[j + 16] = d * (float)(b[4 + j] >> 4) + m;
            }
            break;
        }
        case GGML_Q5_0: {
            const float d = f16_to_f32(b);
            const uint32_t qh = le32(b + 2);
            for (int j = 0; j < 16; j++) {
                int lo = (b[6 + j] & 15) | (int)((qh >> j) & 1) << 4;
                int hi = (b[6 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
                o[j] = d * (float)(lo - 16);
                o[j + 16] = d * (float)(hi - 16);
            }
            break;
        }
        case GGML_Q5_1: {
            const float d = f16_to_f32(b), m = f16_to_f32(b + 2);
            const uint32_t qh = le32(b + 4);
            for (int j = 0; j < 16; j++) {
                int lo = (b[8 + j] & 15) | (int)((qh >> j) & 1) << 4;
                int hi = (b[8 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
                o[j] = d * (float)lo + m;
                o[j + 16] = d * (float)hi + m;
            }
            break;
        }
        case GGML_Q8_0: {
            const float d = f16_to_f32(b);
            for (int j = 0; j < 32; j++) o[j] = (float)(int8_t)b[2 + j] * d;
            break;
        }
        case GGML_Q4_K:
        case GGML_Q5_K: {
            float scale[8], off[8];
            k_scale_min(b, scale, off);
            const uint8_t *qh = b + 16, *qs = b + (type == GGML_Q4_K ? 16 : 48);
            for (int s = 0; s < 8; s++)
                for (int l = 0; l < 32; l++) {
                    int q = (s & 1) ? qs[(s / 2) * 32 + l] >> 4 : qs[(s / 2) * 32 + l] & 15;
                    if (type == GGML_Q5_K) q |= ((qh[l] >> s) & 1) << 4;
                    o[s * 32 + l] = scale[s] * (float)q - off[s];
                }
            break;
        }
        default: { /* GGML_Q6_K */
            const float d = f16_to_f32(b + 208);
            float scale[16];
            for (int s = 0; s < 16; s++) scale[s] = d * (float)(int8_t)b[192 + s];
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < 4; j++)
                    for (int l = 0; l < 32; l++) {
                        int ql = b[h * 64 + (j & 1) * 32 + l];
                        int q = ((j < 2 ? ql : ql >> 4) & 15) |
                                ((b[128 + h * 32 + l] >> (2 * j)) & 3) << 4;
                        int i = h * 128 + j * 32 + l;
                        o[i] = scale[i / 16] * (float)(q - 32);
                    }
            break;
        }
        }
        b += TYPES[type].block_bytes;
        o += TYPES[type].block_weights;
    }
}

/* acc[r][o][l] += sum over i = l (mod VL) of w[o][i] * x[r][i], i ascending; see ggml_f32.c. */
static inline __attribute__((always_inline)) void tile(const int R, const float *x, int64_t ldx,
                                                       const float *w, int64_t ldw, int64_t kn,
                                                       float *acc, int first, int last, float *y,
                                                       int64_t ldy, int accumulate, int nout) {
    float a[TR][TO][VL];
    for (int r = 0; r < R; r++)
        for (int o = 0; o < TO; o++)
            for (int l = 0; l < VL; l++) a[r][o][l] = first ? 0.0f : acc[(r * TO + o) * VL + l];
    for (int64_t i = 0; i < kn; i += VL)
        for (int r = 0; r < R; r++)
            for (int o = 0; o < TO; o++)
                for (int l = 0; l < VL; l++)
                    a[r][o][l] = a[r][o][l] + w[o * ldw + i + l] * x[r * ldx + i + l];
    if (!last) {
        for (int r = 0; r < R; r++)
            for (int o = 0; o < TO; o++)
                for (int l = 0; l < VL; l++) acc[(r * TO + o) * VL + l] = a[r][o][l];
        return;
    }
    for (int r = 0; r < R; r++)
        for (int o = 0; o < nout; o++) {
            const float *v = a[r][o]; /* the tree of the SIMD paths: l + l+4, then +2, +1 */
            float s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
            float *out = y + r * ldy + o;
            *out = accumulate ? *out + s : s;
        }
}
