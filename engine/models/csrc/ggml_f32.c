/* The fp32 path over a GGUF's quantised codes, read in ggml's own block layout as the
 * memory-mapped file holds them (read-only, any alignment): no dense copy of a weight is kept.
 * The contract: docs/ggml_kernels.md; the wrapper and its checks: engine/models/ggml_f32.py.
 *
 * dequantize_rows: out row r = W's row ids[r] (rows 0.. without ids) in fp32, the bits of
 * gguf's dequantiser (engine.models.kquant.dequantize_ggml). Its fp32 operations, in order,
 * with d, m, dmin the block's f16 fields and q the unsigned code:
 *   Q4_0 d * (q - 8)        Q5_0 d * (q - 16)       Q8_0 q * d (q signed)
 *   Q4_1, Q5_1 (d * q) + m
 *   Q4_K, Q5_K (d * sc) * q - (dmin * m)  (sc, m: the 32-weight sub-block's 6-bit scale, min)
 *   Q6_K (d * sc) * (q - 32)  (sc: the 16-weight sub-block's int8 scale)
 * q - 8, q - 16, q - 32 are exact in any type; every * and + / - rounds once (-std=c11 keeps
 * gcc from contracting C expressions). FMA_EXACT: where the product is exact in fp32, the SIMD
 * paths fuse it with the add: (d * sc) * q - (dmin * m) as fma(d * sc, q, -(dmin * m)) and
 * (d * q) + m as fma(d, q, m), the same bits: the products are exact in fp32. d * sc has at
 * most 17 significant bits (an f16's 11 times a 6-bit integer), times a code of at most 5 bits
 * 22 (d * q: 16), within fp32's 24, and no f16 scale is small enough to reach fp32's
 * subnormals; so the fma rounds the same exact sum once, and x - y is by definition x + (-y),
 * signed zeros included. (Not so for d * (q - 8) as fma(d, q, -8d): at q = 8 it gives +0 where
 * gguf gives -0 for d < 0.)
 *
 * matmul: y[r, o] (+)= sum_i x[r, i] * w[o, i] with w exactly those weights. The order of a
 * sum is fixed by the build alone: lane l of VL (16 for AVX-512, 8 otherwise) accumulates the
 * products of i = l (mod VL) in ascending i, from +0.0, one FMA each (mul then add in the
 * portable build); then the lanes are added by a fixed tree (l + l+VL/2, ..., l + l+1), and
 * with `accumulate` the sum is added to y once. Each (row, output) is computed whole by one
 * thread, with its lane sums kept in registers or saved unchanged between chunks of k, so its
 * bits do not depend on the other rows of the call, on the chunking, the tiling or the
 * threads: the fp32 path is batch-invariant. Different builds (AVX-512 / AVX2 / portable)
 * split the lanes differently and may differ from each other in the last bits.
 *
 * How: a decode's 1-4 rows (SIMD builds) take the fused kernel: the codes stream from memory
 * once, prefetched, a few outputs at a time, each block dequantised into registers and
 * multiplied into every row's accumulators straight away. More rows take buffers: a panel of P
 * outputs is dequantised (a chunk of kc weights of each) into a thread-local fp32 buffer, and a
 * register tile of TR rows x TO outputs runs over it for every row, each FMA taking a vector of
 * weights and a vector of x along k. Up to 16 rows the panels are small and stay in L1; beyond,
 * they are dozens of outputs that stay in L2 while every row block passes over them. The
 * dequantisers give the weights in vectors in ascending order, so the fused kernel and the
 * buffers see the same weights in the same order: the same bits.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum {
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3,
    GGML_Q5_0 = 6,
    GGML_Q5_1 = 7,
    GGML_Q8_0 = 8,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    NUM_TYPES = 15
};

typedef struct {
    int block_weights, block_bytes; /* 0: not a type this kernel reads */
} TypeInfo;

/* ggml-common.h's block sizes, by ggml type id. */
static const TypeInfo TYPES[NUM_TYPES] = {
    [GGML_Q4_0] = {32, 18},  [GGML_Q4_1] = {32, 20},  [GGML_Q5_0] = {32, 22},
    [GGML_Q5_1] = {32, 24},  [GGML_Q8_0] = {32, 34},  [GGML_Q4_K] = {256, 144},
    [GGML_Q5_K] = {256, 176}, [GGML_Q6_K] = {256, 210},
};

static int known_type(int type) {
    return type >= 0 && type < NUM_TYPES && TYPES[type].block_weights != 0;
}

#if defined(__F16C__)
#include <immintrin.h>
#endif

/* The little-endian f16 at p as fp32 (exact: every f16 is an fp32). */
static inline float f16_to_f32(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact */
        float f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    if (e == 0x1f) bits = sign | 0x7f800000u | m << 13 | (m ? 0x00400000u : 0); /* quiet, as F16C */
    else bits = sign | (e + 112) << 23 | m << 13;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A Q4_K/Q5_K super-block's 6-bit sub-block scales sc[0..7] (bytes 0-7 of sm) and mins
 * m[0..7] (bytes 8-15), unpacked from its 12 bytes as gguf's get_scale_min does, four at a time
 * in 32-bit words (ggml's own trick; little-endian). */
static inline void k_sc_m(const uint8_t *b, uint8_t sm[16]) {
    uint32_t u[4];
    memcpy(u, b + 4, 12);
    const uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
    u[3] = ((u[2] >> 4) & four) | ((u[1] >> 6) & two) << 4; /* m[4..7] */
    const uint32_t m_low = u[1] & six;                       /* m[0..3] */
    u[1] = (u[2] & four) | ((u[0] >> 6) & two) << 4;         /* sc[4..7] */
    u[2] = m_low;
    u[0] &= six; /* sc[0..3] */
    memcpy(sm, u, 16);
}

/* The sub-block scales d * sc[s] and offsets dmin * m[s] (s < 8), each one fp32 product as
 * gguf forms them. */
static inline void k_scale_min(const uint8_t *b, float scale[8], float off[8]) {
    const float d = f16_to_f32(b), dmin = f16_to_f32(b + 2);
    uint8_t sm[16];
    k_sc_m(b, sm);
    for (int j = 0; j < 8; j++) {
        scale[j] = d * (float)sm[j];
        off[j] = dmin * (float)sm[8 + j];
    }
}

#if defined(__AVX512F__) && defined(__FMA__) && defined(__F16C__)
#include "ggml_f32_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "ggml_f32_avx2.h"
#else
#include "ggml_f32_scalar.h"
#endif

#ifdef FUSED_ROWS
/* The SIMD paths give a block's weights part by part (blk_setup once a block, then blk_part for
 * each PART_W(type) weights, in ascending order); both the dequantiser here and the fused kernel
 * below take them from there, so the matmul's weights are the dequantiser's bits. */
#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE void deq_blocks_of(const int type, const uint8_t *b, int64_t nb, float *o) {
    const int bw = TYPES[type].block_weights, bb = TYPES[type].block_bytes, pw = PART_W(type);
    for (; nb > 0; nb--, b += bb, o += bw) {
        BState st;
        blk_setup(type, b, &st);
        for (int p = 0; p < bw / pw; p++) {
            vec w[4];
            blk_part(type, b, &st, p, w);
            for (int v = 0; v < pw / VL; v++) VSTOREU(o + p * pw + v * VL, w[v]);
        }
    }
}

#define EACH_TYPE(M) M(GGML_Q4_0) M(GGML_Q4_1) M(GGML_Q5_0) M(GGML_Q5_1) M(GGML_Q8_0) \
    M(GGML_Q4_K) M(GGML_Q5_K) M(GGML_Q6_K)

static void deq_blocks(int type, const uint8_t *b, int64_t nb, float *o) {
    switch (type) {
#define DEQ_CASE(T) case T: deq_blocks_of(T, b, nb, o); break;
        EACH_TYPE(DEQ_CASE)
#undef DEQ_CASE
    default: break;
    }
}
#endif

/* ---- dequantize_rows ------------------------------------------------------------------- */

/* Weights a call needs before its rows are split over threads: one decode token's row costs
 * less than waking the team. */
#define PARALLEL_WEIGHTS (1 << 16)

static void dequantize_rows_run(int type, const uint8_t *w, int64_t k, const int64_t *ids,
                                int64_t num_rows, float *out, int num_threads) {
    const int64_t nb = k / TYPES[type].block_weights, row_bytes = nb * TYPES[type].block_bytes;
#pragma omp parallel for schedule(static) num_threads(num_threads) \
    if (num_rows * k >= PARALLEL_WEIGHTS && num_rows > 1)
    for (int64_t r = 0; r < num_rows; r++)
        deq_blocks(type, w + (ids ? ids[r] : r) * row_bytes, nb, out + r * k);
}

/* ---- matmul -------------------------------------------------------------------------------- */

typedef struct {
    int type;
    const uint8_t *w;
    int64_t n, k, row_bytes;
    const float *x;
    int64_t rows;
    float *y;
    int64_t ldy;
    int accumulate;
} MatMul;

/* Up to FUSED_MAX_ROWS rows (SIMD builds), the fused kernel; up to FEW_ROWS, small buffered
 * panels; beyond, panels for many rows (see the header comment). Measured on Zen 5 (AVX-512
 * and AVX2 builds) with Q4_K rows of 1536: the fused kernel's rereading of the codes for each
 * group of 4 rows costs more than the buffer's stores from 5 rows on. */
#define FUSED_MAX_ROWS 4
#define FEW_ROWS 16
#define FEW_PANEL_BYTES (36 << 10) /* a few-rows panel, in L1 beside the rows' chunk of x */
#define MANY_PANEL_TILES 8         /* outputs of a many-rows panel: 8 tiles */
#define MANY_KC 1536               /* weights of a chunk of k for many rows (a multiple of 256) */
#define ROW_BLOCK 256              /* rows that pass over a many-rows panel together */
/* Prefetching W: how far ahead of its reads a thread asks for the codes (the buffered path:
 * PREFETCH_ROWS rows of W; the fused one: PREFETCH_BYTES, by address while FO rows of W fit in
 * LINEAR_BYTES). Measured single-threaded on Zen 5: 8 KB ahead streamed 1.5-2.5x faster than
 * no prefetch or 4 KB ahead, 16 KB no faster. */
#define PREFETCH_ROWS 16
#define PREFETCH_BYTES 8192
#define LINEAR_BYTES 16384

typedef struct {
    int64_t panel, kc, row_block; /* outputs a panel (a multiple of TO), chunk of k, rows */
} Plan;

static Plan plan(const MatMul *a) {
    Plan p;
    const int64_t bw = TYPES[a->type].block_weights;
    int64_t most;
    if (a->rows <= FEW_ROWS) {
        p.panel = TO;
        most = FEW_PANEL_BYTES / (TO * (int64_t)sizeof(float));
        p.row_block = a->rows;
    } else {
        p.panel = MANY_PANEL_TILES * TO;
        most = MANY_KC;
        p.row_block = ROW_BLOCK;
    }
    /* Chunks of near-equal size (1536 in two of 768, not 1024 + 512), whole blocks each. */
    const int64_t blocks = a->k / bw, most_blocks = most / bw > 0 ? most / bw : 1;
    const int64_t chunks = (blocks + most_blocks - 1) / most_blocks;
    p.kc = (blocks + chunks - 1) / chunks * bw;
    return p;
}

/* One tile over one chunk, R rows as a constant so that the accumulators stay in registers. */
static void tile_rows(int R, const float *x, int64_t ldx, const float *w, int64_t ldw, int64_t kn,
                      float *acc, int first, int last, float *y, int64_t ldy, int accumulate,
                      int nout) {
    _Static_assert(TR == 4, "tile_rows has a case for each row count 1..TR");
    switch (R) {
    case 1: tile(1, x, ldx, w, ldw, kn, acc, first, last, y, ldy, accumulate, nout); break;
    case 2: tile(2, x, ldx, w, ldw, kn, acc, first, last, y, ldy, accumulate, nout); break;
    case 3: tile(3, x, ldx, w, ldw, kn, acc, first, last, y, ldy, accumulate, nout); break;
    default: tile(TR, x, ldx, w, ldw, kn, acc, first, last, y, ldy, accumulate, nout); break;
    }
}

/* Buffers a thread keeps between calls (OpenMP's threads persist): a fresh 300 KB allocation
 * a call would be mapped and faulted in anew each time. */
static _Thread_local float *tls_buf;
static _Thread_local size_t tls_floats;

static float *thread_buffer(size_t floats) {
    if (floats > tls_floats) {
        free(tls_buf);
        size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
        tls_buf = aligned_alloc(64, bytes);
        tls_floats = tls_buf ? floats : 0;
    }
    return tls_buf;
}

/* Outputs [o0, o0 + panel) for rows [r0, r1): wbuf holds panel x kc weights, acc the lane sums
 * of every (row tile, output tile) between chunks. */
static void run_panel(const MatMul *a, const Plan *p, int64_t o0, int64_t r0, int64_t r1,
                      float *wbuf, float *acc) {
    const int type = a->type;
    const int64_t bw = TYPES[type].block_weights, bb = TYPES[type].block_bytes;
    const int64_t valid = a->n - o0 < p->panel ? a->n - o0 : p->panel;
    const int64_t tiles = (valid + TO - 1) / TO;
    /* A last tile's missing outputs are zero weights, computed and never written. */
    memset(wbuf + valid * p->kc, 0, (size_t)((tiles * TO - valid) * p->kc) * sizeof(float));
    for (int64_t kb = 0; kb < a->k; kb += p->kc) {
        const int64_t kn = a->k - kb < p->kc ? a->k - kb : p->kc;
        const int first = kb == 0, last = kb + kn == a->k;
        const int64_t span = kn / bw * bb; /* bytes of a row's chunk */
        for (int64_t o = 0; o < valid; o++) {
            const uint8_t *src = a->w + (o0 + o) * a->row_bytes + kb / bw * bb;
            /* The codes stream from memory once: ask for a later row's now, so that the loads
             * overlap the arithmetic (one thread's misses alone do not fill the bandwidth). */
            if (o0 + o + PREFETCH_ROWS < a->n)
                for (int64_t off = 0; off < span; off += 64)
                    __builtin_prefetch(src + PREFETCH_ROWS * a->row_bytes + off);
            deq_blocks(type, src, kn / bw, wbuf + o * p->kc);
        }
        for (int64_t r = r0; r < r1; r += TR) {
            const int R = r1 - r < TR ? (int)(r1 - r) : TR;
            for (int64_t t = 0; t < tiles; t++) {
                const int nout = valid - t * TO < TO ? (int)(valid - t * TO) : TO;
                float *tacc = acc + (((r - r0) / TR) * tiles + t) * (TR * TO * VL);
                tile_rows(R, a->x + r * a->k + kb, a->k, wbuf + t * TO * p->kc, p->kc, kn, tacc,
                          first, last, a->y + r * a->ldy + o0 + t * TO, a->ldy, a->accumulate,
                          nout);
            }
        }
    }
}

#ifdef FUSED_ROWS
/* Few rows, fused: FO outputs at once, their blocks dequantised part by part into registers and
 * multiplied into R rows' accumulators straight away (no buffer: a store a vector was a third
 * of the time). The FO outputs' parts interleave, so their FO x R accumulator chains overlap.
 * Lane sums as in tile(), so the bits are the buffered path's. */
_Static_assert(FUSED_O(1) <= 8 && FUSED_O(2) <= 8, "fused_of keeps up to 8 outputs");

static ALWAYS_INLINE void fused_of(const int type, const int R, const int FO, const MatMul *a,
                                   int64_t o0, int64_t r0) {
    const int bw = TYPES[type].block_weights, bb = TYPES[type].block_bytes, pw = PART_W(type);
    const int64_t nb = a->k / bw, k = a->k;
    const uint8_t *wrow[8];
    for (int j = 0; j < FO; j++) /* outputs past n repeat the last one, never written */
        wrow[j] = a->w + (o0 + j < a->n ? o0 + j : a->n - 1) * a->row_bytes;
    /* Prefetch: a thread's demand misses alone do not fill the memory bandwidth. Each step (a
     * block of each of the FO rows) asks for what it will read about PREFETCH_BYTES later, at
     * the pace it reads. Short rows (FO of them within LINEAR_BYTES) are one run of bytes read
     * nearly in order: it is swept in address order, a line at a time (DRAM and the hardware
     * prefetcher stream it best; the next FO rows are the next chunk of a static schedule, this
     * thread's own). Long rows are FO streams, each asked for `ahead` blocks further on (in the
     * next FO rows near the end). */
    const int linear = FO * a->row_bytes <= LINEAR_BYTES;
    const uint8_t *sweep = a->w + o0 * a->row_bytes + PREFETCH_BYTES;
    const uint8_t *const sweep_end = a->w + a->n * a->row_bytes;
    const int64_t ahead = (PREFETCH_BYTES + FO * bb - 1) / (FO * bb);
    int64_t pf_row = o0 + ahead / nb * FO, pf_blk = ahead % nb; /* `ahead` steps on */
    vec acc[FUSED_ROWS][8];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < FO; j++) acc[r][j] = VZERO();
    const float *x = a->x + r0 * k;
    for (int64_t blk = 0; blk < nb; blk++) {
        if (linear) {
            const uint8_t *target = a->w + o0 * a->row_bytes + PREFETCH_BYTES + (blk + 1) * FO * bb;
            for (; sweep < target && sweep < sweep_end; sweep += 64) __builtin_prefetch(sweep);
        } else {
            if (pf_row + FO <= a->n) {
                const uint8_t *next = a->w + pf_row * a->row_bytes + pf_blk * bb;
                for (int j = 0; j < FO; j++, next += a->row_bytes)
                    for (int64_t off = 0; off < bb; off += 64) __builtin_prefetch(next + off);
            }
            if (++pf_blk == nb) pf_blk = 0, pf_row += FO;
        }
        BState st[8];
        for (int j = 0; j < FO; j++) blk_setup(type, wrow[j] + blk * bb, &st[j]);
        for (int p = 0; p < bw / pw; p++) {
            const float *xp = x + blk * bw + p * pw;
            for (int j = 0; j < FO; j++) {
                vec w[4];
                blk_part(type, wrow[j] + blk * bb, &st[j], p, w);
                for (int v = 0; v < pw / VL; v++)
                    for (int r = 0; r < R; r++)
                        acc[r][j] = VFMA(w[v], VLOADU(xp + r * k + v * VL), acc[r][j]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < FO && o0 + j < a->n; j++) {
            const float sum = HSUM(acc[r][j]);
            float *out = a->y + (r0 + r) * a->ldy + o0 + j;
            *out = a->accumulate ? *out + sum : sum;
        }
}

static void fused(const MatMul *a, int R, int64_t o0, int64_t r0) {
    _Static_assert(FUSED_ROWS == 4, "fused has a case for each row count 1..FUSED_ROWS");
    switch (a->type * 8 + R) {
#define FUSED_CASE(T)                                                   \
    case T * 8 + 1: fused_of(T, 1, FUSED_O(1), a, o0, r0); break;       \
    case T * 8 + 2: fused_of(T, 2, FUSED_O(2), a, o0, r0); break;       \
    case T * 8 + 3: fused_of(T, 3, FUSED_O(3), a, o0, r0); break;       \
    case T * 8 + 4: fused_of(T, 4, FUSED_O(4), a, o0, r0); break;
        EACH_TYPE(FUSED_CASE)
#undef FUSED_CASE
    default: break;
    }
}

static void fused_run(const MatMul *a, int num_threads) {
    /* Row groups of near-equal size (5 rows: 3 + 2), each dequantising the weights again; of
     * 2 rows or more when the call has 2 or more, so that all take FUSED_O(2) outputs at once
     * (FUSED_O(1) only for a call of 1 row). */
    const int64_t groups = (a->rows + FUSED_ROWS - 1) / FUSED_ROWS;
    const int64_t fo = a->rows == 1 ? FUSED_O(1) : FUSED_O(2);
    const int64_t chunks = (a->n + fo - 1) / fo;
    int threads = num_threads;
    if (threads > chunks) threads = (int)chunks;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t c = 0; c < chunks; c++)
        for (int64_t g = 0, r0 = 0; g < groups; g++) {
            const int R = (int)((a->rows - r0 + (groups - g) - 1) / (groups - g));
            fused(a, R, c * fo, r0);
            r0 += R;
        }
}
#endif

static int matmul_run(const MatMul *a, int num_threads) {
#ifdef FUSED_ROWS
    if (a->rows <= FUSED_MAX_ROWS) {
        fused_run(a, num_threads);
        return 0;
    }
#endif
    const Plan p = plan(a);
    const int64_t panels = (a->n + p.panel - 1) / p.panel;
    const int64_t blocks = (a->rows + p.row_block - 1) / p.row_block;
    /* Row blocks of near-equal size, each a multiple of TR but the last. */
    const int64_t per_block = ((a->rows + blocks - 1) / blocks + TR - 1) / TR * TR;
    const int64_t tasks = panels * blocks;
    const int64_t row_tiles = (per_block + TR - 1) / TR;
    const size_t wfloats = (size_t)(p.panel * p.kc);
    const size_t afloats = p.kc < a->k ? (size_t)(row_tiles * (p.panel / TO) * TR * TO * VL) : 0;
    int threads = num_threads;
    if (threads > tasks) threads = (int)tasks;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *buf = thread_buffer(wfloats + afloats);
        if (!buf) failed = 1;
        /* Panels of few-rows calls go to threads in contiguous runs, so each streams its part of
         * W in order. */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            if (!buf) continue;
            const int64_t panel = t / blocks, blk = t % blocks;
            const int64_t r0 = blk * per_block;
            const int64_t r1 = r0 + per_block < a->rows ? r0 + per_block : a->rows;
            if (r0 < r1) run_panel(a, &p, panel * p.panel, r0, r1, buf, buf + wfloats);
        }
    }
    return failed ? -1 : 0;
}

/* ---- Python ------------------------------------------------------------------------------ */

static int check_type_k(int type, long long k) {
    if (!known_type(type)) {
        PyErr_Format(PyExc_ValueError, "ggml type %d has no fp32 codes kernel", type);
        return -1;
    }
    if (k <= 0 || k % TYPES[type].block_weights != 0) {
        PyErr_Format(PyExc_ValueError, "k = %lld is not a positive multiple of the %d weights "
                     "of a block of ggml type %d", k, TYPES[type].block_weights, type);
        return -1;
    }
    return 0;
}

static PyObject *py_dequantize_rows(PyObject *self, PyObject *args) {
    (void)self;
    int type, num_threads;
    unsigned long long w, ids, out;
    long long k, num_rows;
    if (!PyArg_ParseTuple(args, "iKLKLKi", &type, &w, &k, &ids, &num_rows, &out, &num_threads))
        return NULL;
    if (check_type_k(type, k) < 0) return NULL;
    if (num_rows < 0 || num_threads <= 0) {
        PyErr_SetString(PyExc_ValueError, "dequantize_rows: num_rows < 0 or num_threads <= 0");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    dequantize_rows_run(type, (const uint8_t *)w, k, (const int64_t *)ids, num_rows, (float *)out,
                        num_threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_matmul(PyObject *self, PyObject *args) {
    (void)self;
    int type, accumulate, num_threads;
    unsigned long long w, x, y;
    long long n, k, rows, ldy;
    if (!PyArg_ParseTuple(args, "iKLLKLKLpi", &type, &w, &n, &k, &x, &rows, &y, &ldy, &accumulate,
                          &num_threads))
        return NULL;
    if (check_type_k(type, k) < 0) return NULL;
    if (n < 0 || rows < 0 || ldy < n || num_threads <= 0) {
        PyErr_SetString(PyExc_ValueError, "matmul: n < 0, rows < 0, ldy < n or num_threads <= 0");
        return NULL;
    }
    if (n == 0 || rows == 0) Py_RETURN_NONE;
    MatMul a = {type, (const uint8_t *)w, n, k, k / TYPES[type].block_weights *
                TYPES[type].block_bytes, (const float *)x, rows, (float *)y, ldy, accumulate};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = matmul_run(&a, num_threads);
    Py_END_ALLOW_THREADS
    if (rc < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_simd(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(GF_SIMD);
}

static PyMethodDef methods[] = {
    {"dequantize_rows", py_dequantize_rows, METH_VARARGS,
     "dequantize_rows(type_id, w, k, row_ids_or_0, num_rows, out_f32, num_threads): out row r "
     "= fp32 row row_ids[r] (int64; rows 0.. with 0) of W's ggml blocks, gguf's bits"},
    {"matmul", py_matmul, METH_VARARGS,
     "matmul(type_id, w, n, k, x_f32, rows, y, ldy, accumulate, num_threads): "
     "y[r * ldy + o] (+)= sum_i x[r, i] * w[o, i], each sum in one fixed order"},
    {"simd", py_simd, METH_NOARGS, "the instruction set the kernel was built for"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ggml_f32", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ggml_f32(void) { return PyModule_Create(&module); }
