/* SPDX-License-Identifier: MIT */
/* The int8 path shared by the AVX2 and AVX-512 variants: each file includes this under its own
 * -m flags and hands the driver its integer block dot products. */
#ifndef COLIBRI_Q8_X86_H
#define COLIBRI_Q8_X86_H

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../arch.h"
#include "../../src/ops/quant_tables.h"
#include "kx8_x86.h"

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 32 nibbles of a q4_0 block in weight order (byte j: weight j low, weight j + 16 high), 0..15. */
static inline __m256i q4_nibbles(const uint8_t *q)
{
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0f));
}

static inline float amax8(__m256 m)
{
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* max |x| of 32 activations, 8 lanes apart. */
static inline __m256 abs_max32(const float *x, __m256 m)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 a = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x), abs_mask), _mm256_and_ps(_mm256_loadu_ps(x + 8), abs_mask));
    __m256 b = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + 16), abs_mask), _mm256_and_ps(_mm256_loadu_ps(x + 24), abs_mask));
    return _mm256_max_ps(m, _mm256_max_ps(a, b));
}

/* One block of 32 activations with the scale d (as colibri_ref_quantize_q8: the same rounding). */
static inline void quantize_block_x86(colibri_q8_block *xq, const float *x, float d)
{
    __m256i i0, i1, i2, i3, q16a, q16b, sum;
    __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    xq->d = d;
    i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));   /* rounds to nearest even */
    i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
    i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
    i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
    sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    {
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
        xq->sum = _mm_cvtsi128_si32(s);
    }
    /* the packs work within 128-bit lanes: one permute puts the bytes back in order */
    q16a = _mm256_packs_epi32(i0, i1);
    q16b = _mm256_packs_epi32(i2, i3);
    _mm256_storeu_si256((__m256i *)xq->q, _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16a, q16b),
                                                                      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* xq (n, cols / 32) = x (n, cols) in blocks of 32, as colibri_ref_quantize_q8. */
static inline void quantize_q8_x86(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    int32_t b, blocks = n * (cols / COLIBRI_BLOCK);
    for (b = 0; b < blocks; b++, x += COLIBRI_BLOCK, xq++)
        quantize_block_x86(xq, x, amax8(abs_max32(x, _mm256_setzero_ps())) / 127.0f);
}

/* The same, each 256 sharing one d (colibri_ref_quantize_q8_256). */
static inline void quantize_q8_256_x86(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    int32_t g, b, groups = n * (cols / 256);
    for (g = 0; g < groups; g++, x += 256, xq += 8) {
        __m256 m = _mm256_setzero_ps();
        float d;
        for (b = 0; b < 8; b++) m = abs_max32(x + 32 * b, m);
        d = amax8(m) / 127.0f;
        for (b = 0; b < 8; b++) quantize_block_x86(xq + b, x + 32 * b, d);
    }
}

/* A variant's integer primitive: 32 unsigned bytes times 32 signed bytes, four products summed
 * into each of 8 int32 lanes (maddubs + madd on AVX2, vpdpbusd on AVX-512 VNNI). */
typedef __m256i (*dot_us_fn)(__m256i u, __m256i s);

/* One weight block as dot_us's unsigned operand: q4_0's nibbles are unsigned already (the "- 8"
 * comes back as -8 sum(x)); q8_0 gives |w|, and block_dot moves w's sign onto x. */
static inline __m256i w_unsigned(const uint8_t *block, colibri_dtype dtype)
{
    if (dtype == COLIBRI_DTYPE_Q4_0) return q4_nibbles(block + 2);
    {
        __m256i w = _mm256_loadu_si256((const __m256i *)(block + 2));
        return _mm256_sign_epi8(w, w);
    }
}

static inline float w_scale(const uint8_t *block)
{
    uint16_t h;
    memcpy(&h, block, 2);
    return _cvtsh_ss(h);
}

/* The exact integer dot of one weight block (w_u its unsigned form) with one activation block. */
static inline __attribute__((always_inline)) __m256i block_dot(const uint8_t *block, __m256i w_u, colibri_dtype dtype,
                                                               const colibri_q8_block *xb, dot_us_fn dot_us)
{
    __m256i x = _mm256_loadu_si256((const __m256i *)xb->q);
    if (dtype == COLIBRI_DTYPE_Q8_0) return dot_us(w_u, _mm256_sign_epi8(x, _mm256_loadu_si256((const __m256i *)(block + 2))));
    return _mm256_add_epi32(dot_us(w_u, x), _mm256_setr_epi32(-8 * xb->sum, 0, 0, 0, 0, 0, 0, 0));
}

/* One row of W against one token's blocks (decode).  One row at a time: two rows sharing each x
 * block ran 12% faster on weights in cache but up to 20% slower when they stream from DRAM, as
 * the experts' do; the software prefetch keeps the stream ahead.  One accumulator, as each of a
 * tile's: an output does not depend on how many tokens came with it (nor on the thread count,
 * which splits the tokens). */
static inline __attribute__((always_inline)) float row_q8_x86(const uint8_t *w, colibri_dtype dtype, const colibri_q8_block *xb,
                                                              int32_t blocks, dot_us_fn dot_us)
{
    size_t block_bytes = dtype == COLIBRI_DTYPE_Q8_0 ? 34 : 18;
    __m256 acc = _mm256_setzero_ps();
    int32_t b;
    for (b = 0; b < blocks; b++, xb++, w += block_bytes) {
        _mm_prefetch((const char *)w + 1024, _MM_HINT_T0);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(w_scale(w) * xb->d), _mm256_cvtepi32_ps(block_dot(w, w_unsigned(w, dtype), dtype, xb, dot_us)),
                              acc);
    }
    return hsum8(acc);
}

/* An RM x RN tile of y (several tokens: prefill, an expert's group of tokens): RM rows of W
 * against RN tokens, each weight block unpacked once for RN tokens and each activation block
 * loaded once for RM rows; RM * RN accumulators.  y (RN tokens, `rows` apart) gets the tile. */
static inline __attribute__((always_inline)) void tile_q8_x86(int RM, int RN, float *y, int32_t rows, const uint8_t *w,
                                                              size_t row_bytes, colibri_dtype dtype,
                                                              const colibri_q8_block *xq, int32_t blocks, dot_us_fn dot_us)
{
    size_t block_bytes = dtype == COLIBRI_DTYPE_Q8_0 ? 34 : 18;
    __m256 acc[4][4];
    int32_t b, r, t;
    for (r = 0; r < RM; r++) for (t = 0; t < RN; t++) acc[r][t] = _mm256_setzero_ps();
    for (b = 0; b < blocks; b++) {
        __m256i w_u[4], w_s[4];
        __m256 d[4];
        for (r = 0; r < RM; r++) {
            const uint8_t *block = w + (size_t)r * row_bytes + (size_t)b * block_bytes;
            w_u[r] = w_unsigned(block, dtype);
            if (dtype == COLIBRI_DTYPE_Q8_0) w_s[r] = _mm256_loadu_si256((const __m256i *)(block + 2));
            d[r] = _mm256_set1_ps(w_scale(block));
        }
        for (t = 0; t < RN; t++) {
            const colibri_q8_block *xb = xq + (size_t)t * blocks + b;
            __m256i x = _mm256_loadu_si256((const __m256i *)xb->q);
            __m256i minus_8sum = _mm256_setr_epi32(-8 * xb->sum, 0, 0, 0, 0, 0, 0, 0);
            __m256 dx = _mm256_set1_ps(xb->d);
            for (r = 0; r < RM; r++) {
                __m256i dot = dtype == COLIBRI_DTYPE_Q8_0 ? dot_us(w_u[r], _mm256_sign_epi8(x, w_s[r]))
                                                          : _mm256_add_epi32(dot_us(w_u[r], x), minus_8sum);
                acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(d[r], dx), _mm256_cvtepi32_ps(dot), acc[r][t]);
            }
        }
    }
    for (t = 0; t < RN; t++) for (r = 0; r < RM; r++) y[(size_t)t * rows + r] = hsum8(acc[r][t]);
}

/* y (n, rows) = xq @ W^T for one block format (a constant once inlined): one token row by row;
 * several in tiles of 4 rows x RN tokens (the edges in smaller tiles). */
static inline __attribute__((always_inline)) void matmul_q8_format(int RN, float *y, const colibri_q8_block *xq, const uint8_t *w,
                                                                   colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows,
                                                                   dot_us_fn dot_us)
{
    size_t row_bytes = colibri_row_bytes(dtype, (size_t)cols);
    int32_t r, t, blocks = cols / COLIBRI_BLOCK;
    if (n == 1) {
        for (r = 0; r < rows; r++) y[r] = row_q8_x86(w + (size_t)r * row_bytes, dtype, xq, blocks, dot_us);
        return;
    }
    for (r = 0; r + 4 <= rows; r += 4) {
        for (t = 0; t + RN <= n; t += RN)
            tile_q8_x86(4, RN, y + (size_t)t * rows + r, rows, w + (size_t)r * row_bytes, row_bytes, dtype, xq + (size_t)t * blocks, blocks, dot_us);
        for (; t < n; t++)
            tile_q8_x86(4, 1, y + (size_t)t * rows + r, rows, w + (size_t)r * row_bytes, row_bytes, dtype, xq + (size_t)t * blocks, blocks, dot_us);
    }
    for (; r < rows; r++)
        for (t = 0; t < n; t++)
            tile_q8_x86(1, 1, y + (size_t)t * rows + r, rows, w + (size_t)r * row_bytes, row_bytes, dtype, xq + (size_t)t * blocks, blocks, dot_us);
}

/* ---- The int8 path's other formats: q4_k, q5_k, q6_k, q3_k, q2_k, iq4_xs, iq4_nl, mxfp4, q4_1, q5_0,
 * q5_1 (see colibri_ref_matmul_q8 for the sums), one weight block at a time.  The 32-weight ones:
 * per activation block an 8-lane integer dot, converted and added in times d * dx (q4_1's and
 * q5_1's m times dx sum(q) apart); the 256-weight ones below their own way. */

/* 32 signed weights w against the activations x: |w| unsigned, w's sign moved onto x. */
static inline __m256i dot_signed(__m256i w, __m256i x, dot_us_fn dot_us)
{
    return dot_us(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

static inline __m256i xq_load(const colibri_q8_block *xb) { return _mm256_loadu_si256((const __m256i *)xb->q); }

/* acc += dot's 8 lanes times f. */
static inline __m256 add_scaled(__m256 acc, __m256i dot, float f)
{
    return _mm256_fmadd_ps(_mm256_set1_ps(f), _mm256_cvtepi32_ps(dot), acc);
}

/* A variant's scaled integer primitive for the 256-weight formats: acc + the dot of 32 unsigned
 * weights with 32 signed activations, each int32 lane's two pairs of products times their int16
 * scales (maddubs then madd on AVX2, vpdpwssd on AVX-512 VNNI).  No pair overflows int16: |w| <= 127
 * only for iq4_xs's table values, which the activations' 127 keep at 2 * 127 * 127. */
typedef __m256i (*dot_scaled_fn)(__m256i acc, __m256i w_u, __m256i x_s, __m256i sc16);

/* A block's scales as int16 lanes, for pick_scales: the 8 of a 32-weight-scale format (q4_k's) in
 * both halves; the 16 of a 16-weight-scale one (q6_k's) as the even ones in the low half, the odd
 * ones in the high half. */
static inline __m256i scales_of8(const uint8_t *sc8) { return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc8))); }

static inline __m128i evens_then_odds(__m128i v16)
{
    return _mm_shuffle_epi8(v16, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
}

/* Activation block a's scales from those: int16 lane a of each half in all of that half's lanes
 * (weights 0..15 get the low half's, 16..31 the high half's, as maddubs pairs them). */
static inline __m256i pick_scales(__m256i scales, int a)
{
    return _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(2 * a | (2 * a + 1) << 8)));
}

enum { KQ_TOKENS = 8 };   /* the most tokens the tiles below take at once (AVX-512's 32 registers) */

/* The blocks below (256 weights each, against 8 activation blocks that share one dx: quantize_q8_256)
 * take RN <= KQ_TOKENS tokens at once (prefill, an expert's group of tokens): each weight block
 * unpacked once for all of them, token t's activation blocks xs apart from token 0's.  Per token, the block's exact
 * integer sum of scale * dot, then one float multiply-add by d dx into acc[t]; the mins' d dx sum
 * into mins[t].  Each token's arithmetic is the same whatever RN is: an output does not depend on
 * how many tokens came with it. */

/* One q4_k or q5_k block: 8 sub-blocks of 32, each a 6-bit scale and min; the mins' integer sum
 * sum(m_g sum(q_g)) from the activation blocks' sums. */
static inline __attribute__((always_inline)) void k4_block(int RN, const uint8_t *b, colibri_dtype dtype, const colibri_q8_block *xb,
                                                           size_t xs, __m256 *acc, float *mins, dot_scaled_fn dot)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const uint8_t *qs = b + (dtype == COLIBRI_DTYPE_Q4_K ? 16 : 48);
    __m256i qh = dtype == COLIBRI_DTYPE_Q5_K ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
    __m256i sum[KQ_TOKENS];
    float d = w_scale(b), dmin = w_scale(b + 2);
    uint8_t sm[16];
    int k, t;
    __m256i scales;
    k4_unpack(b + 4, sm);
    scales = scales_of8(sm);
    for (t = 0; t < RN; t++) sum[t] = _mm256_setzero_si256();
    for (k = 0; k < 4; k++) {   /* sub-blocks 2k (low nibbles) and 2k + 1 (high) */
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * k));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        __m256i s_lo = pick_scales(scales, 2 * k), s_hi = pick_scales(scales, 2 * k + 1);
        if (dtype == COLIBRI_DTYPE_Q5_K) {   /* the fifth bit: bit s of qh[j] */
            __m256i bl = _mm256_set1_epi8((char)(1 << (2 * k))), bh = _mm256_set1_epi8((char)(2 << (2 * k))), sixteen = _mm256_set1_epi8(16);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bl), bl), sixteen));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bh), bh), sixteen));
        }
        for (t = 0; t < RN; t++) {
            const colibri_q8_block *x = xb + t * xs + 2 * k;
            sum[t] = dot(dot(sum[t], lo, xq_load(x), s_lo), hi, xq_load(x + 1), s_hi);
        }
    }
    for (t = 0; t < RN; t++) {
        const colibri_q8_block *x = xb + t * xs;
        int32_t msum = 0;
        for (k = 0; k < 8; k++) msum += sm[8 + k] * x[k].sum;
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * x->d), _mm256_cvtepi32_ps(sum[t]), acc[t]);
        mins[t] += dmin * x->d * (float)msum;
    }
}

/* One q6_k block: two halves of 128, each 64 bytes of low nibbles and 32 of 2-bit pairs; per
 * activation block two int8 scales, one for each 16. */
static inline __attribute__((always_inline)) void q6_k_block(int RN, const uint8_t *b, const colibri_q8_block *xb, size_t xs,
                                                             __m256 *acc, dot_scaled_fn dot)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30), c32 = _mm256_set1_epi8(32);
    __m256i scales = _mm256_cvtepi8_epi16(evens_then_odds(_mm_loadu_si128((const __m128i *)(b + 192)))), sum[KQ_TOKENS];
    int h, g, t;
    for (t = 0; t < RN; t++) sum[t] = _mm256_setzero_si256();
    for (h = 0; h < 2; h++) {
        __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h)), l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m2));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
        for (g = 0; g < 4; g++) {
            const int a = 4 * h + g;   /* the activation block */
            __m256i w = _mm256_sub_epi8(q[g], c32), w_abs = _mm256_sign_epi8(w, w), s = pick_scales(scales, a);
            for (t = 0; t < RN; t++) sum[t] = dot(sum[t], w_abs, _mm256_sign_epi8(xq_load(xb + t * xs + a), w), s);
        }
    }
    for (t = 0; t < RN; t++) acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(w_scale(b + 208) * xb[t * xs].d), _mm256_cvtepi32_ps(sum[t]), acc[t]);
}

/* One q3_k block: two halves of 128, each 32 bytes of 2-bit quants (32 weights per shift), the
 * third bit of activation block g's weight j bit g of hmask[j] (clear: the quant less 4, -4..3);
 * per activation block two 6-bit scales less 32, one for each 16, as q6_k's. */
static inline __attribute__((always_inline)) void q3_k_block(int RN, const uint8_t *b, const colibri_q8_block *xb, size_t xs,
                                                             __m256 *acc, dot_scaled_fn dot)
{
    const __m256i m2 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    __m256i hmask = _mm256_loadu_si256((const __m256i *)b), scales, sum[KQ_TOKENS];
    uint8_t sc[16];
    int h, g, t;
    k3_unpack(b + 96, sc);
    scales = _mm256_sub_epi16(_mm256_cvtepu8_epi16(evens_then_odds(_mm_loadu_si128((const __m128i *)sc))), _mm256_set1_epi16(32));
    for (t = 0; t < RN; t++) sum[t] = _mm256_setzero_si256();
    for (h = 0; h < 2; h++) {
        __m256i qs = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * h));
        for (g = 0; g < 4; g++) {
            const int a = 4 * h + g;   /* the activation block */
            __m256i bit = _mm256_set1_epi8((char)(1 << a));
            __m256i w = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(qs, 2 * g), m2),
                                        _mm256_andnot_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit), four));
            __m256i w_abs = _mm256_sign_epi8(w, w), s = pick_scales(scales, a);
            for (t = 0; t < RN; t++) sum[t] = dot(sum[t], w_abs, _mm256_sign_epi8(xq_load(xb + t * xs + a), w), s);
        }
    }
    for (t = 0; t < RN; t++) acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(w_scale(b + 108) * xb[t * xs].d), _mm256_cvtepi32_ps(sum[t]), acc[t]);
}

/* One q2_k block: the quants as q3_k's low two bits (0..3); per 16 weights a 4-bit scale and a
 * 4-bit min, the mins' integer dot with q one more scaled dot (the mins, 16 bytes each, as its
 * unsigned operand), times -dmin dx. */
static inline __attribute__((always_inline)) void q2_k_block(int RN, const uint8_t *b, const colibri_q8_block *xb, size_t xs,
                                                             __m256 *acc, dot_scaled_fn dot)
{
    const __m256i m2 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi16(1);
    __m256i min16 = _mm256_and_si256(_mm256_srli_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)b)), 4), m4);
    __m256i scales = _mm256_cvtepu8_epi16(_mm_and_si128(evens_then_odds(_mm_loadu_si128((const __m128i *)b)), _mm_set1_epi8(0x0f)));
    __m256i sum[KQ_TOKENS], msum[KQ_TOKENS];
    int h, g, t;
    for (t = 0; t < RN; t++) sum[t] = msum[t] = _mm256_setzero_si256();
    for (h = 0; h < 2; h++) {
        __m256i qs = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * h));
        for (g = 0; g < 4; g++) {
            const int a = 4 * h + g;   /* the activation block: sub-blocks 2a, 2a + 1 */
            __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * g), m2), s = pick_scales(scales, a);
            __m256i mn = _mm256_shuffle_epi8(min16, _mm256_set_m128i(_mm_set1_epi8((char)(2 * a + 1)), _mm_set1_epi8((char)(2 * a))));
            for (t = 0; t < RN; t++) {
                __m256i x = xq_load(xb + t * xs + a);
                sum[t] = dot(sum[t], q, x, s);
                msum[t] = dot(msum[t], mn, x, one);
            }
        }
    }
    for (t = 0; t < RN; t++) {
        float dx = xb[t * xs].d;
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(w_scale(b + 80) * dx), _mm256_cvtepi32_ps(sum[t]), acc[t]);
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(-w_scale(b + 82) * dx), _mm256_cvtepi32_ps(msum[t]), acc[t]);
    }
}

/* The 32 values of a q4_0-ordered nibble group through a 16-entry table (iq4_nl's, mxfp4's). */
static inline __m256i table_nibbles(const uint8_t *q, __m256i table) { return _mm256_shuffle_epi8(table, q4_nibbles(q)); }

/* One iq4_xs block: 8 sub-blocks of 32, each a q4_0 nibble group and a 6-bit scale less 32 (low
 * nibbles in bytes 4..7, two bits each in the u16 at 2). */
static inline __attribute__((always_inline)) void iq4_xs_block(int RN, const uint8_t *b, const colibri_q8_block *xb, size_t xs,
                                                               __m256 *acc, __m256i table, dot_scaled_fn dot)
{
    __m256i sum[KQ_TOKENS];
    uint16_t high;
    int s, t;
    memcpy(&high, b + 2, 2);
    for (t = 0; t < RN; t++) sum[t] = _mm256_setzero_si256();
    for (s = 0; s < 8; s++) {
        __m256i v = table_nibbles(b + 8 + 16 * s, table), v_abs = _mm256_sign_epi8(v, v);
        __m256i sc = _mm256_set1_epi16((short)((((b[4 + s / 2] >> (s % 2 * 4)) & 0x0f) | ((high >> (2 * s)) & 3) << 4) - 32));
        for (t = 0; t < RN; t++) sum[t] = dot(sum[t], v_abs, _mm256_sign_epi8(xq_load(xb + t * xs + s), v), sc);
    }
    for (t = 0; t < RN; t++) acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(w_scale(b) * xb[t * xs].d), _mm256_cvtepi32_ps(sum[t]), acc[t]);
}

/* One iq4_nl or mxfp4 block: 32 table values, one scale. */
static inline __attribute__((always_inline)) void table_block(int RN, const uint8_t *b, colibri_dtype dtype, const colibri_q8_block *xb,
                                                              size_t xs, __m256 *acc0, __m256i table, dot_us_fn dot_us)
{
    __m256i v = table_nibbles(b + (dtype == COLIBRI_DTYPE_IQ4_NL ? 2 : 1), table);
    float d = dtype == COLIBRI_DTYPE_IQ4_NL ? w_scale(b) : colibri_e8m0_half(b[0]);
    int t;
    for (t = 0; t < RN; t++) acc0[t] = add_scaled(acc0[t], dot_signed(v, xq_load(xb + t * xs), dot_us), d * xb[t * xs].d);
}

/* 32 bits (bit j: weight j's fifth) as 32 bytes, 16 where the bit is set, else 0. */
static inline __m256i fifth_bits(const uint8_t *q)
{
    uint32_t bits;
    __m256i v;
    memcpy(&bits, q, 4);
    v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                             0x0101010101010101, 0));   /* byte j: byte j / 8 */
    v = _mm256_cmpeq_epi8(_mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi8(-1));   /* bit j % 8 */
    return _mm256_and_si256(v, _mm256_set1_epi8(16));
}

/* One q4_1, q5_0 or q5_1 block: d q + m (q5_0: d (q - 16), its "- 16" through the activations'
 * sum as q4_0's "- 8"); m dx sum(q) added in lane 0 of acc1. */
static inline __attribute__((always_inline)) void legacy_block(int RN, const uint8_t *b, colibri_dtype dtype, const colibri_q8_block *xb,
                                                               size_t xs, __m256 *acc0, __m256 *acc1, dot_us_fn dot_us)
{
    size_t at = dtype == COLIBRI_DTYPE_Q4_1 ? 4 : dtype == COLIBRI_DTYPE_Q5_0 ? 6 : 8;
    __m256i q = q4_nibbles(b + at);
    float d = w_scale(b), m = dtype == COLIBRI_DTYPE_Q5_0 ? 0.0f : w_scale(b + 2);
    int t;
    if (dtype != COLIBRI_DTYPE_Q4_1) q = _mm256_or_si256(q, fifth_bits(b + at - 4));
    for (t = 0; t < RN; t++) {
        const colibri_q8_block *x = xb + t * xs;
        __m256i dot = dot_us(q, xq_load(x));
        if (dtype == COLIBRI_DTYPE_Q5_0) dot = _mm256_add_epi32(dot, _mm256_setr_epi32(-16 * x->sum, 0, 0, 0, 0, 0, 0, 0));
        acc0[t] = add_scaled(acc0[t], dot, d * x->d);
        if (dtype != COLIBRI_DTYPE_Q5_0) acc1[t] = _mm256_add_ps(acc1[t], _mm256_setr_ps(m * (x->d * (float)x->sum), 0, 0, 0, 0, 0, 0, 0));
    }
}

/* Bytes of one weight block, a constant once inlined. */
static inline size_t kq_block_bytes(colibri_dtype dtype)
{
    switch (dtype) {
    case COLIBRI_DTYPE_Q4_K: return 144;
    case COLIBRI_DTYPE_Q5_K: return 176;
    case COLIBRI_DTYPE_Q6_K: return 210;
    case COLIBRI_DTYPE_Q3_K: return 110;
    case COLIBRI_DTYPE_Q2_K: return 84;
    case COLIBRI_DTYPE_IQ4_XS: return 136;
    case COLIBRI_DTYPE_IQ4_NL: return 18;
    case COLIBRI_DTYPE_Q4_1: return 20;
    case COLIBRI_DTYPE_Q5_0: return 22;
    case COLIBRI_DTYPE_Q5_1: return 24;
    default: return 17;   /* mxfp4 */
    }
}

/* One row of W (blocks activation blocks long) against RN tokens' blocks (xq, `blocks` apart):
 * y (RN tokens, `rows` apart). */
static inline __attribute__((always_inline)) void tile_kq_x86(int RN, float *y, int32_t rows, const uint8_t *w, colibri_dtype dtype,
                                                              const colibri_q8_block *xq, int32_t blocks, dot_us_fn dot_us,
                                                              dot_scaled_fn dot_scaled)
{
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(dtype == COLIBRI_DTYPE_MXFP4 ? colibri_mxfp4_values
                                                                                                                    : colibri_iq4nl_values)));
    size_t block_bytes = kq_block_bytes(dtype), xs = (size_t)blocks;
    int32_t b, per = block_bytes < 32 ? 1 : 8;
    __m256 acc0[KQ_TOKENS], acc1[KQ_TOKENS];
    float mins[KQ_TOKENS];
    int t;
    for (t = 0; t < RN; t++) { acc0[t] = acc1[t] = _mm256_setzero_ps(); mins[t] = 0.0f; }
    for (b = 0; b < blocks; b += per, w += block_bytes) {
        _mm_prefetch((const char *)w + 1024, _MM_HINT_T0);
        switch (dtype) {
        case COLIBRI_DTYPE_Q4_K: case COLIBRI_DTYPE_Q5_K: k4_block(RN, w, dtype, xq + b, xs, acc0, mins, dot_scaled); break;
        case COLIBRI_DTYPE_Q6_K: q6_k_block(RN, w, xq + b, xs, acc0, dot_scaled); break;
        case COLIBRI_DTYPE_Q3_K: q3_k_block(RN, w, xq + b, xs, acc0, dot_scaled); break;
        case COLIBRI_DTYPE_Q2_K: q2_k_block(RN, w, xq + b, xs, acc0, dot_scaled); break;
        case COLIBRI_DTYPE_IQ4_XS: iq4_xs_block(RN, w, xq + b, xs, acc0, table, dot_scaled); break;
        case COLIBRI_DTYPE_Q4_1: case COLIBRI_DTYPE_Q5_0: case COLIBRI_DTYPE_Q5_1: legacy_block(RN, w, dtype, xq + b, xs, acc0, acc1, dot_us); break;
        default: table_block(RN, w, dtype, xq + b, xs, acc0, table, dot_us); break;
        }
    }
    for (t = 0; t < RN; t++) y[(size_t)t * rows] = hsum8(_mm256_add_ps(acc0[t], acc1[t])) - mins[t];
}

/* y (n, rows) = xq @ W^T for one of those formats (a constant once inlined): row by row, each
 * row against RN tokens at a time (then the rest one by one) while it is in L1. */
static inline __attribute__((always_inline)) void matmul_kq_format(int RN, float *y, const colibri_q8_block *xq, const uint8_t *w,
                                                                   colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows,
                                                                   dot_us_fn dot_us, dot_scaled_fn dot_scaled)
{
    size_t row_bytes = colibri_row_bytes(dtype, (size_t)cols);
    int32_t r, t, blocks = cols / COLIBRI_BLOCK;
    for (r = 0; r < rows; r++) {
        for (t = 0; t + RN <= n; t += RN)
            tile_kq_x86(RN, y + (size_t)t * rows + r, rows, w + (size_t)r * row_bytes, dtype, xq + (size_t)t * blocks, blocks,
                        dot_us, dot_scaled);
        for (; t < n; t++)
            tile_kq_x86(1, y + (size_t)t * rows + r, rows, w + (size_t)r * row_bytes, dtype, xq + (size_t)t * blocks, blocks,
                        dot_us, dot_scaled);
    }
}

/* y (n, rows) = xq @ W^T for an int8_path W, given the variant's integer primitives and how many
 * tokens its registers hold in a tile: RN in q8_0's and q4_0's 4-row tiles, RN_KQ in the other
 * formats' one-row tiles.  The 256-weight formats take xq from quantize_q8_256. */
static inline __attribute__((always_inline)) void matmul_q8_x86(int RN, int RN_KQ, float *y, const colibri_q8_block *xq, const void *w,
                                                                colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows,
                                                                dot_us_fn dot_us, dot_scaled_fn dot_scaled)
{
#define KQ(format) matmul_kq_format(RN_KQ, y, xq, w, format, n, cols, rows, dot_us, dot_scaled)
    switch (dtype) {
    case COLIBRI_DTYPE_Q8_0: matmul_q8_format(RN, y, xq, w, COLIBRI_DTYPE_Q8_0, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_Q4_0: matmul_q8_format(RN, y, xq, w, COLIBRI_DTYPE_Q4_0, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_Q4_K: KQ(COLIBRI_DTYPE_Q4_K); break;
    case COLIBRI_DTYPE_Q5_K: KQ(COLIBRI_DTYPE_Q5_K); break;
    case COLIBRI_DTYPE_Q6_K: KQ(COLIBRI_DTYPE_Q6_K); break;
    case COLIBRI_DTYPE_Q3_K: KQ(COLIBRI_DTYPE_Q3_K); break;
    case COLIBRI_DTYPE_Q2_K: KQ(COLIBRI_DTYPE_Q2_K); break;
    case COLIBRI_DTYPE_IQ4_XS: KQ(COLIBRI_DTYPE_IQ4_XS); break;
    case COLIBRI_DTYPE_IQ4_NL: KQ(COLIBRI_DTYPE_IQ4_NL); break;
    case COLIBRI_DTYPE_Q4_1: KQ(COLIBRI_DTYPE_Q4_1); break;
    case COLIBRI_DTYPE_Q5_0: KQ(COLIBRI_DTYPE_Q5_0); break;
    case COLIBRI_DTYPE_Q5_1: KQ(COLIBRI_DTYPE_Q5_1); break;
    case COLIBRI_DTYPE_MXFP4: KQ(COLIBRI_DTYPE_MXFP4); break;
    case COLIBRI_DTYPE_Q4_0X8: case COLIBRI_DTYPE_Q8_0X8: matmul_x8_x86(y, xq, w, dtype, n, cols, rows); break;
    default: matmul_kx8_x86(y, xq, w, dtype, n, cols, rows); break;   /* q4_kx8, q5_kx8, q6_kx8, iq4_xsx8, mxfp4x8 */
    }
#undef KQ
}

#endif
