/* SPDX-License-Identifier: MIT */
/* The kernels a forward pass calls.
 *
 * Each has a plain reference implementation (ops/reference.c): the oracle that faster
 * variants are tested against.  colibri_kernels is the one place where an optimised
 * variant is plugged in; the forward pass calls only through it.  A variant's table names the
 * kernels it has; arch/dispatch.c fills the rest from its base (the reference, or the variant it
 * extends). */
#ifndef COLIBRI_OPS_H
#define COLIBRI_OPS_H

#include <stdint.h>
#include <string.h>

#include "colibri/colibri.h"

/* 32 activations quantized to int8 on the fly, for integer dot products with the int8 path's
 * weights (traits' int8_path): x[j] ~ d * q[j], d = max|x| / 127, q rounded to nearest (ties to
 * even).  Every sub-block of those formats (16 or 32 weights, aligned) lies inside one block.
 * For the formats of 256-weight blocks (the k-quants, iq4_xs) the 8 blocks of each 256 share one d,
 * the max over the 256 (quantize_q8_256, as llama.cpp's Q8_K): their kernels then sum a weight
 * block's integer dots exactly and scale once per 256, not once per 32. */
typedef struct colibri_q8_block {
    float d;
    int32_t sum;            /* sum of q: folds q4_0's "- 8" and q4_k's mins into one product per block */
    int8_t q[32];
} colibri_q8_block;

typedef struct colibri_kernels {
    const char *name;
    /* y (n, rows) = x (n, cols) @ W (rows, cols)^T, W stored in `dtype` */
    void (*matmul)(float *y, const float *x, const void *w, colibri_dtype dtype,
                   int32_t n, int32_t cols, int32_t rows);
    /* y (dim) = x / sqrt(mean(x^2) + eps) * w */
    void (*rmsnorm)(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t dim, float eps);
    /* The int8 path for the int8_path formats' weights, NULL where a variant has none (the reference: its
     * matmul is the float oracle; a variant based on it that leaves these empty has none either).
     * xq (n, cols / 32) = blocks of x (n, cols); then y (n, rows) = xq @ W (rows, cols)^T by integer
     * dot products, one scale per block pair. */
    void (*quantize_q8)(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols);
    void (*quantize_q8_256)(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols);   /* cols % 256 == 0 */
    void (*matmul_q8)(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                      int32_t n, int32_t cols, int32_t rows);
    /* One head's attention over its cached rows, stored in `dtype` (the KV cache's type: f32, f16 or
     * q8_0, whose blocks of 32 run along hd): span rows `stride` elements apart (a multiple of the
     * block), from k and v, which point at the head's first element of the first row:
     * scores (span) = scale * K (span, hd) q (hd), then out (hd) = p (span) @ V (span, hd). */
    void (*attention_scores)(float *scores, const float *q, const void *k, colibri_dtype dtype, size_t stride,
                             int32_t span, int32_t hd, float scale);
    void (*attention_values)(float *out, const float *p, const void *v, colibri_dtype dtype, size_t stride,
                             int32_t span, int32_t hd);
    /* x (n) <- softmax(x); g (n) <- silu(g) * u.  The reference's exp is colibri_expf (the same bits
     * everywhere); the variants' is a float polynomial within a few ulp, 8 or 16 at a time. */
    void (*softmax)(float *x, int32_t n);
    void (*silu_mul)(float *g, const float *u, size_t n);
    /* One head of latent attention (DeepSeek's), over cached latents (span, rank) and rotary keys
     * (span, dr): q_latent (rank) = Wk (dn, rank)^T q_nope (dn), Wk stored in `dtype`, the query
     * folded into the latent space; then scores (span) = scale * (C q_latent + K_rope q_rope).  The
     * weighted sum of the latents is attention_values over rows `rank` apart. */
    void (*latent_query)(float *q_latent, const float *q_nope, const void *wk, colibri_dtype dtype, int32_t dn,
                         int32_t rank);
    void (*latent_scores)(float *scores, const float *q_latent, const float *q_rope, const float *latent,
                          const float *k_rope, int32_t span, int32_t rank, int32_t dr, float scale);
} colibri_kernels;

/* Every slot above, X(slot) each: how arch/dispatch.c fills the slots a variant leaves empty from
 * its base (a slot added above is named here too; dispatch.c's size check fails until it is). */
#define COLIBRI_KERNEL_SLOTS(X) X(matmul) X(rmsnorm) X(quantize_q8) X(quantize_q8_256) X(matmul_q8) X(attention_scores) \
                                X(attention_values) X(softmax) X(silu_mul) X(latent_query) X(latent_scores)

/* What a forward pass computes with: the kernels, and the threads (platform.h's pool) that share
 * a big matmul's rows (one token) or tokens (several), each computing exactly what one thread
 * would: the result does not depend on the thread count. */
typedef struct colibri_compute {
    const colibri_kernels *kernels;
    struct colibri_pool *pool;      /* NULL: this thread alone */
    colibri_q8_block *xq;           /* (n_batch, xq_row_blocks) quantized activations */
    int32_t xq_row_blocks;          /* the widest int8-path input / 32 */
} colibri_compute;

/* y (n, rows) = x (n, cols) @ W (rows, cols)^T through c's kernels and threads (ops/parallel.c). */
void colibri_matmul(const colibri_compute *c, float *y, const float *x, const void *w, colibri_dtype dtype,
                    int32_t n, int32_t cols, int32_t rows);

const colibri_kernels *colibri_kernels_reference(void);
const colibri_kernels *colibri_kernels_reference_int8(void);   /* the reference plus the scalar int8 path */
/* arch/dispatch.c: the variants this build has, reference first (NULL past the end), each with
 * every slot filled; whether this CPU runs one; the best it runs; one by name (NULL: unknown here
 * or not runnable).  Which variants exist and their probes: c_core/arch/arch.h. */
const colibri_kernels *colibri_kernels_variant(int32_t i);
int colibri_kernels_runnable(const colibri_kernels *kernels);
const colibri_kernels *colibri_kernels_best(void);
const colibri_kernels *colibri_kernels_named(const char *name);
/* Whether a variant's matmul_q8 has kernels of its own for an interleaved format (else it hands it
 * to the scalar int8 path, block by block: correct, and slower than the plain format). */
int colibri_kernels_interleave(const colibri_kernels *kernels, colibri_dtype x8);

/* The scalar int8 path: what every variant's quantize_q8 and matmul_q8 are tested against. */
void colibri_ref_quantize_q8(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols);
void colibri_ref_quantize_q8_256(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols);
/* xq (n, cols / 32) = x (n, cols) as matmul_q8 takes it for W in `dtype`: k's quantize_q8, or
 * quantize_q8_256 for the 256-weight block formats. */
void colibri_quantize_q8_for(const colibri_kernels *k, colibri_dtype dtype, colibri_q8_block *xq, const float *x,
                             int32_t n, int32_t cols);
void colibri_ref_matmul_q8(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                           int32_t n, int32_t cols, int32_t rows);

/* Reference kernels that variants call for the shapes and formats they have nothing faster for. */
void colibri_ref_rmsnorm(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t dim, float eps);
void colibri_ref_attention_scores(float *scores, const float *q, const void *k, colibri_dtype dtype, size_t stride,
                                  int32_t span, int32_t hd, float scale);
void colibri_ref_attention_values(float *out, const float *p, const void *v, colibri_dtype dtype, size_t stride,
                                  int32_t span, int32_t hd);
void colibri_ref_latent_query(float *q_latent, const float *q_nope, const void *wk, colibri_dtype dtype, int32_t dn,
                              int32_t rank);
void colibri_ref_latent_scores(float *scores, const float *q_latent, const float *q_rope, const float *latent,
                               const float *k_rope, int32_t span, int32_t rank, int32_t dr, float scale);

/* Scalar element conversions, exact. */
static inline float colibri_e8m0_half(uint8_t e)   /* 2^(e - 128): half of an mxfp4 block's scale */
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float half_scale;
    memcpy(&half_scale, &bits, 4);
    return half_scale;
}
float colibri_f16_to_f32(uint16_t h);
uint16_t colibri_f32_to_f16(float x);   /* rounded to nearest, ties to even; overflow to inf */
/* dst = x (n) stored as a KV cache row in `dtype`: f32 copied, f16 rounded to nearest even, q8_0 as
 * llama.cpp's quantize_row_q8_0 does it (n a multiple of 32; d = max|x| / 127 stored as f16, each
 * q = roundf(x / d) with 1 / d taken from the unrounded d). */
void colibri_kv_store(void *dst, colibri_dtype dtype, const float *x, int32_t n);
float colibri_bf16_to_f32(uint16_t b);
/* Element i of a row-major tensor; not for the interleaved formats (the loader allows them only
 * where the forward pass multiplies the whole matrix): they read as 0. */
float colibri_load_f32(const void *w, colibri_dtype dtype, size_t i);
/* y (n) = the first n elements of w (n a multiple of the dtype's block), as colibri_load_f32 reads them. */
void colibri_dequantize(float *y, const void *w, colibri_dtype dtype, size_t n);
/* y (rows, cols) = W in any weight dtype, the interleaved ones included (rows % 8 == 0 for those). */
void colibri_dequantize_rows(float *y, const void *w, colibri_dtype dtype, int32_t rows, int32_t cols);

/* What a dtype stores: blocks of `block` elements in `block_bytes` bytes each (a plain type is a
 * block of one); a block format's f16 scales are `f16_count` halves from byte `f16_at` of each block
 * (what verify mode checks for inf and nan).  `rows` > 1: the blocks of each `rows` consecutive rows
 * are interleaved (q4_0x8, q8_0x8), one group of `rows` blocks per block column, whose f16 scales
 * f16_at and f16_count describe (mxfp4x8: its 8 E8M0 bytes from 0); sizes are the plain format's. */
typedef struct colibri_dtype_traits {
    const char *name;
    int32_t block, block_bytes;
    int holds_weights;      /* a float or block format; else an integer table (the tokenizer's) */
    int int8_path;          /* dot products with int8 activation blocks (matmul_q8) */
    int simd;               /* the arch variants' kernels for it: COLIBRI_SIMD_*; 0: they call the reference */
    int32_t f16_at, f16_count;
    int32_t rows;           /* rows interleaved in each block group; 1: every row stands alone */
} colibri_dtype_traits;
extern const colibri_dtype_traits colibri_dtypes[COLIBRI_DTYPE_COUNT];

#define COLIBRI_SIMD_ALL 1          /* matmul and, for an int8_path format, matmul_q8 */
#define COLIBRI_SIMD_INT8 2         /* matmul_q8 alone: the float matmul, which sessions do not call for
                                     * the format (they take the int8 path), is the reference's */

/* Bytes of one row of n weights (n a multiple of the dtype's block). */
size_t colibri_row_bytes(colibri_dtype dtype, size_t n);
int colibri_dtype_is_block(colibri_dtype dtype);
int colibri_dtype_int8_path(colibri_dtype dtype);
int colibri_dtype_simd(colibri_dtype dtype);
/* The format an interleaved one moves the blocks of (q4_0x8: q4_0); any other: itself. */
colibri_dtype colibri_dtype_plain(colibri_dtype dtype);
/* The interleaved form of a plain format (q4_k: q4_kx8); any other: itself. */
colibri_dtype colibri_dtype_x8(colibri_dtype dtype);
#define COLIBRI_MAX_BLOCK_BYTES 210   /* q6_k's */
/* Block b (the weights block * b ..) of row r of W (rows, cols) in its plain format's bytes: a pointer
 * into W, or for an interleaved format the block gathered into buf (COLIBRI_MAX_BLOCK_BYTES). */
const uint8_t *colibri_block_at(uint8_t *buf, const void *w, colibri_dtype dtype, int32_t cols, int32_t r, int32_t b);
#define COLIBRI_BLOCK 32            /* an int8 activation block, and a q8_0 / q4_0 block */

/* y (n, rows) = x (n, cols) @ W^T as one dot(row of W, dtype, x row, cols) per output, in the
 * loop order that keeps the reused operand in cache: how the variants run their float paths. */
void colibri_matmul_by_rows(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t n, int32_t cols,
                            int32_t rows, float (*dot)(const uint8_t *row, colibri_dtype dtype, const float *x, int32_t cols));

/* The reference matmul, which variants call for formats they have no kernel for. */
void colibri_ref_matmul(float *y, const float *x, const void *w, colibri_dtype dtype,
                        int32_t n, int32_t cols, int32_t rows);

/* Elementary functions of our own (ops/math.c): the same bits on every platform. */
double colibri_exp(double x);
double colibri_log(double x);
double colibri_sin(double x);
double colibri_cos(double x);
float colibri_expf(float x);

/* y (dim) = (x - mean) / sqrt(var + eps) * w + b: LayerNorm, biased variance */
void colibri_layernorm(float *y, const float *x, const void *w, colibri_dtype w_dtype, const void *b,
                       colibri_dtype b_dtype, int32_t dim, float eps);
/* x (n) <- softmax(x) */
void colibri_softmax(float *x, int32_t n);
/* g (n) <- silu(g) * u */
void colibri_silu_mul(float *g, const float *u, size_t n);
/* g (n) <- act(g) * u, act one of COLIBRI_ACT_* (GELU with an erf of our own) */
void colibri_act_mul(int activation, float *g, const float *u, size_t n);
/* Rotates the first rope_dim dimensions of each head of v (n_heads, head_dim) by the angle
 * table of one position, cos/sin (rope_dim/2): pairs (j, j + rope_dim/2), or (2j, 2j+1)
 * when interleaved. */
void colibri_rope(float *v, int32_t n_heads, int32_t head_dim, int32_t rope_dim, int interleaved,
                  const float *cos_t, const float *sin_t);

#endif
