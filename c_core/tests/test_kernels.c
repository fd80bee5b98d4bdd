/* SPDX-License-Identifier: MIT */
/* Every kernel variant this CPU runs against the reference kernels, over shapes that hit
 * every loop tail and every weight dtype.  Budget per output: float summation can be off by
 * at most cols * 2^-24 * sum|w x| (the classic bound for any order), with the reference
 * itself exact to well inside that.
 *
 *   test_kernels              (exit 0: all within budget, or no variant on this architecture)
 *   test_kernels --emulated   for a cross build's tests, which run emulated (QEMU): the matmul
 *                             shapes with 1 and 5 rows only, and one past 256 KiB (see test_variant) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/ops/ops.h"

static uint32_t lcg = 12345u;
static float next_float(void)   /* uniform in [-1, 1) */
{
    lcg = lcg * 1664525u + 1013904223u;
    return (float)(lcg >> 8) / 8388608.0f - 1.0f;
}

static uint16_t to_half_bits(float f, colibri_dtype dtype)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (dtype == COLIBRI_DTYPE_BF16) return (uint16_t)(bits >> 16);   /* truncation is fine for test data */
    {   /* f16 for |f| < 2: exponent rebias, mantissa truncated; tiny values flush to 0 */
        uint32_t sign = (bits >> 16) & 0x8000u, exponent = (bits >> 23) & 0xffu, mantissa = bits & 0x7fffffu;
        if (exponent < 113) return (uint16_t)sign;
        return (uint16_t)(sign | ((exponent - 112u) << 10) | (mantissa >> 13));
    }
}

/* One row of float weights as q8_0, q4_0 or w4g128 blocks, quantized as llama.cpp does q8_0 and
 * q4_0 (w4g128: q4_0's rule over 128 weights, then four nibble groups of 32). */
static void quantize_row(const float *x, int32_t cols, colibri_dtype dtype, uint8_t *out)
{
    int32_t block = colibri_dtypes[dtype].block, b, g, j;
    for (b = 0; b < cols / block; b++, x += block, out += colibri_dtypes[dtype].block_bytes) {
        float amax = 0.0f, max = 0.0f, d, id;
        uint16_t dh;
        for (j = 0; j < block; j++) if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
        d = dtype == COLIBRI_DTYPE_Q8_0 ? amax / 127.0f : max / -8.0f;
        dh = to_half_bits(d, COLIBRI_DTYPE_F16);
        d = colibri_f16_to_f32(dh);
        id = d != 0.0f ? 1.0f / d : 0.0f;
        memcpy(out, &dh, 2);
        if (dtype == COLIBRI_DTYPE_Q8_0)
            for (j = 0; j < 32; j++) out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
        else
            for (g = 0; g < block / 32; g++)
                for (j = 0; j < 16; j++) {
                    int lo = (int)(x[32 * g + j] * id + 8.5f), hi = (int)(x[32 * g + j + 16] * id + 8.5f);
                    out[2 + 16 * g + j] = (uint8_t)((lo > 15 ? 15 : lo) | (hi > 15 ? 15 : hi) << 4);
                }
    }
}

/* The activations a variant's float matmul multiplies W in dtype by: x, or for avx512-bf16's bf16 W
 * x rounded to bf16 (nearest, ties to even: its numerics choice), into buf (n). */
static const float *activations_for(const colibri_kernels *k, colibri_dtype dtype, const float *x, float *buf, size_t n)
{
    size_t i;
    if (dtype != COLIBRI_DTYPE_BF16 || strcmp(k->name, "avx512-bf16") != 0) return x;
    for (i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], 4);
        bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;   /* the test data are finite */
        memcpy(&buf[i], &bits, 4);
    }
    return buf;
}

/* size bytes of random blocks of a format, their f16 scales set to moderate values of either
 * sign (mxfp4: its exponent), so every weight is finite. */
static void random_blocks(uint8_t *w, size_t size, colibri_dtype dtype)
{
    const colibri_dtype_traits *tr = &colibri_dtypes[dtype];
    size_t i, b, unit = (size_t)tr->block_bytes * (size_t)tr->rows;   /* a block, or an interleaved group */
    int32_t j;
    for (i = 0; i < size; i++) { lcg = lcg * 1664525u + 1013904223u; w[i] = (uint8_t)(lcg >> 24); }
    for (b = 0; b < size / unit; b++) {
        uint8_t *block = w + b * unit;
        for (j = 0; j < tr->rows && colibri_dtype_plain(dtype) == COLIBRI_DTYPE_MXFP4; j++) block[j] = (uint8_t)(118 + (b + (size_t)j) % 5);
        for (j = 0; j < tr->f16_count; j++) {
            uint16_t h = to_half_bits(0.01f * next_float(), COLIBRI_DTYPE_F16);
            memcpy(block + tr->f16_at + 2 * j, &h, 2);
        }
    }
}

static int failures, checked, emulated;

/* out = W (rows, cols) of plain blocks with each 8 rows interleaved (rows % 8 == 0): the core's own
 * colibri_interleave_rows (test_repack.py checks its bytes against docs/FORMAT.md's rule); and back
 * (what an open does where the kernels have none for the form), which must give the plain bytes. */
static void interleave_rows(uint8_t *out, const uint8_t *plain, colibri_dtype dtype, int32_t rows, int32_t cols)
{
    size_t bytes = (size_t)rows * colibri_row_bytes(dtype, (size_t)cols);
    uint8_t *back = malloc(bytes);
    colibri_error err;
    if (colibri_interleave_rows(out, plain, colibri_dtype_plain(dtype), rows, cols, &err) != COLIBRI_OK ||
        colibri_interleave_rows(back, out, dtype, rows, cols, &err) != COLIBRI_OK) {
        fprintf(stderr, "colibri_interleave_rows: %s\n", err.message);
        exit(1);
    }
    checked++;
    if (memcmp(back, plain, bytes) && failures++ < 10)
        fprintf(stderr, "colibri_interleave_rows %s cols=%d rows=%d: back from the groups, not the plain bytes\n",
                colibri_dtypes[dtype].name, (int)cols, (int)rows);
    free(back);
}

/* wmag (cols) = per weight of one row, |scale part| + |min part|: weight = d * ... - dmin * m in
 * the formats with two f16 fields (q4_k, q5_k, q4_1, q5_1, q2_k: the int8 path sums the two parts
 * apart, so its float sums' error is relative to both); |weight| in the others. */
static void term_magnitudes(float *wmag, const uint8_t *row, colibri_dtype dtype, int32_t cols)
{
    const colibri_dtype_traits *tr = &colibri_dtypes[dtype];
    size_t row_bytes = colibri_row_bytes(dtype, (size_t)cols), b, k;
    int32_t i;
    if (tr->f16_count != 2) {
        for (i = 0; i < cols; i++) wmag[i] = fabsf(colibri_load_f32(row, dtype, (size_t)i));
        return;
    }
    {
        uint8_t *part = malloc(row_bytes);
        for (k = 0; k < 2; k++) {   /* k 0: dmin zeroed, the scale part; k 1: d zeroed, the min part */
            memcpy(part, row, row_bytes);
            for (b = 0; b < row_bytes; b += (size_t)tr->block_bytes) memset(part + b + (size_t)tr->f16_at + 2 * (1 - k), 0, 2);
            for (i = 0; i < cols; i++) wmag[i] = (k ? wmag[i] : 0.0f) + fabsf(colibri_load_f32(part, dtype, (size_t)i));
        }
        free(part);
    }
}

/* Budget of the int8 path against the float oracle: quantizing x to blocks moves each x by at
 * most d / 2 = amax / 254 of its scale's group (32 activations, or 256 for the formats of 256-weight
 * blocks; d's and 1/d's roundings inside the 1e-6), so |error| <= sum over groups of amax / 254 *
 * sum |w|, plus float summation of the block sums and the oracle's rounding of each weight, both
 * relative to the terms' magnitudes (wmag). */
static double q8_budget(const float *w32, const float *wmag, const float *x, int32_t cols, int32_t group)
{
    double budget = 0.0, mag = 0.0;
    int32_t b, j;
    for (b = 0; b < cols / group; b++) {
        double amax = 0.0, wsum = 0.0;
        for (j = 0; j < group; j++) {
            if (fabs((double)x[b * group + j]) > amax) amax = fabs((double)x[b * group + j]);
            wsum += fabs((double)w32[b * group + j]);
            mag += fabs((double)wmag[b * group + j] * x[b * group + j]);
        }
        budget += amax / 254.0 * wsum * (1.0 + 1e-6);
    }
    return budget + cols * ldexp(1.0, -22) * mag + 1e-30;
}

static void check(const char *variant, const char *what, const char *dtype, int32_t n, int32_t cols, int32_t rows,
                  int32_t t, int32_t r, double got, double want, double budget)
{
    checked++;
    if (fabs(got - want) > budget && failures++ < 10)
        fprintf(stderr, "%s %s %s n=%d cols=%d rows=%d [%d,%d]: %.9g != %.9g (budget %.3g)\n", variant, what, dtype,
                (int)n, (int)cols, (int)rows, (int)t, (int)r, got, want, budget);
}

/* The threads split a matmul's tokens into runs of any length, and an expert gets any number of
 * tokens: each output must not depend on how many tokens came with it.  y (n, rows) from one call
 * against n calls of one token, bit for bit. */
static void same_bits_one_token_at_a_time(const colibri_kernels *k, const char *what, const char *dtype_name, const float *y,
                                          const float *x, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                                          int32_t n, int32_t cols, int32_t rows)
{
    float *one = malloc((size_t)rows * 4);
    int32_t t, r;
    for (t = 0; t < n; t++) {
        if (xq) k->matmul_q8(one, xq + (size_t)t * (cols / 32), w, dtype, 1, cols, rows);
        else k->matmul(one, x + (size_t)t * cols, w, dtype, 1, cols, rows);
        for (r = 0; r < rows; r++) {
            checked++;
            if (memcmp(&one[r], &y[(size_t)t * rows + r], 4) && failures++ < 10)
                fprintf(stderr, "%s %s %s n=%d cols=%d rows=%d [%d,%d]: %.9g alone, %.9g with the other tokens\n", k->name,
                        what, dtype_name, (int)n, (int)cols, (int)rows, (int)t, (int)r, one[r], y[(size_t)t * rows + r]);
        }
    }
    free(one);
}

/* An interleaved W against the same rows in the plain format: the float oracle's and the scalar
 * int8 path's outputs bit for bit, and colibri_dequantize_rows's weights. */
static void same_bits_as_plain(const char *dtype_name, const float *x, const void *w, const void *wp, colibri_dtype dtype,
                               int32_t n, int32_t cols, int32_t rows)
{
    colibri_dtype plain = colibri_dtype_plain(dtype);
    size_t out = (size_t)n * rows, all = (size_t)rows * cols;
    float *a = malloc(out * 4), *b = malloc(out * 4), *wa = malloc(all * 4), *wb = malloc(all * 4);
    colibri_q8_block *xq = malloc((size_t)n * (cols / 32 + 1) * sizeof *xq);
    int k;
    colibri_ref_quantize_q8(xq, x, n, cols);
    for (k = 0; k < 2; k++) {
        if (k) { colibri_ref_matmul_q8(a, xq, w, dtype, n, cols, rows); colibri_ref_matmul_q8(b, xq, wp, plain, n, cols, rows); }
        else { colibri_ref_matmul(a, x, w, dtype, n, cols, rows); colibri_ref_matmul(b, x, wp, plain, n, cols, rows); }
        checked++;
        if (memcmp(a, b, out * 4) && failures++ < 10)
            fprintf(stderr, "reference %s %s n=%d cols=%d rows=%d: not the plain format's bits\n", k ? "matmul_q8" : "matmul",
                    dtype_name, (int)n, (int)cols, (int)rows);
    }
    colibri_dequantize_rows(wa, w, dtype, rows, cols);
    colibri_dequantize_rows(wb, wp, plain, rows, cols);
    checked++;
    if (memcmp(wa, wb, all * 4) && failures++ < 10)
        fprintf(stderr, "colibri_dequantize_rows %s cols=%d rows=%d: not the plain format's weights\n", dtype_name, (int)cols, (int)rows);
    free(a); free(b); free(wa); free(wb); free(xq);
}

/* The variants whose int8 path gives the scalar int8 path's bits: the same integer block sums,
 * scaled and added in its order (rvv and rvv-int8: vector-length agnostic, so at every VLEN; mve and mve-int8). */
static int exact_int8(const colibri_kernels *k) { return strncmp(k->name, "rvv", 3) == 0 || strncmp(k->name, "mve", 3) == 0; }

/* One variant against the reference: the float matmul for every dtype; for the int8_path ones,
 * its int8 path against the scalar int8 path (the same integers: only float summation order
 * differs) and against the float oracle (the activation quantization's bound).  The formats
 * the variants have only int8 kernels for are random blocks (their float matmul is the
 * reference's: test_reference_formats). */
static void test_variant(const colibri_kernels *k)
{
    static const int32_t ns[] = { 1, 3, 5, 8 }, colss[] = { 1, 7, 8, 15, 16, 31, 33, 64, 100, 128, 256, 257, 384, 1024, 2080 };
    static const int32_t rowss[] = { 1, 5, 70 };   /* 70 x 1024 f32: past 256 KiB, the other tile order */
    static const int32_t rowss_x8[] = { 8, 16, 72 };   /* the interleaved formats: groups of 8 rows */
    static const colibri_dtype dtypes[] = { COLIBRI_DTYPE_F32, COLIBRI_DTYPE_F16, COLIBRI_DTYPE_BF16,
                                            COLIBRI_DTYPE_Q8_0, COLIBRI_DTYPE_Q4_0, COLIBRI_DTYPE_W4G128,
                                            COLIBRI_DTYPE_Q4_K, COLIBRI_DTYPE_Q5_K, COLIBRI_DTYPE_Q6_K,
                                            COLIBRI_DTYPE_IQ4_XS, COLIBRI_DTYPE_IQ4_NL, COLIBRI_DTYPE_MXFP4,
                                            COLIBRI_DTYPE_Q4_1, COLIBRI_DTYPE_Q5_0, COLIBRI_DTYPE_Q5_1,
                                            COLIBRI_DTYPE_Q3_K, COLIBRI_DTYPE_Q2_K, COLIBRI_DTYPE_Q4_0X8,
                                            COLIBRI_DTYPE_Q8_0X8, COLIBRI_DTYPE_Q4_KX8, COLIBRI_DTYPE_Q5_KX8,
                                            COLIBRI_DTYPE_Q6_KX8, COLIBRI_DTYPE_IQ4_XSX8, COLIBRI_DTYPE_MXFP4X8 };
    const colibri_kernels *ref = colibri_kernels_reference();
    int di, ni, ci, ri, before = failures, count = checked;
    for (di = 0; di < (int)(sizeof dtypes / sizeof dtypes[0]); di++) {
        colibri_dtype dtype = dtypes[di], plain = colibri_dtype_plain(dtype);   /* x8: built from plain rows */
        const char *dtype_name = colibri_dtypes[dtype].name;
        for (ni = 0; ni < (int)(sizeof ns / sizeof ns[0]); ni++) for (ci = 0; ci < (int)(sizeof colss / sizeof colss[0]); ci++) for (ri = 0; ri < (int)(sizeof rowss / sizeof rowss[0]); ri++) {
            int32_t n = ns[ni], cols = colss[ci], rows = plain != dtype ? rowss_x8[ri] : rowss[ri], i, t, r;
            size_t wsize = (size_t)rows * colibri_row_bytes(dtype, (size_t)cols);
            if (cols % colibri_dtypes[dtype].block) continue;   /* rows are whole blocks */
            /* emulated: every tail still (cols, tokens, a 4-row tile and one more), at a tenth of the
             * multiply-adds; of the 70-row shapes the one that crosses 256 KiB, 5 tokens of f32 */
            if (emulated && ri == 2 && !(n == 5 && cols == 1024 && dtype == COLIBRI_DTYPE_F32)) continue;
            float *x = malloc((size_t)n * cols * 4), *w32 = malloc((size_t)rows * cols * 4), *wmag = malloc((size_t)rows * cols * 4);
            float *x_rounded = malloc((size_t)n * cols * 4);
            const float *x_ref;
            float *y_ref = malloc((size_t)n * rows * 4), *y = malloc((size_t)n * rows * 4), *y_q8 = malloc((size_t)n * rows * 4);
            colibri_q8_block *xq_ref = malloc((size_t)n * (cols / 32 + 1) * sizeof *xq_ref);
            colibri_q8_block *xq = malloc((size_t)n * (cols / 32 + 1) * sizeof *xq);
            void *w = malloc(wsize), *wp = plain != dtype ? malloc(wsize) : w;   /* wp: the rows in the plain format */
            for (i = 0; i < n * cols; i++) x[i] = next_float();
            if (n == 3 && cols >= 64) for (i = 0; i < 32; i++) x[i] = 0.0f;   /* an all-zero block: d = 0 */
            if (n == 5 && cols >= 512) for (i = 256; i < 512; i++) x[i] = 0.0f;   /* and a group of 256 */
            for (i = 0; i < rows * cols; i++) {
                w32[i] = next_float();
                if (dtype == COLIBRI_DTYPE_F32) ((float *)w)[i] = w32[i];
                else if (!colibri_dtype_is_block(dtype)) {
                    ((uint16_t *)w)[i] = to_half_bits(w32[i], dtype);
                    w32[i] = colibri_load_f32(w, dtype, (size_t)i);
                }
            }
            if (colibri_dtypes[plain].simd == COLIBRI_SIMD_INT8) random_blocks(wp, wsize, plain);
            for (r = 0; r < rows && colibri_dtype_is_block(dtype); r++) {   /* the budget is on the weights the blocks encode */
                uint8_t *row = (uint8_t *)wp + (size_t)r * colibri_row_bytes(dtype, (size_t)cols);
                if (colibri_dtypes[plain].simd != COLIBRI_SIMD_INT8) quantize_row(w32 + (size_t)r * cols, cols, plain, row);
                for (i = 0; i < cols; i++) w32[(size_t)r * cols + i] = colibri_load_f32(row, plain, (size_t)i);
                term_magnitudes(wmag + (size_t)r * cols, row, plain, cols);
            }
            if (plain != dtype) {   /* the reference computes exactly the plain format's sums, bit for bit */
                interleave_rows(w, wp, dtype, rows, cols);
                same_bits_as_plain(dtype_name, x, w, wp, dtype, n, cols, rows);
            }
            x_ref = activations_for(k, dtype, x, x_rounded, (size_t)n * cols);
            ref->matmul(y_ref, x_ref, w, dtype, n, cols, rows);
            k->matmul(y, x, w, dtype, n, cols, rows);
            same_bits_one_token_at_a_time(k, "matmul", dtype_name, y, x, NULL, w, dtype, n, cols, rows);
            for (t = 0; t < n; t++) for (r = 0; r < rows; r++) {
                double mag = 0.0;
                for (i = 0; i < cols; i++) mag += fabs((double)w32[r * cols + i] * x_ref[t * cols + i]);
                check(k->name, "matmul", dtype_name, n, cols, rows, t, r, y[t * rows + r], y_ref[t * rows + r],
                      cols * ldexp(1.0, -24) * mag + 1e-30);
            }
            if (colibri_dtype_int8_path(dtype) && k->matmul_q8) {
                colibri_quantize_q8_for(colibri_kernels_reference_int8(), dtype, xq_ref, x, n, cols);
                colibri_quantize_q8_for(k, dtype, xq, x, n, cols);
                for (i = 0; i < n * cols / 32; i++) {   /* the same blocks, bit for bit */
                    checked++;
                    if ((memcmp(&xq[i].d, &xq_ref[i].d, 4) || xq[i].sum != xq_ref[i].sum || memcmp(xq[i].q, xq_ref[i].q, 32))
                        && failures++ < 10)
                        fprintf(stderr, "%s quantize_q8 cols=%d block %d differs from the reference\n", k->name, (int)cols, (int)i);
                }
                colibri_ref_matmul_q8(y, xq_ref, w, dtype, n, cols, rows);
                k->matmul_q8(y_q8, xq_ref, w, dtype, n, cols, rows);
                same_bits_one_token_at_a_time(k, "matmul_q8", dtype_name, y_q8, NULL, xq_ref, w, dtype, n, cols, rows);
                for (i = 0; i < n * rows && exact_int8(k); i++) {   /* the scalar int8 path's bits */
                    checked++;
                    if (memcmp(&y_q8[i], &y[i], 4) && failures++ < 10)
                        fprintf(stderr, "%s matmul_q8 %s n=%d cols=%d rows=%d [%d]: %.9g, the scalar int8 path %.9g\n", k->name,
                                dtype_name, (int)n, (int)cols, (int)rows, (int)i, y_q8[i], y[i]);
                }
                for (t = 0; t < n; t++) for (r = 0; r < rows; r++) {
                    double mag = 0.0;   /* sum |block scale * integer dot| bounds the float sums' error */
                    for (i = 0; i < cols; i++) mag += fabs((double)wmag[r * cols + i] * xq_ref[t * cols / 32 + i / 32].d * xq_ref[t * cols / 32 + i / 32].q[i % 32]);
                    check(k->name, "matmul_q8 vs scalar int8", dtype_name, n, cols, rows, t, r, y_q8[t * rows + r],
                          y[t * rows + r], (cols / 32 + 8) * ldexp(1.0, -23) * mag + 1e-30);
                    check(k->name, "matmul_q8 vs float oracle", dtype_name, n, cols, rows, t, r, y_q8[t * rows + r],
                          y_ref[t * rows + r], q8_budget(w32 + (size_t)r * cols, wmag + (size_t)r * cols, x + (size_t)t * cols, cols,
                                    colibri_dtypes[dtype].block == 256 ? 256 : 32));
                }
            }
            free(x); free(x_rounded); free(w32); free(wmag); free(y_ref); free(y); free(y_q8); free(xq_ref); free(xq); free(w);
            if (wp != w) free(wp);
        }
    }
    printf("%s kernels: %d outputs compared with the reference, %d outside the budget\n", k->name, checked - count,
           failures - before);
}

/* The formats a variant has no float kernels for (colibri_dtype_simd 0, or the int8 path's
 * alone): its matmul is the reference's, bit for bit, on random blocks. */
static void test_reference_formats(const colibri_kernels *k)
{
    static const int32_t ns[] = { 1, 3 }, blockss[] = { 1, 3 }, rowss[] = { 1, 5 };
    const colibri_kernels *ref = colibri_kernels_reference();
    int d, ni, bi, ri, before = failures, count = checked;
    for (d = 0; d < COLIBRI_DTYPE_COUNT; d++) {
        const colibri_dtype_traits *tr = &colibri_dtypes[d];
        if (tr->simd == COLIBRI_SIMD_ALL || !tr->holds_weights) continue;
        for (ni = 0; ni < 2; ni++) for (bi = 0; bi < 2; bi++) for (ri = 0; ri < 2; ri++) {
            int32_t n = ns[ni], cols = blockss[bi] * tr->block, rows = rowss[ri] * tr->rows, i;
            size_t wsize = (size_t)rows * colibri_row_bytes((colibri_dtype)d, (size_t)cols);
            uint8_t *w = malloc(wsize);
            float *x = malloc((size_t)n * cols * 4), *y = malloc((size_t)n * rows * 4), *y_ref = malloc((size_t)n * rows * 4);
            random_blocks(w, wsize, (colibri_dtype)d);
            for (i = 0; i < n * cols; i++) x[i] = next_float();
            ref->matmul(y_ref, x, w, (colibri_dtype)d, n, cols, rows);
            k->matmul(y, x, w, (colibri_dtype)d, n, cols, rows);
            for (i = 0; i < n * rows; i++) {
                checked++;
                if (memcmp(&y[i], &y_ref[i], 4) && failures++ < 10)
                    fprintf(stderr, "%s matmul %s n=%d cols=%d rows=%d [%d]: %.9g, the reference %.9g\n", k->name, tr->name,
                            (int)n, (int)cols, (int)rows, (int)i, y[i], y_ref[i]);
            }
            free(w); free(x); free(y); free(y_ref);
        }
    }
    printf("%s kernels on the formats they leave to the reference: %d outputs compared, %d differ\n", k->name,
           checked - count, failures - before);
}

/* The attention kernels against the reference, over a cache of each KV type (rows stored by
 * colibri_kv_store, every value then exact in f32): any order of n float products and sums (fused
 * or not) lies within (n + 1) * 2^-24 * sum |terms| of the exact sum, so two orders differ by at
 * most twice that: per score (n = hd terms q k) and per output (n = span terms p v). */
static void test_attention(const colibri_kernels *k)
{
    static const int32_t hds[] = { 4, 8, 12, 16, 32, 64, 80, 128, 256 }, spans[] = { 1, 3, 4, 5, 17, 64 };
    static const colibri_dtype kv_types[] = { COLIBRI_DTYPE_F32, COLIBRI_DTYPE_F16, COLIBRI_DTYPE_Q8_0 };
    int hi, si, ti, before = failures, count = checked;
    for (ti = 0; ti < 3; ti++) for (hi = 0; hi < (int)(sizeof hds / sizeof hds[0]); hi++) for (si = 0; si < (int)(sizeof spans / sizeof spans[0]); si++) {
        colibri_dtype dtype = kv_types[ti];
        const char *type_name = colibri_dtypes[dtype].name;
        int32_t hd = hds[hi], span = spans[si], i, j;
        size_t stride = (size_t)hd + (dtype == COLIBRI_DTYPE_Q8_0 ? 32 : 8);   /* other heads between a head's rows */
        size_t row_bytes = colibri_row_bytes(dtype, stride);
        float *q = malloc((size_t)hd * 4), *kv32 = malloc(stride * 4), *p = malloc((size_t)span * 4);
        float *scores = malloc((size_t)span * 4), *scores_ref = malloc((size_t)span * 4);
        float *out = malloc((size_t)hd * 4), *out_ref = malloc((size_t)hd * 4);
        uint8_t *kv = malloc((size_t)span * row_bytes);
        if (dtype == COLIBRI_DTYPE_Q8_0 && hd % 32) goto next;   /* q8_0 caches hold heads of whole blocks */
        for (i = 0; i < hd; i++) q[i] = next_float();
        for (j = 0; j < span; j++) {
            for (i = 0; i < (int32_t)stride; i++) kv32[i] = next_float();
            colibri_kv_store(kv + (size_t)j * row_bytes, dtype, kv32, (int32_t)stride);
        }
        for (j = 0; j < span; j++) p[j] = (next_float() + 1.0f) / (float)span;
        colibri_ref_attention_scores(scores_ref, q, kv, dtype, stride, span, hd, 0.125f);
        k->attention_scores(scores, q, kv, dtype, stride, span, hd, 0.125f);
        for (j = 0; j < span; j++) {
            double mag = 0.0;
            for (i = 0; i < hd; i++) mag += fabs((double)q[i] * colibri_load_f32(kv + (size_t)j * row_bytes, dtype, (size_t)i)) * 0.125;
            check(k->name, "attention_scores", type_name, 1, hd, span, 0, j, scores[j], scores_ref[j], 2 * (hd + 1) * ldexp(1.0, -24) * mag + 1e-30);
        }
        colibri_ref_attention_values(out_ref, p, kv, dtype, stride, span, hd);
        k->attention_values(out, p, kv, dtype, stride, span, hd);
        for (i = 0; i < hd; i++) {
            double mag = 0.0;
            for (j = 0; j < span; j++) mag += fabs((double)p[j] * colibri_load_f32(kv + (size_t)j * row_bytes, dtype, (size_t)i));
            check(k->name, "attention_values", type_name, 1, span, hd, 0, i, out[i], out_ref[i], 2 * (span + 1) * ldexp(1.0, -24) * mag + 1e-30);
        }
next:
        free(q); free(kv32); free(kv); free(p); free(scores); free(scores_ref); free(out); free(out_ref);
    }
    printf("%s attention (f32, f16, q8_0 caches): %d outputs compared with the reference, %d outside the budget\n", k->name,
           checked - count, failures - before);
}

/* The latent-attention kernels against the reference, with the budget of test_attention: the fold
 * q_latent[r] sums dn terms q_nope[i] Wk[i, r] (Wk in every weight dtype), a score sums rank + dr
 * terms; and the weighted latent sum is attention_values over rows `rank` apart. */
static void test_latent(const colibri_kernels *k)
{
    static const int32_t dns[] = { 1, 16, 128 }, ranks[] = { 16, 32, 96, 512 }, drs[] = { 8, 64 }, spans[] = { 1, 5, 33 };
    static const colibri_dtype dtypes[] = { COLIBRI_DTYPE_F32, COLIBRI_DTYPE_F16, COLIBRI_DTYPE_BF16,
                                            COLIBRI_DTYPE_Q8_0, COLIBRI_DTYPE_Q4_0 };
    int ni, ri, di, si, ti, before = failures, count = checked;
    for (ni = 0; ni < 3; ni++) for (ri = 0; ri < 4; ri++) for (di = 0; di < 2; di++) for (si = 0; si < 3; si++) {
        int32_t dn = dns[ni], rank = ranks[ri], dr = drs[di], span = spans[si], i, j, r;
        float *q = malloc((size_t)(dn + dr) * 4), *w32 = malloc((size_t)dn * rank * 4), *cache = malloc((size_t)span * rank * 4);
        float *k_rope = malloc((size_t)span * dr * 4), *q_latent = malloc((size_t)rank * 4), *q_latent_ref = malloc((size_t)rank * 4);
        float *scores = malloc((size_t)span * 4), *scores_ref = malloc((size_t)span * 4), *p = malloc((size_t)span * 4);
        uint8_t *w = malloc(colibri_row_bytes(COLIBRI_DTYPE_F32, (size_t)dn * rank));
        for (i = 0; i < dn + dr; i++) q[i] = next_float();
        for (i = 0; i < span * rank; i++) cache[i] = next_float();
        for (i = 0; i < span * dr; i++) k_rope[i] = next_float();
        for (j = 0; j < span; j++) p[j] = (next_float() + 1.0f) / (float)span;
        for (i = 0; i < dn * rank; i++) w32[i] = next_float();
        for (ti = 0; ti < (int)(sizeof dtypes / sizeof dtypes[0]); ti++) {
            colibri_dtype dtype = dtypes[ti];
            if (rank % colibri_dtypes[dtype].block) continue;   /* rows are whole blocks */
            for (i = 0; i < dn; i++) {
                uint8_t *row = w + (size_t)i * colibri_row_bytes(dtype, (size_t)rank);
                if (dtype == COLIBRI_DTYPE_F32) memcpy(row, w32 + (size_t)i * rank, (size_t)rank * 4);
                else if (colibri_dtype_is_block(dtype)) quantize_row(w32 + (size_t)i * rank, rank, dtype, row);
                else for (r = 0; r < rank; r++) {
                    uint16_t h = to_half_bits(w32[(size_t)i * rank + r], dtype);
                    memcpy(row + 2 * r, &h, 2);
                }
            }
            colibri_ref_latent_query(q_latent_ref, q, w, dtype, dn, rank);
            k->latent_query(q_latent, q, w, dtype, dn, rank);
            for (r = 0; r < rank; r++) {
                double mag = 0.0;
                for (i = 0; i < dn; i++) mag += fabs((double)q[i] * colibri_load_f32(w, dtype, (size_t)i * rank + r));
                check(k->name, "latent_query", colibri_dtypes[dtype].name, 1, dn, rank, 0, r, q_latent[r], q_latent_ref[r],
                      2 * (dn + 1) * ldexp(1.0, -24) * mag + 1e-30);
            }
        }
        colibri_ref_latent_scores(scores_ref, q_latent_ref, q + dn, cache, k_rope, span, rank, dr, 0.125f);
        k->latent_scores(scores, q_latent_ref, q + dn, cache, k_rope, span, rank, dr, 0.125f);
        for (j = 0; j < span; j++) {
            double mag = 0.0;
            for (r = 0; r < rank; r++) mag += fabs((double)q_latent_ref[r] * cache[(size_t)j * rank + r]) * 0.125;
            for (i = 0; i < dr; i++) mag += fabs((double)q[dn + i] * k_rope[(size_t)j * dr + i]) * 0.125;
            check(k->name, "latent_scores", "f32", 1, rank + dr, span, 0, j, scores[j], scores_ref[j],
                  2 * (rank + dr + 1) * ldexp(1.0, -24) * mag + 1e-30);
        }
        colibri_ref_attention_values(q_latent_ref, p, cache, COLIBRI_DTYPE_F32, (size_t)rank, span, rank);
        k->attention_values(q_latent, p, cache, COLIBRI_DTYPE_F32, (size_t)rank, span, rank);
        for (r = 0; r < rank; r++) {
            double mag = 0.0;
            for (j = 0; j < span; j++) mag += fabs((double)p[j] * cache[(size_t)j * rank + r]);
            check(k->name, "attention_values (latent rows)", "f32", 1, span, rank, 0, r, q_latent[r], q_latent_ref[r],
                  2 * (span + 1) * ldexp(1.0, -24) * mag + 1e-30);
        }
        free(q); free(w32); free(cache); free(k_rope); free(q_latent); free(q_latent_ref); free(scores); free(scores_ref); free(p);
        free(w);
    }
    printf("%s latent attention: %d outputs compared with the reference, %d outside the budget\n", k->name,
           checked - count, failures - before);
}

/* Every f16 bit pattern as a weight (the other tests' f16 weights are normals): y (65536) = W
 * (65536, 1) x with x = 1, each output the weight itself, bit for bit but a zero's sign (a variant
 * may add it to +0), nan where it is nan: subnormals, infinities, nans widened as the reference
 * widens them. */
static void test_f16_values(const colibri_kernels *k)
{
    uint16_t *w = malloc(65536 * 2);
    float *y = malloc(65536 * 4), one = 1.0f;
    int before = failures, count = checked;
    int32_t i;
    for (i = 0; i < 65536; i++) w[i] = (uint16_t)i;
    k->matmul(y, &one, w, COLIBRI_DTYPE_F16, 1, 1, 65536);
    for (i = 0; i < 65536; i++) {
        float want = colibri_f16_to_f32((uint16_t)i);
        checked++;
        if ((want != want ? y[i] == y[i] : y[i] != want) && failures++ < 10)
            fprintf(stderr, "%s matmul f16 weight 0x%04x: %.9g, the reference %.9g\n", k->name, (unsigned)i, y[i], want);
    }
    free(w); free(y);
    printf("%s f16 weights, every bit pattern: %d outputs compared with the reference, %d differ\n", k->name, checked - count,
           failures - before);
}

/* Every length 1..TAILS of the kernels whose loops run over a vector length (cols, head_dim, n):
 * 3 times VLMAX + 1 of e32m4 at VLEN 1024, so every tail of RVV's strip-mined loops at every VLEN
 * the tests run, against the budgets of the tests above. */
#define TAILS 385
static void test_tails(const colibri_kernels *k)
{
    static const colibri_dtype dtypes[] = { COLIBRI_DTYPE_F32, COLIBRI_DTYPE_F16, COLIBRI_DTYPE_BF16 };
    float *x = malloc(3 * TAILS * 4), *v = malloc(3 * TAILS * 4), *y = malloc(TAILS * 4), *y_ref = malloc(TAILS * 4);
    float *x_rounded = malloc(TAILS * 4);
    uint16_t *h = malloc(3 * TAILS * 2);
    int before = failures, count = checked;
    int32_t len, i, j, di;
    for (i = 0; i < 3 * TAILS; i++) { x[i] = next_float(); v[i] = next_float(); }
    for (len = 1; len <= TAILS; len++) {
        for (di = 0; di < 3; di++) {   /* y (2) = x (len) @ W (2, len)^T */
            const void *w = v;
            double mag[2] = { 0.0, 0.0 };
            if (dtypes[di] != COLIBRI_DTYPE_F32) {
                for (i = 0; i < 2 * len; i++) h[i] = to_half_bits(v[i], dtypes[di]);
                w = h;
            }
            const float *x_ref = activations_for(k, dtypes[di], x, x_rounded, (size_t)len);
            colibri_ref_matmul(y_ref, x_ref, w, dtypes[di], 1, len, 2);
            k->matmul(y, x, w, dtypes[di], 1, len, 2);
            for (j = 0; j < 2; j++) {
                for (i = 0; i < len; i++) mag[j] += fabs((double)colibri_load_f32(w, dtypes[di], (size_t)(j * len + i)) * x_ref[i]);
                check(k->name, "matmul (tails)", colibri_dtypes[dtypes[di]].name, 1, len, 2, 0, j, y[j], y_ref[j],
                      len * ldexp(1.0, -24) * mag[j] + 1e-30);
            }
        }
        colibri_ref_attention_scores(y_ref, x, v, COLIBRI_DTYPE_F32, (size_t)len, 3, len, 0.125f);
        k->attention_scores(y, x, v, COLIBRI_DTYPE_F32, (size_t)len, 3, len, 0.125f);
        for (j = 0; j < 3; j++) {
            double mag = 0.0;
            for (i = 0; i < len; i++) mag += fabs((double)x[i] * v[j * len + i]) * 0.125;
            check(k->name, "attention_scores (tails)", "f32", 1, len, 3, 0, j, y[j], y_ref[j], 2 * (len + 1) * ldexp(1.0, -24) * mag + 1e-30);
        }
        colibri_ref_attention_values(y_ref, x, v, COLIBRI_DTYPE_F32, (size_t)len, 3, len);
        k->attention_values(y, x, v, COLIBRI_DTYPE_F32, (size_t)len, 3, len);
        for (i = 0; i < len; i++) {
            double mag = 0.0;
            for (j = 0; j < 3; j++) mag += fabs((double)x[j] * v[j * len + i]);
            check(k->name, "attention_values (tails)", "f32", 1, 3, len, 0, i, y[i], y_ref[i], 8 * ldexp(1.0, -24) * mag + 1e-30);
        }
        memcpy(y, x, (size_t)len * 4);
        memcpy(y_ref, x, (size_t)len * 4);
        colibri_softmax(y_ref, len);
        k->softmax(y, len);
        for (i = 0; i < len; i++)
            check(k->name, "softmax (tails)", "f32", 1, len, 1, 0, i, y[i], y_ref[i], (16 + 2 * len) * ldexp(1.0, -24) * y_ref[i] + 1e-30);
        memcpy(y, x, (size_t)len * 4);
        memcpy(y_ref, x, (size_t)len * 4);
        colibri_silu_mul(y_ref, v, (size_t)len);
        k->silu_mul(y, v, (size_t)len);
        for (i = 0; i < len; i++)
            check(k->name, "silu_mul (tails)", "f32", 1, len, 1, 0, i, y[i], y_ref[i], 16 * ldexp(1.0, -24) * fabs(y_ref[i]) + 1e-30);
        colibri_ref_rmsnorm(y_ref, x, v, COLIBRI_DTYPE_F32, len, 1e-6f);
        k->rmsnorm(y, x, v, COLIBRI_DTYPE_F32, len, 1e-6f);
        for (i = 0; i < len; i++)
            check(k->name, "rmsnorm (tails)", "f32", 1, len, 1, 0, i, y[i], y_ref[i], (len + 4) * ldexp(1.0, -24) * fabs(y_ref[i]) + 1e-30);
    }
    free(x); free(x_rounded); free(v); free(y); free(y_ref); free(h);
    printf("%s tails 1..%d: %d outputs compared with the reference, %d outside the budget\n", k->name, TAILS, checked - count,
           failures - before);
}

/* softmax and silu_mul against the reference's (colibri_expf, within an ulp of exp): each output
 * within a few ulp of the exp plus the float sums' bound, relative to the reference value. */
static void test_exp_kernels(const colibri_kernels *k)
{
    static const int32_t ns[] = { 1, 3, 8, 15, 16, 17, 64, 100, 1000 };
    int ni, before = failures, count = checked;
    for (ni = 0; ni < (int)(sizeof ns / sizeof ns[0]); ni++) {
        int32_t n = ns[ni], i;
        float *x = malloc((size_t)n * 4), *x_ref = malloc((size_t)n * 4), *u = malloc((size_t)n * 4);
        for (i = 0; i < n; i++) { x[i] = x_ref[i] = 12.0f * next_float(); u[i] = next_float(); }
        if (n == 100) x[7] = x_ref[7] = -200.0f;   /* exp underflows: 0 for the reference */
        colibri_softmax(x_ref, n);
        k->softmax(x, n);
        for (i = 0; i < n; i++)
            check(k->name, "softmax", "f32", 1, n, 1, 0, i, x[i], x_ref[i], (16 + 2 * n) * ldexp(1.0, -24) * x_ref[i] + 1e-30);
        for (i = 0; i < n; i++) x[i] = x_ref[i] = 20.0f * next_float();
        if (n == 100) { x[3] = x_ref[3] = -120.0f; x[4] = x_ref[4] = 95.0f; }   /* silu(-120) = -0, silu(95) = 95 */
        colibri_silu_mul(x_ref, u, (size_t)n);
        k->silu_mul(x, u, (size_t)n);
        for (i = 0; i < n; i++)
            check(k->name, "silu_mul", "f32", 1, n, 1, 0, i, x[i], x_ref[i], 16 * ldexp(1.0, -24) * fabs(x_ref[i]) + 1e-30);
        free(x); free(x_ref); free(u);
    }
    {   /* rmsnorm: the sum of squares within dim * 2^-24 relative, three roundings after it */
        static const int32_t dims[] = { 1, 7, 16, 64, 100, 1024 };
        static const colibri_dtype norm_dtypes[] = { COLIBRI_DTYPE_F32, COLIBRI_DTYPE_F16, COLIBRI_DTYPE_BF16, COLIBRI_DTYPE_Q8_0 };
        int di, dj;
        for (di = 0; di < 6; di++) for (dj = 0; dj < 4; dj++) {
            int32_t dim = dims[di], i;
            colibri_dtype dtype = norm_dtypes[dj];
            float *x = malloc((size_t)dim * 4), *y = malloc((size_t)dim * 4), *y_ref = malloc((size_t)dim * 4);
            uint8_t *w = malloc(colibri_row_bytes(COLIBRI_DTYPE_F32, (size_t)dim));
            if (dim % colibri_dtypes[dtype].block) { free(x); free(y); free(y_ref); free(w); continue; }
            for (i = 0; i < dim; i++) {
                float v = 1.0f + 0.5f * next_float();
                x[i] = 3.0f * next_float();
                if (dtype == COLIBRI_DTYPE_F32) memcpy(w + 4 * i, &v, 4);
                else if (dtype != COLIBRI_DTYPE_Q8_0) { uint16_t h = to_half_bits(v, dtype); memcpy(w + 2 * i, &h, 2); }
            }
            if (dtype == COLIBRI_DTYPE_Q8_0) {
                float *v = malloc((size_t)dim * 4);
                for (i = 0; i < dim; i++) v[i] = 1.0f + 0.5f * next_float();
                quantize_row(v, dim, dtype, w);
                free(v);
            }
            colibri_ref_rmsnorm(y_ref, x, w, dtype, dim, 1e-6f);
            k->rmsnorm(y, x, w, dtype, dim, 1e-6f);
            for (i = 0; i < dim; i++)
                check(k->name, "rmsnorm", colibri_dtypes[dtype].name, 1, dim, 1, 0, i, y[i], y_ref[i],
                      (dim + 4) * ldexp(1.0, -24) * fabs(y_ref[i]) + 1e-30);
            free(x); free(y); free(y_ref); free(w);
        }
    }
    printf("%s softmax, silu, rmsnorm: %d outputs compared with the reference, %d outside the budget\n", k->name, checked - count,
           failures - before);
}

/* colibri_kv_store's conversions against their definitions.  f16: every finite half comes back
 * unchanged, and each point halfway between neighbours (and a hair either side of it) rounds to the
 * even one (to the nearer); past 65504 + half a step, inf.  q8_0: llama.cpp's rule, d = max|x| / 127
 * (stored as f16) and q = roundf(x * 127 / max|x|) with that unrounded d, over blocks of assorted
 * magnitudes, an all-zero block included. */
static void test_kv_store(void)
{
    int before = failures, count = checked, c;
    uint32_t h;
    for (h = 0; h < 0x7bffu; h++) {   /* 0x7bff's upper neighbour is inf: checked below */   /* the positive finite halves; the negative ones by sign */
        float x = colibri_f16_to_f32((uint16_t)h), next = colibri_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)(((double)x + next) / 2);   /* exact in f32: halves have 11 significant bits */
        uint16_t even = (uint16_t)((h & 1u) ? h + 1 : h);
        uint16_t got[5], want[5];
        got[0] = colibri_f32_to_f16(x); want[0] = (uint16_t)h;
        got[1] = colibri_f32_to_f16(-x); want[1] = (uint16_t)(h | 0x8000u);
        got[2] = colibri_f32_to_f16(mid); want[2] = even;
        got[3] = colibri_f32_to_f16(nextafterf(mid, 0.0f)); want[3] = (uint16_t)h;
        got[4] = colibri_f32_to_f16(nextafterf(mid, 1e30f)); want[4] = (uint16_t)(h + 1);
        for (c = 0; c < 5; c++) {
            checked++;
            if (got[c] != want[c] && failures++ < 10)
                fprintf(stderr, "f32 -> f16 of case %d near half 0x%04x: 0x%04x, want 0x%04x\n", c, (unsigned)h,
                        (unsigned)got[c], (unsigned)want[c]);
        }
    }
    {
        float x[4 * 32];
        uint8_t blocks[4 * 34];
        int32_t b, j;
        for (b = 0; b < 4; b++)
            for (j = 0; j < 32; j++) x[32 * b + j] = b == 3 ? 0.0f : next_float() * (b == 0 ? 1e-3f : b == 1 ? 1.0f : 300.0f);
        colibri_kv_store(blocks, COLIBRI_DTYPE_Q8_0, x, 4 * 32);
        for (b = 0; b < 4; b++) {
            float amax = 0.0f, d, id;
            uint16_t dh;
            for (j = 0; j < 32; j++) amax = fabsf(x[32 * b + j]) > amax ? fabsf(x[32 * b + j]) : amax;
            d = amax / 127.0f;
            id = d != 0.0f ? 1.0f / d : 0.0f;
            memcpy(&dh, blocks + 34 * b, 2);
            checked++;
            if (dh != colibri_f32_to_f16(d) && failures++ < 10) fprintf(stderr, "q8_0 block %d: d 0x%04x\n", (int)b, (unsigned)dh);
            for (j = 0; j < 32; j++) {
                checked++;
                if ((int8_t)blocks[34 * b + 2 + j] != (int8_t)roundf(x[32 * b + j] * id) && failures++ < 10)
                    fprintf(stderr, "q8_0 block %d quant %d: %d\n", (int)b, (int)j, (int)(int8_t)blocks[34 * b + 2 + j]);
            }
        }
    }
    checked++;
    if ((colibri_f32_to_f16(65504.0f) != 0x7bffu || colibri_f32_to_f16(65519.99f) != 0x7bffu ||
         colibri_f32_to_f16(65520.0f) != 0x7c00u) && failures++ < 10)
        fprintf(stderr, "f32 -> f16 at the top of the range: not 65504, 65504, inf\n");
    printf("KV cache stores (f16 rounding, q8_0 blocks): %d checked, %d wrong\n", checked - count, failures - before);
}

int main(int argc, char **argv)
{
    int32_t i, tested = 0;
    if (argc == 2 && strcmp(argv[1], "--emulated") == 0) emulated = 1;
    else if (argc != 1) { fprintf(stderr, "usage: test_kernels [--emulated]\n"); return 2; }
    for (i = 1; colibri_kernels_variant(i); i++) {   /* reference-int8 too: its int8 path against the float oracle */
        const colibri_kernels *k = colibri_kernels_variant(i);
        if (!colibri_kernels_runnable(k)) { printf("%s kernels: this CPU cannot run them\n", k->name); continue; }
        test_variant(k);
        test_reference_formats(k);
        test_attention(k);
        test_latent(k);
        test_exp_kernels(k);
        test_tails(k);
        test_f16_values(k);
        tested++;
    }
    test_kv_store();
    if (tested == 1) printf("no SIMD kernel variant runs here: only the references\n");
    return failures ? 1 : 0;
}
