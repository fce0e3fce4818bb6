/* bf16 <-> fp32 for the C kernels under engine/ (plain C; loops over them vectorise).
 *
 * to_bf16 rounds to nearest even, as torch's conversion does, and keeps a NaN a quiet NaN, so
 * a kernel that writes bf16 matches `tensor.to(torch.bfloat16)` bit for bit.
 */
#ifndef RADIXGATE_BF16_H
#define RADIXGATE_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t rg_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float rg_from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
