/* The int8 path shared by the AVX2 and AVX-512 variants: each file includes this under its own
 * -m flags and hands the driver its integer block dot products. */
#ifndef COLIBRI_Q8_X86_H
#define COLIBRI_Q8_X86_H

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../arch.h"
#include "../../src/ops/quant_tables.h"
#include "rows8_x86.h"

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

/* xq (n, cols / 32) = x (n, cols) in blocks of 32, as colibri_ref_quantize_q8 (same rounding). */
static inline void quantize_q8_x86(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int32_t b, blocks = n * (cols / COLIBRI_BLOCK);
    for (b = 0; b < blocks; b++, x += COLIBRI_BLOCK, xq++) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8), v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask)),
                                 _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        __m256i i0, i1, i2, i3, q16a, q16b, sum;
        __m256 id;
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        xq->d = _mm_cvtss_f32(h) / 127.0f;
        id = _mm256_set1_ps(xq->d != 0.0f ? 1.0f / xq->d : 0.0f);
        i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, id));   /* rounds to nearest even */
        i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, id));
        i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, id));
        i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, id));
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
 * q5_1 (see colibri_ref_matmul_q8 for the sums), one weight block at a time: per activation block
 * an 8-lane integer dot, converted and added in times d * scale * dx; q4_k's and q5_k's mins as
 * dmin * m * dx * sum(q), q2_k's as dmin * dx * its mins' dot, summed apart. */

/* 32 signed weights w against the activations x: |w| unsigned, w's sign moved onto x. */
static inline __m256i dot_signed(__m256i w, __m256i x, dot_us_fn dot_us)
{
    return dot_us(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

static inline __m256i xq_load(const colibri_q8_block *xb) { return _mm256_loadu_si256((const __m256i *)xb->q); }

/* dx, and sum(q) as floats times dx, of 8 consecutive activation blocks: one per lane. */
static inline __m256 x_scales8(const colibri_q8_block *xb)
{
    const __m256i at = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(sizeof *xb / 4));
    return _mm256_i32gather_ps(&xb->d, at, 4);
}

static inline __m256 x_sums8(const colibri_q8_block *xb, __m256 dx)
{
    const __m256i at = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(sizeof *xb / 4));
    return _mm256_mul_ps(dx, _mm256_cvtepi32_ps(_mm256_i32gather_epi32((const int *)&xb->sum, at, 4)));
}

/* Lane i of v in every lane. */
static inline __m256 lane(__m256 v, int i) { return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(i)); }

/* 8 bytes as 8 float lanes. */
static inline __m256 u8x8_ps(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p))); }

/* acc += dot's 8 lanes times f. */
static inline __m256 add_scaled(__m256 acc, __m256i dot, float f)
{
    return _mm256_fmadd_ps(_mm256_set1_ps(f), _mm256_cvtepi32_ps(dot), acc);
}

/* The blocks below take RN tokens at once (prefill, an expert's group of tokens): each weight
 * block unpacked once for all of them, token t's activation blocks xs apart from token 0's, its
 * sums in acc0[t], acc1[t] (and mins[t]) in the order one token alone would take: an output does
 * not depend on how many tokens came with it. */

/* One q4_k or q5_k block (256 weights, 8 sub-blocks of 32) against its 8 activation blocks: the
 * factors d sc dx of the 8 sub-blocks in one vector, their mins' dmin m dx sum(q) added in one. */
static inline __attribute__((always_inline)) void k4_block(int RN, const uint8_t *b, colibri_dtype dtype, const colibri_q8_block *xb,
                                                           size_t xs, __m256 *acc0, __m256 *acc1, __m256 *mins, dot_us_fn dot_us)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const uint8_t *qs = b + (dtype == COLIBRI_DTYPE_Q4_K ? 16 : 48);
    __m256i qh = dtype == COLIBRI_DTYPE_Q5_K ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
    __m256 dsc, dm, f[4];
    uint8_t sm[16];
    int k, t;
    k4_unpack(b + 4, sm);
    dsc = _mm256_mul_ps(_mm256_set1_ps(w_scale(b)), u8x8_ps(sm));
    dm = _mm256_mul_ps(_mm256_set1_ps(w_scale(b + 2)), u8x8_ps(sm + 8));
    for (t = 0; t < RN; t++) {
        __m256 dx = x_scales8(xb + t * xs);
        f[t] = _mm256_mul_ps(dsc, dx);
        mins[t] = _mm256_fmadd_ps(dm, x_sums8(xb + t * xs, dx), mins[t]);
    }
    for (k = 0; k < 4; k++) {   /* sub-blocks 2k (low nibbles) and 2k + 1 (high) */
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * k));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (dtype == COLIBRI_DTYPE_Q5_K) {   /* the fifth bit: bit s of qh[j] */
            __m256i bl = _mm256_set1_epi8((char)(1 << (2 * k))), bh = _mm256_set1_epi8((char)(2 << (2 * k))), sixteen = _mm256_set1_epi8(16);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bl), bl), sixteen));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bh), bh), sixteen));
        }
        for (t = 0; t < RN; t++) {
            const colibri_q8_block *x = xb + t * xs + 2 * k;
            acc0[t] = _mm256_fmadd_ps(lane(f[t], 2 * k), _mm256_cvtepi32_ps(dot_us(lo, xq_load(x))), acc0[t]);
            acc1[t] = _mm256_fmadd_ps(lane(f[t], 2 * k + 1), _mm256_cvtepi32_ps(dot_us(hi, xq_load(x + 1))), acc1[t]);
        }
    }
}

/* One q6_k block: two halves of 128, each 64 bytes of low nibbles and 32 of 2-bit pairs; per
 * activation block two int8 scales, one for each 16 (lanes 0..3 and 4..7 of a dot). */
static inline __attribute__((always_inline)) void q6_k_block(int RN, const uint8_t *b, const colibri_q8_block *xb, size_t xs,
                                                             __m256 *acc0, __m256 *acc1, dot_us_fn dot_us)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30), c32 = _mm256_set1_epi8(32);
    __m256 f[4];
    int h, g, t;
    for (t = 0; t < RN; t++) f[t] = _mm256_mul_ps(_mm256_set1_ps(w_scale(b + 208)), x_scales8(xb + t * xs));   /* d dx per block */
    for (h = 0; h < 2; h++) {
        __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h)), l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 192 + 8 * h)));   /* this half's 8 scales */
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m2));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
        for (g = 0; g < 4; g++) {
            __m256i w = _mm256_sub_epi8(q[g], c32), w_abs = _mm256_sign_epi8(w, w);
            __m256i scale = _mm256_permutevar8x32_epi32(sc, _mm256_setr_epi32(2 * g, 2 * g, 2 * g, 2 * g, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1));
            for (t = 0; t < RN; t++) {
                __m256i dot = _mm256_mullo_epi32(dot_us(w_abs, _mm256_sign_epi8(xq_load(xb + t * xs + 4 * h + g), w)), scale);
                if (g % 2) acc1[t] = _mm256_fmadd_ps(lane(f[t], 4 * h + g), _mm256_cvtepi32_ps(dot), acc1[t]);
                else acc0[t] = _mm256_fmadd_ps(lane(f[t], 4 * h + g), _mm256_cvtepi32_ps(dot), acc0[t]);
            }
        }
    }
}

/* The 4 int32 lanes of each half of a dot (a 16-weight sub-block each) times lanes k and k + 1 of sc. */
static inline __m256i scale_halves(__m256i dot, __m256i sc, int k)
{
    return _mm256_mullo_epi32(dot, _mm256_permutevar8x32_epi32(sc, _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1)));
}

/* One q3_k block: two halves of 128, each 32 bytes of 2-bit quants (32 weights per shift), the
 * third bit of activation block g's weight j bit g of hmask[j] (clear: the quant less 4, -4..3);
 * per activation block two 6-bit scales less 32, one for each 16, as q6_k's. */
static inline __attribute__((always_inline)) void q3_k_block(int RN, const uint8_t *b, const colibri_q8_block *xb, size_t xs,
                                                             __m256 *acc0, __m256 *acc1, dot_us_fn dot_us)
{
    const __m256i m2 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    __m256i hmask = _mm256_loadu_si256((const __m256i *)b);
    __m256 f[4];
    uint8_t sc16[16];
    int h, g, t;
    k3_unpack(b + 96, sc16);
    for (t = 0; t < RN; t++) f[t] = _mm256_mul_ps(_mm256_set1_ps(w_scale(b + 108)), x_scales8(xb + t * xs));   /* d dx per block */
    for (h = 0; h < 2; h++) {
        __m256i qs = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * h));
        __m256i sc = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc16 + 8 * h))), _mm256_set1_epi32(32));
        for (g = 0; g < 4; g++) {
            const int a = 4 * h + g;   /* the activation block */
            __m256i bit = _mm256_set1_epi8((char)(1 << a));
            __m256i w = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(qs, 2 * g), m2),
                                        _mm256_andnot_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit), four));
            __m256i w_abs = _mm256_sign_epi8(w, w);
            for (t = 0; t < RN; t++) {
                __m256i dot = scale_halves(dot_us(w_abs, _mm256_sign_epi8(xq_load(xb + t * xs + a), w)), sc, 2 * g);
                if (g % 2) acc1[t] = _mm256_fmadd_ps(lane(f[t], a), _mm256_cvtepi32_ps(dot), acc1[t]);
                else acc0[t] = _mm256_fmadd_ps(lane(f[t], a), _mm256_cvtepi32_ps(dot), acc0[t]);
            }
        }
    }
}

/* One q2_k block: the quants as q3_k's low two bits (0..3); per 16 weights a 4-bit scale and a
 * 4-bit min, the min's integer dot with q one more dot_us (the mins, 16 bytes each, as its
 * unsigned operand), times dmin dx, summed apart. */
static inline __attribute__((always_inline)) void q2_k_block(int RN, const uint8_t *b, const colibri_q8_block *xb, size_t xs,
                                                             __m256 *acc0, __m256 *acc1, __m256 *mins, dot_us_fn dot_us)
{
    const __m256i m2 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(0x0f);
    __m256i min16 = _mm256_and_si256(_mm256_srli_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)b)), 4), m4);
    __m256 f[4], fm[4];
    int h, g, t;
    for (t = 0; t < RN; t++) {
        __m256 dx = x_scales8(xb + t * xs);
        f[t] = _mm256_mul_ps(_mm256_set1_ps(w_scale(b + 80)), dx);
        fm[t] = _mm256_mul_ps(_mm256_set1_ps(w_scale(b + 82)), dx);
    }
    for (h = 0; h < 2; h++) {
        __m256i qs = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * h));
        __m256i sc = _mm256_and_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 8 * h))), _mm256_set1_epi32(0x0f));
        for (g = 0; g < 4; g++) {
            const int a = 4 * h + g;   /* the activation block: sub-blocks 2a, 2a + 1 */
            __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * g), m2);
            __m256i mn = _mm256_shuffle_epi8(min16, _mm256_set_m128i(_mm_set1_epi8((char)(2 * a + 1)), _mm_set1_epi8((char)(2 * a))));
            for (t = 0; t < RN; t++) {
                __m256i x = xq_load(xb + t * xs + a);
                __m256i dot = scale_halves(dot_us(q, x), sc, 2 * g);
                if (g % 2) acc1[t] = _mm256_fmadd_ps(lane(f[t], a), _mm256_cvtepi32_ps(dot), acc1[t]);
                else acc0[t] = _mm256_fmadd_ps(lane(f[t], a), _mm256_cvtepi32_ps(dot), acc0[t]);
                mins[t] = _mm256_fmadd_ps(lane(fm[t], a), _mm256_cvtepi32_ps(dot_us(mn, x)), mins[t]);
            }
        }
    }
}

/* The 32 values of a q4_0-ordered nibble group through a 16-entry table (iq4_nl's, mxfp4's). */
static inline __m256i table_nibbles(const uint8_t *q, __m256i table) { return _mm256_shuffle_epi8(table, q4_nibbles(q)); }

/* One iq4_xs block: 8 sub-blocks of 32, each a q4_0 nibble group and a 6-bit scale less 32 (low
 * nibbles in bytes 4..7, two bits each in the u16 at 2), the 8 factors d (scale - 32) dx in one vector. */
static inline __attribute__((always_inline)) void iq4_xs_block(int RN, const uint8_t *b, const colibri_q8_block *xb, size_t xs,
                                                               __m256 *acc0, __m256 *acc1, __m256i table, dot_us_fn dot_us)
{
    uint16_t high;
    uint32_t low;
    __m128i l;
    __m256i scale;
    __m256 ds, f[4];
    int s, t;
    memcpy(&high, b + 2, 2);
    memcpy(&low, b + 4, 4);
    l = _mm_cvtsi32_si128((int)low);
    l = _mm_unpacklo_epi8(_mm_and_si128(l, _mm_set1_epi8(0x0f)), _mm_and_si128(_mm_srli_epi16(l, 4), _mm_set1_epi8(0x0f)));
    scale = _mm256_or_si256(_mm256_cvtepu8_epi32(l), _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(high),
                                                       _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)), _mm256_set1_epi32(3)), 4));
    ds = _mm256_mul_ps(_mm256_set1_ps(w_scale(b)), _mm256_cvtepi32_ps(_mm256_sub_epi32(scale, _mm256_set1_epi32(32))));
    for (t = 0; t < RN; t++) f[t] = _mm256_mul_ps(ds, x_scales8(xb + t * xs));
    for (s = 0; s < 8; s += 2) {
        __m256i v0 = table_nibbles(b + 8 + 16 * s, table), v1 = table_nibbles(b + 24 + 16 * s, table);
        for (t = 0; t < RN; t++) {
            const colibri_q8_block *x = xb + t * xs + s;
            acc0[t] = _mm256_fmadd_ps(lane(f[t], s), _mm256_cvtepi32_ps(dot_signed(v0, xq_load(x), dot_us)), acc0[t]);
            acc1[t] = _mm256_fmadd_ps(lane(f[t], s + 1), _mm256_cvtepi32_ps(dot_signed(v1, xq_load(x + 1), dot_us)), acc1[t]);
        }
    }
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
                                                              const colibri_q8_block *xq, int32_t blocks, dot_us_fn dot_us)
{
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(dtype == COLIBRI_DTYPE_MXFP4 ? colibri_mxfp4_values
                                                                                                                    : colibri_iq4nl_values)));
    size_t block_bytes = kq_block_bytes(dtype), xs = (size_t)blocks;
    int32_t b, per = block_bytes < 32 ? 1 : 8;
    __m256 acc0[4], acc1[4], mins[4];
    int t;
    for (t = 0; t < RN; t++) acc0[t] = acc1[t] = mins[t] = _mm256_setzero_ps();
    for (b = 0; b < blocks; b += per, w += block_bytes) {
        _mm_prefetch((const char *)w + 1024, _MM_HINT_T0);
        switch (dtype) {
        case COLIBRI_DTYPE_Q4_K: case COLIBRI_DTYPE_Q5_K: k4_block(RN, w, dtype, xq + b, xs, acc0, acc1, mins, dot_us); break;
        case COLIBRI_DTYPE_Q6_K: q6_k_block(RN, w, xq + b, xs, acc0, acc1, dot_us); break;
        case COLIBRI_DTYPE_Q3_K: q3_k_block(RN, w, xq + b, xs, acc0, acc1, dot_us); break;
        case COLIBRI_DTYPE_Q2_K: q2_k_block(RN, w, xq + b, xs, acc0, acc1, mins, dot_us); break;
        case COLIBRI_DTYPE_IQ4_XS: iq4_xs_block(RN, w, xq + b, xs, acc0, acc1, table, dot_us); break;
        case COLIBRI_DTYPE_Q4_1: case COLIBRI_DTYPE_Q5_0: case COLIBRI_DTYPE_Q5_1: legacy_block(RN, w, dtype, xq + b, xs, acc0, acc1, dot_us); break;
        default: table_block(RN, w, dtype, xq + b, xs, acc0, table, dot_us); break;
        }
    }
    for (t = 0; t < RN; t++) y[(size_t)t * rows] = hsum8(_mm256_sub_ps(_mm256_add_ps(acc0[t], acc1[t]), mins[t]));
}

/* y (n, rows) = xq @ W^T for one of those formats (a constant once inlined): row by row, each
 * row against RN tokens at a time (then the rest one by one) while it is in L1. */
static inline __attribute__((always_inline)) void matmul_kq_format(int RN, float *y, const colibri_q8_block *xq, const uint8_t *w,
                                                                   colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows,
                                                                   dot_us_fn dot_us)
{
    size_t row_bytes = colibri_row_bytes(dtype, (size_t)cols);
    int32_t r, t, blocks = cols / COLIBRI_BLOCK;
    for (r = 0; r < rows; r++) {
        for (t = 0; t + RN <= n; t += RN)
            tile_kq_x86(RN, y + (size_t)t * rows + r, rows, w + (size_t)r * row_bytes, dtype, xq + (size_t)t * blocks, blocks, dot_us);
        for (; t < n; t++)
            tile_kq_x86(1, y + (size_t)t * rows + r, rows, w + (size_t)r * row_bytes, dtype, xq + (size_t)t * blocks, blocks, dot_us);
    }
}

/* y (n, rows) = xq @ W^T for an int8_path W, given the variant's dot_us and how many tokens its
 * registers hold in a tile (RN). */
static inline __attribute__((always_inline)) void matmul_q8_x86(int RN, float *y, const colibri_q8_block *xq, const void *w,
                                                                colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows,
                                                                dot_us_fn dot_us)
{
    switch (dtype) {
    case COLIBRI_DTYPE_Q8_0: matmul_q8_format(RN, y, xq, w, COLIBRI_DTYPE_Q8_0, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_Q4_0: matmul_q8_format(RN, y, xq, w, COLIBRI_DTYPE_Q4_0, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_Q4_K: matmul_kq_format(RN, y, xq, w, COLIBRI_DTYPE_Q4_K, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_Q5_K: matmul_kq_format(RN, y, xq, w, COLIBRI_DTYPE_Q5_K, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_Q6_K: matmul_kq_format(RN, y, xq, w, COLIBRI_DTYPE_Q6_K, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_Q3_K: matmul_kq_format(RN, y, xq, w, COLIBRI_DTYPE_Q3_K, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_Q2_K: matmul_kq_format(RN, y, xq, w, COLIBRI_DTYPE_Q2_K, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_IQ4_XS: matmul_kq_format(RN, y, xq, w, COLIBRI_DTYPE_IQ4_XS, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_IQ4_NL: matmul_kq_format(RN, y, xq, w, COLIBRI_DTYPE_IQ4_NL, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_Q4_1: matmul_kq_format(RN, y, xq, w, COLIBRI_DTYPE_Q4_1, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_Q5_0: matmul_kq_format(RN, y, xq, w, COLIBRI_DTYPE_Q5_0, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_Q5_1: matmul_kq_format(RN, y, xq, w, COLIBRI_DTYPE_Q5_1, n, cols, rows, dot_us); break;
    case COLIBRI_DTYPE_Q4_0X8: case COLIBRI_DTYPE_Q8_0X8: matmul_x8_x86(y, xq, w, dtype, n, cols, rows); break;
    default: matmul_kq_format(RN, y, xq, w, COLIBRI_DTYPE_MXFP4, n, cols, rows, dot_us); break;
    }
}

#endif
