/* SPDX-License-Identifier: MIT */
/* The int8 path for q4_0x8 and q8_0x8 (8 rows interleaved, docs/FORMAT.md), AVX-512 VNNI or AVX2
 * by the flags of the file that includes it.  A block group holds 8 rows' block b: d[0..7], then
 * 64-byte chunks whose qword i is 8 quant bytes of row i, so one broadcast of 8 activation bytes
 * meets 8 rows: per chunk one vpdpbusd on a zmm (two maddubs on ymm) for 8 rows instead of one
 * row's whole block dot.  Int32 lanes 2i, 2i + 1 hold row i's partial dots; they are converted
 * (exactly: |dot| < 2^24), scaled by d[i] dx and added into float lanes of their own, the pair
 * summed at the end.  Every token's outputs take the same operations whatever RN tokens share
 * the unpacked weights, and a group's rows do not depend on the others: an output is the same
 * whatever tokens or threads came with it. */
#ifndef COLIBRI_ROWS8_X86_H
#define COLIBRI_ROWS8_X86_H

#include <immintrin.h>
#include <string.h>

#include "../../src/ops/ops.h"

/* 8 activation bytes in every qword. */
static inline int64_t x8_bytes(const int8_t *q)
{
    int64_t v;
    memcpy(&v, q, 8);
    return v;
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)

/* One block group of 8 rows against RN tokens' block b (token t's xq + t * xs): acc[t] lanes
 * 2i, 2i + 1 += row i's dot times d[i] dx.  The unsigned operand: q4_0's nibbles (its "- 8" as
 * -8 sum(x) in the even lanes' start), q8_0's w + 128 (w ^ 0x80; -128 sum(x) back the same way). */
static inline __attribute__((always_inline)) void group_x8(int RN, int q8, const uint8_t *g, const colibri_q8_block *xb,
                                                           size_t xs, __m512 *acc)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8((char)0x80);
    __m512i u[4];
    __m512 d;
    int c, t;
    {   /* d[0..7] as f16 pairs (d0, d0, d1, d1, ...), then 16 floats */
        __m128i h = _mm_loadu_si128((const __m128i *)g);
        d = _mm512_cvtph_ps(_mm256_set_m128i(_mm_unpackhi_epi16(h, h), _mm_unpacklo_epi16(h, h)));
    }
    if (q8) {
        for (c = 0; c < 4; c++) u[c] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(g + 16 + 64 * c)), flip);
    } else {   /* chunk c: low nibbles weights 8c .. 8c + 7, high ones 8c + 16 .. */
        __m512i v0 = _mm512_loadu_si512((const void *)(g + 16)), v1 = _mm512_loadu_si512((const void *)(g + 80));
        u[0] = _mm512_and_si512(v0, m4);
        u[1] = _mm512_and_si512(v1, m4);
        u[2] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
        u[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
    }
    for (t = 0; t < RN; t++) {   /* u[k] meets activation bytes 8k .. 8k + 7 */
        const colibri_q8_block *x = xb + (size_t)t * xs;
        __m512i dot = _mm512_maskz_set1_epi32(0x5555, (q8 ? -128 : -8) * x->sum);
        for (c = 0; c < 4; c++) dot = _mm512_dpbusd_epi32(dot, u[c], _mm512_set1_epi64(x8_bytes(x->q + 8 * c)));
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(x->d)), _mm512_cvtepi32_ps(dot), acc[t]);
    }
}

/* Rows i's two lanes summed, the 8 rows' outputs stored at y. */
static inline void store_x8(float *y, __m512 acc)
{
    __m512 s = _mm512_add_ps(acc, _mm512_permute_ps(acc, 0xb1));   /* lane 2i: 2i + (2i + 1) */
    _mm256_storeu_ps(y, _mm512_castps512_ps256(_mm512_maskz_compress_ps(0x5555, s)));
}

typedef __m512 x8_acc;
#define X8_ZERO() _mm512_setzero_ps()
#define X8_RN 4

#else   /* AVX2: a chunk is two ymm, rows 0..3 and rows 4..7 */

typedef struct x8_acc { __m256 lo, hi; } x8_acc;

static inline x8_acc x8_zero(void)
{
    x8_acc a;
    a.lo = a.hi = _mm256_setzero_ps();
    return a;
}
#define X8_ZERO() x8_zero()
#define X8_RN 2

/* As AVX-512's: q4_0 nibbles unsigned, the four products' pairs summed in int16 (at most
 * 4 * 2 * 15 * 127) before one madd; q8_0 by the sign trick (|w|, w's sign on x), each maddubs
 * (at most 2 * 128 * 127) widened by its own madd. */
static inline __attribute__((always_inline)) void group_x8(int RN, int q8, const uint8_t *g, const colibri_q8_block *xb,
                                                           size_t xs, x8_acc *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i even = _mm256_setr_epi32(-1, 0, -1, 0, -1, 0, -1, 0);
    __m256i u[8];   /* q4_0: chunk c half h at u[4 h + c] low nibbles, u[4 h + 2 + c] high; q8_0: w (tiles: |w|) at u[2 c + h] */
    __m256 dlo, dhi;
    int c, h, t;
    {
        __m128i v = _mm_loadu_si128((const __m128i *)g);
        dlo = _mm256_cvtph_ps(_mm_unpacklo_epi16(v, v));
        dhi = _mm256_cvtph_ps(_mm_unpackhi_epi16(v, v));
    }
    for (c = 0; c < (q8 ? 4 : 2); c++)
        for (h = 0; h < 2; h++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(g + 16 + 64 * c + 32 * h));
            if (q8) u[2 * c + h] = RN > 1 ? _mm256_sign_epi8(v, v) : v;   /* tiles: |w| once, w's sign from L1 below */
            else {
                u[4 * h + c] = _mm256_and_si256(v, m4);
                u[4 * h + 2 + c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            }
        }
    for (t = 0; t < RN; t++) {
        const colibri_q8_block *x = xb + (size_t)t * xs;
        __m256i xv[4], dot[2];
        for (c = 0; c < 4; c++) xv[c] = _mm256_set1_epi64x(x8_bytes(x->q + 8 * c));
        for (h = 0; h < 2; h++) {
            if (q8) {
                __m256i s = _mm256_setzero_si256();
                for (c = 0; c < 4; c++) {
                    __m256i w = RN > 1 ? _mm256_loadu_si256((const __m256i *)(g + 16 + 64 * c + 32 * h)) : u[2 * c + h];
                    __m256i w_abs = RN > 1 ? u[2 * c + h] : _mm256_sign_epi8(w, w);
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(xv[c], w)), ones));
                }
                dot[h] = s;
            } else {
                __m256i p = _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u[4 * h], xv[0]), _mm256_maddubs_epi16(u[4 * h + 1], xv[1])),
                                             _mm256_add_epi16(_mm256_maddubs_epi16(u[4 * h + 2], xv[2]), _mm256_maddubs_epi16(u[4 * h + 3], xv[3])));
                dot[h] = _mm256_add_epi32(_mm256_madd_epi16(p, ones), _mm256_and_si256(_mm256_set1_epi32(-8 * x->sum), even));
            }
        }
        {
            __m256 dx = _mm256_set1_ps(x->d);
            acc[t].lo = _mm256_fmadd_ps(_mm256_mul_ps(dlo, dx), _mm256_cvtepi32_ps(dot[0]), acc[t].lo);
            acc[t].hi = _mm256_fmadd_ps(_mm256_mul_ps(dhi, dx), _mm256_cvtepi32_ps(dot[1]), acc[t].hi);
        }
    }
}

static inline void store_x8(float *y, x8_acc acc)
{
    /* hadd within 128-bit lanes: (lo0+lo1, lo2+lo3, hi0+hi1, hi2+hi3 | lo4+lo5, lo6+lo7, hi4+hi5, hi6+hi7) */
    __m256 s = _mm256_hadd_ps(acc.lo, acc.hi);
    _mm256_storeu_ps(y, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), 0xd8)));
}

#endif

/* Rows 8 g .. 8 g + 7 (their group at w) against RN tokens: y (RN tokens, `rows` apart). */
static inline __attribute__((always_inline)) void tile_x8(int RN, int q8, float *y, int32_t rows, const uint8_t *w,
                                                          const colibri_q8_block *xq, int32_t blocks)
{
    const size_t gb = q8 ? 272 : 144;
    x8_acc acc[X8_RN];
    int32_t b;
    int t;
    for (t = 0; t < RN; t++) acc[t] = X8_ZERO();
    for (b = 0; b < blocks; b++, w += gb) {   /* the group's one stream, 2 KiB ahead (1 KiB: 10-20% slower from DRAM) */
        _mm_prefetch((const char *)w + 2048, _MM_HINT_T0);
        _mm_prefetch((const char *)w + 2048 + 64, _MM_HINT_T0);
        if (q8) { _mm_prefetch((const char *)w + 2048 + 128, _MM_HINT_T0); _mm_prefetch((const char *)w + 2048 + 192, _MM_HINT_T0); }
        group_x8(RN, q8, w, xq + b, (size_t)blocks, acc);
    }
    for (t = 0; t < RN; t++) store_x8(y + (size_t)t * rows, acc[t]);
}

/* y (n, rows) = xq @ W^T, W q4_0x8 or q8_0x8 (rows % 8 == 0): each group of 8 rows against X8_RN
 * tokens at a time while it is in L1, the rest one by one. */
static inline __attribute__((always_inline)) void matmul_x8_format(int q8, float *y, const colibri_q8_block *xq, const uint8_t *w,
                                                                   int32_t n, int32_t cols, int32_t rows)
{
    size_t group_bytes = (size_t)cols / 32 * (q8 ? 272 : 144);
    int32_t g, t, blocks = cols / COLIBRI_BLOCK;
    for (g = 0; g < rows / 8; g++) {
        const uint8_t *wg = w + (size_t)g * group_bytes;
        for (t = 0; t + X8_RN <= n; t += X8_RN)
            tile_x8(X8_RN, q8, y + (size_t)t * rows + 8 * g, rows, wg, xq + (size_t)t * blocks, blocks);
        for (; t < n; t++) tile_x8(1, q8, y + (size_t)t * rows + 8 * g, rows, wg, xq + (size_t)t * blocks, blocks);
    }
}

static inline void matmul_x8_x86(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                                 int32_t n, int32_t cols, int32_t rows)
{
    if (dtype == COLIBRI_DTYPE_Q8_0X8) matmul_x8_format(1, y, xq, w, n, cols, rows);
    else matmul_x8_format(0, y, xq, w, n, cols, rows);
}

#endif
