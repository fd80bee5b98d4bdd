/* SPDX-License-Identifier: MIT */
/* AVX2 + FMA + F16C kernels (x86-64).  Compiled with -mavx2 -mfma -mf16c; called only
 * after colibri_cpu_has_avx2() said yes.  Each is tested against ops/reference.c. */
#include "q8_x86.h"

/* 8 weights of row w starting at c, as floats. */
static inline __m256 load8(const void *w, colibri_dtype dtype, size_t c)
{
    if (dtype == COLIBRI_DTYPE_F32) return _mm256_loadu_ps((const float *)w + c);
    {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + c));
        if (dtype == COLIBRI_DTYPE_F16) return _mm256_cvtph_ps(h);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));   /* bf16 */
    }
}

/* 8 int8 quants as floats. */
static inline __m256 i8x8(const void *q)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

/* 8 nibbles (the low 8 bytes of v, each 0..15) minus 8, as floats. */
static inline __m256 u4x8(__m128i v)
{
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(v), _mm256_set1_epi32(8)));
}

/* 32 products of one q4_0 nibble group (byte j: weight j low, weight j + 16 high) with x, in 8 lanes. */
static inline __m256 q4_group(const uint8_t *group, const float *x, __m256 s)
{
    __m128i v = _mm_loadu_si128((const __m128i *)group), m = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    s = _mm256_fmadd_ps(u4x8(lo), _mm256_loadu_ps(x), s);
    s = _mm256_fmadd_ps(u4x8(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(u4x8(hi), _mm256_loadu_ps(x + 16), s);
    return _mm256_fmadd_ps(u4x8(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), s);
}

/* x (cols) . one row of q8_0, q4_0 or w4g128 blocks (w4a16: x stays float): each block's products
 * summed in one 8-wide accumulator, then added in times the block's scale. */
static float dot_blocks(const uint8_t *row, colibri_dtype dtype, const float *x, int32_t cols)
{
    size_t block = (size_t)colibri_dtypes[dtype].block, block_bytes = (size_t)colibri_dtypes[dtype].block_bytes;
    __m256 acc = _mm256_setzero_ps();
    int32_t b;
    for (b = 0; b < cols / (int32_t)block; b++, row += block_bytes, x += block) {
        __m256 s = _mm256_setzero_ps();
        uint16_t h;
        memcpy(&h, row, 2);
        if (dtype == COLIBRI_DTYPE_Q8_0) {
            s = _mm256_mul_ps(i8x8(row + 2), _mm256_loadu_ps(x));
            s = _mm256_fmadd_ps(i8x8(row + 10), _mm256_loadu_ps(x + 8), s);
            s = _mm256_fmadd_ps(i8x8(row + 18), _mm256_loadu_ps(x + 16), s);
            s = _mm256_fmadd_ps(i8x8(row + 26), _mm256_loadu_ps(x + 24), s);
        } else if (dtype == COLIBRI_DTYPE_Q4_0) {
            s = q4_group(row + 2, x, s);
        } else {   /* w4g128: four groups, one scale */
            s = q4_group(row + 2, x, s);
            s = q4_group(row + 18, x + 32, s);
            s = q4_group(row + 34, x + 64, s);
            s = q4_group(row + 50, x + 96, s);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(h)), s, acc);
    }
    return hsum8(acc);
}

/* One float dot product: row wr of W (dtype) . xt (cols). */
static float dot_row(const uint8_t *wr, colibri_dtype dtype, const float *xt, int32_t cols)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t c = 0, end = (size_t)cols;
    float acc;
    for (; c + 32 <= end; c += 32) {
        a0 = _mm256_fmadd_ps(load8(wr, dtype, c), _mm256_loadu_ps(xt + c), a0);
        a1 = _mm256_fmadd_ps(load8(wr, dtype, c + 8), _mm256_loadu_ps(xt + c + 8), a1);
        a2 = _mm256_fmadd_ps(load8(wr, dtype, c + 16), _mm256_loadu_ps(xt + c + 16), a2);
        a3 = _mm256_fmadd_ps(load8(wr, dtype, c + 24), _mm256_loadu_ps(xt + c + 24), a3);
    }
    for (; c + 8 <= end; c += 8) a0 = _mm256_fmadd_ps(load8(wr, dtype, c), _mm256_loadu_ps(xt + c), a0);
    acc = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; c < end; c++) acc += colibri_load_f32(wr, dtype, c) * xt[c];
    return acc;
}

/* y (n, rows) = x (n, cols) @ W (rows, cols)^T: four 8-wide accumulators per dot product; the
 * formats without kernels here take the reference. */
static void matmul_avx2(float *y, const float *x, const void *w, colibri_dtype dtype,
                        int32_t n, int32_t cols, int32_t rows)
{
    if (colibri_dtype_simd(dtype) != COLIBRI_SIMD_ALL) { colibri_ref_matmul(y, x, w, dtype, n, cols, rows); return; }
    colibri_matmul_by_rows(y, x, w, dtype, n, cols, rows, colibri_dtype_is_block(dtype) ? dot_blocks : dot_row);
}

/* maddubs multiplies unsigned by signed bytes; pairs sum to int16 without overflow (at most
 * 2 * 128 * 127), madd with ones widens them to 8 int32. */
static inline __m256i dot_us(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* acc + sc16 * (u s) per pair of products, summed in int32 pairs: maddubs, madd, add. */
static inline __m256i dot_scaled(__m256i acc, __m256i u, __m256i s, __m256i sc16)
{
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), sc16));
}

static void matmul_q8_avx2(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                           int32_t n, int32_t cols, int32_t rows)
{
    matmul_q8_x86(2, 2, y, xq, w, dtype, n, cols, rows, dot_us, dot_scaled);   /* 16 ymm registers: 4 x 2 accumulators */
}

/* 8 elements of a KV cache row from i (i % 8 == 0), as floats: f32, f16, or q8_0 as d * q (exact). */
static inline __m256 kv8(const uint8_t *row, colibri_dtype dtype, int32_t i)
{
    const uint8_t *block = row + (size_t)(i / 32) * 34;
    uint16_t d;
    if (dtype != COLIBRI_DTYPE_Q8_0) return load8(row, dtype, (size_t)i);
    memcpy(&d, block, 2);
    return _mm256_mul_ps(i8x8(block + 2 + i % 32), _mm256_set1_ps(_cvtsh_ss(d)));
}

/* scores (span) = scale * K q, four keys at a time: four 8-wide dot products, then one horizontal
 * reduction for all four (two hadds and a lane add).  Inlined once per cache type. */
static inline void scores_typed(float *scores, const float *q, const uint8_t *k, colibri_dtype dtype, size_t row,
                                int32_t span, int32_t hd, float scale)
{
    int32_t j = 0, i;
    for (; j + 4 <= span; j += 4, k += 4 * row) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        __m128 s;
        for (i = 0; i < hd; i += 8) {
            __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, kv8(k, dtype, i), a0);
            a1 = _mm256_fmadd_ps(qv, kv8(k + row, dtype, i), a1);
            a2 = _mm256_fmadd_ps(qv, kv8(k + 2 * row, dtype, i), a2);
            a3 = _mm256_fmadd_ps(qv, kv8(k + 3 * row, dtype, i), a3);
        }
        a0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));   /* lanes: k0 k1 k2 k3 | k0 k1 k2 k3 */
        s = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
        _mm_storeu_ps(scores + j, _mm_mul_ps(s, _mm_set1_ps(scale)));
    }
    for (; j < span; j++, k += row) {
        __m256 a = _mm256_setzero_ps();
        for (i = 0; i < hd; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv8(k, dtype, i), a);
        scores[j] = hsum8(a) * scale;
    }
}

static void attention_scores_avx2(float *scores, const float *q, const void *k, colibri_dtype dtype, size_t stride,
                                  int32_t span, int32_t hd, float scale)
{
    size_t row = colibri_row_bytes(dtype, stride);
    if (hd % 8 || (dtype == COLIBRI_DTYPE_Q8_0 && hd % 32)) {
        colibri_ref_attention_scores(scores, q, k, dtype, stride, span, hd, scale);
        return;
    }
    if (dtype == COLIBRI_DTYPE_F32) scores_typed(scores, q, k, COLIBRI_DTYPE_F32, row, span, hd, scale);
    else if (dtype == COLIBRI_DTYPE_F16) scores_typed(scores, q, k, COLIBRI_DTYPE_F16, row, span, hd, scale);
    else scores_typed(scores, q, k, COLIBRI_DTYPE_Q8_0, row, span, hd, scale);
}

/* out (hd) = p @ V: each 8-wide slice of out stays in a register over all span rows.  Inlined once
 * per cache type. */
static inline void values_typed(float *out, const float *p, const uint8_t *v, colibri_dtype dtype, size_t row,
                                int32_t span, int32_t hd)
{
    int32_t i = 0, j;
    for (; i + 32 <= hd; i += 32) {
        __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
        const uint8_t *vj = v;
        for (j = 0; j < span; j++, vj += row) {
            __m256 pj = _mm256_set1_ps(p[j]);
            o0 = _mm256_fmadd_ps(pj, kv8(vj, dtype, i), o0);
            o1 = _mm256_fmadd_ps(pj, kv8(vj, dtype, i + 8), o1);
            o2 = _mm256_fmadd_ps(pj, kv8(vj, dtype, i + 16), o2);
            o3 = _mm256_fmadd_ps(pj, kv8(vj, dtype, i + 24), o3);
        }
        _mm256_storeu_ps(out + i, o0); _mm256_storeu_ps(out + i + 8, o1);
        _mm256_storeu_ps(out + i + 16, o2); _mm256_storeu_ps(out + i + 24, o3);
    }
    for (; i + 8 <= hd; i += 8) {
        __m256 o = _mm256_setzero_ps();
        for (j = 0; j < span; j++) o = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), kv8(v + (size_t)j * row, dtype, i), o);
        _mm256_storeu_ps(out + i, o);
    }
    for (; i < hd; i++) {
        float o = 0.0f;
        for (j = 0; j < span; j++) o += p[j] * colibri_load_f32(v + (size_t)j * row, dtype, (size_t)i);
        out[i] = o;
    }
}

static void attention_values_avx2(float *out, const float *p, const void *v, colibri_dtype dtype, size_t stride,
                                  int32_t span, int32_t hd)
{
    size_t row = colibri_row_bytes(dtype, stride);
    if (dtype == COLIBRI_DTYPE_Q8_0 && hd % 32) colibri_ref_attention_values(out, p, v, dtype, stride, span, hd);
    else if (dtype == COLIBRI_DTYPE_F32) values_typed(out, p, v, COLIBRI_DTYPE_F32, row, span, hd);
    else if (dtype == COLIBRI_DTYPE_F16) values_typed(out, p, v, COLIBRI_DTYPE_F16, row, span, hd);
    else values_typed(out, p, v, COLIBRI_DTYPE_Q8_0, row, span, hd);
}

/* y (dim) = x / sqrt(mean(x^2) + eps) * w, 8 at a time; block-format weights take the reference. */
static void rmsnorm_avx2(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t dim, float eps)
{
    __m256 ss = _mm256_setzero_ps(), scale;
    float sum, s;
    int32_t i, body = dim & ~7;
    if (colibri_dtype_is_block(dtype)) { colibri_ref_rmsnorm(y, x, w, dtype, dim, eps); return; }
    for (i = 0; i < body; i += 8) ss = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(x + i), ss);
    sum = hsum8(ss);
    for (; i < dim; i++) sum += x[i] * x[i];
    s = 1.0f / sqrtf(sum / (float)dim + eps);
    scale = _mm256_set1_ps(s);
    for (i = 0; i < body; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(load8(w, dtype, (size_t)i), _mm256_mul_ps(_mm256_loadu_ps(x + i), scale)));
    for (; i < dim; i++) y[i] = colibri_load_f32(w, dtype, (size_t)i) * (x[i] * s);
}

/* exp(x), 8 at a time: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is exact), a
 * degree-7 polynomial for exp(r) (Cephes' expf coefficients, within 2 ulp), times 2^n built in the
 * exponent bits.  x is clamped to [-87.3, 88]: below, results are tiny normals rather than 0. */
static inline __m256 exp8(__m256 x)
{
    __m256 n, r, p;
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.0f));
    n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    p = _mm256_fmadd_ps(_mm256_set1_ps(1.9875691500e-4f), r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)));
}

static void softmax_avx2(float *x, int32_t n)
{
    __m256 vmax = _mm256_set1_ps(x[0]), vsum = _mm256_setzero_ps();
    float max, sum, inv;
    int32_t i;
    for (i = 0; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
    {
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        max = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    }
    for (; i < n; i++) if (x[i] > max) max = x[i];
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(max)));
        _mm256_storeu_ps(x + i, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    sum = hsum8(vsum);
    for (; i < n; i++) { x[i] = colibri_expf(x[i] - max); sum += x[i]; }
    inv = 1.0f / sum;
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(inv)));
    for (; i < n; i++) x[i] *= inv;
}

static void silu_mul_avx2(float *g, const float *u, size_t n)
{
    size_t i;
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(g + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
        _mm256_storeu_ps(g + i, _mm256_div_ps(_mm256_mul_ps(v, _mm256_loadu_ps(u + i)), _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + colibri_expf(-g[i])) * u[i];
}

/* q_latent (rank) = Wk (dn, rank)^T q_nope (dn), f32 / f16 / bf16 Wk: 32 outputs held in registers
 * down the dn rows, each a chain of FMAs in row order as the reference adds them; other formats, and
 * ranks that are no multiple of 8, take the reference. */
static void latent_query_avx2(float *q_latent, const float *q_nope, const void *wk, colibri_dtype dtype, int32_t dn,
                              int32_t rank)
{
    size_t row = colibri_row_bytes(dtype, (size_t)rank);
    int32_t r = 0, i;
    if ((dtype != COLIBRI_DTYPE_F32 && dtype != COLIBRI_DTYPE_F16 && dtype != COLIBRI_DTYPE_BF16) || rank % 8) {
        colibri_ref_latent_query(q_latent, q_nope, wk, dtype, dn, rank);
        return;
    }
    for (; r + 32 <= rank; r += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const uint8_t *w = wk;
        for (i = 0; i < dn; i++, w += row) {
            __m256 q = _mm256_set1_ps(q_nope[i]);
            a0 = _mm256_fmadd_ps(q, load8(w, dtype, (size_t)r), a0);
            a1 = _mm256_fmadd_ps(q, load8(w, dtype, (size_t)r + 8), a1);
            a2 = _mm256_fmadd_ps(q, load8(w, dtype, (size_t)r + 16), a2);
            a3 = _mm256_fmadd_ps(q, load8(w, dtype, (size_t)r + 24), a3);
        }
        _mm256_storeu_ps(q_latent + r, a0); _mm256_storeu_ps(q_latent + r + 8, a1);
        _mm256_storeu_ps(q_latent + r + 16, a2); _mm256_storeu_ps(q_latent + r + 24, a3);
    }
    for (; r < rank; r += 8) {
        __m256 a = _mm256_setzero_ps();
        const uint8_t *w = wk;
        for (i = 0; i < dn; i++, w += row) a = _mm256_fmadd_ps(_mm256_set1_ps(q_nope[i]), load8(w, dtype, (size_t)r), a);
        _mm256_storeu_ps(q_latent + r, a);
    }
}

/* scores (span) = scale * (C q_latent + K_rope q_rope), four positions at a time as attention_scores
 * does: each position's latent and rotary products in one 8-wide chain; rank or dr no multiple of 8
 * take the reference. */
static void latent_scores_avx2(float *scores, const float *q_latent, const float *q_rope, const float *latent,
                               const float *k_rope, int32_t span, int32_t rank, int32_t dr, float scale)
{
    int32_t j = 0, i;
    if (rank % 8 || dr % 8) { colibri_ref_latent_scores(scores, q_latent, q_rope, latent, k_rope, span, rank, dr, scale); return; }
    for (; j + 4 <= span; j += 4) {
        const float *c = latent + (size_t)j * rank, *p = k_rope + (size_t)j * dr;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, qv;
        __m128 s;
        for (i = 0; i < rank; i += 8) {
            qv = _mm256_loadu_ps(q_latent + i);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(c + i), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(c + rank + i), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(c + 2 * (size_t)rank + i), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(c + 3 * (size_t)rank + i), a3);
        }
        for (i = 0; i < dr; i += 8) {
            qv = _mm256_loadu_ps(q_rope + i);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(p + i), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(p + dr + i), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(p + 2 * (size_t)dr + i), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(p + 3 * (size_t)dr + i), a3);
        }
        a0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));   /* lanes: j0 j1 j2 j3 | j0 j1 j2 j3 */
        s = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
        _mm_storeu_ps(scores + j, _mm_mul_ps(s, _mm_set1_ps(scale)));
    }
    for (; j < span; j++) {
        const float *c = latent + (size_t)j * rank, *p = k_rope + (size_t)j * dr;
        __m256 a = _mm256_setzero_ps();
        for (i = 0; i < rank; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q_latent + i), _mm256_loadu_ps(c + i), a);
        for (i = 0; i < dr; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q_rope + i), _mm256_loadu_ps(p + i), a);
        scores[j] = hsum8(a) * scale;
    }
}

static const colibri_kernels avx2_kernels = {
    .name = "avx2", .matmul = matmul_avx2, .rmsnorm = rmsnorm_avx2, .quantize_q8 = quantize_q8_x86,
    .quantize_q8_256 = quantize_q8_256_x86,
    .matmul_q8 = matmul_q8_avx2, .attention_scores = attention_scores_avx2, .attention_values = attention_values_avx2,
    .softmax = softmax_avx2, .silu_mul = silu_mul_avx2, .latent_query = latent_query_avx2,
    .latent_scores = latent_scores_avx2,
};

const colibri_kernels *colibri_kernels_avx2(void) { return &avx2_kernels; }
