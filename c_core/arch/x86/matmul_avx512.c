/* SPDX-License-Identifier: MIT */
/* AVX-512 kernels (F, BW, VL, VNNI): 16-wide float dot products, and int8 block dots with
 * vpdpbusd.  Called only after colibri_cpu_has_avx512_vnni() said yes; tested against
 * ops/reference.c like every variant. */
#include "q8_x86.h"

/* 16 weights of row w starting at c, as floats. */
static inline __m512 load16(const void *w, colibri_dtype dtype, size_t c)
{
    if (dtype == COLIBRI_DTYPE_F32) return _mm512_loadu_ps((const float *)w + c);
    {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + c));
        if (dtype == COLIBRI_DTYPE_F16) return _mm512_cvtph_ps(h);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));   /* bf16 */
    }
}

/* An RM x RN tile of y for f32 / f16 / bf16 W: each 16 weights converted once
 * for RN tokens, each 16 activations loaded once for RM rows, RM * RN accumulators.  y (RN
 * tokens, y_stride apart) gets the tile. */
static inline __attribute__((always_inline)) void tile_float(int RM, int RN, float *y, size_t y_stride, const uint8_t *w,
                                                             size_t row_bytes, colibri_dtype dtype, const float *x, int32_t cols)
{
    __m512 acc[4][4];
    int32_t r, t;
    size_t c = 0, end = (size_t)cols & ~(size_t)15;
    for (r = 0; r < RM; r++) for (t = 0; t < RN; t++) acc[r][t] = _mm512_setzero_ps();
    for (; c < end; c += 16) {
        __m512 wv[4];
        for (r = 0; r < RM; r++) wv[r] = load16(w + (size_t)r * row_bytes, dtype, c);
        for (t = 0; t < RN; t++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)t * cols + c);
            for (r = 0; r < RM; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
    for (t = 0; t < RN; t++)
        for (r = 0; r < RM; r++) {
            float sum = _mm512_reduce_add_ps(acc[r][t]);
            for (c = end; c < (size_t)cols; c++) sum += colibri_load_f32(w + (size_t)r * row_bytes, dtype, c) * x[(size_t)t * cols + c];
            y[(size_t)t * y_stride + r] = sum;
        }
}

/* The tile of y at rows r.., tokens t..: 4 x 4, else single dots, row after row (one token:
 * decode, where one row streaming at a time keeps DRAM's prefetch ahead; 4 rows at once ran 30%
 * slower).  Every output is one chain of 16-wide FMAs in the same order, whichever tile computed
 * it, so it does not depend on how many tokens came with it. */
static void tile_at(float *y, const float *x, const uint8_t *w, size_t row_bytes, colibri_dtype dtype, int32_t n,
                    int32_t cols, int32_t rows, int32_t r, int32_t t)
{
    int32_t i, j;
    if (rows - r >= 4 && n - t >= 4) {
        tile_float(4, 4, y + (size_t)t * rows + r, (size_t)rows, w + (size_t)r * row_bytes, row_bytes, dtype, x + (size_t)t * cols, cols);
        return;
    }
    for (i = r; i < r + 4 && i < rows; i++)
        for (j = t; j < t + 4 && j < n; j++)
            tile_float(1, 1, y + (size_t)j * rows + i, (size_t)rows, w + (size_t)i * row_bytes, row_bytes, dtype, x + (size_t)j * cols, cols);
}

/* y (n, rows) = x (n, cols) @ W^T, f32 / f16 / bf16 W, in 4 x 4 tiles.  W small
 * enough for L2 (a router): token tiles outside, so each tile of x is read once; else row tiles
 * outside, so each tile of W is. */
static void matmul_tiles(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows)
{
    size_t row_bytes = colibri_row_bytes(dtype, (size_t)cols);
    int32_t r, t;
    if ((size_t)rows * row_bytes <= (256u << 10)) {
        for (t = 0; t < n; t += 4) for (r = 0; r < rows; r += 4) tile_at(y, x, w, row_bytes, dtype, n, cols, rows, r, t);
    } else {
        for (r = 0; r < rows; r += 4) for (t = 0; t < n; t += 4) tile_at(y, x, w, row_bytes, dtype, n, cols, rows, r, t);
    }
}

/* 32 products of one q4_0 nibble group (byte j: weight j low, weight j + 16 high) with x: the
 * nibbles minus 8 as signed bytes, widened 16 at a time. */
static inline __m512 q4_group(const uint8_t *group, const float *x, __m512 s)
{
    __m128i v = _mm_loadu_si128((const __m128i *)group), m = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    __m128i lo = _mm_sub_epi8(_mm_and_si128(v, m), eight), hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m), eight);
    s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), _mm512_loadu_ps(x), s);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), _mm512_loadu_ps(x + 16), s);
}

/* x (cols) . one row of w4g128 blocks, x float (w4a16): four chains per block, one per group. */
static float dot_w4g128(const uint8_t *row, colibri_dtype dtype, const float *x, int32_t cols)
{
    __m512 acc = _mm512_setzero_ps();
    int32_t b;
    (void)dtype;
    for (b = 0; b < cols / 128; b++, row += 66, x += 128) {
        __m512 zero = _mm512_setzero_ps();
        __m512 s0 = q4_group(row + 2, x, zero), s1 = q4_group(row + 18, x + 32, zero);
        __m512 s2 = q4_group(row + 34, x + 64, zero), s3 = q4_group(row + 50, x + 96, zero);
        uint16_t h;
        memcpy(&h, row, 2);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(h)), _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* y (n, rows) = x (n, cols) @ W (rows, cols)^T in tiles.  q8_0 and q4_0 take AVX2's float path (every AVX-512 CPU has
 * AVX2) where a session has no int8 scratch: sessions use matmul_q8. */
static void matmul_avx512(float *y, const float *x, const void *w, colibri_dtype dtype,
                          int32_t n, int32_t cols, int32_t rows)
{
    if (colibri_dtype_simd(dtype) != COLIBRI_SIMD_ALL) colibri_ref_matmul(y, x, w, dtype, n, cols, rows);
    else if (dtype == COLIBRI_DTYPE_W4G128) colibri_matmul_by_rows(y, x, w, dtype, n, cols, rows, dot_w4g128);
    else if (colibri_dtype_is_block(dtype)) colibri_kernels_avx2()->matmul(y, x, w, dtype, n, cols, rows);
    else matmul_tiles(y, x, w, dtype, n, cols, rows);
}

/* vpdpbusd: unsigned bytes times signed bytes, four products summed into each int32 lane. */
static inline __m256i dot_us(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }

/* vpdpwssd: the int16 pairs maddubs makes, times sc16, summed into each int32 lane of acc. */
static inline __m256i dot_scaled(__m256i acc, __m256i u, __m256i s, __m256i sc16)
{
    return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), sc16);
}

/* One token of q5_kx8 or q6_kx8 (decode) takes AVX2's kernel: on the AMD EPYC (Zen 4) these were
 * measured on, 512-bit operations run as two 256-bit halves, and the 512-bit form of their fifth-
 * and sixth-bit shuffling ran 10-20% slower for one token (benchmarks/x8_matmul.c, 2026-12-04); with
 * several, the 4-token tiles win.  The two give the same bits: the same integer sums, the same
 * float operations on them (test_kernels.c checks one token against several). */
static void matmul_q8_avx512(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                             int32_t n, int32_t cols, int32_t rows)
{
    if (n == 1 && (dtype == COLIBRI_DTYPE_Q5_KX8 || dtype == COLIBRI_DTYPE_Q6_KX8))
        colibri_kernels_avx2()->matmul_q8(y, xq, w, dtype, n, cols, rows);
    else matmul_q8_x86(4, 8, y, xq, w, dtype, n, cols, rows, dot_us, dot_scaled);   /* 32 registers: 4 x 4 accumulators; 8 rows of 1 */
}

/* y (dim) = x / sqrt(mean(x^2) + eps) * w, 16 at a time; block-format weights take the reference. */
static void rmsnorm_avx512(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t dim, float eps)
{
    __m512 ss = _mm512_setzero_ps(), scale;
    float sum;
    int32_t i, body = dim & ~15;
    if (colibri_dtype_is_block(dtype)) { colibri_ref_rmsnorm(y, x, w, dtype, dim, eps); return; }
    for (i = 0; i < body; i += 16) ss = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i), ss);
    sum = _mm512_reduce_add_ps(ss);
    for (; i < dim; i++) sum += x[i] * x[i];
    scale = _mm512_set1_ps(1.0f / sqrtf(sum / (float)dim + eps));
    for (i = 0; i < body; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(load16(w, dtype, (size_t)i), _mm512_mul_ps(_mm512_loadu_ps(x + i), scale)));
    for (; i < dim; i++) y[i] = colibri_load_f32(w, dtype, (size_t)i) * (x[i] * _mm512_cvtss_f32(scale));
}

/* The two 8-lane halves of v added. */
static inline __m256 fold16(__m512 v)
{
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* scores (span) = scale * K q, four keys at a time, 16 wide; heads whose size is no multiple of
 * 16, and the f16 and q8_0 caches, take AVX2's. */
static void attention_scores_avx512(float *scores, const float *q, const void *k_cache, colibri_dtype dtype,
                                    size_t stride, int32_t span, int32_t hd, float scale)
{
    const float *k = k_cache;
    int32_t j = 0, i;
    if (hd % 16 || dtype != COLIBRI_DTYPE_F32) {
        colibri_kernels_avx2()->attention_scores(scores, q, k_cache, dtype, stride, span, hd, scale);
        return;
    }
    for (; j + 4 <= span; j += 4, k += 4 * stride) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        __m256 h;
        __m128 s;
        for (i = 0; i < hd; i += 16) {
            __m512 qv = _mm512_loadu_ps(q + i);
            a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + i), a0);
            a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + stride + i), a1);
            a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + 2 * stride + i), a2);
            a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + 3 * stride + i), a3);
        }
        h = _mm256_hadd_ps(_mm256_hadd_ps(fold16(a0), fold16(a1)), _mm256_hadd_ps(fold16(a2), fold16(a3)));
        s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(scores + j, _mm_mul_ps(s, _mm_set1_ps(scale)));
    }
    for (; j < span; j++, k += stride) {
        __m512 a = _mm512_setzero_ps();
        for (i = 0; i < hd; i += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), a);
        scores[j] = _mm512_reduce_add_ps(a) * scale;
    }
}

/* out (hd) = p @ V, out in registers 64 floats at a time; other head sizes, and the f16 and q8_0
 * caches, take AVX2's. */
static void attention_values_avx512(float *out, const float *p, const void *v_cache, colibri_dtype dtype,
                                    size_t stride, int32_t span, int32_t hd)
{
    const float *v = v_cache;
    int32_t i, j;
    if (hd % 64 || dtype != COLIBRI_DTYPE_F32) {
        colibri_kernels_avx2()->attention_values(out, p, v_cache, dtype, stride, span, hd);
        return;
    }
    for (i = 0; i < hd; i += 64) {
        __m512 o0 = _mm512_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
        const float *vj = v + i;
        for (j = 0; j < span; j++, vj += stride) {
            __m512 pj = _mm512_set1_ps(p[j]);
            o0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj), o0);
            o1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 16), o1);
            o2 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 32), o2);
            o3 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 48), o3);
        }
        _mm512_storeu_ps(out + i, o0); _mm512_storeu_ps(out + i + 16, o1);
        _mm512_storeu_ps(out + i + 32, o2); _mm512_storeu_ps(out + i + 48, o3);
    }
}

/* exp(x), 16 at a time: AVX2's exp8 (see there) at twice the width. */
static inline __m512 exp16(__m512 x)
{
    __m512 n, r, p;
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.0f));
    n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    p = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23)));
}

/* The tails (n % 16) run masked: the same polynomial for every element. */
static void softmax_avx512(float *x, int32_t n)
{
    __m512 vmax = _mm512_set1_ps(x[0]), vsum = _mm512_setzero_ps(), vmaxb, inv;
    __mmask16 tail = (__mmask16)((1u << (n % 16)) - 1u);
    int32_t i, body = n - n % 16;
    for (i = 0; i < body; i += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(x + i));
    vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, tail, x + body));
    vmaxb = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    for (i = 0; i < body; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmaxb));
        _mm512_storeu_ps(x + i, e);
        vsum = _mm512_add_ps(vsum, e);
    }
    if (tail) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + body), vmaxb));
        _mm512_mask_storeu_ps(x + body, tail, e);
        vsum = _mm512_mask_add_ps(vsum, tail, vsum, e);
    }
    inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
    for (i = 0; i < body; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
    if (tail) _mm512_mask_storeu_ps(x + body, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + body), inv));
}

static void silu_mul_avx512(float *g, const float *u, size_t n)
{
    size_t i;
    for (i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(m, g + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), v));
        _mm512_mask_storeu_ps(g + i, m, _mm512_div_ps(_mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, u + i)), _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
    }
}

/* q_latent (rank) = Wk (dn, rank)^T q_nope (dn), f32 / f16 / bf16 Wk: 64 outputs held in registers
 * down the dn rows, each a chain of FMAs in row order; other formats and ranks (rank % 16) take AVX2's. */
static void latent_query_avx512(float *q_latent, const float *q_nope, const void *wk, colibri_dtype dtype, int32_t dn,
                                int32_t rank)
{
    size_t row = colibri_row_bytes(dtype, (size_t)rank);
    int32_t r = 0, i;
    if ((dtype != COLIBRI_DTYPE_F32 && dtype != COLIBRI_DTYPE_F16 && dtype != COLIBRI_DTYPE_BF16) || rank % 16) {
        colibri_kernels_avx2()->latent_query(q_latent, q_nope, wk, dtype, dn, rank);
        return;
    }
    for (; r + 64 <= rank; r += 64) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const uint8_t *w = wk;
        for (i = 0; i < dn; i++, w += row) {
            __m512 q = _mm512_set1_ps(q_nope[i]);
            a0 = _mm512_fmadd_ps(q, load16(w, dtype, (size_t)r), a0);
            a1 = _mm512_fmadd_ps(q, load16(w, dtype, (size_t)r + 16), a1);
            a2 = _mm512_fmadd_ps(q, load16(w, dtype, (size_t)r + 32), a2);
            a3 = _mm512_fmadd_ps(q, load16(w, dtype, (size_t)r + 48), a3);
        }
        _mm512_storeu_ps(q_latent + r, a0); _mm512_storeu_ps(q_latent + r + 16, a1);
        _mm512_storeu_ps(q_latent + r + 32, a2); _mm512_storeu_ps(q_latent + r + 48, a3);
    }
    for (; r < rank; r += 16) {
        __m512 a = _mm512_setzero_ps();
        const uint8_t *w = wk;
        for (i = 0; i < dn; i++, w += row) a = _mm512_fmadd_ps(_mm512_set1_ps(q_nope[i]), load16(w, dtype, (size_t)r), a);
        _mm512_storeu_ps(q_latent + r, a);
    }
}

/* scores (span) = scale * (C q_latent + K_rope q_rope), four positions at a time, 16 wide, the
 * rotary tail (dr % 16) masked; ranks that are no multiple of 16 take AVX2's. */
static void latent_scores_avx512(float *scores, const float *q_latent, const float *q_rope, const float *latent,
                                 const float *k_rope, int32_t span, int32_t rank, int32_t dr, float scale)
{
    int32_t j = 0, i;
    if (rank % 16) { colibri_kernels_avx2()->latent_scores(scores, q_latent, q_rope, latent, k_rope, span, rank, dr, scale); return; }
    for (; j + 4 <= span; j += 4) {
        const float *c = latent + (size_t)j * rank, *p = k_rope + (size_t)j * dr;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, qv;
        __m256 h;
        __m128 s;
        for (i = 0; i < rank; i += 16) {
            qv = _mm512_loadu_ps(q_latent + i);
            a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(c + i), a0);
            a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(c + rank + i), a1);
            a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(c + 2 * (size_t)rank + i), a2);
            a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(c + 3 * (size_t)rank + i), a3);
        }
        for (i = 0; i < dr; i += 16) {
            __mmask16 m = dr - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (dr - i)) - 1u);
            qv = _mm512_maskz_loadu_ps(m, q_rope + i);
            a0 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, p + i), a0);
            a1 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, p + dr + i), a1);
            a2 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, p + 2 * (size_t)dr + i), a2);
            a3 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, p + 3 * (size_t)dr + i), a3);
        }
        h = _mm256_hadd_ps(_mm256_hadd_ps(fold16(a0), fold16(a1)), _mm256_hadd_ps(fold16(a2), fold16(a3)));
        s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(scores + j, _mm_mul_ps(s, _mm_set1_ps(scale)));
    }
    for (; j < span; j++) {
        const float *c = latent + (size_t)j * rank, *p = k_rope + (size_t)j * dr;
        __m512 a = _mm512_setzero_ps();
        for (i = 0; i < rank; i += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(q_latent + i), _mm512_loadu_ps(c + i), a);
        for (i = 0; i < dr; i += 16) {
            __mmask16 m = dr - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (dr - i)) - 1u);
            a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q_rope + i), _mm512_maskz_loadu_ps(m, p + i), a);
        }
        scores[j] = _mm512_reduce_add_ps(a) * scale;
    }
}

static const colibri_kernels avx512_kernels = {
    .name = "avx512", .matmul = matmul_avx512, .rmsnorm = rmsnorm_avx512, .quantize_q8 = quantize_q8_x86,
    .quantize_q8_256 = quantize_q8_256_x86,
    .matmul_q8 = matmul_q8_avx512, .attention_scores = attention_scores_avx512,
    .attention_values = attention_values_avx512, .softmax = softmax_avx512, .silu_mul = silu_mul_avx512,
    .latent_query = latent_query_avx512, .latent_scores = latent_scores_avx512,
};

const colibri_kernels *colibri_kernels_avx512(void) { return &avx512_kernels; }
