/* SPDX-License-Identifier: MIT */
/* The int8 path shared by the NEON variants: each file includes this under its own flags and
 * hands the driver its integer dot product of 16 bytes by 16 bytes. */
#ifndef COLIBRI_Q8_NEON_H
#define COLIBRI_Q8_NEON_H

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "../arch.h"
#include "../../src/ops/quant_tables.h"
#include "rows8_neon.h"

/* max |x| of 32 activations, 4 lanes apart. */
static inline float32x4_t abs_max32(const float *x, float32x4_t m)
{
    int32_t i;
    for (i = 0; i < 8; i++) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + 4 * i)));
    return m;
}

/* One block of 32 activations with the scale d (colibri_ref_quantize_q8's rounding). */
static inline void quantize_block_neon(colibri_q8_block *xq, const float *x, float d)
{
    int32x4_t q[8], sum = vdupq_n_s32(0);
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t i;
    xq->d = d;
    for (i = 0; i < 8; i++) { q[i] = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 4 * i), id)); sum = vaddq_s32(sum, q[i]); }
    xq->sum = vaddvq_s32(sum);
    for (i = 0; i < 2; i++) {   /* 16 int32 -> 16 int8, in order */
        int16x8_t lo = vcombine_s16(vmovn_s32(q[4 * i]), vmovn_s32(q[4 * i + 1]));
        int16x8_t hi = vcombine_s16(vmovn_s32(q[4 * i + 2]), vmovn_s32(q[4 * i + 3]));
        vst1q_s8(xq->q + 16 * i, vcombine_s8(vmovn_s16(lo), vmovn_s16(hi)));
    }
}

/* xq (n, cols / 32) = x (n, cols) in blocks of 32, as colibri_ref_quantize_q8 (same rounding). */
static inline void quantize_q8_neon(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    int32_t b, blocks = n * (cols / COLIBRI_BLOCK);
    for (b = 0; b < blocks; b++, x += COLIBRI_BLOCK, xq++)
        quantize_block_neon(xq, x, vmaxvq_f32(abs_max32(x, vdupq_n_f32(0.0f))) / 127.0f);
}

/* The same, each 256 sharing one d (colibri_ref_quantize_q8_256). */
static inline void quantize_q8_256_neon(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    int32_t g, b, groups = n * (cols / 256);
    for (g = 0; g < groups; g++, x += 256, xq += 8) {
        float32x4_t m = vdupq_n_f32(0.0f);
        float d;
        for (b = 0; b < 8; b++) m = abs_max32(x + 32 * b, m);
        d = vmaxvq_f32(m) / 127.0f;
        for (b = 0; b < 8; b++) quantize_block_neon(xq + b, x + 32 * b, d);
    }
}

typedef int32x4_t (*dot16_fn)(int32x4_t acc, int8x16_t a, int8x16_t b);

/* ---- The int8 path's other formats: q4_k, q5_k, q6_k, q3_k, q2_k, iq4_xs, iq4_nl, mxfp4, q4_1, q5_0,
 * q5_1 (see colibri_ref_matmul_q8 for the sums), one weight block at a time: per activation block a
 * 4-lane integer dot of signed bytes, converted and added in times d * scale * dx; q4_k's and
 * q5_k's mins as dmin * m * dx * sum(q), q2_k's per 16, summed apart. */

/* 32 weights (w0: the first 16) against one activation block. */
static inline __attribute__((always_inline)) int32x4_t dot32(int8x16_t w0, int8x16_t w1, const colibri_q8_block *xb, dot16_fn dot16)
{
    return dot16(dot16(vdupq_n_s32(0), w0, vld1q_s8(xb->q)), w1, vld1q_s8(xb->q + 16));
}

static inline float32x4_t add_scaled(float32x4_t acc, int32x4_t dot, float f) { return vfmaq_n_f32(acc, vcvtq_f32_s32(dot), f); }

static inline float f16_scale(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return colibri_f16_to_f32(h);
}

static inline int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

/* The blocks below take RN tokens at once (prefill, an expert's group of tokens): each weight
 * block unpacked once for all of them, token t's activation blocks xs apart from token 0's, its
 * sums in acc0[t], acc1[t] (and mins[t]) in the order one token alone would take: an output does
 * not depend on how many tokens came with it. */

/* One q4_k or q5_k block (256 weights, 8 sub-blocks of 32) against its 8 activation blocks. */
static inline __attribute__((always_inline)) void k4_block(int RN, const uint8_t *b, colibri_dtype dtype, const colibri_q8_block *xb,
                                                           size_t xs, float32x4_t *acc0, float32x4_t *acc1, float *mins, dot16_fn dot16)
{
    const uint8_t *qs = b + (dtype == COLIBRI_DTYPE_Q4_K ? 16 : 48);
    const uint8x16_t m4 = vdupq_n_u8(0x0f), f = vdupq_n_u8(16);
    uint8x16_t qh0 = vld1q_u8(b + 16), qh1 = vld1q_u8(b + 32);   /* q5_k's fifth bits (q4_k: unused) */
    float d = f16_scale(b), dmin = f16_scale(b + 2), m[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    uint8_t sm[16];
    int k, t;
    k4_unpack(b + 4, sm);
    for (k = 0; k < 4; k++) {   /* sub-blocks 2k (low nibbles) and 2k + 1 (high) */
        uint8x16_t v0 = vld1q_u8(qs + 32 * k), v1 = vld1q_u8(qs + 32 * k + 16);
        uint8x16_t lo0 = vandq_u8(v0, m4), lo1 = vandq_u8(v1, m4), hi0 = vshrq_n_u8(v0, 4), hi1 = vshrq_n_u8(v1, 4);
        if (dtype == COLIBRI_DTYPE_Q5_K) {   /* bit s of qh[j] */
            uint8x16_t bl = vdupq_n_u8((uint8_t)(1u << (2 * k))), bh = vdupq_n_u8((uint8_t)(2u << (2 * k)));
            lo0 = vorrq_u8(lo0, vandq_u8(vtstq_u8(qh0, bl), f));
            lo1 = vorrq_u8(lo1, vandq_u8(vtstq_u8(qh1, bl), f));
            hi0 = vorrq_u8(hi0, vandq_u8(vtstq_u8(qh0, bh), f));
            hi1 = vorrq_u8(hi1, vandq_u8(vtstq_u8(qh1, bh), f));
        }
        for (t = 0; t < RN; t++) {
            const colibri_q8_block *x = xb + t * xs + 2 * k;
            acc0[t] = add_scaled(acc0[t], dot32(s8(lo0), s8(lo1), x, dot16), d * (float)sm[2 * k] * x[0].d);
            acc1[t] = add_scaled(acc1[t], dot32(s8(hi0), s8(hi1), x + 1, dot16), d * (float)sm[2 * k + 1] * x[1].d);
            m[t] += (float)sm[8 + 2 * k] * (x[0].d * (float)x[0].sum) + (float)sm[9 + 2 * k] * (x[1].d * (float)x[1].sum);
        }
    }
    for (t = 0; t < RN; t++) mins[t] += dmin * m[t];
}

/* One q6_k block: two halves of 128, each 64 bytes of low nibbles and 32 of 2-bit pairs; per
 * activation block two int8 scales, one for each 16. */
static inline __attribute__((always_inline)) void q6_k_block(int RN, const uint8_t *b, const colibri_q8_block *xb, size_t xs,
                                                             float32x4_t *acc0, float32x4_t *acc1, dot16_fn dot16)
{
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m2 = vdupq_n_u8(0x30);
    const int8_t *sc = (const int8_t *)b + 192;
    float d = f16_scale(b + 208);
    int h, g, i, t;
    for (h = 0; h < 2; h++) {
        uint8x16_t q[4][2];
        for (i = 0; i < 2; i++) {   /* bytes 16 i.. of each run */
            uint8x16_t l0 = vld1q_u8(b + 64 * h + 16 * i), l1 = vld1q_u8(b + 64 * h + 32 + 16 * i);
            uint8x16_t qh = vld1q_u8(b + 128 + 32 * h + 16 * i);
            q[0][i] = vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8(qh, 4), m2));
            q[1][i] = vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(qh, 2), m2));
            q[2][i] = vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(qh, m2));
            q[3][i] = vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(qh, 2), m2));
        }
        for (g = 0; g < 4; g++, sc += 2) {
            int8x16_t w0 = vsubq_s8(s8(q[g][0]), vdupq_n_s8(32)), w1 = vsubq_s8(s8(q[g][1]), vdupq_n_s8(32));
            for (t = 0; t < RN; t++) {
                const colibri_q8_block *x = xb + t * xs + 4 * h + g;
                int32x4_t dot = vmulq_n_s32(dot16(vdupq_n_s32(0), w0, vld1q_s8(x->q)), sc[0]);
                dot = vmlaq_n_s32(dot, dot16(vdupq_n_s32(0), w1, vld1q_s8(x->q + 16)), sc[1]);
                if (g % 2) acc1[t] = add_scaled(acc1[t], dot, d * x->d);
                else acc0[t] = add_scaled(acc0[t], dot, d * x->d);
            }
        }
    }
}

/* 16 weights' 2-bit quants: bits 2g, 2g + 1 of each byte of v. */
static inline uint8x16_t quants2(uint8x16_t v, int g) { return vandq_u8(vshlq_u8(v, vdupq_n_s8((int8_t)(-2 * g))), vdupq_n_u8(3)); }

/* One q3_k block: two halves of 128, each 32 bytes of 2-bit quants (32 weights per shift), the
 * third bit of activation block g's weight j bit g of hmask[j] (clear: the quant less 4, -4..3);
 * per activation block two 6-bit scales less 32, one for each 16, as q6_k's. */
static inline __attribute__((always_inline)) void q3_k_block(int RN, const uint8_t *b, const colibri_q8_block *xb, size_t xs,
                                                             float32x4_t *acc0, float32x4_t *acc1, dot16_fn dot16)
{
    const uint8x16_t four = vdupq_n_u8(4), hm0 = vld1q_u8(b), hm1 = vld1q_u8(b + 16);
    float d = f16_scale(b + 108);
    uint8_t sc[16];
    int h, g, t;
    k3_unpack(b + 96, sc);
    for (h = 0; h < 2; h++) {
        uint8x16_t q0 = vld1q_u8(b + 32 + 32 * h), q1 = vld1q_u8(b + 48 + 32 * h);
        for (g = 0; g < 4; g++) {
            const int a = 4 * h + g;   /* the activation block */
            uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << a));
            int8x16_t w0 = s8(vsubq_u8(quants2(q0, g), vbicq_u8(four, vtstq_u8(hm0, bit))));
            int8x16_t w1 = s8(vsubq_u8(quants2(q1, g), vbicq_u8(four, vtstq_u8(hm1, bit))));
            for (t = 0; t < RN; t++) {
                const colibri_q8_block *x = xb + t * xs + a;
                int32x4_t dot = vmulq_n_s32(dot16(vdupq_n_s32(0), w0, vld1q_s8(x->q)), sc[2 * a] - 32);
                dot = vmlaq_n_s32(dot, dot16(vdupq_n_s32(0), w1, vld1q_s8(x->q + 16)), sc[2 * a + 1] - 32);
                if (g % 2) acc1[t] = add_scaled(acc1[t], dot, d * x->d);
                else acc0[t] = add_scaled(acc0[t], dot, d * x->d);
            }
        }
    }
}

/* One q2_k block: the quants as q3_k's low two bits (0..3); per 16 weights a 4-bit scale and a
 * 4-bit min, the min times the 16 activations' sum, times dmin dx, summed apart. */
static inline __attribute__((always_inline)) void q2_k_block(int RN, const uint8_t *b, const colibri_q8_block *xb, size_t xs,
                                                             float32x4_t *acc0, float32x4_t *acc1, float *mins, dot16_fn dot16)
{
    float d = f16_scale(b + 80), dmin = f16_scale(b + 82), m[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    int h, g, t;
    for (h = 0; h < 2; h++) {
        uint8x16_t q0 = vld1q_u8(b + 16 + 32 * h), q1 = vld1q_u8(b + 32 + 32 * h);
        for (g = 0; g < 4; g++) {
            const int a = 4 * h + g;   /* the activation block: sub-blocks 2a, 2a + 1 */
            int8x16_t w0 = s8(quants2(q0, g)), w1 = s8(quants2(q1, g));
            int sc0 = b[2 * a] & 0x0f, sc1 = b[2 * a + 1] & 0x0f, mn0 = b[2 * a] >> 4, mn1 = b[2 * a + 1] >> 4;
            for (t = 0; t < RN; t++) {
                const colibri_q8_block *x = xb + t * xs + a;
                int8x16_t x0 = vld1q_s8(x->q), x1 = vld1q_s8(x->q + 16);
                int32x4_t dot = vmulq_n_s32(dot16(vdupq_n_s32(0), w0, x0), sc0);
                dot = vmlaq_n_s32(dot, dot16(vdupq_n_s32(0), w1, x1), sc1);
                if (g % 2) acc1[t] = add_scaled(acc1[t], dot, d * x->d);
                else acc0[t] = add_scaled(acc0[t], dot, d * x->d);
                m[t] += x->d * (float)(mn0 * vaddlvq_s8(x0) + mn1 * vaddlvq_s8(x1));
            }
        }
    }
    for (t = 0; t < RN; t++) mins[t] += dmin * m[t];
}

/* A q4_0-ordered nibble group's 32 values through a 16-entry table: the first 16, then the rest. */
static inline void table_values(const uint8_t *q, int8x16_t table, int8x16_t *v0, int8x16_t *v1)
{
    uint8x16_t v = vld1q_u8(q);
    *v0 = vqtbl1q_s8(table, vandq_u8(v, vdupq_n_u8(0x0f)));
    *v1 = vqtbl1q_s8(table, vshrq_n_u8(v, 4));
}

/* One iq4_xs block: 8 sub-blocks of 32, each a q4_0 nibble group and a 6-bit scale less 32. */
static inline __attribute__((always_inline)) void iq4_xs_block(int RN, const uint8_t *b, const colibri_q8_block *xb, size_t xs,
                                                               float32x4_t *acc0, float32x4_t *acc1, int8x16_t table, dot16_fn dot16)
{
    uint16_t high;
    float d = f16_scale(b);
    int s, t;
    memcpy(&high, b + 2, 2);
    for (s = 0; s < 8; s += 2) {
        int ls0 = ((b[4 + s / 2] & 0x0f) | ((high >> 2 * s) & 3) << 4) - 32;
        int ls1 = ((b[4 + s / 2] >> 4) | ((high >> (2 * s + 2)) & 3) << 4) - 32;
        int8x16_t a0, a1, b0, b1;
        table_values(b + 8 + 16 * s, table, &a0, &a1);
        table_values(b + 24 + 16 * s, table, &b0, &b1);
        for (t = 0; t < RN; t++) {
            const colibri_q8_block *x = xb + t * xs + s;
            acc0[t] = add_scaled(acc0[t], dot32(a0, a1, x, dot16), d * (float)ls0 * x[0].d);
            acc1[t] = add_scaled(acc1[t], dot32(b0, b1, x + 1, dot16), d * (float)ls1 * x[1].d);
        }
    }
}

/* Bits 16 h .. 16 h + 15 of the u32 at q (bit j: weight j's fifth) as 16 bytes, 16 where set. */
static inline uint8x16_t fifth_bits(const uint8_t *q, int h)
{
    static const uint8_t at[2][16] = { { 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1 },
                                       { 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3 } };
    static const uint8_t bit[16] = { 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128 };
    uint32_t bits;
    memcpy(&bits, q, 4);
    return vandq_u8(vtstq_u8(vqtbl1q_u8(vreinterpretq_u8_u32(vdupq_n_u32(bits)), vld1q_u8(at[h])), vld1q_u8(bit)), vdupq_n_u8(16));
}

/* One row of W (blocks activation blocks long) against RN tokens' blocks (xq, `blocks` apart):
 * y (RN tokens, `rows` apart). */
static inline __attribute__((always_inline)) void tile_kq_neon(int RN, float *y, int32_t rows, const uint8_t *w, colibri_dtype dtype,
                                                               const colibri_q8_block *xq, int32_t blocks, size_t block_bytes,
                                                               dot16_fn dot16)
{
    const int8x16_t table = vld1q_s8(dtype == COLIBRI_DTYPE_MXFP4 ? colibri_mxfp4_values : colibri_iq4nl_values);
    size_t xs = (size_t)blocks;
    int32_t b, per = block_bytes < 32 ? 1 : 8;
    float32x4_t acc0[4], acc1[4];
    float mins[4];
    int t;
    for (t = 0; t < RN; t++) { acc0[t] = acc1[t] = vdupq_n_f32(0.0f); mins[t] = 0.0f; }
    for (b = 0; b < blocks; b += per, w += block_bytes) {
        switch (dtype) {
        case COLIBRI_DTYPE_Q4_K: case COLIBRI_DTYPE_Q5_K: k4_block(RN, w, dtype, xq + b, xs, acc0, acc1, mins, dot16); break;
        case COLIBRI_DTYPE_Q6_K: q6_k_block(RN, w, xq + b, xs, acc0, acc1, dot16); break;
        case COLIBRI_DTYPE_Q3_K: q3_k_block(RN, w, xq + b, xs, acc0, acc1, dot16); break;
        case COLIBRI_DTYPE_Q2_K: q2_k_block(RN, w, xq + b, xs, acc0, acc1, mins, dot16); break;
        case COLIBRI_DTYPE_IQ4_XS: iq4_xs_block(RN, w, xq + b, xs, acc0, acc1, table, dot16); break;
        case COLIBRI_DTYPE_Q4_1: case COLIBRI_DTYPE_Q5_0: case COLIBRI_DTYPE_Q5_1: {   /* d q + m; q5_0: d (q - 16) */
            size_t at = dtype == COLIBRI_DTYPE_Q4_1 ? 4 : dtype == COLIBRI_DTYPE_Q5_0 ? 6 : 8;
            uint8x16_t v = vld1q_u8(w + at), lo = vandq_u8(v, vdupq_n_u8(0x0f)), hi = vshrq_n_u8(v, 4);
            float d = f16_scale(w), m = dtype == COLIBRI_DTYPE_Q5_0 ? 0.0f : f16_scale(w + 2);
            int8x16_t w0, w1;
            if (dtype != COLIBRI_DTYPE_Q4_1) { lo = vorrq_u8(lo, fifth_bits(w + at - 4, 0)); hi = vorrq_u8(hi, fifth_bits(w + at - 4, 1)); }
            w0 = s8(lo); w1 = s8(hi);
            if (dtype == COLIBRI_DTYPE_Q5_0) { w0 = vsubq_s8(w0, vdupq_n_s8(16)); w1 = vsubq_s8(w1, vdupq_n_s8(16)); }
            for (t = 0; t < RN; t++) {
                const colibri_q8_block *x = xq + b + t * xs;
                acc0[t] = add_scaled(acc0[t], dot32(w0, w1, x, dot16), d * x->d);
                mins[t] -= m * (x->d * (float)x->sum);
            }
            break;
        }
        default: {   /* iq4_nl, mxfp4: 32 table values, one scale */
            float d = dtype == COLIBRI_DTYPE_IQ4_NL ? f16_scale(w) : colibri_e8m0_half(w[0]);
            int8x16_t v0, v1;
            table_values(w + (dtype == COLIBRI_DTYPE_IQ4_NL ? 2 : 1), table, &v0, &v1);
            for (t = 0; t < RN; t++) acc0[t] = add_scaled(acc0[t], dot32(v0, v1, xq + b + t * xs, dot16), d * xq[b + t * xs].d);
            break;
        }
        }
    }
    for (t = 0; t < RN; t++) y[(size_t)t * rows] = vaddvq_f32(vaddq_f32(acc0[t], acc1[t])) - mins[t];
}

/* y (n, rows) = xq @ W^T for one of those formats (a constant once inlined): row by row, each
 * row against 4 tokens at a time (then the rest one by one) while it is in L1. */
static inline __attribute__((always_inline)) void matmul_kq_neon(float *y, const colibri_q8_block *xq, const uint8_t *w,
                                                                 colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows,
                                                                 size_t block_bytes, dot16_fn dot16)
{
    size_t row_bytes = colibri_row_bytes(dtype, (size_t)cols);
    int32_t r, t, blocks = cols / COLIBRI_BLOCK;
    for (r = 0; r < rows; r++) {
        for (t = 0; t + 4 <= n; t += 4)
            tile_kq_neon(4, y + (size_t)t * rows + r, rows, w + (size_t)r * row_bytes, dtype, xq + (size_t)t * blocks, blocks, block_bytes, dot16);
        for (; t < n; t++)
            tile_kq_neon(1, y + (size_t)t * rows + r, rows, w + (size_t)r * row_bytes, dtype, xq + (size_t)t * blocks, blocks, block_bytes, dot16);
    }
}

/* y (n, rows) = xq @ W^T for q8_0 / q4_0 W; q4_0's nibbles minus 8 are signed bytes like q8_0's. */
static inline void matmul_q8_0_neon(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                                    int32_t n, int32_t cols, int32_t rows, dot16_fn dot16)
{
    size_t row_bytes = colibri_row_bytes(dtype, (size_t)cols), block_bytes = dtype == COLIBRI_DTYPE_Q8_0 ? 34 : 18;
    int32_t r, t, b, blocks = cols / COLIBRI_BLOCK;
    for (r = 0; r < rows; r++) {
        for (t = 0; t < n; t++) {
            const uint8_t *wb = (const uint8_t *)w + (size_t)r * row_bytes;
            const colibri_q8_block *xb = xq + (size_t)t * blocks;
            float32x4_t acc = vdupq_n_f32(0.0f);
            for (b = 0; b < blocks; b++, wb += block_bytes, xb++) {
                int8x16_t w0, w1;
                int32x4_t dot;
                uint16_t h;
                memcpy(&h, wb, 2);
                if (dtype == COLIBRI_DTYPE_Q8_0) {
                    w0 = vld1q_s8((const int8_t *)wb + 2);
                    w1 = vld1q_s8((const int8_t *)wb + 18);
                } else {   /* byte j: weight j (low nibble), weight j + 16 (high) */
                    uint8x16_t v = vld1q_u8(wb + 2);
                    w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
                    w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
                }
                dot = dot16(dot16(vdupq_n_s32(0), w0, vld1q_s8(xb->q)), w1, vld1q_s8(xb->q + 16));
                acc = vfmaq_n_f32(acc, vcvtq_f32_s32(dot), colibri_f16_to_f32(h) * xb->d);
            }
            y[(size_t)t * rows + r] = vaddvq_f32(acc);
        }
    }
}

/* y (n, rows) = xq @ W^T for an int8_path W; every weight a signed byte. */
static inline void matmul_q8_neon_with(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                                       int32_t n, int32_t cols, int32_t rows, dot16_fn dot16)
{
    switch (dtype) {
    case COLIBRI_DTYPE_Q8_0: case COLIBRI_DTYPE_Q4_0: matmul_q8_0_neon(y, xq, w, dtype, n, cols, rows, dot16); return;
    case COLIBRI_DTYPE_Q4_K: matmul_kq_neon(y, xq, w, COLIBRI_DTYPE_Q4_K, n, cols, rows, 144, dot16); return;
    case COLIBRI_DTYPE_Q5_K: matmul_kq_neon(y, xq, w, COLIBRI_DTYPE_Q5_K, n, cols, rows, 176, dot16); return;
    case COLIBRI_DTYPE_Q6_K: matmul_kq_neon(y, xq, w, COLIBRI_DTYPE_Q6_K, n, cols, rows, 210, dot16); return;
    case COLIBRI_DTYPE_Q3_K: matmul_kq_neon(y, xq, w, COLIBRI_DTYPE_Q3_K, n, cols, rows, 110, dot16); return;
    case COLIBRI_DTYPE_Q2_K: matmul_kq_neon(y, xq, w, COLIBRI_DTYPE_Q2_K, n, cols, rows, 84, dot16); return;
    case COLIBRI_DTYPE_IQ4_XS: matmul_kq_neon(y, xq, w, COLIBRI_DTYPE_IQ4_XS, n, cols, rows, 136, dot16); return;
    case COLIBRI_DTYPE_IQ4_NL: matmul_kq_neon(y, xq, w, COLIBRI_DTYPE_IQ4_NL, n, cols, rows, 18, dot16); return;
    case COLIBRI_DTYPE_Q4_1: matmul_kq_neon(y, xq, w, COLIBRI_DTYPE_Q4_1, n, cols, rows, 20, dot16); return;
    case COLIBRI_DTYPE_Q5_0: matmul_kq_neon(y, xq, w, COLIBRI_DTYPE_Q5_0, n, cols, rows, 22, dot16); return;
    case COLIBRI_DTYPE_Q5_1: matmul_kq_neon(y, xq, w, COLIBRI_DTYPE_Q5_1, n, cols, rows, 24, dot16); return;
    case COLIBRI_DTYPE_Q4_0X8: case COLIBRI_DTYPE_Q8_0X8: matmul_x8_neon(y, xq, w, dtype, n, cols, rows); return;
    case COLIBRI_DTYPE_MXFP4: matmul_kq_neon(y, xq, w, COLIBRI_DTYPE_MXFP4, n, cols, rows, 17, dot16); return;
    default: colibri_ref_matmul_q8(y, xq, w, dtype, n, cols, rows); return;   /* the other interleaved formats */
    }
}

#endif
