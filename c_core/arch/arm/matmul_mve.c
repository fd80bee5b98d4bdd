/* SPDX-License-Identifier: MIT */
/* Helium (MVE, Armv8.1-M's vector extension with float: the Cortex-M55) kernels.  Vectors are 128
 * bits, 4 floats or 16 bytes, in 8 registers; loads take a lane predicate (vctp32q), so the float
 * dot products' and rmsnorm's tails are the last vector's lanes switched off rather than a scalar
 * loop.  Vector loads of halves and floats need their element's alignment: tensors lie 64 bytes
 * aligned (docs/FORMAT.md), activations are floats.  MVE has no across-vector float add and no
 * vector divide: sums are reduced lane by lane in a fixed order (sum4), divides are scalar.
 * The int8 path gives the scalar int8 path's bits: quantize_q8 rounds as colibri_ref_quantize_q8
 * does, and matmul_q8's block dots are exact integers whose float terms are added in
 * colibri_ref_matmul_q8's expression and order.  Built only where the compiler targets MVE with
 * float (c_core/meson.build).  Each kernel is tested against ops/reference.c. */
#include <arm_mve.h>
#include <math.h>
#include <string.h>

#include "../arch.h"

/* The 4 lanes of a added in one fixed order. */
static inline float sum4(float32x4_t a)
{
    return (vgetq_lane_f32(a, 0) + vgetq_lane_f32(a, 1)) + (vgetq_lane_f32(a, 2) + vgetq_lane_f32(a, 3));
}

/* f16 bits (one per 32-bit lane, high half 0) as f32: vcvtb widens each lane's bottom half,
 * exactly (subnormals too).  In asm on q0 alone: Debian's binutils 2.40 encodes vcvtb.f32.f16
 * q1, q2 with the registers doubled (q2, q4), so vcvtbq_f32_f16 would read and clobber the wrong
 * ones; register 0 doubled is still 0. */
static inline __attribute__((always_inline)) float32x4_t f16_to_f32(uint32x4_t h)
{
    register float32x4_t q0 __asm__("q0") = vreinterpretq_f32_u32(h);
    __asm__("vcvtb.f32.f16 q0, q0" : "+w"(q0));
    return q0;
}

/* 4 weights of row w from c as floats, lanes off in p read as 0 (and not read at all):
 * f16 and bf16 widened on load, each half in the low half of its 32-bit lane. */
static inline __attribute__((always_inline)) float32x4_t load4_z(const void *w, colibri_dtype dtype, size_t c, mve_pred16_t p)
{
    if (dtype == COLIBRI_DTYPE_F32) return vld1q_z_f32((const float *)w + c, p);
    {
        uint32x4_t h = vldrhq_z_u32((const uint16_t *)w + c, p);
        if (dtype == COLIBRI_DTYPE_F16) return f16_to_f32(h);
        return vreinterpretq_f32_u32(vshlq_n_u32(h, 16));   /* bf16 */
    }
}

/* The same, every lane on (no predicate to set). */
static inline __attribute__((always_inline)) float32x4_t load4(const void *w, colibri_dtype dtype, size_t c)
{
    if (dtype == COLIBRI_DTYPE_F32) return vld1q_f32((const float *)w + c);
    {
        uint32x4_t h = vldrhq_u32((const uint16_t *)w + c);
        if (dtype == COLIBRI_DTYPE_F16) return f16_to_f32(h);
        return vreinterpretq_f32_u32(vshlq_n_u32(h, 16));
    }
}

/* row wr of W (f32, f16 or bf16: a constant once inlined) . xt (cols): four 4-lane accumulators,
 * the last columns by predicated loads into the first. */
static inline __attribute__((always_inline)) float dot_with(const uint8_t *wr, colibri_dtype dtype, const float *xt, int32_t cols)
{
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int32_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        a0 = vfmaq_f32(a0, load4(wr, dtype, (size_t)c), vld1q_f32(xt + c));
        a1 = vfmaq_f32(a1, load4(wr, dtype, (size_t)c + 4), vld1q_f32(xt + c + 4));
        a2 = vfmaq_f32(a2, load4(wr, dtype, (size_t)c + 8), vld1q_f32(xt + c + 8));
        a3 = vfmaq_f32(a3, load4(wr, dtype, (size_t)c + 12), vld1q_f32(xt + c + 12));
    }
    for (; c < cols; c += 4) {   /* lanes past cols: 0 * 0 */
        mve_pred16_t p = vctp32q((uint32_t)(cols - c));
        a0 = vfmaq_f32(a0, load4_z(wr, dtype, (size_t)c, p), vld1q_z_f32(xt + c, p));
    }
    return sum4(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
}

static float dot_row(const uint8_t *wr, colibri_dtype dtype, const float *xt, int32_t cols)
{
    if (dtype == COLIBRI_DTYPE_F32) return dot_with(wr, COLIBRI_DTYPE_F32, xt, cols);
    if (dtype == COLIBRI_DTYPE_F16) return dot_with(wr, COLIBRI_DTYPE_F16, xt, cols);
    return dot_with(wr, COLIBRI_DTYPE_BF16, xt, cols);
}

static int float_weights(colibri_dtype dtype)
{
    return dtype == COLIBRI_DTYPE_F32 || dtype == COLIBRI_DTYPE_F16 || dtype == COLIBRI_DTYPE_BF16;
}

/* y (n, rows) = x (n, cols) @ W (rows, cols)^T for f32 / f16 / bf16 W; the other formats take the
 * reference. */
static void matmul_mve(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows)
{
    if (!float_weights(dtype)) { colibri_ref_matmul(y, x, w, dtype, n, cols, rows); return; }
    colibri_matmul_by_rows(y, x, w, dtype, n, cols, rows, dot_row);
}

/* ---- the int8 path ---- */

/* max |x| of 32 activations, 4 lanes apart (a max: exact in any order). */
static inline float32x4_t abs_max32(const float *x, float32x4_t m)
{
    int32_t i;
    for (i = 0; i < 8; i++) m = vmaxnmaq_f32(m, vld1q_f32(x + 4 * i));
    return m;
}

/* One block of 32 activations with the scale d: q = x * (1 / d) converted to nearest, ties to
 * even (colibri_ref_quantize_q8's round_even), each int32 lane stored as its low byte. */
static inline void quantize_block(colibri_q8_block *xq, const float *x, float d)
{
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t i, sum = 0;
    xq->d = d;
    for (i = 0; i < 8; i++) {
        int32x4_t q = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 4 * i), id));
        sum = vaddvaq_s32(sum, q);
        vstrbq_s32(xq->q + 4 * i, q);
    }
    xq->sum = sum;
}

/* xq (n, cols / 32) = x (n, cols) in blocks of 32, d = max |x| / 127 each. */
static void quantize_q8(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    int32_t b, blocks = n * (cols / COLIBRI_BLOCK);
    for (b = 0; b < blocks; b++, x += COLIBRI_BLOCK, xq++)
        quantize_block(xq, x, vmaxnmavq_f32(0.0f, abs_max32(x, vdupq_n_f32(0.0f))) / 127.0f);
}

/* The same, each 256 sharing one d (colibri_ref_quantize_q8_256). */
static void quantize_q8_256(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    int32_t g, b, groups = n * (cols / 256);
    for (g = 0; g < groups; g++, x += 256, xq += 8) {
        float32x4_t m = vdupq_n_f32(0.0f);
        float d;
        for (b = 0; b < 8; b++) m = abs_max32(x + 32 * b, m);
        d = vmaxnmavq_f32(0.0f, m) / 127.0f;
        for (b = 0; b < 8; b++) quantize_block(xq + b, x + 32 * b, d);
    }
}

/* sum w q of one block's 32 weights w0 (0..15), w1 (16..31) and an activation block: int8 products
 * summed across the vector into int32, exactly. */
static inline int32_t dot32(int8x16_t w0, int8x16_t w1, const int8_t *q)
{
    return vmladavaq_s8(vmladavq_s8(w0, vld1q_s8(q)), w1, vld1q_s8(q + 16));
}

/* The same for a q4_0 block's 16 quant bytes v: byte j holds weight j (low nibble) and j + 16
 * (high), less 8. */
static inline int32_t dot32_q4(uint8x16_t v, const int8_t *q)
{
    return dot32(vsubq_n_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), 8),
                 vsubq_n_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), 8), q);
}

/* One q8_0 or q4_0 block's dot, its quants at wq. */
static inline __attribute__((always_inline)) int32_t block_dot(const uint8_t *wq, int q4, const int8_t *q)
{
    return q4 ? dot32_q4(vld1q_u8(wq), q) : dot32(vld1q_s8((const int8_t *)wq), vld1q_s8((const int8_t *)wq + 16), q);
}

/* y (n, rows) = xq @ W^T for q8_0 / q4_0 W, 4 blocks at a time: their integer dots, then the
 * terms f16 d * dx * (float)dot lane by lane (each one IEEE multiply, as the scalar path's: the f16
 * scales gathered and widened exactly, the dx gathered), added to acc in block order: the scalar
 * int8 path's sum, bit for bit.  The last blocks % 4 one by one in its expression (a predicated
 * gather made GCC 12 stop with an internal compiler error). */
static inline __attribute__((always_inline)) void matmul_q8_0(float *y, const colibri_q8_block *xq, const uint8_t *w, int q4,
                                                              int32_t n, int32_t cols, int32_t rows)
{
    const uint32_t block_bytes = q4 ? 18 : 34;
    const uint32x4_t w_at = vmulq_n_u32(vidupq_n_u32(0u, 1), block_bytes);   /* 4 blocks' scales */
    const uint32x4_t x_at = vmulq_n_u32(vidupq_n_u32(0u, 1), (uint32_t)sizeof(colibri_q8_block));
    size_t row_bytes = (size_t)(cols / COLIBRI_BLOCK) * block_bytes;
    int32_t r, t, b, k, blocks = cols / COLIBRI_BLOCK;
    for (r = 0; r < rows; r++) {
        for (t = 0; t < n; t++) {
            const uint8_t *wb = w + (size_t)r * row_bytes;
            const colibri_q8_block *xb = xq + (size_t)t * blocks;
            float acc = 0.0f;
            for (b = 0; b + 4 <= blocks; b += 4, wb += 4 * block_bytes, xb += 4) {
                int32_t dots[4];
                float terms[4];
                for (k = 0; k < 4; k++) dots[k] = block_dot(wb + (size_t)k * block_bytes + 2, q4, xb[k].q);
                vst1q_f32(terms, vmulq_f32(vmulq_f32(f16_to_f32(vldrhq_gather_offset_u32((const uint16_t *)(const void *)wb, w_at)),
                                                     vldrwq_gather_offset_f32(&xb->d, x_at)),
                                           vcvtq_f32_s32(vld1q_s32(dots))));
                for (k = 0; k < 4; k++) acc += terms[k];
            }
            for (; b < blocks; b++, wb += block_bytes, xb++) {
                uint16_t h;
                memcpy(&h, wb, 2);
                acc += colibri_f16_to_f32(h) * xb->d * (float)block_dot(wb + 2, q4, xb->q);
            }
            y[(size_t)t * rows + r] = acc;
        }
    }
}

/* The same for q4_0x8 / q8_0x8 (8 rows' blocks interleaved: colibri_block_at): block b of a group
 * of 8 rows is their 8 scales, then 8-byte chunks, chunk c of row i at 16 + 64 c + 8 i; row i's
 * quants gathered from its chunks, its term in the scalar int8 path's expression, in block order. */
static void matmul_q8_x8(float *y, const colibri_q8_block *xq, const uint8_t *w, int q4, int32_t n, int32_t cols,
                         int32_t rows)
{
    static const uint8_t chunks_at[16] = { 16, 17, 18, 19, 20, 21, 22, 23, 80, 81, 82, 83, 84, 85, 86, 87 };
    const uint8x16_t at = vld1q_u8(chunks_at);   /* row 0's chunks 0, 1; chunks 2, 3 lie 128 on */
    const size_t group_block = 8u * (q4 ? 18u : 34u), row_bytes = (size_t)(cols / COLIBRI_BLOCK) * (q4 ? 18u : 34u);
    int32_t r, t, b, blocks = cols / COLIBRI_BLOCK;
    for (r = 0; r < rows; r++) {
        const uint8_t *group = w + (size_t)(r / 8) * 8 * row_bytes;
        int32_t i = r % 8;
        for (t = 0; t < n; t++) {
            const colibri_q8_block *xb = xq + (size_t)t * blocks;
            const uint8_t *gb = group;
            float acc = 0.0f;
            for (b = 0; b < blocks; b++, gb += group_block, xb++) {
                const uint8_t *quants = gb + 8 * i;
                int32_t dot = q4 ? dot32_q4(vldrbq_gather_offset_u8(quants, at), xb->q)
                                 : dot32(vreinterpretq_s8_u8(vldrbq_gather_offset_u8(quants, at)),
                                         vreinterpretq_s8_u8(vldrbq_gather_offset_u8(quants + 128, at)), xb->q);
                uint16_t h;
                memcpy(&h, gb + 2 * i, 2);
                acc += colibri_f16_to_f32(h) * xb->d * (float)dot;
            }
            y[(size_t)t * rows + r] = acc;
        }
    }
}

/* y (n, rows) = xq @ W^T: q8_0 and q4_0 (plain or x8) here, every other int8-path format the
 * scalar int8 path's. */
static void matmul_q8(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows)
{
    if (dtype == COLIBRI_DTYPE_Q8_0) matmul_q8_0(y, xq, w, 0, n, cols, rows);
    else if (dtype == COLIBRI_DTYPE_Q4_0) matmul_q8_0(y, xq, w, 1, n, cols, rows);
    else if (dtype == COLIBRI_DTYPE_Q8_0X8) matmul_q8_x8(y, xq, w, 0, n, cols, rows);
    else if (dtype == COLIBRI_DTYPE_Q4_0X8) matmul_q8_x8(y, xq, w, 1, n, cols, rows);
    else colibri_ref_matmul_q8(y, xq, w, dtype, n, cols, rows);
}

/* ---- normalisation, attention, activations ---- */

/* y (dim) = x / sqrt(mean(x^2) + eps) * w for f32 / f16 / bf16 w, 4 at a time, the last 1..3 by
 * predicated loads and stores; block-format weights take the reference. */
static void rmsnorm(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t dim, float eps)
{
    float32x4_t ss = vdupq_n_f32(0.0f);
    float scale;
    int32_t i;
    if (!float_weights(dtype)) { colibri_ref_rmsnorm(y, x, w, dtype, dim, eps); return; }
    for (i = 0; i < dim; i += 4) {
        float32x4_t v = vld1q_z_f32(x + i, vctp32q((uint32_t)(dim - i)));
        ss = vfmaq_f32(ss, v, v);
    }
    scale = 1.0f / sqrtf(sum4(ss) / (float)dim + eps);
    for (i = 0; i < dim; i += 4) {
        mve_pred16_t p = vctp32q((uint32_t)(dim - i));
        vst1q_p_f32(y + i, vmulq_f32(load4_z(w, dtype, (size_t)i, p), vmulq_n_f32(vld1q_z_f32(x + i, p), scale)), p);
    }
}

/* scores (span) = scale * K q, four keys at a time (four 4-lane dot products); hd % 4 != 0 and the
 * f16 and q8_0 caches take the reference. */
static void attention_scores(float *scores, const float *q, const void *k_cache, colibri_dtype dtype, size_t stride,
                             int32_t span, int32_t hd, float scale)
{
    const float *k = k_cache;
    int32_t j = 0, i;
    if (hd % 4 || dtype != COLIBRI_DTYPE_F32) {
        colibri_ref_attention_scores(scores, q, k_cache, dtype, stride, span, hd, scale);
        return;
    }
    for (; j + 4 <= span; j += 4, k += 4 * stride) {
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        for (i = 0; i < hd; i += 4) {
            float32x4_t qv = vld1q_f32(q + i);
            a0 = vfmaq_f32(a0, qv, vld1q_f32(k + i));
            a1 = vfmaq_f32(a1, qv, vld1q_f32(k + stride + i));
            a2 = vfmaq_f32(a2, qv, vld1q_f32(k + 2 * stride + i));
            a3 = vfmaq_f32(a3, qv, vld1q_f32(k + 3 * stride + i));
        }
        scores[j] = sum4(a0) * scale;
        scores[j + 1] = sum4(a1) * scale;
        scores[j + 2] = sum4(a2) * scale;
        scores[j + 3] = sum4(a3) * scale;
    }
    for (; j < span; j++, k += stride) {
        float32x4_t a = vdupq_n_f32(0.0f);
        for (i = 0; i < hd; i += 4) a = vfmaq_f32(a, vld1q_f32(q + i), vld1q_f32(k + i));
        scores[j] = sum4(a) * scale;
    }
}

/* out (hd) = p @ V, out in registers 16 floats at a time; hd % 16 != 0 and the f16 and q8_0 caches
 * take the reference. */
static void attention_values(float *out, const float *p, const void *v_cache, colibri_dtype dtype, size_t stride,
                             int32_t span, int32_t hd)
{
    const float *v = v_cache;
    int32_t i, j;
    if (hd % 16 || dtype != COLIBRI_DTYPE_F32) {
        colibri_ref_attention_values(out, p, v_cache, dtype, stride, span, hd);
        return;
    }
    for (i = 0; i < hd; i += 16) {
        float32x4_t o0 = vdupq_n_f32(0.0f), o1 = o0, o2 = o0, o3 = o0;
        const float *vj = v + i;
        for (j = 0; j < span; j++, vj += stride) {
            o0 = vfmaq_n_f32(o0, vld1q_f32(vj), p[j]);
            o1 = vfmaq_n_f32(o1, vld1q_f32(vj + 4), p[j]);
            o2 = vfmaq_n_f32(o2, vld1q_f32(vj + 8), p[j]);
            o3 = vfmaq_n_f32(o3, vld1q_f32(vj + 12), p[j]);
        }
        vst1q_f32(out + i, o0); vst1q_f32(out + i + 4, o1);
        vst1q_f32(out + i + 8, o2); vst1q_f32(out + i + 12, o3);
    }
}

/* exp(x), 4 at a time, as the NEON variant's: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts,
 * so r is exact), a degree-7 polynomial for exp(r) (Cephes' expf coefficients, within 2 ulp), times
 * 2^n built in the exponent bits.  x is clamped to [-87.3, 88]: below, results are tiny normals
 * rather than 0. */
static inline float32x4_t exp4(float32x4_t x)
{
    float32x4_t r, p, nf;
    int32x4_t n;
    x = vminnmq_f32(vmaxnmq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(88.0f));
    n = vcvtnq_s32_f32(vmulq_n_f32(x, 1.44269504f));
    nf = vcvtq_f32_s32(n);
    r = vfmsq_f32(x, nf, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, nf, vdupq_n_f32(-2.12194440e-4f));
    p = vfmasq_n_f32(vdupq_n_f32(1.9875691500e-4f), r, 1.3981999507e-3f);   /* p r + c */
    p = vfmasq_n_f32(p, r, 8.3334519073e-3f);
    p = vfmasq_n_f32(p, r, 4.1665795894e-2f);
    p = vfmasq_n_f32(p, r, 1.6666665459e-1f);
    p = vfmasq_n_f32(p, r, 5.0000001201e-1f);
    p = vfmaq_f32(vaddq_n_f32(r, 1.0f), p, vmulq_f32(r, r));
    return vmulq_f32(p, vreinterpretq_f32_s32(vshlq_n_s32(vaddq_n_s32(n, 127), 23)));
}

/* x (n) <- softmax(x): the max and the exps 4 at a time, the last n % 4 with colibri_expf. */
static void softmax(float *x, int32_t n)
{
    float32x4_t vmax = vdupq_n_f32(x[0]), vsum = vdupq_n_f32(0.0f);
    float max, sum, inv;
    int32_t i;
    for (i = 0; i + 4 <= n; i += 4) vmax = vmaxnmq_f32(vmax, vld1q_f32(x + i));
    max = vmaxnmvq_f32(x[0], vmax);
    for (; i < n; i++) if (x[i] > max) max = x[i];
    for (i = 0; i + 4 <= n; i += 4) {
        float32x4_t e = exp4(vsubq_n_f32(vld1q_f32(x + i), max));
        vst1q_f32(x + i, e);
        vsum = vaddq_f32(vsum, e);
    }
    sum = sum4(vsum);
    for (; i < n; i++) { x[i] = colibri_expf(x[i] - max); sum += x[i]; }
    inv = 1.0f / sum;
    for (i = 0; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_n_f32(vld1q_f32(x + i), inv));
    for (; i < n; i++) x[i] *= inv;
}

/* g (n) <- g u / (1 + exp(-g)): the products and exps 4 at a time, the divides lane by lane (MVE
 * has no vector divide), the last n % 4 with colibri_expf. */
static void silu_mul(float *g, const float *u, size_t n)
{
    size_t i, k;
    for (i = 0; i + 4 <= n; i += 4) {
        float32x4_t v = vld1q_f32(g + i);
        float num[4], den[4];
        vst1q_f32(num, vmulq_f32(v, vld1q_f32(u + i)));
        vst1q_f32(den, vaddq_n_f32(exp4(vnegq_f32(v)), 1.0f));
        for (k = 0; k < 4; k++) g[i + k] = num[k] / den[k];
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + colibri_expf(-g[i])) * u[i];
}

/* latent_query and latent_scores: the reference's (dispatch.c fills them). */
static const colibri_kernels mve_kernels = {
    .name = "mve", .matmul = matmul_mve, .rmsnorm = rmsnorm, .quantize_q8 = quantize_q8, .quantize_q8_256 = quantize_q8_256,
    .matmul_q8 = matmul_q8, .attention_scores = attention_scores, .attention_values = attention_values, .softmax = softmax,
    .silu_mul = silu_mul,
};

/* mve's int8 path alone, the rest the reference's: whole-model logits with the bits of
 * reference-int8's (tests/test_firmware.py); never picked as the best. */
static const colibri_kernels mve_int8_kernels = {
    .name = "mve-int8", .quantize_q8 = quantize_q8, .quantize_q8_256 = quantize_q8_256, .matmul_q8 = matmul_q8,
};

const colibri_kernels *colibri_kernels_mve(void) { return &mve_kernels; }
const colibri_kernels *colibri_kernels_mve_int8(void) { return &mve_int8_kernels; }
