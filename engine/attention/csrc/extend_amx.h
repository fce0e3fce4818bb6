/* AMX-BF16 micro-block of the extend attention kernel (extend_cpu.c) for a bf16 pool, on Xeons
 * since Sapphire Rapids: both products on the tile unit, the online softmax on AVX-512 as in
 * extend_avx512.h (rows in lanes).
 *
 * Scores come out transposed, s^T (16 keys x 16 rows) = K (16 keys x 32 dims) . q^T pairs: the
 * tile's K rows copied contiguous (kc) are the A operand, the item's q^T pairs (qtb, already in
 * the dot-product layout) the B operand, so s^T lands in the lanes layout the softmax reads.
 * The output too, out^T (16 dims x 16 rows) = V^T (16 dims x 32 positions) . weight pairs: V^T
 * (vt) is the tile's V pairs (vp) transposed once for all the item's rows, the weights are
 * ex_pack_p's pairs, and out^T adds into acc^T. Both round as the AVX512-BF16 path does (q and
 * the weights to bf16, sums in fp32).
 *
 * Linux hands out the tile registers on request (arch_prctl ARCH_REQ_XCOMP_PERM); where it
 * refuses, the kernel takes the AVX512-BF16 path. Included only with __AMX_TILE__ and
 * __AMX_BF16__ after extend_avx512.h's bf16 part.
 */
#ifndef RADIXGATE_EXTEND_AMX_H
#define RADIXGATE_EXTEND_AMX_H

#include <sys/syscall.h>
#include <unistd.h>

#define AMX_REQ_XCOMP_PERM 0x1023 /* arch_prctl: ask for an XSAVE feature */
#define AMX_XTILEDATA 18          /* the tile data feature */

/* Whether this process may use the tile registers (asks Linux; a no-op once granted). */
static int amx_permitted(void) {
    return syscall(SYS_arch_prctl, AMX_REQ_XCOMP_PERM, AMX_XTILEDATA) == 0;
}

typedef struct __attribute__((packed)) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} AmxConfig;

/* Tiles 0-5 as 16 rows of 64 bytes: 0-3 accumulators, 4 the A operand, 5 the B operand. The
 * configuration is per thread. */
static void amx_configure(void) {
    AmxConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 6; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}

/* The tile's operands for every row of the item: kc, its n K rows contiguous (zero rows to KT),
 * and vt[d][jp] = vp[jp][d] (vp packed by ex_pack_v, zero pairs to KT / 2). head_dim is a
 * multiple of 32. */
static void ex_pack_amx(const Item *it, int64_t d_len, const uint16_t *const *k, int n) {
    for (int j = 0; j < KT; j++) {
        if (j < n)
            memcpy(it->kc + j * d_len, k[j], (size_t)d_len * sizeof(uint16_t));
        else
            memset(it->kc + j * d_len, 0, (size_t)d_len * sizeof(uint16_t));
    }
    for (int jp = (n + 1) / 2; jp < KT / 2; jp++)
        memset(it->vp + jp * d_len, 0, (size_t)d_len * sizeof(uint32_t));
    for (int jb = 0; jb < KT / 2; jb += 16)
        for (int64_t db = 0; db < d_len; db += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(it->vp + (jb + i) * d_len + db);
            rg_transpose16(r);
            for (int i = 0; i < 16; i++)
                _mm512_storeu_si512(it->vt + (db + i) * (KT / 2) + jb, r[i]);
        }
}

/* Vectors v0 .. v0 + nv - 1 of the item through the tile of n keys from p0 (ex_pack_amx done). */
static void micro_block_amx(const Item *it, int64_t d_len, int64_t v0, int nv, int64_t p0,
                            int n, int masked) {
    const int64_t qt_bytes = it->stride * (int64_t)sizeof(uint32_t);
    const int64_t kc_bytes = d_len * (int64_t)sizeof(uint16_t);
    const int64_t s_bytes = MB * LANES * (int64_t)sizeof(float);
    __m512 corr[MB];
    for (int u = 0; u < nv; u++) {
        const uint32_t *qb = it->qtb + (v0 + u) * LANES;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t kk = 0; kk < d_len / 32; kk++) {
            _tile_loadd(5, qb + kk * 16 * it->stride, qt_bytes);
            _tile_loadd(4, it->kc + kk * 32, kc_bytes);
            _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(4, it->kc + 16 * d_len + kk * 32, kc_bytes);
            _tile_dpbf16ps(1, 4, 5);
            _tile_loadd(4, it->kc + 32 * d_len + kk * 32, kc_bytes);
            _tile_dpbf16ps(2, 4, 5);
            _tile_loadd(4, it->kc + 48 * d_len + kk * 32, kc_bytes);
            _tile_dpbf16ps(3, 4, 5);
        }
        float *s = it->s + u * LANES;
        _tile_stored(0, s, s_bytes);
        _tile_stored(1, s + 16 * MB * LANES, s_bytes);
        _tile_stored(2, s + 32 * MB * LANES, s_bytes);
        _tile_stored(3, s + 48 * MB * LANES, s_bytes);
        __m512 top = _mm512_load_ps(it->m + (v0 + u) * LANES); /* ex_softmax's, unmasked */
        for (int j = 0; j < n && !masked; j++)
            top = _mm512_max_ps(top, _mm512_load_ps(s + j * MB * LANES));
        corr[u] = ex_softmax(it, v0, u, p0, n, masked, 1, top);
    }
    int key_steps = (n + 31) / 32;
    ex_pack_p(it, nv, n, key_steps * 16);
    const int64_t vt_bytes = KT / 2 * (int64_t)sizeof(uint32_t);
    const int64_t sb_bytes = MB * LANES * (int64_t)sizeof(uint32_t);
    for (int u = 0; u < nv; u++) {
        float *acc = it->acc + (v0 + u) * LANES;
        for (int64_t d0 = 0; d0 < d_len; d0 += 64) {
            int64_t blocks = (d_len - d0) / 16 < 4 ? (d_len - d0) / 16 : 4;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int kk = 0; kk < key_steps; kk++) {
                const uint32_t *vt = it->vt + d0 * (KT / 2) + kk * 16;
                _tile_loadd(5, it->sb + (kk * 16 * MB + u) * LANES, sb_bytes);
                _tile_loadd(4, vt, vt_bytes);
                _tile_dpbf16ps(0, 4, 5);
                _tile_loadd(4, vt + 16 * (KT / 2), vt_bytes);
                _tile_dpbf16ps(1, 4, 5);
                if (blocks > 2) {
                    _tile_loadd(4, vt + 32 * (KT / 2), vt_bytes);
                    _tile_dpbf16ps(2, 4, 5);
                }
                if (blocks > 3) {
                    _tile_loadd(4, vt + 48 * (KT / 2), vt_bytes);
                    _tile_dpbf16ps(3, 4, 5);
                }
            }
            _tile_stored(0, it->ob, 64);
            _tile_stored(1, it->ob + 256, 64);
            if (blocks > 2) _tile_stored(2, it->ob + 512, 64);
            if (blocks > 3) _tile_stored(3, it->ob + 768, 64);
            for (int64_t i = 0; i < blocks * 16; i++) {
                float *a = acc + (d0 + i) * it->stride;
                _mm512_store_ps(a, _mm512_fmadd_ps(_mm512_load_ps(a), corr[u],
                                                   _mm512_load_ps(it->ob + i * 16)));
            }
        }
    }
}

#endif
