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

/* One float dot product: row wr of W (dtype) . xt (cols). */
static float dot_row(const uint8_t *wr, colibri_dtype dtype, const float *xt, int32_t cols)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t c = 0, end = (size_t)cols;
    float acc;
    for (; c + 64 <= end; c += 64) {
        a0 = _mm512_fmadd_ps(load16(wr, dtype, c), _mm512_loadu_ps(xt + c), a0);
        a1 = _mm512_fmadd_ps(load16(wr, dtype, c + 16), _mm512_loadu_ps(xt + c + 16), a1);
        a2 = _mm512_fmadd_ps(load16(wr, dtype, c + 32), _mm512_loadu_ps(xt + c + 32), a2);
        a3 = _mm512_fmadd_ps(load16(wr, dtype, c + 48), _mm512_loadu_ps(xt + c + 48), a3);
    }
    for (; c + 16 <= end; c += 16) a0 = _mm512_fmadd_ps(load16(wr, dtype, c), _mm512_loadu_ps(xt + c), a0);
    acc = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; c < end; c++) acc += colibri_load_f32(wr, dtype, c) * xt[c];
    return acc;
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

/* y (n, rows) = x (n, cols) @ W (rows, cols)^T: four 16-wide accumulators per dot product.
 * q8_0 and q4_0 take AVX2's float path (every AVX-512 CPU has AVX2) where a session has no int8
 * scratch: sessions use matmul_q8. */
static void matmul_avx512(float *y, const float *x, const void *w, colibri_dtype dtype,
                          int32_t n, int32_t cols, int32_t rows)
{
    if (dtype == COLIBRI_DTYPE_W4G128) colibri_matmul_by_rows(y, x, w, dtype, n, cols, rows, dot_w4g128);
    else if (colibri_dtype_is_block(dtype)) colibri_kernels_avx2()->matmul(y, x, w, dtype, n, cols, rows);
    else colibri_matmul_by_rows(y, x, w, dtype, n, cols, rows, dot_row);
}

/* vpdpbusd: unsigned bytes times signed bytes, four products summed into each int32 lane.
 * q8_0 moves w's sign onto x as the AVX2 path does; q4_0's nibbles are unsigned already. */
static inline __m256i dot_q8_0(const uint8_t *block, const int8_t *x)
{
    __m256i w = _mm256_loadu_si256((const __m256i *)block), v = _mm256_loadu_si256((const __m256i *)x);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(v, w));
}

static inline __m256i dot_q4_0(const uint8_t *block, const int8_t *x)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), q4_nibbles(block), _mm256_loadu_si256((const __m256i *)x));
}

static void quantize_q8_avx512(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    quantize_q8_x86(xq, x, n, cols);
}

static void matmul_q8_avx512(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                             int32_t n, int32_t cols, int32_t rows)
{
    matmul_q8_x86(y, xq, w, dtype, n, cols, rows, dot_q8_0, dot_q4_0);
}

static const colibri_kernels avx512_kernels = { "avx512", matmul_avx512, colibri_ref_rmsnorm, quantize_q8_avx512,
                                                matmul_q8_avx512 };

const colibri_kernels *colibri_kernels_avx512(void) { return &avx512_kernels; }
