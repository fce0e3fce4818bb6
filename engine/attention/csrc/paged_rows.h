/* Where a sequence's K or V rows lie in the paged KV pool, shared by the decode kernel
 * (paged_cpu.c) and the extend kernel (extend_common.h).
 */
#ifndef RADIXGATE_PAGED_ROWS_H
#define RADIXGATE_PAGED_ROWS_H

#include <stdint.h>

/* rows[j]: the K or V row of KV head `h` at position p0 + j, j < n, of a sequence whose page
 * ids are `pages`, in one layer of the pool at `base` ((num_slots, num_kv_heads, head_dim)
 * elements of `elem` bytes). */
static inline void rg_paged_rows(const void *base, int64_t elem, int64_t page_size,
                                 int64_t num_kv_heads, int64_t head_dim, const int64_t *pages,
                                 int64_t h, int64_t p0, int n, const void **rows) {
    int64_t stride = num_kv_heads * head_dim;
    for (int j = 0; j < n;) {
        /* One division per page, not per position (64-bit division costs ~40 cycles). */
        int64_t pos = p0 + j, in_page = pos % page_size;
        int64_t run = page_size - in_page < n - j ? page_size - in_page : n - j;
        int64_t off = ((pages[pos / page_size] * page_size + in_page) * num_kv_heads + h)
                      * head_dim;
        for (int64_t i = 0; i < run; i++, j++, off += stride)
            rows[j] = (const char *)base + off * elem;
    }
}

#endif
