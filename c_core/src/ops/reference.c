/* SPDX-License-Identifier: MIT */
/* Reference kernels: plain C, one obvious loop each, never "optimised". */
#include <math.h>
#include <string.h>

#include "ops.h"
#include "../util.h"
#include "quant_tables.h"

float colibri_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    uint32_t bits;
    float f;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13);           /* inf, nan */
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;                                             /* +-0 */
    } else {                                                     /* subnormal: renormalise */
        exponent = 113;
        while (!(mantissa & 0x400u)) { mantissa <<= 1; exponent--; }
        bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t colibri_f32_to_f16(float x)
{
    uint32_t bits, sign, rest, h, rem, half;
    int32_t shift;
    memcpy(&bits, &x, 4);
    sign = (bits >> 16) & 0x8000u;
    bits &= 0x7fffffffu;
    if (bits >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (bits > 0x7f800000u ? 0x200u : 0u));   /* inf, nan */
    if (bits >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   /* 65520 and up round past 65504 */
    if (bits >= 0x38800000u) {   /* a normal half: rebias, keep 10 of 23 mantissa bits */
        h = (bits - 0x38000000u) >> 13;
        rem = bits & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    if (bits < 0x33000000u) return (uint16_t)sign;   /* at most 2^-25: rounds to zero */
    /* a subnormal half: x / 2^-24 rounded, x = (1.m) 2^(e - 127), e in [102, 112] */
    rest = (bits & 0x7fffffu) | 0x800000u;
    shift = 126 - (int32_t)(bits >> 23);
    h = rest >> shift;
    rem = rest & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

void colibri_kv_store(void *dst, colibri_dtype dtype, const float *x, int32_t n)
{
    uint8_t *out = dst;
    int32_t i, j;
    if (dtype == COLIBRI_DTYPE_F32) { memcpy(dst, x, (size_t)n * sizeof(float)); return; }
    if (dtype == COLIBRI_DTYPE_F16) {
        for (i = 0; i < n; i++) {
            uint16_t h = colibri_f32_to_f16(x[i]);
            memcpy(out + 2 * (size_t)i, &h, 2);
        }
        return;
    }
    for (i = 0; i < n; i += COLIBRI_BLOCK, out += 34) {   /* q8_0: d (f16), then 32 int8 */
        float amax = 0.0f, d, id;
        uint16_t h;
        for (j = 0; j < COLIBRI_BLOCK; j++) amax = fabsf(x[i + j]) > amax ? fabsf(x[i + j]) : amax;
        d = amax / 127;
        id = d != 0.0f ? 1.0f / d : 0.0f;
        h = colibri_f32_to_f16(d);
        memcpy(out, &h, 2);
        for (j = 0; j < COLIBRI_BLOCK; j++) out[2 + j] = (uint8_t)(int8_t)roundf(x[i + j] * id);
    }
}

float colibri_bf16_to_f32(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

const colibri_dtype_traits colibri_dtypes[COLIBRI_DTYPE_COUNT] = {
    /*                        name      block  bytes  weights int8  simd  f16 at, count  rows */
    [COLIBRI_DTYPE_F32]    = { "f32",      1,     4,     1,     0,    1,     0, 0,  1 },
    [COLIBRI_DTYPE_F16]    = { "f16",      1,     2,     1,     0,    1,     0, 0,  1 },
    [COLIBRI_DTYPE_BF16]   = { "bf16",     1,     2,     1,     0,    1,     0, 0,  1 },
    [COLIBRI_DTYPE_U8]     = { "u8",       1,     1,     0,     0,    1,     0, 0,  1 },
    [COLIBRI_DTYPE_I32]    = { "i32",      1,     4,     0,     0,    1,     0, 0,  1 },
    [COLIBRI_DTYPE_Q8_0]   = { "q8_0",     32,    34,    1,     1,    1,     0, 1,  1 },
    [COLIBRI_DTYPE_Q4_0]   = { "q4_0",     32,    18,    1,     1,    1,     0, 1,  1 },
    [COLIBRI_DTYPE_W4G128] = { "w4g128",   128,   66,    1,     0,    1,     0, 1,  1 },
    [COLIBRI_DTYPE_Q4_K]   = { "q4_k",     256,   144,   1,     1,    2,     0, 2,  1 },
    [COLIBRI_DTYPE_Q6_K]   = { "q6_k",     256,   210,   1,     1,    2,   208, 1,  1 },
    [COLIBRI_DTYPE_Q5_K]   = { "q5_k",     256,   176,   1,     1,    2,     0, 2,  1 },
    [COLIBRI_DTYPE_Q4_1]   = { "q4_1",     32,    20,    1,     1,    2,     0, 2,  1 },
    [COLIBRI_DTYPE_Q5_0]   = { "q5_0",     32,    22,    1,     1,    2,     0, 1,  1 },
    [COLIBRI_DTYPE_Q5_1]   = { "q5_1",     32,    24,    1,     1,    2,     0, 2,  1 },
    [COLIBRI_DTYPE_IQ4_NL] = { "iq4_nl",   32,    18,    1,     1,    2,     0, 1,  1 },
    [COLIBRI_DTYPE_IQ4_XS] = { "iq4_xs",   256,   136,   1,     1,    2,     0, 1,  1 },
    [COLIBRI_DTYPE_MXFP4]  = { "mxfp4",    32,    17,    1,     1,    2,     0, 0,  1 },   /* an E8M0 scale */
    [COLIBRI_DTYPE_Q3_K]   = { "q3_k",     256,   110,   1,     1,    2,   108, 1,  1 },
    [COLIBRI_DTYPE_Q2_K]   = { "q2_k",     256,   84,    1,     1,    2,    80, 2,  1 },
    /* 8 rows' blocks interleaved: f16 at, count of each group of 8 blocks (the 8 scales) */
    [COLIBRI_DTYPE_Q4_0X8] = { "q4_0x8",   32,    18,    1,     1,    2,     0, 8,  8 },
    [COLIBRI_DTYPE_Q8_0X8] = { "q8_0x8",   32,    34,    1,     1,    2,     0, 8,  8 },
    [COLIBRI_DTYPE_Q4_KX8] = { "q4_kx8",   256,   144,   1,     1,    2,     0, 16, 8 },   /* d[8], dmin[8] */
    [COLIBRI_DTYPE_Q5_KX8] = { "q5_kx8",   256,   176,   1,     1,    2,     0, 16, 8 },
    [COLIBRI_DTYPE_Q6_KX8] = { "q6_kx8",   256,   210,   1,     1,    2,  1664, 8,  8 },
    [COLIBRI_DTYPE_IQ4_XSX8] = { "iq4_xsx8", 256, 136,   1,     1,    2,     0, 8,  8 },
    [COLIBRI_DTYPE_MXFP4X8] = { "mxfp4x8", 32,    17,    1,     1,    2,     0, 0,  8 },   /* e[8]: E8M0 */
};

/* Each interleaved format's plain one, and the plain block's fields (bytes, in order, 0 ends):
 * a group of 8 rows' block b holds each field in turn, the 8 rows' copies side by side, a field of
 * 8k bytes as 8-byte pieces (row i's piece c at 64 c + 8 i of the field's 8 copies), a smaller
 * one (1, 2 or 4 bytes: q4_k's 12 scale bytes are three of 4) row after row.  docs/FORMAT.md. */
static const struct { colibri_dtype x8, plain; uint8_t fields[8]; } interleaved[] = {
    { COLIBRI_DTYPE_Q4_0X8, COLIBRI_DTYPE_Q4_0, { 2, 16 } },
    { COLIBRI_DTYPE_Q8_0X8, COLIBRI_DTYPE_Q8_0, { 2, 32 } },
    { COLIBRI_DTYPE_Q4_KX8, COLIBRI_DTYPE_Q4_K, { 2, 2, 4, 4, 4, 128 } },          /* d, dmin, scales, qs */
    { COLIBRI_DTYPE_Q5_KX8, COLIBRI_DTYPE_Q5_K, { 2, 2, 4, 4, 4, 32, 128 } },      /* d, dmin, scales, qh, qs */
    { COLIBRI_DTYPE_Q6_KX8, COLIBRI_DTYPE_Q6_K, { 128, 64, 16, 2 } },              /* ql, qh, scales, d */
    { COLIBRI_DTYPE_IQ4_XSX8, COLIBRI_DTYPE_IQ4_XS, { 2, 2, 4, 128 } },            /* d, scales_h, scales_l, qs */
    { COLIBRI_DTYPE_MXFP4X8, COLIBRI_DTYPE_MXFP4, { 1, 16 } },                     /* e, qs */
};
#define INTERLEAVED ((int32_t)(sizeof interleaved / sizeof interleaved[0]))

/* Moves row i's block between its plain bytes and its group's: into_group 1 copies the block at
 * `from` into the group at `to`, 0 the group at `from` out into the block at `to`. */
static void move_block(uint8_t *to, const uint8_t *from, const uint8_t *fields, size_t i, int into_group)
{
    size_t in_group = 0, in_block = 0, f, c;
    for (f = 0; f < 8 && fields[f]; in_group += 8 * (size_t)fields[f], in_block += fields[f], f++) {
        size_t size = fields[f], piece = size % 8 ? size : 8;   /* a small field whole, a larger one in 8-byte pieces */
        for (c = 0; c < size / piece; c++) {
            size_t g = in_group + (size % 8 ? size * i : 64 * c + 8 * i), b = in_block + piece * c;
            memcpy(to + (into_group ? g : b), from + (into_group ? b : g), piece);
        }
    }
}

static const uint8_t *fields_of(colibri_dtype dtype)
{
    int32_t k;
    for (k = 0; k < INTERLEAVED; k++)
        if (interleaved[k].x8 == dtype) return interleaved[k].fields;
    return NULL;
}

int colibri_dtype_is_block(colibri_dtype dtype) { return colibri_dtypes[dtype].block > 1; }
int colibri_dtype_int8_path(colibri_dtype dtype) { return colibri_dtypes[dtype].int8_path; }
int colibri_dtype_simd(colibri_dtype dtype) { return colibri_dtypes[dtype].simd; }

colibri_dtype colibri_dtype_plain(colibri_dtype dtype)
{
    int32_t k;
    for (k = 0; k < INTERLEAVED; k++)
        if (interleaved[k].x8 == dtype) return interleaved[k].plain;
    return dtype;
}

colibri_dtype colibri_dtype_x8(colibri_dtype dtype)
{
    int32_t k;
    for (k = 0; k < INTERLEAVED; k++)
        if (interleaved[k].plain == dtype) return interleaved[k].x8;
    return dtype;
}

colibri_status colibri_interleave_rows(void *dst, const void *src, colibri_dtype dtype, int64_t rows, int64_t cols,
                                       colibri_error *err)
{
    colibri_dtype plain = (unsigned)dtype < COLIBRI_DTYPE_COUNT ? colibri_dtype_plain(dtype) : dtype;
    colibri_dtype x8 = (unsigned)dtype < COLIBRI_DTYPE_COUNT ? colibri_dtype_x8(plain) : dtype;
    int into_groups = dtype == plain;   /* plain -> interleaved; an interleaved dtype goes back */
    int64_t r, b, blocks;
    size_t bb;
    if (x8 == plain)
        return colibri_fail(err, COLIBRI_E_DTYPE, "dtype %d has no row-interleaved form", (int)dtype);
    if (rows < 0 || rows % 8 || cols <= 0 || cols % colibri_dtypes[dtype].block)
        return colibri_fail(err, COLIBRI_E_SHAPE, "%s: %lld rows of %lld weights are not groups of 8 rows of whole %d-weight blocks",
                            colibri_dtypes[dtype].name, (long long)rows, (long long)cols, (int)colibri_dtypes[dtype].block);
    bb = (size_t)colibri_dtypes[dtype].block_bytes;
    blocks = cols / colibri_dtypes[dtype].block;
    for (r = 0; r < rows; r++)
        for (b = 0; b < blocks; b++) {
            size_t at_group = ((size_t)(r / 8) * 8 * (size_t)blocks + (size_t)b * 8) * bb;
            size_t at_block = ((size_t)r * (size_t)blocks + (size_t)b) * bb;
            size_t to = into_groups ? at_group : at_block, from = into_groups ? at_block : at_group;
            move_block((uint8_t *)dst + to, (const uint8_t *)src + from, fields_of(x8), (size_t)(r % 8), into_groups);
        }
    return COLIBRI_OK;
}

size_t colibri_row_bytes(colibri_dtype dtype, size_t n)
{
    return n / (size_t)colibri_dtypes[dtype].block * (size_t)colibri_dtypes[dtype].block_bytes;
}

/* Quant j (0..31) of a q4_0 nibble group: byte j low, byte j - 16 high; 0..15. */
static int q4_nibble(const uint8_t *group, size_t j) { return j < 16 ? group[j] & 0x0f : group[j - 16] >> 4; }

static float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return colibri_f16_to_f32(h);
}

/* Sub-block s (0..7) of a q4_k / q5_k block's 12 scale bytes: a 6-bit scale and a 6-bit min,
 * s < 4 in bytes s and s + 4, s >= 4 split over byte s + 4 (low bits) and the top two bits of
 * bytes s - 4 and s. */
static void k4_scale_min(const uint8_t *sc, size_t s, int *scale, int *min)
{
    if (s < 4) {
        *scale = sc[s] & 63;
        *min = sc[s + 4] & 63;
    } else {
        *scale = (sc[s + 4] & 0x0f) | ((sc[s - 4] >> 6) << 4);
        *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
}

/* Element j of one block, in llama.cpp's arithmetic (float, in its order): the block formats'
 * one definition, which every kernel of theirs is tested against. */
static float block_element(const uint8_t *b, colibri_dtype dtype, size_t j)
{
    switch (dtype) {
    case COLIBRI_DTYPE_Q8_0: return f16_at(b) * (float)(int8_t)b[2 + j];
    case COLIBRI_DTYPE_Q4_0: case COLIBRI_DTYPE_W4G128:   /* q4_0: one group; w4g128: four */
        return f16_at(b) * (float)(q4_nibble(b + 2 + j / 32 * 16, j % 32) - 8);
    case COLIBRI_DTYPE_Q4_K: case COLIBRI_DTYPE_Q5_K: {
        /* d, dmin, scales[12], (q5_k: qh[32]), qs[128]: 64 weights per 32 bytes of qs, low
         * nibbles then high; sub-block s = j / 32; q5_k's fifth bit is bit s of qh[j % 32] */
        size_t s = j / 32, l = j % 32;
        const uint8_t *qs = b + (dtype == COLIBRI_DTYPE_Q4_K ? 16 : 48) + j / 64 * 32;
        int scale, min, q = s % 2 ? qs[l] >> 4 : qs[l] & 0x0f;
        if (dtype == COLIBRI_DTYPE_Q5_K) q |= ((b[16 + l] >> s) & 1) << 4;
        k4_scale_min(b + 4, s, &scale, &min);
        return f16_at(b) * (float)scale * (float)q - f16_at(b + 2) * (float)min;
    }
    case COLIBRI_DTYPE_Q6_K: {
        /* ql[128], qh[64], scales[16] int8, d; per half of 128 weights: 64 bytes of ql (low
         * nibbles then high), 32 of qh (2 bits each, 32 weights per shift) */
        size_t h = j / 128, r = j % 128;
        int lo = (b[h * 64 + r % 64] >> (r / 64 * 4)) & 0x0f, hi = (b[128 + h * 32 + r % 32] >> (r / 32 * 2)) & 3;
        return f16_at(b + 208) * (float)(int8_t)b[192 + j / 16] * (float)((lo | hi << 4) - 32);
    }
    case COLIBRI_DTYPE_Q4_1: return f16_at(b) * (float)q4_nibble(b + 4, j) + f16_at(b + 2);
    case COLIBRI_DTYPE_Q5_0: case COLIBRI_DTYPE_Q5_1: {   /* d, (m), qh[4]: bit j, qs[16] as q4_0 */
        size_t at = dtype == COLIBRI_DTYPE_Q5_0 ? 2 : 4;
        int q = q4_nibble(b + at + 4, j) | ((b[at + j / 8] >> (j % 8)) & 1) << 4;
        return dtype == COLIBRI_DTYPE_Q5_0 ? f16_at(b) * (float)(q - 16) : f16_at(b) * (float)q + f16_at(b + 2);
    }
    case COLIBRI_DTYPE_IQ4_NL: return f16_at(b) * (float)colibri_iq4nl_values[q4_nibble(b + 2, j)];
    case COLIBRI_DTYPE_IQ4_XS: {   /* d, scales_h (2 bits each), scales_l[4] (nibbles), qs[128]: q4_0 groups */
        size_t s = j / 32;
        int scale = ((b[4 + s / 2] >> (s % 2 * 4)) & 0x0f) | ((b[2 + s / 4] >> (s % 4 * 2)) & 3) << 4;
        return f16_at(b) * (float)(scale - 32) * (float)colibri_iq4nl_values[q4_nibble(b + 8 + s * 16, j % 32)];
    }
    case COLIBRI_DTYPE_MXFP4:   /* e, then q4_0's nibbles: E2M1 values (doubled) times 2^(e - 128) */
        return colibri_e8m0_half(b[0]) * (float)colibri_mxfp4_values[q4_nibble(b + 1, j)];
    case COLIBRI_DTYPE_Q3_K: {
        /* hmask[32], qs[64], scales[12], d: a 2-bit quant (shift 2 (j % 128 / 32) of qs[j / 128 * 32
         * + j % 32]) less 4 where bit j / 32 of hmask[j % 32] is clear; 16 6-bit scales less 32, low
         * nibbles in bytes 0..7 (the first 8 low, the next 8 high), top 2 bits in bytes 8..11 */
        size_t r = j % 128, k = j / 16;
        int q = (b[32 + j / 128 * 32 + r % 32] >> (r / 32 * 2)) & 3;
        int scale = ((k < 8 ? b[96 + k] : b[96 + k - 8] >> 4) & 0x0f) | ((b[104 + k % 4] >> (k / 4 * 2)) & 3) << 4;
        if (!((b[j % 32] >> (j / 32)) & 1)) q -= 4;
        return f16_at(b + 108) * (float)(scale - 32) * (float)q;
    }
    case COLIBRI_DTYPE_Q2_K: {   /* scales[16] (scale low, min high nibble), qs[64], d, dmin */
        size_t r = j % 128;
        int q = (b[16 + j / 128 * 32 + r % 32] >> (r / 32 * 2)) & 3, sc = b[j / 16];
        return f16_at(b + 80) * (float)(sc & 0x0f) * (float)q - f16_at(b + 82) * (float)(sc >> 4);
    }
    default: return 0.0f;   /* not a block format */
    }
}

float colibri_load_f32(const void *w, colibri_dtype dtype, size_t i)
{
    uint16_t h;
    if (dtype == COLIBRI_DTYPE_F32) return ((const float *)w)[i];
    if (colibri_dtype_is_block(dtype)) {   /* rows are whole blocks, so element i is in block i / block */
        size_t j = i % (size_t)colibri_dtypes[dtype].block;
        return block_element((const uint8_t *)w + colibri_row_bytes(dtype, i - j), dtype, j);
    }
    memcpy(&h, (const uint8_t *)w + 2 * i, 2);
    return dtype == COLIBRI_DTYPE_F16 ? colibri_f16_to_f32(h) : colibri_bf16_to_f32(h);
}

void colibri_dequantize(float *y, const void *w, colibri_dtype dtype, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) y[i] = colibri_load_f32(w, dtype, i);
}

const uint8_t *colibri_block_at(uint8_t *buf, const void *w, colibri_dtype dtype, int32_t cols, int32_t r, int32_t b)
{
    const colibri_dtype_traits *tr = &colibri_dtypes[dtype];
    size_t row_bytes = colibri_row_bytes(dtype, (size_t)cols), bb = (size_t)tr->block_bytes;
    if (tr->rows == 1) return (const uint8_t *)w + (size_t)r * row_bytes + (size_t)b * bb;
    move_block(buf, (const uint8_t *)w + (size_t)r / 8 * 8 * row_bytes + (size_t)b * 8 * bb, fields_of(dtype), (size_t)r % 8, 0);
    return buf;
}

void colibri_dequantize_rows(float *y, const void *w, colibri_dtype dtype, int32_t rows, int32_t cols)
{
    colibri_dtype plain = colibri_dtype_plain(dtype);
    int32_t r, b, j, block = colibri_dtypes[dtype].block;
    uint8_t buf[COLIBRI_MAX_BLOCK_BYTES];
    if (colibri_dtypes[dtype].rows == 1) { colibri_dequantize(y, w, dtype, (size_t)rows * (size_t)cols); return; }
    for (r = 0; r < rows; r++)
        for (b = 0; b < cols / block; b++) {
            const uint8_t *blk = colibri_block_at(buf, w, dtype, cols, r, b);
            for (j = 0; j < block; j++) y[(size_t)r * cols + (size_t)b * block + j] = block_element(blk, plain, (size_t)j);
        }
}

void colibri_matmul_by_rows(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t n, int32_t cols,
                            int32_t rows, float (*dot)(const uint8_t *row, colibri_dtype dtype, const float *x, int32_t cols))
{
    size_t row_bytes = colibri_row_bytes(dtype, (size_t)cols);
    int32_t r, t;
    /* W small enough for L2 (a router, a small projection): each token's x stays in L1 while the
     * rows go by; else each row stays in L1 while the tokens go by.  The same dots either way. */
    if ((size_t)rows * row_bytes <= (256u << 10)) {
        for (t = 0; t < n; t++)
            for (r = 0; r < rows; r++)
                y[(size_t)t * rows + r] = dot((const uint8_t *)w + (size_t)r * row_bytes, dtype, x + (size_t)t * cols, cols);
    } else {
        for (r = 0; r < rows; r++)
            for (t = 0; t < n; t++)
                y[(size_t)t * rows + r] = dot((const uint8_t *)w + (size_t)r * row_bytes, dtype, x + (size_t)t * cols, cols);
    }
}

/* y (n, rows) = x (n, cols) @ W (rows, cols)^T */
void colibri_ref_matmul(float *y, const float *x, const void *w, colibri_dtype dtype,
                        int32_t n, int32_t cols, int32_t rows)
{
    int32_t r, t, c;
    for (r = 0; r < rows; r++) {
        for (t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * cols;
            double acc = 0.0;   /* the oracle sums exactly enough not to add error of its own */
            if (dtype == COLIBRI_DTYPE_F32) {
                const float *wr = (const float *)w + (size_t)r * cols;
                for (c = 0; c < cols; c++) acc += (double)wr[c] * xt[c];
            } else if (colibri_dtypes[dtype].rows > 1) {   /* interleaved: the plain format's sums */
                colibri_dtype plain = colibri_dtype_plain(dtype);
                int32_t block = colibri_dtypes[dtype].block;
                uint8_t buf[COLIBRI_MAX_BLOCK_BYTES];
                for (c = 0; c < cols; c += block) {
                    const uint8_t *blk = colibri_block_at(buf, w, dtype, cols, r, c / block);
                    int32_t j;
                    for (j = 0; j < block; j++) acc += (double)block_element(blk, plain, (size_t)j) * xt[c + j];
                }
            } else if (colibri_dtype_is_block(dtype)) {
                const uint8_t *wr = (const uint8_t *)w + (size_t)r * colibri_row_bytes(dtype, (size_t)cols);
                for (c = 0; c < cols; c++) acc += (double)colibri_load_f32(wr, dtype, (size_t)c) * xt[c];
            } else {
                const uint16_t *wr = (const uint16_t *)w + (size_t)r * cols;
                for (c = 0; c < cols; c++)
                    acc += (double)(dtype == COLIBRI_DTYPE_F16 ? colibri_f16_to_f32(wr[c]) : colibri_bf16_to_f32(wr[c])) * xt[c];
            }
            y[(size_t)t * rows + r] = (float)acc;
        }
    }
}

/* y (dim) = x / sqrt(mean(x^2) + eps) * w */
void colibri_ref_rmsnorm(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t dim, float eps)
{
    double ss = 0.0;
    float scale;
    int32_t i;
    for (i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    scale = 1.0f / sqrtf((float)(ss / dim) + eps);
    for (i = 0; i < dim; i++) y[i] = colibri_load_f32(w, dtype, (size_t)i) * (x[i] * scale);
}

void colibri_layernorm(float *y, const float *x, const void *w, colibri_dtype w_dtype, const void *b,
                       colibri_dtype b_dtype, int32_t dim, float eps)
{
    double sum = 0.0, sq = 0.0;
    float mean, inv;
    int32_t i;
    for (i = 0; i < dim; i++) sum += x[i];
    mean = (float)(sum / dim);
    for (i = 0; i < dim; i++) sq += ((double)x[i] - mean) * ((double)x[i] - mean);
    inv = 1.0f / sqrtf((float)(sq / dim) + eps);
    for (i = 0; i < dim; i++)
        y[i] = (x[i] - mean) * inv * colibri_load_f32(w, w_dtype, (size_t)i) + colibri_load_f32(b, b_dtype, (size_t)i);
}

/* Round to nearest, ties to even, for |v| < 2^22: what cvtps2dq and fcvtns do in their default mode. */
static float round_even(float v) { return (v + 12582912.0f) - 12582912.0f; }

/* Blocks of 32 that share one d in each `group` of x's elements (32 or 256). */
static void quantize_groups(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols, int32_t group)
{
    int32_t g, b, j, per = group / COLIBRI_BLOCK;
    for (g = 0; g < n * (cols / group); g++, x += group, xq += per) {
        float amax = 0.0f, d, id;
        for (j = 0; j < group; j++) if (fabsf(x[j]) > amax) amax = fabsf(x[j]);
        d = amax / 127.0f;
        id = d != 0.0f ? 1.0f / d : 0.0f;
        for (b = 0; b < per; b++) {
            xq[b].d = d;
            xq[b].sum = 0;
            for (j = 0; j < COLIBRI_BLOCK; j++) {
                xq[b].q[j] = (int8_t)round_even(x[b * COLIBRI_BLOCK + j] * id);
                xq[b].sum += xq[b].q[j];
            }
        }
    }
}

void colibri_ref_quantize_q8(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    quantize_groups(xq, x, n, cols, COLIBRI_BLOCK);
}

void colibri_ref_quantize_q8_256(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    quantize_groups(xq, x, n, cols, 256);
}

/* Activation block g (32 weights from 32 g) of one weight block of the int8 path's other formats
 * (q4_1 and q5_1: m is minus the block's m):
 * the weights as integers w (0..63 or signed table values), an integer scale and an integer min
 * for each half of 16, and floats d, m such that weight j = d * scale[j / 16] * w[j] - m *
 * min[j / 16].  Every such group lies inside one sub-block of its format (sub-blocks are 16 or 32
 * weights, aligned), so d and m are the group's; min is 1 but for q2_k's mins, one per 16. */
static void int8_group(const uint8_t *b, colibri_dtype dtype, size_t g, int w[32], int scale[2], int min[2], float *d, float *m)
{
    size_t j;
    *m = 0.0f;
    min[0] = min[1] = 1;
    switch (dtype) {
    case COLIBRI_DTYPE_Q4_K: case COLIBRI_DTYPE_Q5_K: {
        const uint8_t *qs = b + (dtype == COLIBRI_DTYPE_Q4_K ? 16 : 48) + g / 2 * 32;
        int sc, mn;
        k4_scale_min(b + 4, g, &sc, &mn);
        for (j = 0; j < 32; j++) {
            w[j] = g % 2 ? qs[j] >> 4 : qs[j] & 0x0f;
            if (dtype == COLIBRI_DTYPE_Q5_K) w[j] |= ((b[16 + j] >> g) & 1) << 4;
        }
        scale[0] = scale[1] = sc;
        *d = f16_at(b);
        *m = f16_at(b + 2) * (float)mn;
        return;
    }
    case COLIBRI_DTYPE_Q6_K: {
        size_t h = g / 4, r0 = g % 4 * 32;
        for (j = 0; j < 32; j++) {
            size_t r = r0 + j;
            int lo = (b[h * 64 + r % 64] >> (r / 64 * 4)) & 0x0f, hi = (b[128 + h * 32 + r % 32] >> (r / 32 * 2)) & 3;
            w[j] = (lo | hi << 4) - 32;
        }
        scale[0] = (int8_t)b[192 + 2 * g];
        scale[1] = (int8_t)b[193 + 2 * g];
        *d = f16_at(b + 208);
        return;
    }
    case COLIBRI_DTYPE_Q3_K: {   /* block_element's q3_k: a quant -4..3, a 6-bit scale less 32 per 16 */
        size_t h = g / 4, k;
        for (j = 0; j < 32; j++) {
            w[j] = (b[32 + h * 32 + j] >> (g % 4 * 2)) & 3;
            if (!((b[j] >> g) & 1)) w[j] -= 4;
        }
        for (k = 2 * g; k < 2 * g + 2; k++)
            scale[k % 2] = (((k < 8 ? b[96 + k] : b[96 + k - 8] >> 4) & 0x0f) | ((b[104 + k % 4] >> (k / 4 * 2)) & 3) << 4) - 32;
        *d = f16_at(b + 108);
        return;
    }
    case COLIBRI_DTYPE_Q2_K:   /* a quant 0..3; per 16 a 4-bit scale (low nibble) and min (high) */
        for (j = 0; j < 32; j++) w[j] = (b[16 + g / 4 * 32 + j] >> (g % 4 * 2)) & 3;
        scale[0] = b[2 * g] & 0x0f;
        scale[1] = b[2 * g + 1] & 0x0f;
        min[0] = b[2 * g] >> 4;
        min[1] = b[2 * g + 1] >> 4;
        *d = f16_at(b + 80);
        *m = f16_at(b + 82);
        return;
    case COLIBRI_DTYPE_IQ4_XS: {
        int sc = ((b[4 + g / 2] >> (g % 2 * 4)) & 0x0f) | ((b[2 + g / 4] >> (g % 4 * 2)) & 3) << 4;
        for (j = 0; j < 32; j++) w[j] = colibri_iq4nl_values[q4_nibble(b + 8 + g * 16, j)];
        scale[0] = scale[1] = sc - 32;
        *d = f16_at(b);
        return;
    }
    case COLIBRI_DTYPE_Q4_1: case COLIBRI_DTYPE_Q5_0: case COLIBRI_DTYPE_Q5_1: {   /* weight = d q (+ m); q5_0: d (q - 16) */
        size_t at = dtype == COLIBRI_DTYPE_Q4_1 ? 4 : dtype == COLIBRI_DTYPE_Q5_0 ? 6 : 8;
        for (j = 0; j < 32; j++) {
            w[j] = q4_nibble(b + at, j);
            if (dtype != COLIBRI_DTYPE_Q4_1) w[j] |= ((b[at - 4 + j / 8] >> (j % 8)) & 1) << 4;
            if (dtype == COLIBRI_DTYPE_Q5_0) w[j] -= 16;
        }
        scale[0] = scale[1] = 1;
        *d = f16_at(b);
        if (dtype != COLIBRI_DTYPE_Q5_0) *m = -f16_at(b + 2);
        return;
    }
    case COLIBRI_DTYPE_IQ4_NL:
        for (j = 0; j < 32; j++) w[j] = colibri_iq4nl_values[q4_nibble(b + 2, j)];
        scale[0] = scale[1] = 1;
        *d = f16_at(b);
        return;
    default:   /* mxfp4 */
        for (j = 0; j < 32; j++) w[j] = colibri_mxfp4_values[q4_nibble(b + 1, j)];
        scale[0] = scale[1] = 1;
        *d = colibri_e8m0_half(b[0]);
        return;
    }
}

/* y (n, rows) = xq @ W^T: per block pair an exact integer dot, times both scales.  The other
 * formats: per activation block an exact integer dot with each half's scale in it, then
 * dx (d dot - m msum), m the sub-block's min (0 but for q4_k, q5_k, q4_1, q5_1 and q2_k), msum
 * the exact integer dot of the halves' mins with q: sum(q) where they are 1. */
void colibri_ref_matmul_q8(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                           int32_t n, int32_t cols, int32_t rows)
{
    colibri_dtype plain = colibri_dtype_plain(dtype);   /* interleaved: the plain format's sums */
    int32_t r, t, b, j, blocks = cols / COLIBRI_BLOCK;
    uint8_t buf[COLIBRI_MAX_BLOCK_BYTES];
    for (r = 0; r < rows; r++) {
        for (t = 0; t < n; t++) {
            const colibri_q8_block *xb = xq + (size_t)t * blocks;
            float acc = 0.0f;
            if (plain != COLIBRI_DTYPE_Q8_0 && plain != COLIBRI_DTYPE_Q4_0) {
                int32_t groups = colibri_dtypes[dtype].block / COLIBRI_BLOCK;
                for (b = 0; b < blocks; b++, xb++) {
                    int wq[32], scale[2], min[2];
                    int32_t dot[2] = { 0, 0 }, msum = 0;
                    float d, m;
                    int8_group(colibri_block_at(buf, w, dtype, cols, r, b / groups), plain, (size_t)(b % groups),
                               wq, scale, min, &d, &m);
                    for (j = 0; j < COLIBRI_BLOCK; j++) {
                        dot[j / 16] += wq[j] * xb->q[j];
                        msum += min[j / 16] * xb->q[j];
                    }
                    acc += xb->d * (d * (float)(scale[0] * dot[0] + scale[1] * dot[1]) - m * (float)msum);
                }
                y[(size_t)t * rows + r] = acc;
                continue;
            }
            for (b = 0; b < blocks; b++, xb++) {
                const uint8_t *blk = colibri_block_at(buf, w, dtype, cols, r, b);
                int32_t dot = 0;
                uint16_t h;
                memcpy(&h, blk, 2);
                for (j = 0; j < COLIBRI_BLOCK; j++) {
                    int wq = plain == COLIBRI_DTYPE_Q8_0 ? (int8_t)blk[2 + j] : q4_nibble(blk + 2, (size_t)j) - 8;
                    dot += wq * xb->q[j];
                }
                acc += colibri_f16_to_f32(h) * xb->d * (float)dot;
            }
            y[(size_t)t * rows + r] = acc;
        }
    }
}

/* scores (span) = scale * K q: four partial sums, no hd-long dependency chain; a typed cache's
 * elements read one by one as colibri_load_f32 reads them. */
void colibri_ref_attention_scores(float *scores, const float *q, const void *k, colibri_dtype dtype, size_t stride,
                                  int32_t span, int32_t hd, float scale)
{
    int32_t j, i;
    for (j = 0; j < span; j++) {
        const uint8_t *row = (const uint8_t *)k + colibri_row_bytes(dtype, (size_t)j * stride);
        float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
        for (i = 0; i + 4 <= hd; i += 4) {
            d0 += q[i] * colibri_load_f32(row, dtype, (size_t)i);
            d1 += q[i + 1] * colibri_load_f32(row, dtype, (size_t)i + 1);
            d2 += q[i + 2] * colibri_load_f32(row, dtype, (size_t)i + 2);
            d3 += q[i + 3] * colibri_load_f32(row, dtype, (size_t)i + 3);
        }
        for (; i < hd; i++) d0 += q[i] * colibri_load_f32(row, dtype, (size_t)i);
        scores[j] = ((d0 + d1) + (d2 + d3)) * scale;
    }
}

/* out (hd) = sum over j of p[j] * V row j */
void colibri_ref_attention_values(float *out, const float *p, const void *v, colibri_dtype dtype, size_t stride,
                                  int32_t span, int32_t hd)
{
    int32_t j, i;
    for (i = 0; i < hd; i++) out[i] = 0.0f;
    for (j = 0; j < span; j++) {
        const uint8_t *row = (const uint8_t *)v + colibri_row_bytes(dtype, (size_t)j * stride);
        for (i = 0; i < hd; i++) out[i] += p[j] * colibri_load_f32(row, dtype, (size_t)i);
    }
}

/* q_latent (rank) = Wk (dn, rank)^T q_nope (dn): Wk's rows scaled by q_nope and added in row order */
void colibri_ref_latent_query(float *q_latent, const float *q_nope, const void *wk, colibri_dtype dtype, int32_t dn,
                              int32_t rank)
{
    int32_t i, r;
    for (r = 0; r < rank; r++) q_latent[r] = 0.0f;
    for (i = 0; i < dn; i++)
        for (r = 0; r < rank; r++) q_latent[r] += q_nope[i] * colibri_load_f32(wk, dtype, (size_t)i * rank + r);
}

/* scores (span) = scale * (latent (span, rank) q_latent + k_rope (span, dr) q_rope): one sum per position */
void colibri_ref_latent_scores(float *scores, const float *q_latent, const float *q_rope, const float *latent,
                               const float *k_rope, int32_t span, int32_t rank, int32_t dr, float scale)
{
    int32_t j, r, i;
    for (j = 0; j < span; j++) {
        const float *cj = latent + (size_t)j * rank, *pj = k_rope + (size_t)j * dr;
        float dot = 0.0f;
        for (r = 0; r < rank; r++) dot += q_latent[r] * cj[r];
        for (i = 0; i < dr; i++) dot += q_rope[i] * pj[i];
        scores[j] = dot * scale;
    }
}

static const colibri_kernels reference_kernels = {
    .name = "reference", .matmul = colibri_ref_matmul, .rmsnorm = colibri_ref_rmsnorm,
    .quantize_q8 = NULL, .matmul_q8 = NULL,   /* no int8 path: its matmul is the float oracle */
    .quantize_q8_256 = colibri_ref_quantize_q8_256,   /* what variants based on it and without their own take */
    .attention_scores = colibri_ref_attention_scores, .attention_values = colibri_ref_attention_values,
    .softmax = colibri_softmax, .silu_mul = colibri_silu_mul,
    .latent_query = colibri_ref_latent_query, .latent_scores = colibri_ref_latent_scores,
};

/* The reference with the int8 path: the same integers as every variant's, so whole-model runs of
 * a variant can be compared with it to float rounding (never picked as the best). */
static const colibri_kernels reference_int8_kernels = {
    .name = "reference-int8", .matmul = colibri_ref_matmul, .rmsnorm = colibri_ref_rmsnorm,
    .quantize_q8 = colibri_ref_quantize_q8, .quantize_q8_256 = colibri_ref_quantize_q8_256,
    .matmul_q8 = colibri_ref_matmul_q8, .attention_scores = colibri_ref_attention_scores, .attention_values = colibri_ref_attention_values,
    .softmax = colibri_softmax, .silu_mul = colibri_silu_mul,
    .latent_query = colibri_ref_latent_query, .latent_scores = colibri_ref_latent_scores,
};

const colibri_kernels *colibri_kernels_reference(void) { return &reference_kernels; }
const colibri_kernels *colibri_kernels_reference_int8(void) { return &reference_int8_kernels; }

void colibri_softmax(float *x, int32_t n)
{
    float max = x[0], sum = 0.0f;
    int32_t i;
    for (i = 1; i < n; i++) if (x[i] > max) max = x[i];
    for (i = 0; i < n; i++) { x[i] = colibri_expf(x[i] - max); sum += x[i]; }
    for (i = 0; i < n; i++) x[i] /= sum;
}

/* erf of our own, so every target computes the same GELU: the Taylor series below 3 (double
 * keeps ~13 digits through its cancellation), the asymptotic series of erfc above. */
static double erf_own(double x)
{
    double a = x < 0 ? -x : x, sum, term, r;
    int n;
    if (a < 3.0) {
        sum = term = a;
        for (n = 1; n < 60 && (term > 1e-17 * sum || -term > 1e-17 * sum); n++) {
            term *= -a * a / n;
            sum += term / (2 * n + 1);
        }
        r = sum * 1.1283791670955126;   /* 2 / sqrt(pi) */
    } else {
        double z = 1.0 / (a * a);
        r = 1.0 - colibri_exp(-a * a) / (a * 1.7724538509055160) *
                  (1.0 - z * 0.5 * (1.0 - z * 1.5 * (1.0 - z * 2.5 * (1.0 - z * 3.5 * (1.0 - z * 4.5)))));
    }
    return x < 0 ? -r : r;
}

static float activate(int activation, float x)
{
    switch (activation) {
    case COLIBRI_ACT_GELU: return (float)(0.5 * x * (1.0 + erf_own(x * 0.7071067811865476)));
    case COLIBRI_ACT_GELU_TANH: {   /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
        double y = 0.7978845608028654 * ((double)x + 0.044715 * (double)x * x * x);
        return (float)(0.5 * x * (1.0 + (1.0 - 2.0 / (colibri_exp(2.0 * y) + 1.0))));
    }
    case COLIBRI_ACT_RELU: return x > 0.0f ? x : 0.0f;
    default: return x / (1.0f + colibri_expf(-x));   /* silu */
    }
}

void colibri_act_mul(int activation, float *g, const float *u, size_t n)
{
    size_t i;
    if (activation == COLIBRI_ACT_SILU) { colibri_silu_mul(g, u, n); return; }
    for (i = 0; i < n; i++) g[i] = activate(activation, g[i]) * u[i];
}

void colibri_silu_mul(float *g, const float *u, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) g[i] = g[i] / (1.0f + colibri_expf(-g[i])) * u[i];
}

void colibri_rope(float *v, int32_t n_heads, int32_t head_dim, int32_t rope_dim, int interleaved,
                  const float *cos_t, const float *sin_t)
{
    int32_t h, j, half = rope_dim / 2;
    for (h = 0; h < n_heads; h++) {
        float *vh = v + (size_t)h * head_dim;
        for (j = 0; j < half; j++) {
            float *pa = interleaved ? vh + 2 * j : vh + j, *pb = interleaved ? vh + 2 * j + 1 : vh + j + half;
            float a = *pa, b = *pb;
            *pa = a * cos_t[j] - b * sin_t[j];
            *pb = b * cos_t[j] + a * sin_t[j];
        }
    }
}
