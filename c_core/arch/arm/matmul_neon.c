/* SPDX-License-Identifier: MIT */
/* NEON kernels (AArch64, where Advanced SIMD is part of the base architecture).
 * Each is tested against ops/reference.c. */
#include "q8_neon.h"

/* 4 weights of row w starting at c, as floats. */
static inline float32x4_t load4(const void *w, colibri_dtype dtype, size_t c)
{
    if (dtype == COLIBRI_DTYPE_F32) return vld1q_f32((const float *)w + c);
    {
        uint16x4_t h = vld1_u16((const uint16_t *)w + c);
        if (dtype == COLIBRI_DTYPE_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
        return vreinterpretq_f32_u32(vshll_n_u16(h, 16));   /* bf16 */
    }
}

/* 16 quants of a block (int8, or nibbles already minus 8) times x (16), into acc. */
static inline float32x4_t fma16(float32x4_t acc, int8x16_t q, const float *x)
{
    int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
    acc = vfmaq_f32(acc, vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), vld1q_f32(x));
    acc = vfmaq_f32(acc, vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), vld1q_f32(x + 4));
    acc = vfmaq_f32(acc, vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), vld1q_f32(x + 8));
    return vfmaq_f32(acc, vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), vld1q_f32(x + 12));
}

/* 32 products of one q4_0 nibble group (byte j: weight j low, weight j + 16 high) with x, into acc. */
static inline float32x4_t q4_group(float32x4_t acc, const uint8_t *group, const float *x)
{
    uint8x16_t v = vld1q_u8(group);
    int8x16_t eight = vdupq_n_s8(8);
    acc = fma16(acc, vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), eight), x);
    return fma16(acc, vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight), x + 16);
}

/* x (cols) . one row of q8_0, q4_0 or w4g128 blocks (w4a16: x stays float): each block's products
 * in one accumulator, added in times the block's scale. */
static float dot_blocks(const uint8_t *row, colibri_dtype dtype, const float *x, int32_t cols)
{
    size_t block = (size_t)colibri_dtypes[dtype].block, block_bytes = (size_t)colibri_dtypes[dtype].block_bytes;
    float32x4_t acc = vdupq_n_f32(0.0f);
    int32_t b;
    for (b = 0; b < cols / (int32_t)block; b++, row += block_bytes, x += block) {
        float32x4_t s = vdupq_n_f32(0.0f);
        uint16_t h;
        memcpy(&h, row, 2);
        if (dtype == COLIBRI_DTYPE_Q8_0) {
            s = fma16(s, vld1q_s8((const int8_t *)row + 2), x);
            s = fma16(s, vld1q_s8((const int8_t *)row + 18), x + 16);
        } else if (dtype == COLIBRI_DTYPE_Q4_0) {
            s = q4_group(s, row + 2, x);
        } else {   /* w4g128: four groups, one scale */
            s = q4_group(s, row + 2, x);
            s = q4_group(s, row + 18, x + 32);
            s = q4_group(s, row + 34, x + 64);
            s = q4_group(s, row + 50, x + 96);
        }
        acc = vfmaq_n_f32(acc, s, colibri_f16_to_f32(h));
    }
    return vaddvq_f32(acc);
}

/* One float dot product: row wr of W (dtype) . xt (cols). */
static float dot_row(const uint8_t *wr, colibri_dtype dtype, const float *xt, int32_t cols)
{
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    size_t c = 0, end = (size_t)cols;
    float acc;
    for (; c + 16 <= end; c += 16) {
        a0 = vfmaq_f32(a0, load4(wr, dtype, c), vld1q_f32(xt + c));
        a1 = vfmaq_f32(a1, load4(wr, dtype, c + 4), vld1q_f32(xt + c + 4));
        a2 = vfmaq_f32(a2, load4(wr, dtype, c + 8), vld1q_f32(xt + c + 8));
        a3 = vfmaq_f32(a3, load4(wr, dtype, c + 12), vld1q_f32(xt + c + 12));
    }
    for (; c + 4 <= end; c += 4) a0 = vfmaq_f32(a0, load4(wr, dtype, c), vld1q_f32(xt + c));
    acc = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; c < end; c++) acc += colibri_load_f32(wr, dtype, c) * xt[c];
    return acc;
}

/* y (n, rows) = x (n, cols) @ W (rows, cols)^T: four 4-wide accumulators per dot product; the
 * formats without kernels here take the reference. */
static void matmul_neon(float *y, const float *x, const void *w, colibri_dtype dtype,
                        int32_t n, int32_t cols, int32_t rows)
{
    if (colibri_dtype_simd(dtype) != COLIBRI_SIMD_ALL) { colibri_ref_matmul(y, x, w, dtype, n, cols, rows); return; }
    colibri_matmul_by_rows(y, x, w, dtype, n, cols, rows, colibri_dtype_is_block(dtype) ? dot_blocks : dot_row);
}

/* 16 by 16 signed bytes into 4 int32: widening multiplies, pairs summed.  No int16 overflows:
 * activations lie in [-127, 127], so a pair is at most 2 * 128 * 127. */
static int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    return vpadalq_s16(acc, vmlal_s8(p, vget_high_s8(a), vget_high_s8(b)));
}

static void matmul_q8(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                      int32_t n, int32_t cols, int32_t rows)
{
    matmul_q8_neon_with(y, xq, w, dtype, n, cols, rows, dot16);
}

/* 4 elements of a KV cache row from i (i % 4 == 0), as floats: f32, f16, or q8_0 as d * q (exact). */
static inline float32x4_t kv4(const uint8_t *row, colibri_dtype dtype, int32_t i)
{
    const uint8_t *block = row + (size_t)(i / 32) * 34;
    int8x8_t q8;
    uint32_t quads;
    uint16_t d;
    if (dtype != COLIBRI_DTYPE_Q8_0) return load4(row, dtype, (size_t)i);
    memcpy(&d, block, 2);
    memcpy(&quads, block + 2 + i % 32, 4);
    q8 = vreinterpret_s8_u32(vdup_n_u32(quads));   /* the 4 quants, twice */
    return vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(q8)))), colibri_f16_to_f32(d));
}

/* scores (span) = scale * K q, four keys at a time: four 4-wide dot products, reduced together
 * by pairwise adds.  Inlined once per cache type. */
static inline void scores_typed(float *scores, const float *q, const uint8_t *k, colibri_dtype dtype, size_t row,
                                int32_t span, int32_t hd, float scale)
{
    int32_t j = 0, i;
    for (; j + 4 <= span; j += 4, k += 4 * row) {
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        for (i = 0; i < hd; i += 4) {
            float32x4_t qv = vld1q_f32(q + i);
            a0 = vfmaq_f32(a0, qv, kv4(k, dtype, i));
            a1 = vfmaq_f32(a1, qv, kv4(k + row, dtype, i));
            a2 = vfmaq_f32(a2, qv, kv4(k + 2 * row, dtype, i));
            a3 = vfmaq_f32(a3, qv, kv4(k + 3 * row, dtype, i));
        }
        vst1q_f32(scores + j, vmulq_n_f32(vpaddq_f32(vpaddq_f32(a0, a1), vpaddq_f32(a2, a3)), scale));
    }
    for (; j < span; j++, k += row) {
        float32x4_t a = vdupq_n_f32(0.0f);
        for (i = 0; i < hd; i += 4) a = vfmaq_f32(a, vld1q_f32(q + i), kv4(k, dtype, i));
        scores[j] = vaddvq_f32(a) * scale;
    }
}

static void attention_scores(float *scores, const float *q, const void *k, colibri_dtype dtype, size_t stride,
                             int32_t span, int32_t hd, float scale)
{
    size_t row = colibri_row_bytes(dtype, stride);
    if (hd % 4 || (dtype == COLIBRI_DTYPE_Q8_0 && hd % 32)) {
        colibri_ref_attention_scores(scores, q, k, dtype, stride, span, hd, scale);
        return;
    }
    if (dtype == COLIBRI_DTYPE_F32) scores_typed(scores, q, k, COLIBRI_DTYPE_F32, row, span, hd, scale);
    else if (dtype == COLIBRI_DTYPE_F16) scores_typed(scores, q, k, COLIBRI_DTYPE_F16, row, span, hd, scale);
    else scores_typed(scores, q, k, COLIBRI_DTYPE_Q8_0, row, span, hd, scale);
}

/* out (hd) = p @ V, out in registers 16 floats at a time.  Inlined once per cache type. */
static inline void values_typed(float *out, const float *p, const uint8_t *v, colibri_dtype dtype, size_t row,
                                int32_t span, int32_t hd)
{
    int32_t i, j;
    for (i = 0; i < hd; i += 16) {
        float32x4_t o0 = vdupq_n_f32(0.0f), o1 = o0, o2 = o0, o3 = o0;
        const uint8_t *vj = v;
        for (j = 0; j < span; j++, vj += row) {
            o0 = vfmaq_n_f32(o0, kv4(vj, dtype, i), p[j]);
            o1 = vfmaq_n_f32(o1, kv4(vj, dtype, i + 4), p[j]);
            o2 = vfmaq_n_f32(o2, kv4(vj, dtype, i + 8), p[j]);
            o3 = vfmaq_n_f32(o3, kv4(vj, dtype, i + 12), p[j]);
        }
        vst1q_f32(out + i, o0); vst1q_f32(out + i + 4, o1);
        vst1q_f32(out + i + 8, o2); vst1q_f32(out + i + 12, o3);
    }
}

static void attention_values(float *out, const float *p, const void *v, colibri_dtype dtype, size_t stride,
                             int32_t span, int32_t hd)
{
    size_t row = colibri_row_bytes(dtype, stride);
    if (hd % 16 || (dtype == COLIBRI_DTYPE_Q8_0 && hd % 32)) colibri_ref_attention_values(out, p, v, dtype, stride, span, hd);
    else if (dtype == COLIBRI_DTYPE_F32) values_typed(out, p, v, COLIBRI_DTYPE_F32, row, span, hd);
    else if (dtype == COLIBRI_DTYPE_F16) values_typed(out, p, v, COLIBRI_DTYPE_F16, row, span, hd);
    else values_typed(out, p, v, COLIBRI_DTYPE_Q8_0, row, span, hd);
}

/* y (dim) = x / sqrt(mean(x^2) + eps) * w, 4 at a time; block-format weights take the reference. */
static void rmsnorm(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t dim, float eps)
{
    float32x4_t ss = vdupq_n_f32(0.0f);
    float sum, scale;
    int32_t i, body = dim & ~3;
    if (colibri_dtype_is_block(dtype)) { colibri_ref_rmsnorm(y, x, w, dtype, dim, eps); return; }
    for (i = 0; i < body; i += 4) ss = vfmaq_f32(ss, vld1q_f32(x + i), vld1q_f32(x + i));
    sum = vaddvq_f32(ss);
    for (; i < dim; i++) sum += x[i] * x[i];
    scale = 1.0f / sqrtf(sum / (float)dim + eps);
    for (i = 0; i < body; i += 4) vst1q_f32(y + i, vmulq_f32(load4(w, dtype, (size_t)i), vmulq_n_f32(vld1q_f32(x + i), scale)));
    for (; i < dim; i++) y[i] = colibri_load_f32(w, dtype, (size_t)i) * (x[i] * scale);
}

/* exp(x), 4 at a time: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is exact), a
 * degree-7 polynomial for exp(r) (Cephes' expf coefficients, within 2 ulp), times 2^n built in the
 * exponent bits.  x is clamped to [-87.3, 88]: below, results are tiny normals rather than 0. */
static inline float32x4_t exp4(float32x4_t x)
{
    float32x4_t r, p;
    int32x4_t n;
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(88.0f));
    n = vcvtnq_s32_f32(vmulq_n_f32(x, 1.44269504f));
    r = vfmsq_f32(x, vcvtq_f32_s32(n), vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, vcvtq_f32_s32(n), vdupq_n_f32(-2.12194440e-4f));
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), vdupq_n_f32(1.9875691500e-4f), r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    return vmulq_f32(p, vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n, vdupq_n_s32(127)), 23)));
}

static void softmax(float *x, int32_t n)
{
    float32x4_t vmax = vdupq_n_f32(x[0]), vsum = vdupq_n_f32(0.0f);
    float max, sum, inv;
    int32_t i;
    for (i = 0; i + 4 <= n; i += 4) vmax = vmaxq_f32(vmax, vld1q_f32(x + i));
    max = vmaxvq_f32(vmax);
    for (; i < n; i++) if (x[i] > max) max = x[i];
    for (i = 0; i + 4 <= n; i += 4) {
        float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), vdupq_n_f32(max)));
        vst1q_f32(x + i, e);
        vsum = vaddq_f32(vsum, e);
    }
    sum = vaddvq_f32(vsum);
    for (; i < n; i++) { x[i] = colibri_expf(x[i] - max); sum += x[i]; }
    inv = 1.0f / sum;
    for (i = 0; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_n_f32(vld1q_f32(x + i), inv));
    for (; i < n; i++) x[i] *= inv;
}

static void silu_mul(float *g, const float *u, size_t n)
{
    size_t i;
    for (i = 0; i + 4 <= n; i += 4) {
        float32x4_t v = vld1q_f32(g + i);
        float32x4_t e = exp4(vnegq_f32(v));
        vst1q_f32(g + i, vdivq_f32(vmulq_f32(v, vld1q_f32(u + i)), vaddq_f32(vdupq_n_f32(1.0f), e)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + colibri_expf(-g[i])) * u[i];
}

/* q_latent (rank) = Wk (dn, rank)^T q_nope (dn), f32 / f16 / bf16 Wk: 32 outputs held in registers
 * down the dn rows, each a chain of FMAs in row order as the reference adds them; other formats, and
 * ranks that are no multiple of 4, take the reference. */
static void latent_query(float *q_latent, const float *q_nope, const void *wk, colibri_dtype dtype, int32_t dn, int32_t rank)
{
    size_t row = colibri_row_bytes(dtype, (size_t)rank);
    int32_t r = 0, i, g;
    if ((dtype != COLIBRI_DTYPE_F32 && dtype != COLIBRI_DTYPE_F16 && dtype != COLIBRI_DTYPE_BF16) || rank % 4) {
        colibri_ref_latent_query(q_latent, q_nope, wk, dtype, dn, rank);
        return;
    }
    for (; r + 32 <= rank; r += 32) {
        float32x4_t a[8];
        const uint8_t *w = wk;
        for (g = 0; g < 8; g++) a[g] = vdupq_n_f32(0.0f);
        for (i = 0; i < dn; i++, w += row)
            for (g = 0; g < 8; g++) a[g] = vfmaq_n_f32(a[g], load4(w, dtype, (size_t)r + 4 * g), q_nope[i]);
        for (g = 0; g < 8; g++) vst1q_f32(q_latent + r + 4 * g, a[g]);
    }
    for (; r < rank; r += 4) {
        float32x4_t a = vdupq_n_f32(0.0f);
        const uint8_t *w = wk;
        for (i = 0; i < dn; i++, w += row) a = vfmaq_n_f32(a, load4(w, dtype, (size_t)r), q_nope[i]);
        vst1q_f32(q_latent + r, a);
    }
}

/* scores (span) = scale * (C q_latent + K_rope q_rope), four positions at a time as attention_scores
 * does; rank or dr no multiple of 4 take the reference. */
static void latent_scores(float *scores, const float *q_latent, const float *q_rope, const float *latent,
                          const float *k_rope, int32_t span, int32_t rank, int32_t dr, float scale)
{
    int32_t j = 0, i;
    if (rank % 4 || dr % 4) { colibri_ref_latent_scores(scores, q_latent, q_rope, latent, k_rope, span, rank, dr, scale); return; }
    for (; j + 4 <= span; j += 4) {
        const float *c = latent + (size_t)j * rank, *p = k_rope + (size_t)j * dr;
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0, qv;
        for (i = 0; i < rank; i += 4) {
            qv = vld1q_f32(q_latent + i);
            a0 = vfmaq_f32(a0, qv, vld1q_f32(c + i));
            a1 = vfmaq_f32(a1, qv, vld1q_f32(c + rank + i));
            a2 = vfmaq_f32(a2, qv, vld1q_f32(c + 2 * (size_t)rank + i));
            a3 = vfmaq_f32(a3, qv, vld1q_f32(c + 3 * (size_t)rank + i));
        }
        for (i = 0; i < dr; i += 4) {
            qv = vld1q_f32(q_rope + i);
            a0 = vfmaq_f32(a0, qv, vld1q_f32(p + i));
            a1 = vfmaq_f32(a1, qv, vld1q_f32(p + dr + i));
            a2 = vfmaq_f32(a2, qv, vld1q_f32(p + 2 * (size_t)dr + i));
            a3 = vfmaq_f32(a3, qv, vld1q_f32(p + 3 * (size_t)dr + i));
        }
        vst1q_f32(scores + j, vmulq_n_f32(vpaddq_f32(vpaddq_f32(a0, a1), vpaddq_f32(a2, a3)), scale));
    }
    for (; j < span; j++) {
        const float *c = latent + (size_t)j * rank, *p = k_rope + (size_t)j * dr;
        float32x4_t a = vdupq_n_f32(0.0f);
        for (i = 0; i < rank; i += 4) a = vfmaq_f32(a, vld1q_f32(q_latent + i), vld1q_f32(c + i));
        for (i = 0; i < dr; i += 4) a = vfmaq_f32(a, vld1q_f32(q_rope + i), vld1q_f32(p + i));
        scores[j] = vaddvq_f32(a) * scale;
    }
}

static const colibri_kernels neon_kernels = {
    .name = "neon", .matmul = matmul_neon, .rmsnorm = rmsnorm, .quantize_q8 = quantize_q8_neon, .quantize_q8_256 = quantize_q8_256_neon, .matmul_q8 = matmul_q8,
    .attention_scores = attention_scores, .attention_values = attention_values, .softmax = softmax, .silu_mul = silu_mul,
    .latent_query = latent_query, .latent_scores = latent_scores,
};

const colibri_kernels *colibri_kernels_neon(void) { return &neon_kernels; }
