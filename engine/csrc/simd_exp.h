/* e^x on eight fp32 lanes (AVX2 + FMA), shared by the C kernels under engine/.
 *
 * x is clamped to [-87, 87] so that 2^n stays a normal float; x = (n + f) / log2(e) with
 * n = floor, and e^(f ln 2) is its degree-7 Taylor polynomial: relative error ~1e-7. The paged
 * attention kernel's scalar exp_nonpos takes the same steps and constants, so a row's vector
 * and scalar tails agree. Include it only under __AVX2__ && __FMA__.
 */
#ifndef RADIXGATE_SIMD_EXP_H
#define RADIXGATE_SIMD_EXP_H

#include <immintrin.h>

static inline __m256 rg_exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(87.0f));
    __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.4426950408889634f));
    __m256 fi = _mm256_floor_ps(t);
    __m256 y = _mm256_mul_ps(_mm256_sub_ps(t, fi), _mm256_set1_ps(0.6931471805599453f));
    __m256 p = _mm256_set1_ps(1.9841270e-4f);
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.3888889e-3f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(8.3333333e-3f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(4.1666667e-2f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.6666667e-1f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvttps_epi32(fi), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

#endif
