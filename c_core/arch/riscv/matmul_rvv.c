/* SPDX-License-Identifier: MIT */
/* RISC-V Vector 1.0 kernels, vector-length agnostic: every loop takes its vl from vsetvl, so one
 * binary runs at any VLEN (V guarantees >= 128: e8m1 holds 16 bytes, e8m2 32, e8m4 64, e32m8 32 floats),
 * tails included.  Compiled with V (clang 14's intrinsics, their pre-1.0 names); called only after
 * colibri_cpu_has_rvv() said yes.  The int8 path is exact: each block's dot product is an integer
 * reduction and the scales are applied in block order, in the scalar int8 path's expressions
 * (scalar code, an ordered vfredosum, or for the 8 rows of q8_0x8 / q4_0x8 one lane each):
 * matmul_q8 gives the bits of colibri_ref_matmul_q8 at every VLEN, for every int8-path format.
 * Each kernel is tested against ops/reference.c. */
#if defined(__riscv_vector)
#include <riscv_vector.h>
#include <math.h>
#include <string.h>

#include "../arch.h"
#include "../../src/ops/quant_tables.h"

static inline float f16_scale(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return colibri_f16_to_f32(h);
}

/* f16 bits (one per u32 lane) as f32, exact, in integer and one float multiply (clang 14 has no
 * zvfh): exponent and mantissa moved into place read as a float are 2^-112 of the value, for
 * normals and (as float subnormals) for f16 subnormals alike; inf and nan get exponent 255. */
static inline vfloat32m4_t f16_to_f32(vuint32m4_t h, size_t vl)
{
    vuint32m4_t sign = vsll_vx_u32m4(vand_vx_u32m4(h, 0x8000u, vl), 16, vl);
    vuint32m4_t mag = vsll_vx_u32m4(vand_vx_u32m4(h, 0x7fffu, vl), 13, vl);
    vuint32m4_t bits = vreinterpret_v_f32m4_u32m4(vfmul_vf_f32m4(vreinterpret_v_u32m4_f32m4(mag), 0x1p112f, vl));
    bits = vmerge_vvm_u32m4(vmsgeu_vx_u32m4_b8(mag, 0x0f800000u, vl), bits, vor_vx_u32m4(mag, 0x7f800000u, vl), vl);
    return vreinterpret_v_u32m4_f32m4(vor_vv_u32m4(bits, sign, vl));
}

/* ---- the int8 path ---- */

/* xq (n, cols / 32) = x (n, cols) in blocks of 32, as colibri_ref_quantize_q8: max |x| by
 * vfredmax, q = x / d converted in the default rounding mode (to nearest, ties to even: what
 * round_even does), narrowed to bytes. */
static void quantize_q8(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    int32_t b, blocks = n * (cols / COLIBRI_BLOCK);
    size_t vl = vsetvl_e32m8(COLIBRI_BLOCK);
    vfloat32m1_t zero = vfmv_v_f_f32m1(0.0f, 1);
    vint32m1_t izero = vmv_v_x_i32m1(0, 1);
    for (b = 0; b < blocks; b++, x += COLIBRI_BLOCK, xq++) {
        vfloat32m8_t v = vle32_v_f32m8(x, vl);
        vint32m8_t q;
        float id;
        xq->d = vfmv_f_s_f32m1_f32(vfredmax_vs_f32m8_f32m1(zero, vfabs_v_f32m8(v, vl), zero, vl)) / 127.0f;
        id = xq->d != 0.0f ? 1.0f / xq->d : 0.0f;
        q = vfcvt_x_f_v_i32m8(vfmul_vf_f32m8(v, id, vl), vl);
        xq->sum = vmv_x_s_i32m1_i32(vredsum_vs_i32m8_i32m1(izero, q, izero, vl));
        vse8_v_i8m2(xq->q, vncvt_x_x_w_i8m2(vncvt_x_x_w_i16m4(q, vl), vl), vl);
    }
}

/* The sum of the first vl int16 lanes of p, exactly, as int32. */
static inline int32_t sum16(vint16m4_t p, size_t vl)
{
    vint32m1_t zero = vmv_v_x_i32m1(0, 1);
    return vmv_x_s_i32m1_i32(vwredsum_vs_i16m4_i32m1(zero, p, zero, vl));
}

/* sum w (32) q (32) of one weight group (signed bytes) and one activation block: int8 products
 * are int16 (|w q| <= 128 * 127), summed into int32. */
static inline int32_t dot32(vint8m2_t w, const int8_t *q)
{
    return sum16(vwmul_vv_i16m4(w, vle8_v_i8m2(q, 32), 32), 32);
}

/* The same for a group in two halves of 16 (q4_0's nibble order: lo the first 16 weights, hi the
 * rest): two products per int16 lane, |w| <= 128 so at most 2 * 128 * 127. */
static inline int32_t dot16x2(vint8m1_t lo, vint8m1_t hi, const int8_t *q)
{
    vint32m1_t zero = vmv_v_x_i32m1(0, 1);
    vint16m2_t p = vwmul_vv_i16m2(lo, vle8_v_i8m1(q, 16), 16);
    p = vwmacc_vv_i16m2(p, hi, vle8_v_i8m1(q + 16, 16), 16);
    return vmv_x_s_i32m1_i32(vwredsum_vs_i16m2_i32m1(zero, p, zero, 16));
}

/* One activation block's term, in colibri_ref_matmul_q8's expression: idot = scale[0] dot[0] +
 * scale[1] dot[1], m the sub-block's min, msum the mins' dot with q. */
static inline float add_group(float acc, const colibri_q8_block *xb, float d, int32_t idot, float m, int32_t msum)
{
    return acc + xb->d * (d * (float)idot - m * (float)msum);
}

/* A q4_0 nibble group (16 bytes: weight j low, j + 16 high) through a 16-entry table. */
static inline int32_t table_dot(const uint8_t *nibbles, vint8m1_t table, const int8_t *q)
{
    vuint8m1_t v = vle8_v_u8m1(nibbles, 16);
    return dot16x2(vrgather_vv_i8m1(table, vand_vx_u8m1(v, 0x0f, 16), 16), vrgather_vv_i8m1(table, vsrl_vx_u8m1(v, 4, 16), 16), q);
}

/* One q4_k or q5_k block (256 weights, 8 sub-blocks of 32, one activation block each). */
static inline __attribute__((always_inline)) float k4_block(float acc, const uint8_t *b, int q5, const colibri_q8_block *xb)
{
    const uint8_t *qs = b + (q5 ? 48 : 16);
    vuint8m2_t qh = vle8_v_u8m2(b + 16, 32);   /* q5_k's fifth bits: bit g of byte j (q4_k: unused) */
    float d = f16_scale(b), dmin = f16_scale(b + 2);
    uint8_t sm[16];
    int g;
    k4_unpack(b + 4, sm);
    for (g = 0; g < 8; g++, xb++) {
        vuint8m2_t v = vle8_v_u8m2(qs + g / 2 * 32, 32);
        v = g % 2 ? vsrl_vx_u8m2(v, 4, 32) : vand_vx_u8m2(v, 0x0f, 32);
        if (q5) v = vor_vv_u8m2(v, vsll_vx_u8m2(vand_vx_u8m2(vsrl_vx_u8m2(qh, (size_t)g, 32), 1, 32), 4, 32), 32);
        acc = add_group(acc, xb, d, sm[g] * dot32(vreinterpret_v_u8m2_i8m2(v), xb->q), dmin * (float)sm[8 + g], xb->sum);
    }
    return acc;
}

/* One q6_k block: two halves of 128, each 64 bytes of low nibbles and 32 of 2-bit pairs; per
 * activation block two int8 scales, one for each 16 (dot[1] is the whole dot less dot[0]). */
static inline float q6_k_block(float acc, const uint8_t *b, const colibri_q8_block *xb)
{
    float d = f16_scale(b + 208);
    int g;
    for (g = 0; g < 8; g++, xb++) {
        int h = g / 4, r0 = g % 4 * 32;
        vuint8m2_t lo = vle8_v_u8m2(b + h * 64 + r0 % 64, 32), hi = vle8_v_u8m2(b + 128 + h * 32, 32);
        vint8m2_t wq;
        vint16m4_t p;
        int32_t all, dot0;
        lo = vand_vx_u8m2(vsrl_vx_u8m2(lo, (size_t)(r0 / 64 * 4), 32), 0x0f, 32);
        hi = vand_vx_u8m2(vsrl_vx_u8m2(hi, (size_t)(g % 4 * 2), 32), 3, 32);
        wq = vsub_vx_i8m2(vreinterpret_v_u8m2_i8m2(vor_vv_u8m2(lo, vsll_vx_u8m2(hi, 4, 32), 32)), 32, 32);
        p = vwmul_vv_i16m4(wq, vle8_v_i8m2(xb->q, 32), 32);
        all = sum16(p, 32);
        dot0 = sum16(p, 16);
        acc = add_group(acc, xb, d, (int8_t)b[192 + 2 * g] * dot0 + (int8_t)b[193 + 2 * g] * (all - dot0), 0.0f, xb->sum);
    }
    return acc;
}

/* Group g's 32 two-bit quants of a q2_k or q3_k block (64 bytes at qs, 4 groups a 32 bytes). */
static inline vuint8m2_t quants2(const uint8_t *qs, int g)
{
    return vand_vx_u8m2(vsrl_vx_u8m2(vle8_v_u8m2(qs + g / 4 * 32, 32), (size_t)(g % 4 * 2), 32), 3, 32);
}

/* scale[0] dot (first 16) + scale[1] dot (the rest) of 32 weights and an activation block. */
static inline int32_t dot_halves(vint8m2_t w, const int8_t *q, int s0, int s1)
{
    vint16m4_t p = vwmul_vv_i16m4(w, vle8_v_i8m2(q, 32), 32);
    int32_t all = sum16(p, 32), dot0 = sum16(p, 16);
    return s0 * dot0 + s1 * (all - dot0);
}

/* One q2_k block: per 16 weights a 4-bit scale (low nibble) and min (high) of d and dmin; the
 * mins' dot with q from the first 16 activations' sum. */
static inline float q2_k_block(float acc, const uint8_t *b, const colibri_q8_block *xb)
{
    float d = f16_scale(b + 80), dmin = f16_scale(b + 82);
    vint16m1_t zero = vmv_v_x_i16m1(0, 1);
    int g;
    for (g = 0; g < 8; g++, xb++) {
        int32_t q0 = vmv_x_s_i16m1_i16(vwredsum_vs_i8m1_i16m1(zero, vle8_v_i8m1(xb->q, 16), zero, 16));   /* |q0| <= 16 * 127 */
        int32_t idot = dot_halves(vreinterpret_v_u8m2_i8m2(quants2(b + 16, g)), xb->q, b[2 * g] & 0x0f, b[2 * g + 1] & 0x0f);
        acc = add_group(acc, xb, d, idot, dmin, (b[2 * g] >> 4) * q0 + (b[2 * g + 1] >> 4) * (xb->sum - q0));
    }
    return acc;
}

/* One q3_k block: a quant less 4 where its bit in the 32 mask bytes is clear; per 16 a 6-bit scale
 * less 32 (int8_group's unpacking). */
static inline float q3_k_block(float acc, const uint8_t *b, const colibri_q8_block *xb)
{
    vuint8m2_t hm = vle8_v_u8m2(b, 32);
    float d = f16_scale(b + 108);
    int g, k, sc[2];
    for (g = 0; g < 8; g++, xb++) {
        vuint8m2_t v = vor_vv_u8m2(quants2(b + 32, g), vsll_vx_u8m2(vand_vx_u8m2(vsrl_vx_u8m2(hm, (size_t)g, 32), 1, 32), 2, 32), 32);
        for (k = 2 * g; k < 2 * g + 2; k++)
            sc[k % 2] = (((k < 8 ? b[96 + k] : b[96 + k - 8] >> 4) & 0x0f) | ((b[104 + k % 4] >> (k / 4 * 2)) & 3) << 4) - 32;
        acc = add_group(acc, xb, d, dot_halves(vsub_vx_i8m2(vreinterpret_v_u8m2_i8m2(v), 4, 32), xb->q, sc[0], sc[1]), 0.0f, xb->sum);
    }
    return acc;
}

/* One iq4_xs block: 8 sub-blocks of 32, each a q4_0 nibble group and a 6-bit scale less 32. */
static inline float iq4_xs_block(float acc, const uint8_t *b, const colibri_q8_block *xb, vint8m1_t table)
{
    float d = f16_scale(b);
    int g;
    for (g = 0; g < 8; g++, xb++) {
        int sc = ((b[4 + g / 2] >> (g % 2 * 4)) & 0x0f) | ((b[2 + g / 4] >> (g % 4 * 2)) & 3) << 4;
        acc = add_group(acc, xb, d, (sc - 32) * table_dot(b + 8 + g * 16, table, xb->q), 0.0f, xb->sum);
    }
    return acc;
}

/* acc + the blocks' terms f16 scale * dx * (float)dot, added in block order: the products
 * elementwise (each one IEEE multiply, as the scalar path's), the sum by vfredosum, which adds
 * element 0 first and rounds after each: the scalar loop's sums, bit for bit.  The n weight scales
 * lie `stride` bytes apart from w, the activation blocks' from xb. */
static inline float add_blocks(float acc, const uint8_t *w, size_t stride, const colibri_q8_block *xb, const int32_t *dots, int32_t n)
{
    vfloat32m1_t sum = vfmv_v_f_f32m1(acc, 1);
    size_t i, vl, end = (size_t)n;
    for (i = 0; i < end; i += vl) {
        vfloat32m4_t d, dx;
        vl = vsetvl_e32m4(end - i);
        d = f16_to_f32(vzext_vf2_u32m4(vlse16_v_u16m2((const uint16_t *)(const void *)(w + i * stride), (ptrdiff_t)stride, vl), vl), vl);
        dx = vlse32_v_f32m4(&xb[i].d, (ptrdiff_t)sizeof *xb, vl);
        sum = vfredosum_vs_f32m4_f32m1(sum, vfmul_vv_f32m4(vfmul_vv_f32m4(d, dx, vl), vfcvt_f_x_v_f32m4(vle32_v_i32m4(dots + i, vl), vl), vl),
                                       sum, vl);
    }
    return vfmv_f_s_f32m1_f32(sum);
}

/* y (n, rows) = xq @ W^T for q8_0 / q4_0 W: per block pair an integer dot, CHUNK blocks at a time,
 * then their terms in the scalar int8 path's order (add_blocks). */
#define CHUNK 64
static inline __attribute__((always_inline)) void matmul_q8_0(float *y, const colibri_q8_block *xq, const uint8_t *w, int q4,
                                                              int32_t n, int32_t cols, int32_t rows)
{
    size_t block_bytes = q4 ? 18 : 34, row_bytes = (size_t)(cols / COLIBRI_BLOCK) * block_bytes;
    int32_t r, t, b, c, blocks = cols / COLIBRI_BLOCK, dots[CHUNK];
    for (r = 0; r < rows; r++) {
        for (t = 0; t < n; t++) {
            const colibri_q8_block *xb = xq + (size_t)t * blocks;
            const uint8_t *wb = w + (size_t)r * row_bytes;
            float acc = 0.0f;
            for (c = 0; c < blocks; c += CHUNK, wb += CHUNK * block_bytes, xb += CHUNK) {
                int32_t count = blocks - c < CHUNK ? blocks - c : CHUNK;
                for (b = 0; b < count; b++) {
                    const uint8_t *q = wb + (size_t)b * block_bytes + 2;
                    if (q4) {   /* byte j: weight j (low nibble), weight j + 16 (high), less 8 */
                        vuint8m1_t v = vle8_v_u8m1(q, 16);
                        dots[b] = dot16x2(vsub_vx_i8m1(vreinterpret_v_u8m1_i8m1(vand_vx_u8m1(v, 0x0f, 16)), 8, 16),
                                          vsub_vx_i8m1(vreinterpret_v_u8m1_i8m1(vsrl_vx_u8m1(v, 4, 16)), 8, 16), xb[b].q);
                    } else {
                        dots[b] = dot32(vle8_v_i8m2((const int8_t *)q, 32), xb[b].q);
                    }
                }
                acc = add_blocks(acc, wb, block_bytes, xb, dots, count);
            }
            y[(size_t)t * rows + r] = acc;
        }
    }
}

/* The integer dot of one block of a 32-weight format but q8_0 / q4_0 with an activation block
 * (int8_group's weights, scale 1). */
static inline __attribute__((always_inline)) int32_t dot_32(const uint8_t *b, colibri_dtype dtype, const int8_t *q, vint8m1_t table)
{
    size_t at = dtype == COLIBRI_DTYPE_Q4_1 ? 4 : dtype == COLIBRI_DTYPE_Q5_0 ? 6 : 8;   /* the nibbles */
    vuint8m1_t v, lo, hi;
    if (dtype == COLIBRI_DTYPE_IQ4_NL || dtype == COLIBRI_DTYPE_MXFP4) return table_dot(b + (dtype == COLIBRI_DTYPE_MXFP4 ? 1 : 2), table, q);
    v = vle8_v_u8m1(b + at, 16);
    lo = vand_vx_u8m1(v, 0x0f, 16);
    hi = vsrl_vx_u8m1(v, 4, 16);
    if (dtype != COLIBRI_DTYPE_Q4_1) {   /* the fifth bits: bit j of the 32 before the nibbles is weight j's, a mask */
        lo = vor_vx_u8m1_m(vlm_v_b8(b + at - 4, 16), lo, lo, 16, 16);
        hi = vor_vx_u8m1_m(vlm_v_b8(b + at - 2, 16), hi, hi, 16, 16);
    }
    if (dtype == COLIBRI_DTYPE_Q5_0) return dot16x2(vsub_vx_i8m1(vreinterpret_v_u8m1_i8m1(lo), 16, 16),
                                                   vsub_vx_i8m1(vreinterpret_v_u8m1_i8m1(hi), 16, 16), q);
    return dot16x2(vreinterpret_v_u8m1_i8m1(lo), vreinterpret_v_u8m1_i8m1(hi), q);
}

/* acc + the blocks' terms dx (d dot - m sum) (add_group's), in block order by vfredosum as
 * add_blocks: d the f16 at w (mxfp4: the E8M0 byte's colibri_e8m0_half), m minus the f16 after it
 * for q4_1 / q5_1, else 0 (its term left out: only a zero's sign could differ, and a zero added
 * to a sum that starts at +0 leaves no sign). */
static inline __attribute__((always_inline)) float add_terms(float acc, const uint8_t *w, colibri_dtype dtype, size_t stride,
                                                             const colibri_q8_block *xb, const int32_t *dots, int32_t n)
{
    vfloat32m1_t sum = vfmv_v_f_f32m1(acc, 1);
    size_t i, vl, end = (size_t)n;
    for (i = 0; i < end; i += vl) {
        vfloat32m4_t d, t;
        vl = vsetvl_e32m4(end - i);
        if (dtype == COLIBRI_DTYPE_MXFP4) {   /* 2^(e - 128): e < 2 a subnormal */
            vuint32m4_t e = vzext_vf4_u32m4(vlse8_v_u8m1(w + i * stride, (ptrdiff_t)stride, vl), vl);
            vuint32m4_t bits = vsll_vx_u32m4(vsub_vx_u32m4(e, 1, vl), 23, vl);
            bits = vmerge_vvm_u32m4(vmsltu_vx_u32m4_b8(e, 2, vl), bits, vsll_vv_u32m4(vmv_v_x_u32m4(0x00200000u, vl), e, vl), vl);
            d = vreinterpret_v_u32m4_f32m4(bits);
        } else {
            d = f16_to_f32(vzext_vf2_u32m4(vlse16_v_u16m2((const uint16_t *)(const void *)(w + i * stride), (ptrdiff_t)stride, vl), vl), vl);
        }
        t = vfmul_vv_f32m4(d, vfcvt_f_x_v_f32m4(vle32_v_i32m4(dots + i, vl), vl), vl);
        if (dtype == COLIBRI_DTYPE_Q4_1 || dtype == COLIBRI_DTYPE_Q5_1) {   /* d dot - (-f16) sum, i.e. + f16 sum */
            vfloat32m4_t m = f16_to_f32(vzext_vf2_u32m4(vlse16_v_u16m2((const uint16_t *)(const void *)(w + i * stride + 2), (ptrdiff_t)stride, vl), vl), vl);
            t = vfadd_vv_f32m4(t, vfmul_vv_f32m4(m, vfcvt_f_x_v_f32m4(vlse32_v_i32m4(&xb[i].sum, (ptrdiff_t)sizeof *xb, vl), vl), vl), vl);
        }
        t = vfmul_vv_f32m4(vlse32_v_f32m4(&xb[i].d, (ptrdiff_t)sizeof *xb, vl), t, vl);
        sum = vfredosum_vs_f32m4_f32m1(sum, t, sum, vl);
    }
    return vfmv_f_s_f32m1_f32(sum);
}

/* y (n, rows) = xq @ W^T for q4_1, q5_0, q5_1, iq4_nl or mxfp4 W (a constant once inlined): the
 * dots CHUNK blocks at a time, then their terms (add_terms). */
static inline __attribute__((always_inline)) void matmul_32(float *y, const colibri_q8_block *xq, const uint8_t *w, colibri_dtype dtype,
                                                            int32_t n, int32_t cols, int32_t rows)
{
    const vint8m1_t table = vle8_v_i8m1(dtype == COLIBRI_DTYPE_MXFP4 ? colibri_mxfp4_values : colibri_iq4nl_values, 16);
    size_t block_bytes = (size_t)colibri_dtypes[dtype].block_bytes, row_bytes = (size_t)(cols / COLIBRI_BLOCK) * block_bytes;
    int32_t r, t, b, c, blocks = cols / COLIBRI_BLOCK, dots[CHUNK];
    for (r = 0; r < rows; r++) {
        for (t = 0; t < n; t++) {
            const colibri_q8_block *xb = xq + (size_t)t * blocks;
            const uint8_t *wb = w + (size_t)r * row_bytes;
            float acc = 0.0f;
            for (c = 0; c < blocks; c += CHUNK, wb += CHUNK * block_bytes, xb += CHUNK) {
                int32_t count = blocks - c < CHUNK ? blocks - c : CHUNK;
                for (b = 0; b < count; b++) dots[b] = dot_32(wb + (size_t)b * block_bytes, dtype, xb[b].q, table);
                acc = add_terms(acc, wb, dtype, block_bytes, xb, dots, count);
            }
            y[(size_t)t * rows + r] = acc;
        }
    }
}

/* y (n, rows) = xq @ W^T for a format of 256-weight blocks (a constant once inlined). */
static inline __attribute__((always_inline)) void matmul_k(float *y, const colibri_q8_block *xq, const uint8_t *w, colibri_dtype dtype,
                                                           size_t block_bytes, int32_t n, int32_t cols, int32_t rows)
{
    const vint8m1_t table = vle8_v_i8m1(colibri_iq4nl_values, 16);
    size_t row_bytes = (size_t)(cols / 256) * block_bytes;
    int32_t r, t, b, blocks = cols / COLIBRI_BLOCK;
    for (r = 0; r < rows; r++) {
        for (t = 0; t < n; t++) {
            const uint8_t *wb = w + (size_t)r * row_bytes;
            const colibri_q8_block *xb = xq + (size_t)t * blocks;
            float acc = 0.0f;
            for (b = 0; b < blocks; b += 8, wb += block_bytes, xb += 8) {
                if (dtype == COLIBRI_DTYPE_Q6_K) acc = q6_k_block(acc, wb, xb);
                else if (dtype == COLIBRI_DTYPE_IQ4_XS) acc = iq4_xs_block(acc, wb, xb, table);
                else if (dtype == COLIBRI_DTYPE_Q3_K) acc = q3_k_block(acc, wb, xb);
                else if (dtype == COLIBRI_DTYPE_Q2_K) acc = q2_k_block(acc, wb, xb);
                else acc = k4_block(acc, wb, dtype == COLIBRI_DTYPE_Q5_K, xb);
            }
            y[(size_t)t * rows + r] = acc;
        }
    }
}

/* ---- q8_0x8 / q4_0x8: the 8 rows of a group at once ---- */

/* Chunk c of a group block (64 bytes, docs/FORMAT.md) holds 8 quants of each row, row i's in
 * lanes 8i..8i+7; the activations they meet, the same 8 for every row, are x's 8 bytes from 8 k
 * (element k of x read as 64-bit elements) in every row's lanes. */
static inline vint8m4_t spread8(vint64m4_t x64, size_t k)
{
    return vreinterpret_v_i64m4_i8m4(vrgather_vx_i64m4(x64, k, 8));
}

/* The 8 rows' dots from int16 products p (64 lanes, row i's in 8i..8i+7): three steps that add
 * each pair of neighbouring lanes, each pair read as one lane twice as wide (low half the even
 * lane) narrowed to its halves: exact, the first widening. */
static inline vint32m2_t row_sums(vint16m8_t p)
{
    vint32m8_t w = vreinterpret_v_i16m8_i32m8(p);
    vint64m8_t s = vreinterpret_v_i32m8_i64m8(vwadd_vv_i32m8(vnsra_wx_i16m4(w, 0, 32), vnsra_wx_i16m4(w, 16, 32), 32));   /* row i: 4i.. */
    vint64m4_t t = vreinterpret_v_i32m4_i64m4(vadd_vv_i32m4(vnsra_wx_i32m4(s, 0, 16), vnsra_wx_i32m4(s, 32, 16), 16));   /* 2i.. */
    return vadd_vv_i32m2(vnsra_wx_i32m2(t, 0, 8), vnsra_wx_i32m2(t, 32, 8), 8);
}

/* q4_0x8's nibbles (64 bytes), low or high, less 8 */
static inline vint8m4_t nibbles8(vuint8m4_t v, int high)
{
    return vsub_vx_i8m4(vreinterpret_v_u8m4_i8m4(high ? vsrl_vx_u8m4(v, 4, 64) : vand_vx_u8m4(v, 0x0f, 64)), 8, 64);
}

/* y (n, rows) = xq @ W^T, W q8_0x8 or q4_0x8 (rows % 8 == 0): per group block 8 integer dots,
 * then each row's term f16 d * dx * dot added in its own lane, in block order (elementwise: the
 * scalar int8 path's sums, row by row). */
static inline __attribute__((always_inline)) void matmul_x8(float *y, const colibri_q8_block *xq, const uint8_t *w, int q4,
                                                            int32_t n, int32_t cols, int32_t rows)
{
    size_t group_block = q4 ? 144 : 272, group_bytes = (size_t)(cols / COLIBRI_BLOCK) * group_block;
    int32_t g, t, b, blocks = cols / COLIBRI_BLOCK;
    for (g = 0; g < rows / 8; g++) {
        for (t = 0; t < n; t++) {
            const uint8_t *gb = w + (size_t)g * group_bytes;
            const colibri_q8_block *xb = xq + (size_t)t * blocks;
            vfloat32m2_t acc = vfmv_v_f_f32m2(0.0f, 8);
            for (b = 0; b < blocks; b++, gb += group_block, xb++) {
                vint64m4_t x64 = vreinterpret_v_i8m4_i64m4(vle8_v_i8m4(xb->q, 32));
                vint32m2_t dots;
                vfloat32m2_t d;
                if (q4) {   /* chunk c: low nibbles weights 8c.., high ones 8c + 16..; |p| <= 4 * 8 * 127 */
                    vuint8m4_t v0 = vle8_v_u8m4(gb + 16, 64), v1 = vle8_v_u8m4(gb + 80, 64);
                    vint16m8_t p = vwmul_vv_i16m8(nibbles8(v0, 0), spread8(x64, 0), 64);
                    p = vwmacc_vv_i16m8(p, nibbles8(v0, 1), spread8(x64, 2), 64);
                    p = vwmacc_vv_i16m8(p, nibbles8(v1, 0), spread8(x64, 1), 64);
                    p = vwmacc_vv_i16m8(p, nibbles8(v1, 1), spread8(x64, 3), 64);
                    dots = row_sums(p);
                } else {    /* two chunks' products per int16 lane at most: 2 * 128 * 127 */
                    const int8_t *q = (const int8_t *)gb + 16;
                    vint16m8_t p = vwmacc_vv_i16m8(vwmul_vv_i16m8(vle8_v_i8m4(q, 64), spread8(x64, 0), 64), vle8_v_i8m4(q + 64, 64),
                                                   spread8(x64, 1), 64);
                    dots = row_sums(p);
                    p = vwmacc_vv_i16m8(vwmul_vv_i16m8(vle8_v_i8m4(q + 128, 64), spread8(x64, 2), 64), vle8_v_i8m4(q + 192, 64),
                                        spread8(x64, 3), 64);
                    dots = vadd_vv_i32m2(dots, row_sums(p), 8);
                }
                d = vlmul_trunc_v_f32m4_f32m2(f16_to_f32(vzext_vf2_u32m4(vle16_v_u16m2((const uint16_t *)(const void *)gb, 8), 8), 8));
                acc = vfadd_vv_f32m2(acc, vfmul_vv_f32m2(vfmul_vf_f32m2(d, xb->d, 8), vfcvt_f_x_v_f32m2(dots, 8), 8), 8);
            }
            vse32_v_f32m2(y + (size_t)t * rows + 8 * g, acc, 8);
        }
    }
}

static void matmul_q8(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                      int32_t n, int32_t cols, int32_t rows)
{
    switch (dtype) {
    case COLIBRI_DTYPE_Q8_0: matmul_q8_0(y, xq, w, 0, n, cols, rows); return;
    case COLIBRI_DTYPE_Q4_0: matmul_q8_0(y, xq, w, 1, n, cols, rows); return;
    case COLIBRI_DTYPE_Q8_0X8: matmul_x8(y, xq, w, 0, n, cols, rows); return;
    case COLIBRI_DTYPE_Q4_0X8: matmul_x8(y, xq, w, 1, n, cols, rows); return;
    case COLIBRI_DTYPE_Q4_1: matmul_32(y, xq, w, COLIBRI_DTYPE_Q4_1, n, cols, rows); return;
    case COLIBRI_DTYPE_Q5_0: matmul_32(y, xq, w, COLIBRI_DTYPE_Q5_0, n, cols, rows); return;
    case COLIBRI_DTYPE_Q5_1: matmul_32(y, xq, w, COLIBRI_DTYPE_Q5_1, n, cols, rows); return;
    case COLIBRI_DTYPE_IQ4_NL: matmul_32(y, xq, w, COLIBRI_DTYPE_IQ4_NL, n, cols, rows); return;
    case COLIBRI_DTYPE_MXFP4: matmul_32(y, xq, w, COLIBRI_DTYPE_MXFP4, n, cols, rows); return;
    case COLIBRI_DTYPE_Q4_K: matmul_k(y, xq, w, COLIBRI_DTYPE_Q4_K, 144, n, cols, rows); return;
    case COLIBRI_DTYPE_Q5_K: matmul_k(y, xq, w, COLIBRI_DTYPE_Q5_K, 176, n, cols, rows); return;
    case COLIBRI_DTYPE_Q6_K: matmul_k(y, xq, w, COLIBRI_DTYPE_Q6_K, 210, n, cols, rows); return;
    case COLIBRI_DTYPE_IQ4_XS: matmul_k(y, xq, w, COLIBRI_DTYPE_IQ4_XS, 136, n, cols, rows); return;
    case COLIBRI_DTYPE_Q3_K: matmul_k(y, xq, w, COLIBRI_DTYPE_Q3_K, 110, n, cols, rows); return;
    case COLIBRI_DTYPE_Q2_K: matmul_k(y, xq, w, COLIBRI_DTYPE_Q2_K, 84, n, cols, rows); return;
    default: colibri_ref_matmul_q8(y, xq, w, dtype, n, cols, rows); return;
    }
}

/* ---- the float path ---- */

/* vl weights of row w from c, as floats. */
static inline vfloat32m4_t load_f32(const void *w, colibri_dtype dtype, size_t c, size_t vl)
{
    vuint32m4_t h;
    if (dtype == COLIBRI_DTYPE_F32) return vle32_v_f32m4((const float *)w + c, vl);
    h = vzext_vf2_u32m4(vle16_v_u16m2((const uint16_t *)w + c, vl), vl);
    if (dtype == COLIBRI_DTYPE_BF16) return vreinterpret_v_u32m4_f32m4(vsll_vx_u32m4(h, 16, vl));
    return f16_to_f32(h, vl);
}

/* One float dot product: row wr of W (dtype) . xt (cols), VLMAX lanes at a time, then the tail's
 * products summed after them (the accumulator's tail lanes are never left to the policy). */
static float dot_row(const uint8_t *wr, colibri_dtype dtype, const float *xt, int32_t cols)
{
    size_t vlmax = vsetvlmax_e32m4(), c = 0, end = (size_t)cols;
    vfloat32m4_t acc = vfmv_v_f_f32m4(0.0f, vlmax);
    vfloat32m1_t sum = vfmv_v_f_f32m1(0.0f, 1);
    for (; c + vlmax <= end; c += vlmax)
        acc = vfmacc_vv_f32m4(acc, load_f32(wr, dtype, c, vlmax), vle32_v_f32m4(xt + c, vlmax), vlmax);
    sum = vfredosum_vs_f32m4_f32m1(sum, acc, sum, vlmax);
    if (c < end) {
        size_t vl = vsetvl_e32m4(end - c);
        sum = vfredosum_vs_f32m4_f32m1(sum, vfmul_vv_f32m4(load_f32(wr, dtype, c, vl), vle32_v_f32m4(xt + c, vl), vl), sum, vl);
    }
    return vfmv_f_s_f32m1_f32(sum);
}

/* 16 signed weights times x (16), into s. */
static inline vfloat32m4_t fma16(vfloat32m4_t s, vint8m1_t q, const float *x)
{
    return vfmacc_vv_f32m4(s, vfcvt_f_x_v_f32m4(vsext_vf4_i32m4(q, 16), 16), vle32_v_f32m4(x, 16), 16);
}

/* x (cols) . one row of q8_0, q4_0 or w4g128 blocks (w4a16: x stays float): each block's products
 * in one accumulator, added in times the block's scale. */
static float dot_blocks(const uint8_t *row, colibri_dtype dtype, const float *x, int32_t cols)
{
    size_t block = (size_t)colibri_dtypes[dtype].block, block_bytes = (size_t)colibri_dtypes[dtype].block_bytes, g;
    vfloat32m4_t acc = vfmv_v_f_f32m4(0.0f, 16);
    vfloat32m1_t sum = vfmv_v_f_f32m1(0.0f, 1);
    int32_t b;
    for (b = 0; b < cols / (int32_t)block; b++, row += block_bytes, x += block) {
        vfloat32m4_t s = vfmv_v_f_f32m4(0.0f, 16);
        if (dtype == COLIBRI_DTYPE_Q8_0) {
            s = fma16(s, vle8_v_i8m1((const int8_t *)row + 2, 16), x);
            s = fma16(s, vle8_v_i8m1((const int8_t *)row + 18, 16), x + 16);
        } else {
            for (g = 0; g < block / 32; g++) {   /* q4_0 nibble groups: weight j low, j + 16 high, less 8 */
                vuint8m1_t v = vle8_v_u8m1(row + 2 + 16 * g, 16);
                s = fma16(s, vsub_vx_i8m1(vreinterpret_v_u8m1_i8m1(vand_vx_u8m1(v, 0x0f, 16)), 8, 16), x + 32 * g);
                s = fma16(s, vsub_vx_i8m1(vreinterpret_v_u8m1_i8m1(vsrl_vx_u8m1(v, 4, 16)), 8, 16), x + 32 * g + 16);
            }
        }
        acc = vfmacc_vf_f32m4(acc, f16_scale(row), s, 16);
    }
    return vfmv_f_s_f32m1_f32(vfredosum_vs_f32m4_f32m1(sum, acc, sum, 16));
}

/* y (n, rows) = x (n, cols) @ W (rows, cols)^T; the formats without kernels here take the reference. */
static void matmul_rvv(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows)
{
    if (colibri_dtype_simd(dtype) != COLIBRI_SIMD_ALL) { colibri_ref_matmul(y, x, w, dtype, n, cols, rows); return; }
    colibri_matmul_by_rows(y, x, w, dtype, n, cols, rows, colibri_dtype_is_block(dtype) ? dot_blocks : dot_row);
}

/* y (dim) = x / sqrt(mean(x^2) + eps) * w; block-format weights take the reference. */
static void rmsnorm(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t dim, float eps)
{
    size_t i, vl, end = (size_t)dim;
    float scale;
    if (colibri_dtype_is_block(dtype)) { colibri_ref_rmsnorm(y, x, w, dtype, dim, eps); return; }
    scale = 1.0f / sqrtf(dot_row((const uint8_t *)x, COLIBRI_DTYPE_F32, x, dim) / (float)dim + eps);
    for (i = 0; i < end; i += vl) {
        vl = vsetvl_e32m4(end - i);
        vse32_v_f32m4(y + i, vfmul_vv_f32m4(load_f32(w, dtype, i, vl), vfmul_vf_f32m4(vle32_v_f32m4(x + i, vl), scale, vl), vl), vl);
    }
}

/* scores (span) = scale * K q: one vector dot product per key; the f16 and q8_0 caches take the
 * reference. */
static void attention_scores(float *scores, const float *q, const void *k_cache, colibri_dtype dtype, size_t stride,
                             int32_t span, int32_t hd, float scale)
{
    const float *k = k_cache;
    int32_t j;
    if (dtype != COLIBRI_DTYPE_F32) { colibri_ref_attention_scores(scores, q, k_cache, dtype, stride, span, hd, scale); return; }
    for (j = 0; j < span; j++, k += stride) scores[j] = dot_row((const uint8_t *)k, COLIBRI_DTYPE_F32, q, hd) * scale;
}

/* out (hd) = p @ V: VLMAX outputs at a time in a register, over every row; the f16 and q8_0
 * caches take the reference. */
static void attention_values(float *out, const float *p, const void *v_cache, colibri_dtype dtype, size_t stride,
                             int32_t span, int32_t hd)
{
    const float *v = v_cache;
    size_t i, vl, end = (size_t)hd;
    int32_t j;
    if (dtype != COLIBRI_DTYPE_F32) { colibri_ref_attention_values(out, p, v_cache, dtype, stride, span, hd); return; }
    for (i = 0; i < end; i += vl) {
        const float *vj = v + i;
        vfloat32m8_t o;
        vl = vsetvl_e32m8(end - i);
        o = vfmv_v_f_f32m8(0.0f, vl);
        for (j = 0; j < span; j++, vj += stride) o = vfmacc_vf_f32m8(o, p[j], vle32_v_f32m8(vj, vl), vl);
        vse32_v_f32m8(out + i, o, vl);
    }
}

/* exp(x), vl at a time: the NEON variant's exp4 (x = n ln2 + r, Cephes' degree-7 polynomial for
 * exp(r), within 2 ulp, times 2^n in the exponent bits; x clamped to [-87.3, 88]). */
static inline vfloat32m4_t exp_v(vfloat32m4_t x, size_t vl)
{
    vfloat32m4_t r, p, nf;
    vint32m4_t n;
    x = vfmin_vf_f32m4(vfmax_vf_f32m4(x, -87.3f, vl), 88.0f, vl);
    n = vfcvt_x_f_v_i32m4(vfmul_vf_f32m4(x, 1.44269504f, vl), vl);
    nf = vfcvt_f_x_v_f32m4(n, vl);
    r = vfnmsac_vf_f32m4(x, 0.693359375f, nf, vl);
    r = vfnmsac_vf_f32m4(r, -2.12194440e-4f, nf, vl);
    p = vfmadd_vv_f32m4(vfmv_v_f_f32m4(1.9875691500e-4f, vl), r, vfmv_v_f_f32m4(1.3981999507e-3f, vl), vl);
    p = vfmadd_vv_f32m4(p, r, vfmv_v_f_f32m4(8.3334519073e-3f, vl), vl);
    p = vfmadd_vv_f32m4(p, r, vfmv_v_f_f32m4(4.1665795894e-2f, vl), vl);
    p = vfmadd_vv_f32m4(p, r, vfmv_v_f_f32m4(1.6666665459e-1f, vl), vl);
    p = vfmadd_vv_f32m4(p, r, vfmv_v_f_f32m4(5.0000001201e-1f, vl), vl);
    p = vfmadd_vv_f32m4(p, vfmul_vv_f32m4(r, r, vl), vfadd_vf_f32m4(r, 1.0f, vl), vl);
    return vfmul_vv_f32m4(p, vreinterpret_v_i32m4_f32m4(vsll_vx_i32m4(vadd_vx_i32m4(n, 127, vl), 23, vl)), vl);
}

static void softmax(float *x, int32_t n)
{
    size_t i, vl, end = (size_t)n;
    vfloat32m1_t max = vfmv_v_f_f32m1(x[0], 1), sum = vfmv_v_f_f32m1(0.0f, 1);
    float m, inv;
    for (i = 0; i < end; i += vl) {
        vl = vsetvl_e32m4(end - i);
        max = vfredmax_vs_f32m4_f32m1(max, vle32_v_f32m4(x + i, vl), max, vl);
    }
    m = vfmv_f_s_f32m1_f32(max);
    for (i = 0; i < end; i += vl) {
        vfloat32m4_t e;
        vl = vsetvl_e32m4(end - i);
        e = exp_v(vfsub_vf_f32m4(vle32_v_f32m4(x + i, vl), m, vl), vl);
        vse32_v_f32m4(x + i, e, vl);
        sum = vfredosum_vs_f32m4_f32m1(sum, e, sum, vl);
    }
    inv = 1.0f / vfmv_f_s_f32m1_f32(sum);
    for (i = 0; i < end; i += vl) {
        vl = vsetvl_e32m4(end - i);
        vse32_v_f32m4(x + i, vfmul_vf_f32m4(vle32_v_f32m4(x + i, vl), inv, vl), vl);
    }
}

/* g (n) <- g u / (1 + exp(-g)) */
static void silu_mul(float *g, const float *u, size_t n)
{
    size_t i, vl;
    for (i = 0; i < n; i += vl) {
        vfloat32m4_t v;
        vl = vsetvl_e32m4(n - i);
        v = vle32_v_f32m4(g + i, vl);
        vse32_v_f32m4(g + i, vfdiv_vv_f32m4(vfmul_vv_f32m4(v, vle32_v_f32m4(u + i, vl), vl),
                                            vfadd_vf_f32m4(exp_v(vfneg_v_f32m4(v, vl), vl), 1.0f, vl), vl), vl);
    }
}

static const colibri_kernels rvv_kernels = {
    .name = "rvv", .matmul = matmul_rvv, .rmsnorm = rmsnorm, .quantize_q8 = quantize_q8, .matmul_q8 = matmul_q8,
    .attention_scores = attention_scores, .attention_values = attention_values, .softmax = softmax, .silu_mul = silu_mul,
};

/* rvv's int8 path alone, the rest the reference's: whole-model logits with the bits of
 * reference-int8's, at every VLEN (tests/test_targets.py); never picked as the best. */
static const colibri_kernels rvv_int8_kernels = { .name = "rvv-int8", .quantize_q8 = quantize_q8, .matmul_q8 = matmul_q8 };

const colibri_kernels *colibri_kernels_rvv(void) { return &rvv_kernels; }
const colibri_kernels *colibri_kernels_rvv_int8(void) { return &rvv_int8_kernels; }
#else
typedef int colibri_rvv_needs_the_vector_extension;   /* meson compiles this file only with V's flags */
#endif
