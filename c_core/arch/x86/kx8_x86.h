/* SPDX-License-Identifier: MIT */
/* The int8 path for q4_kx8, q5_kx8, q6_kx8, iq4_xsx8 and mxfp4x8 (docs/FORMAT.md: each field of 8
 * rows' blocks side by side, the quants in 8-byte pieces; included by q8_x86.h, after
 * quant_tables.h), AVX-512 VNNI or AVX2 by the flags of the file that includes it.
 * A piece is 64 bytes, row i's 8 bytes at 8 i: one broadcast of 8 activation bytes meets 8 rows.
 * maddubs gives int16 lanes 4 i .. 4 i + 3 of row i; the pieces of one sub-block (16 or 32 weights)
 * are summed in int16 (no overflow: see each format), then multiplied by the row's sub-block scale
 * and summed into int32 lanes 2 i, 2 i + 1 (vpdpwssd, or madd + add): the super-block's exact
 * integer sum, as llama.cpp's Q8_K path keeps it.  The activations are quantize_q8_256's (one dx a
 * 256), so each super-block costs one float multiply-add per row pair of lanes.  Every token's
 * outputs take the same operations whatever RN tokens share the unpacked weights, and a group's
 * rows do not depend on the others: an output is the same whatever tokens or threads came with it. */
#ifndef COLIBRI_KX8_X86_H
#define COLIBRI_KX8_X86_H

#include "rows8_x86.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__)

typedef __m512i kv;   /* one piece: 8 rows x 8 bytes; or int16 / int32 lanes of 8 rows */

static inline kv kv_load(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline kv kv_zero(void) { return _mm512_setzero_si512(); }
static inline kv kv_byte(int c) { return _mm512_set1_epi8((char)c); }
static inline kv kv_and(kv a, kv b) { return _mm512_and_si512(a, b); }
static inline kv kv_or(kv a, kv b) { return _mm512_or_si512(a, b); }
static inline kv kv_sub8(kv a, kv b) { return _mm512_sub_epi8(a, b); }
static inline kv kv_add16(kv a, kv b) { return _mm512_add_epi16(a, b); }
static inline kv kv_sub16(kv a, kv b) { return _mm512_sub_epi16(a, b); }
static inline kv kv_srl16(kv a, int n) { return _mm512_srli_epi16(a, (unsigned)n); }   /* n a constant once inlined */
static inline kv kv_sll16(kv a, int n) { return _mm512_slli_epi16(a, (unsigned)n); }
static inline kv kv_bcast(const int8_t *q) { return _mm512_set1_epi64(x8_bytes(q)); }   /* 8 activation bytes in every row */
static inline kv kv_bcast16(int64_t four) { return _mm512_set1_epi64(four); }
static inline kv kv_maddubs(kv u, kv s) { return _mm512_maddubs_epi16(u, s); }
static inline kv kv_dot16(kv acc, kv a, kv b) { return _mm512_dpwssd_epi32(acc, a, b); }
/* |w| and x with w's sign (x 0 where w is 0 on AVX2: the product is 0 either way) */
static inline kv kv_abs8(kv w) { return _mm512_abs_epi8(w); }
static inline kv kv_sign8(kv x, kv w) { return _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x); }
/* 32 bytes, row i's 4 at 4 i, as int16 lanes 4 i .. 4 i + 3 */
static inline kv kv_widen(__m256i four_a_row) { return _mm512_cvtepu8_epi16(four_a_row); }
/* the same 16-byte shuffle in every 128-bit lane (two rows) */
static inline kv kv_shuffle(kv v, __m128i ctrl) { return _mm512_shuffle_epi8(v, _mm512_broadcast_i32x4(ctrl)); }
static inline kv kv_sra16_8(kv v) { return _mm512_srai_epi16(v, 8); }
static inline kv kv_shuffle_by(kv table, kv idx) { return _mm512_shuffle_epi8(table, idx); }
static inline kv kv_of_rows(__m256i rows0_3, __m256i rows4_7) { return _mm512_inserti64x4(_mm512_castsi256_si512(rows0_3), rows4_7, 1); }
/* 8 floats (one a row) times f, in float lanes 2 i, 2 i + 1 */
static inline x8_acc row_floats(__m256 v, float f)
{
    return _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), _mm512_castps256_ps512(v)),
                         _mm512_set1_ps(f));
}
static inline kv kv_table(const int8_t *values) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)values)); }

/* 8 f16 (one a row) times f, in float lanes 2 i, 2 i + 1 */
static inline x8_acc row_scales(const uint8_t *h, float f)
{
    __m128i v = _mm_loadu_si128((const __m128i *)h);
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_set_m128i(_mm_unpackhi_epi16(v, v), _mm_unpacklo_epi16(v, v))), _mm512_set1_ps(f));
}
static inline x8_acc acc_add(x8_acc acc, x8_acc f, kv dot) { return _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(dot), acc); }
#define KX8_RN 4

#else   /* AVX2: a piece is two ymm, rows 0..3 and rows 4..7 */

typedef struct kv { __m256i lo, hi; } kv;

static inline kv kv_pair(__m256i lo, __m256i hi) { kv r; r.lo = lo; r.hi = hi; return r; }
static inline kv kv_load(const uint8_t *p) { return kv_pair(_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 32))); }
static inline kv kv_zero(void) { return kv_pair(_mm256_setzero_si256(), _mm256_setzero_si256()); }
static inline kv kv_byte(int c) { return kv_pair(_mm256_set1_epi8((char)c), _mm256_set1_epi8((char)c)); }
static inline kv kv_and(kv a, kv b) { return kv_pair(_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)); }
static inline kv kv_or(kv a, kv b) { return kv_pair(_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)); }
static inline kv kv_sub8(kv a, kv b) { return kv_pair(_mm256_sub_epi8(a.lo, b.lo), _mm256_sub_epi8(a.hi, b.hi)); }
static inline kv kv_add16(kv a, kv b) { return kv_pair(_mm256_add_epi16(a.lo, b.lo), _mm256_add_epi16(a.hi, b.hi)); }
static inline kv kv_sub16(kv a, kv b) { return kv_pair(_mm256_sub_epi16(a.lo, b.lo), _mm256_sub_epi16(a.hi, b.hi)); }
static inline kv kv_srl16(kv a, int n) { return kv_pair(_mm256_srli_epi16(a.lo, n), _mm256_srli_epi16(a.hi, n)); }
static inline kv kv_sll16(kv a, int n) { return kv_pair(_mm256_slli_epi16(a.lo, n), _mm256_slli_epi16(a.hi, n)); }
static inline kv kv_bcast(const int8_t *q) { __m256i v = _mm256_set1_epi64x(x8_bytes(q)); return kv_pair(v, v); }
static inline kv kv_bcast16(int64_t four) { __m256i v = _mm256_set1_epi64x(four); return kv_pair(v, v); }
static inline kv kv_maddubs(kv u, kv s) { return kv_pair(_mm256_maddubs_epi16(u.lo, s.lo), _mm256_maddubs_epi16(u.hi, s.hi)); }
static inline kv kv_dot16(kv acc, kv a, kv b)
{
    return kv_pair(_mm256_add_epi32(acc.lo, _mm256_madd_epi16(a.lo, b.lo)), _mm256_add_epi32(acc.hi, _mm256_madd_epi16(a.hi, b.hi)));
}
static inline kv kv_abs8(kv w) { return kv_pair(_mm256_sign_epi8(w.lo, w.lo), _mm256_sign_epi8(w.hi, w.hi)); }
static inline kv kv_sign8(kv x, kv w) { return kv_pair(_mm256_sign_epi8(x.lo, w.lo), _mm256_sign_epi8(x.hi, w.hi)); }
static inline kv kv_widen(__m256i four_a_row)
{
    return kv_pair(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(four_a_row)), _mm256_cvtepu8_epi16(_mm256_extracti128_si256(four_a_row, 1)));
}
static inline kv kv_shuffle(kv v, __m128i ctrl)
{
    __m256i c = _mm256_broadcastsi128_si256(ctrl);
    return kv_pair(_mm256_shuffle_epi8(v.lo, c), _mm256_shuffle_epi8(v.hi, c));
}
static inline kv kv_sra16_8(kv v) { return kv_pair(_mm256_srai_epi16(v.lo, 8), _mm256_srai_epi16(v.hi, 8)); }
static inline kv kv_shuffle_by(kv table, kv idx) { return kv_pair(_mm256_shuffle_epi8(table.lo, idx.lo), _mm256_shuffle_epi8(table.hi, idx.hi)); }
static inline kv kv_of_rows(__m256i rows0_3, __m256i rows4_7) { return kv_pair(rows0_3, rows4_7); }
static inline x8_acc row_floats(__m256 v, float f)
{
    __m256 fv = _mm256_set1_ps(f);
    x8_acc a;
    a.lo = _mm256_mul_ps(_mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)), fv);
    a.hi = _mm256_mul_ps(_mm256_permutevar8x32_ps(v, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)), fv);
    return a;
}
static inline kv kv_table(const int8_t *values)
{
    __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)values));
    return kv_pair(t, t);
}

static inline x8_acc row_scales(const uint8_t *h, float f)
{
    __m128i v = _mm_loadu_si128((const __m128i *)h);
    x8_acc r;
    r.lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm_unpacklo_epi16(v, v)), _mm256_set1_ps(f));
    r.hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm_unpackhi_epi16(v, v)), _mm256_set1_ps(f));
    return r;
}
static inline x8_acc acc_add(x8_acc acc, x8_acc f, kv dot)
{
    acc.lo = _mm256_fmadd_ps(f.lo, _mm256_cvtepi32_ps(dot.lo), acc.lo);
    acc.hi = _mm256_fmadd_ps(f.hi, _mm256_cvtepi32_ps(dot.hi), acc.hi);
    return acc;
}
#define KX8_RN 2

#endif

/* int16 lanes 4 i .. 4 i + 3 (row i's four values, two rows a 128-bit lane) -> value s of each row
 * in all four of its lanes. */
static inline kv pick_of4(kv four, int s)
{
    return kv_shuffle(four, _mm_setr_epi8((char)(2 * s), (char)(2 * s + 1), (char)(2 * s), (char)(2 * s + 1), (char)(2 * s),
                                          (char)(2 * s + 1), (char)(2 * s), (char)(2 * s + 1), (char)(8 + 2 * s), (char)(9 + 2 * s),
                                          (char)(8 + 2 * s), (char)(9 + 2 * s), (char)(8 + 2 * s), (char)(9 + 2 * s),
                                          (char)(8 + 2 * s), (char)(9 + 2 * s)));
}

/* A piece of signed bytes (row i's 8 at 8 i) -> byte s of each row, sign-extended, in its four
 * int16 lanes: shuffled into each lane's high byte, then shifted down arithmetically. */
static inline kv pick_of8(kv piece, int s)
{
    const char z = (char)0x80, a = (char)s, b = (char)(8 + s);
    return kv_sra16_8(kv_shuffle(piece, _mm_setr_epi8(z, a, z, a, z, a, z, a, z, b, z, b, z, b, z, b)));
}

/* Four activation blocks' sums as int16 in every row's four lanes. */
static inline int64_t four_sums(const colibri_q8_block *x)
{
    return (int64_t)((uint64_t)(uint16_t)x[0].sum | (uint64_t)(uint16_t)x[1].sum << 16 | (uint64_t)(uint16_t)x[2].sum << 32 |
                     (uint64_t)(uint16_t)x[3].sum << 48);
}

/* Sub-blocks 2k and 2k + 1 of a q4_kx8 / q5_kx8 block column (pieces 4k .. 4k + 3 of qs: low
 * nibbles 2k, high 2k + 1; q5_k's fifth bits bits 2k, 2k + 1 of qh's pieces 0 .. 3) into isum: k a
 * constant once inlined, so every shuffle control is one. */
static inline __attribute__((always_inline)) void k4x8_pair(int RN, int q5, int k, const uint8_t *g, const colibri_q8_block *xb,
                                                            size_t xs, kv scales, kv *isum)
{
    const kv m4 = kv_byte(0x0f), bit4 = kv_byte(0x10);
    const uint8_t *qs = g + (q5 ? 384 : 128) + 256 * k;
    kv lo_sum[KX8_RN], hi_sum[KX8_RN], s_lo = pick_of4(scales, 2 * k % 4), s_hi = pick_of4(scales, (2 * k + 1) % 4);
    int p, t;
    for (t = 0; t < RN; t++) lo_sum[t] = hi_sum[t] = kv_zero();
    for (p = 0; p < 4; p++) {
        kv v = kv_load(qs + 64 * p), lo = kv_and(v, m4), hi = kv_and(kv_srl16(v, 4), m4);
        if (q5) {   /* bit 2k of qh byte j -> bit 4 of weight j's byte (16-bit shifts: the mask keeps each byte's own bit) */
            kv qh = kv_load(g + 128 + 64 * p);
            lo = kv_or(lo, kv_and(kv_sll16(kv_srl16(qh, 2 * k), 4), bit4));
            hi = kv_or(hi, kv_and(kv_sll16(kv_srl16(qh, 2 * k + 1), 4), bit4));
        }
        for (t = 0; t < RN; t++) {
            const colibri_q8_block *x = xb + (size_t)t * xs + 2 * k;
            lo_sum[t] = kv_add16(lo_sum[t], kv_maddubs(lo, kv_bcast(x[0].q + 8 * p)));
            hi_sum[t] = kv_add16(hi_sum[t], kv_maddubs(hi, kv_bcast(x[1].q + 8 * p)));
        }
    }
    for (t = 0; t < RN; t++) isum[t] = kv_dot16(kv_dot16(isum[t], lo_sum[t], s_lo), hi_sum[t], s_hi);
}

/* One q4_kx8 or q5_kx8 block column (g: d[8], dmin[8], the 12 scale bytes as three fields of 4, q5_k's
 * qh in 4 pieces, qs in 16) against RN tokens' 8 activation blocks (token t's at xb + t xs).  int16
 * pieces' sums: at most 4 * 2 * 15 * 127 = 15240 (q5_k: 31 for 15, 31496); int32 lanes: at most
 * 8 * 2 * 63 * 15240 < 2^24 (q5_k: < 2^25, rounded once by the conversion). */
static inline __attribute__((always_inline)) void k4x8_block(int RN, int q5, const uint8_t *g, const colibri_q8_block *xb, size_t xs,
                                                             x8_acc *acc)
{
    const __m256i m6 = _mm256_set1_epi32(0x3f3f3f3f), m4s = _mm256_set1_epi32(0x0f0f0f0f), m2s = _mm256_set1_epi32(0x03030303);
    const __m256i u0 = _mm256_loadu_si256((const __m256i *)(g + 32)), u1 = _mm256_loadu_si256((const __m256i *)(g + 64));
    const __m256i u2 = _mm256_loadu_si256((const __m256i *)(g + 96));
    kv scales_lo, scales_hi, mins_lo, mins_hi, isum[KX8_RN];
    int t;
    /* k4_unpack on 8 rows at once: row i's dword i of each field */
    scales_lo = kv_widen(_mm256_and_si256(u0, m6));
    scales_hi = kv_widen(_mm256_or_si256(_mm256_and_si256(u2, m4s), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), m2s), 4)));
    mins_lo = kv_widen(_mm256_and_si256(u1, m6));
    mins_hi = kv_widen(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m4s),
                                       _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), m2s), 4)));
    for (t = 0; t < RN; t++) isum[t] = kv_zero();
    k4x8_pair(RN, q5, 0, g, xb, xs, scales_lo, isum);
    k4x8_pair(RN, q5, 1, g, xb, xs, scales_lo, isum);
    k4x8_pair(RN, q5, 2, g, xb, xs, scales_hi, isum);
    k4x8_pair(RN, q5, 3, g, xb, xs, scales_hi, isum);
    for (t = 0; t < RN; t++) {   /* the mins: sum over sub-blocks of min * sum(x), in integers too */
        const colibri_q8_block *x = xb + (size_t)t * xs;
        kv msum = kv_dot16(kv_dot16(kv_zero(), mins_lo, kv_bcast16(four_sums(x))), mins_hi, kv_bcast16(four_sums(x + 4)));
        acc[t] = acc_add(acc[t], row_scales(g, x->d), isum[t]);
        acc[t] = acc_add(acc[t], row_scales(g + 16, -x->d), msum);
    }
}

/* Activation block a = 4 h + j of a q6_kx8 block column into isum: half h's ql pieces 8 h + p
 * (j = 0, 2: low and high nibbles) and 8 h + 4 + p (j = 1, 3), qh piece 4 h + p at shift 2 j; one
 * scale a 16 weights (pieces 0, 1 and 2, 3).  (q - 32) x as q x - 32 x: both products exact in int16
 * (pairs at most 2 * 63 * 127 and 2 * 32 * 127), their difference at most 2 * 32 * 127, the sign trick's
 * abs, sign and sign of every weight byte saved.  a a constant once inlined. */
static inline __attribute__((always_inline)) void q6_kx8_sub(int RN, int a, const uint8_t *g, const colibri_q8_block *xb, size_t xs,
                                                             const kv *scale_pieces, kv *isum)
{
    const int h = a / 4, j = a % 4;
    const kv m4 = kv_byte(0x0f), m2 = kv_byte(0x30), c32 = kv_byte(32);
    kv sum16[KX8_RN];
    int half, p, t;
    for (half = 0; half < 2; half++) {
        const int s = 2 * a + half;   /* the scale: piece s / 8, byte s % 8 */
        kv scale = pick_of8(scale_pieces[s / 8], s % 8);
        for (t = 0; t < RN; t++) sum16[t] = kv_zero();
        for (p = 2 * half; p < 2 * half + 2; p++) {
            kv ql = kv_load(g + 64 * (8 * h + 4 * (j % 2) + p)), qh = kv_load(g + 1024 + 64 * (4 * h + p)), q;
            ql = j < 2 ? kv_and(ql, m4) : kv_and(kv_srl16(ql, 4), m4);
            qh = kv_and(j < 2 ? kv_sll16(qh, 4 - 2 * j) : kv_srl16(qh, 2 * j - 4), m2);
            q = kv_or(ql, qh);   /* 0 .. 63 */
            for (t = 0; t < RN; t++) {
                kv x = kv_bcast(xb[(size_t)t * xs + a].q + 8 * p);
                sum16[t] = kv_add16(sum16[t], kv_sub16(kv_maddubs(q, x), kv_maddubs(c32, x)));
            }
        }
        for (t = 0; t < RN; t++) isum[t] = kv_dot16(isum[t], sum16[t], scale);
    }
}

/* One q6_kx8 block column (g: ql in 16 pieces, qh in 8, the int8 scales in 2, d[8] at 1664)
 * against RN tokens.  int16 sums of 16 weights: at most 2 * 2 * 32 * 127 = 16256. */
static inline __attribute__((always_inline)) void q6_kx8_block(int RN, const uint8_t *g, const colibri_q8_block *xb, size_t xs,
                                                               x8_acc *acc)
{
    const kv scale_pieces[2] = { kv_load(g + 1536), kv_load(g + 1600) };
    kv isum[KX8_RN];
    int t;
    for (t = 0; t < RN; t++) isum[t] = kv_zero();
    q6_kx8_sub(RN, 0, g, xb, xs, scale_pieces, isum);
    q6_kx8_sub(RN, 1, g, xb, xs, scale_pieces, isum);
    q6_kx8_sub(RN, 2, g, xb, xs, scale_pieces, isum);
    q6_kx8_sub(RN, 3, g, xb, xs, scale_pieces, isum);
    q6_kx8_sub(RN, 4, g, xb, xs, scale_pieces, isum);
    q6_kx8_sub(RN, 5, g, xb, xs, scale_pieces, isum);
    q6_kx8_sub(RN, 6, g, xb, xs, scale_pieces, isum);
    q6_kx8_sub(RN, 7, g, xb, xs, scale_pieces, isum);
    for (t = 0; t < RN; t++) acc[t] = acc_add(acc[t], row_scales(g + 1664, xb[(size_t)t * xs].d), isum[t]);
}

/* One iq4_xsx8 block column (g: d[8], scales_h (2 bytes a row), scales_l (4), qs in 16 pieces) against
 * RN tokens.  Sub-block s is pieces 2s, 2s + 1 (q4_0 nibble groups: piece 2s + p's low nibbles weights
 * 8p .., its high ones 16 + 8p ..); the table values are signed (sign trick), up to 127, so each
 * maddubs (at most 2 * 127 * 127) meets its scale at once. */
static inline __attribute__((always_inline)) void iq4_xsx8_block(int RN, const uint8_t *g, const colibri_q8_block *xb, size_t xs,
                                                                 kv table, x8_acc *acc)
{
    const kv m4 = kv_byte(0x0f);
    kv scale_piece, isum[KX8_RN];
    int s, p, t;
    {   /* row i's 8 scales (6 bits, less 32) as bytes 8i .. 8i + 7: the low nibble from scales_l (byte s / 2,
         * nibble s % 2), the top two bits from scales_h (bits 2s, 2s + 1), its nibble m spread to byte m first */
        const __m256i n4 = _mm256_set1_epi32(0x0f0f0f0f);
        __m256i sl = _mm256_loadu_si256((const __m256i *)(g + 32)), sh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(g + 16)));
        __m256i evens, odds, lo, hi;
        sh = _mm256_and_si256(_mm256_or_si256(sh, _mm256_slli_epi32(sh, 8)), _mm256_set1_epi32(0x00ff00ff));
        sh = _mm256_and_si256(_mm256_or_si256(sh, _mm256_slli_epi32(sh, 4)), n4);
        evens = _mm256_or_si256(_mm256_and_si256(sl, n4), _mm256_slli_epi32(_mm256_and_si256(sh, _mm256_set1_epi32(0x03030303)), 4));
        odds = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(sl, 4), n4),
                               _mm256_slli_epi32(_mm256_and_si256(sh, _mm256_set1_epi32(0x0c0c0c0c)), 2));
        lo = _mm256_unpacklo_epi8(evens, odds);   /* rows 0, 1 | rows 4, 5 */
        hi = _mm256_unpackhi_epi8(evens, odds);   /* rows 2, 3 | rows 6, 7 */
        scale_piece = kv_sub8(kv_of_rows(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31)), kv_byte(32));
    }
    for (t = 0; t < RN; t++) isum[t] = kv_zero();
    for (s = 0; s < 8; s++) {
        kv scale = pick_of8(scale_piece, s);
        for (p = 0; p < 2; p++) {
            kv v = kv_load(g + 64 + 64 * (2 * s + p)), lo = kv_shuffle_by(table, kv_and(v, m4));
            kv hi = kv_shuffle_by(table, kv_and(kv_srl16(v, 4), m4)), lo_abs = kv_abs8(lo), hi_abs = kv_abs8(hi);
            for (t = 0; t < RN; t++) {
                const colibri_q8_block *x = xb + (size_t)t * xs + s;
                isum[t] = kv_dot16(isum[t], kv_maddubs(lo_abs, kv_sign8(kv_bcast(x->q + 8 * p), lo)), scale);
                isum[t] = kv_dot16(isum[t], kv_maddubs(hi_abs, kv_sign8(kv_bcast(x->q + 16 + 8 * p), hi)), scale);
            }
        }
    }
    for (t = 0; t < RN; t++) acc[t] = acc_add(acc[t], row_scales(g, xb[(size_t)t * xs].d), isum[t]);
}

/* One mxfp4x8 block column (g: e[8], qs in 2 pieces: 32 weights a row) against RN tokens: the E2M1
 * values (doubled, at most 12) by the sign trick, summed in int16 (at most 4 * 2 * 12 * 127), then
 * widened; each row's scale 2^(e - 128) times dx. */
static inline __attribute__((always_inline)) void mxfp4x8_block(int RN, const uint8_t *g, const colibri_q8_block *xb, size_t xs,
                                                                kv table, x8_acc *acc)
{
    const kv m4 = kv_byte(0x0f), ones = kv_bcast16(0x0001000100010001);
    kv w[4], w_abs[4];
    __m256 scale;
    int i, p, t;
    {   /* colibri_e8m0_half of the 8 rows' e: (e - 1) << 23 as float bits, 0x00200000 << e below 2 */
        __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)g)), one = _mm256_set1_epi32(1);
        __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, one), 23), tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
        scale = _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
    }
    for (p = 0; p < 2; p++) {   /* piece p: low nibbles weights 8p .., high 16 + 8p .. */
        kv v = kv_load(g + 8 + 64 * p);
        w[2 * p] = kv_shuffle_by(table, kv_and(v, m4));
        w[2 * p + 1] = kv_shuffle_by(table, kv_and(kv_srl16(v, 4), m4));
    }
    for (i = 0; i < 4; i++) w_abs[i] = kv_abs8(w[i]);
    for (t = 0; t < RN; t++) {
        const colibri_q8_block *x = xb + (size_t)t * xs;
        kv sum = kv_zero();
        for (i = 0; i < 4; i++) sum = kv_add16(sum, kv_maddubs(w_abs[i], kv_sign8(kv_bcast(x->q + 8 * (i / 2) + 16 * (i % 2)), w[i])));
        acc[t] = acc_add(acc[t], row_floats(scale, x->d), kv_dot16(kv_zero(), sum, ones));
    }
}

/* Bytes of a group's block column: 8 plain blocks. */
static inline size_t kx8_group_bytes(colibri_dtype dtype)
{
    switch (dtype) {
    case COLIBRI_DTYPE_Q4_KX8: return 1152;
    case COLIBRI_DTYPE_Q5_KX8: return 1408;
    case COLIBRI_DTYPE_Q6_KX8: return 1680;
    case COLIBRI_DTYPE_IQ4_XSX8: return 1088;
    default: return 136;   /* mxfp4x8 */
    }
}

/* Rows 8 g .. 8 g + 7 (their groups at w) against RN tokens: y (RN tokens, `rows` apart). */
static inline __attribute__((always_inline)) void tile_kx8(int RN, colibri_dtype dtype, float *y, int32_t rows, const uint8_t *w,
                                                           const colibri_q8_block *xq, int32_t blocks)
{
    const size_t gb = kx8_group_bytes(dtype), ahead = gb < 1024 ? 2048 : gb;   /* the next block column, 2 KiB at least */
    const int32_t per = dtype == COLIBRI_DTYPE_MXFP4X8 ? 1 : 8;   /* activation blocks a block column */
    const kv table = kv_table(dtype == COLIBRI_DTYPE_MXFP4X8 ? colibri_mxfp4_values : colibri_iq4nl_values);
    x8_acc acc[KX8_RN];
    int32_t b;
    size_t o;
    int t;
    for (t = 0; t < RN; t++) acc[t] = X8_ZERO();
    for (b = 0; b < blocks; b += per, w += gb) {   /* the group's one stream */
        for (o = 0; o < gb; o += 64) _mm_prefetch((const char *)w + ahead + o, _MM_HINT_T0);
        switch (dtype) {
        case COLIBRI_DTYPE_Q4_KX8: k4x8_block(RN, 0, w, xq + b, (size_t)blocks, acc); break;
        case COLIBRI_DTYPE_Q5_KX8: k4x8_block(RN, 1, w, xq + b, (size_t)blocks, acc); break;
        case COLIBRI_DTYPE_Q6_KX8: q6_kx8_block(RN, w, xq + b, (size_t)blocks, acc); break;
        case COLIBRI_DTYPE_IQ4_XSX8: iq4_xsx8_block(RN, w, xq + b, (size_t)blocks, table, acc); break;
        default: mxfp4x8_block(RN, w, xq + b, (size_t)blocks, table, acc); break;
        }
    }
    for (t = 0; t < RN; t++) store_x8(y + (size_t)t * rows, acc[t]);
}

/* y (n, rows) = xq @ W^T, W one of the formats above (rows % 8 == 0; xq from quantize_q8_256 for the
 * 256-weight ones): each group of 8 rows against KX8_RN tokens at a time, then 2, then one by one. */
static inline __attribute__((always_inline)) void matmul_kx8_format(colibri_dtype dtype, float *y, const colibri_q8_block *xq,
                                                                    const uint8_t *w, int32_t n, int32_t cols, int32_t rows)
{
    size_t group_bytes = (size_t)cols / (size_t)colibri_dtypes[dtype].block * kx8_group_bytes(dtype);
    int32_t g, t, blocks = cols / COLIBRI_BLOCK;
    for (g = 0; g < rows / 8; g++) {
        const uint8_t *wg = w + (size_t)g * group_bytes;
        for (t = 0; t + KX8_RN <= n; t += KX8_RN)
            tile_kx8(KX8_RN, dtype, y + (size_t)t * rows + 8 * g, rows, wg, xq + (size_t)t * blocks, blocks);
        for (; KX8_RN > 2 && t + 2 <= n; t += 2)   /* an expert's 2 or 3 tokens of a batched step: the pair shares each piece */
            tile_kx8(2, dtype, y + (size_t)t * rows + 8 * g, rows, wg, xq + (size_t)t * blocks, blocks);
        for (; t < n; t++) tile_kx8(1, dtype, y + (size_t)t * rows + 8 * g, rows, wg, xq + (size_t)t * blocks, blocks);
    }
}

static inline void matmul_kx8_x86(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                                  int32_t n, int32_t cols, int32_t rows)
{
    switch (dtype) {
    case COLIBRI_DTYPE_Q4_KX8: matmul_kx8_format(COLIBRI_DTYPE_Q4_KX8, y, xq, w, n, cols, rows); break;
    case COLIBRI_DTYPE_Q5_KX8: matmul_kx8_format(COLIBRI_DTYPE_Q5_KX8, y, xq, w, n, cols, rows); break;
    case COLIBRI_DTYPE_Q6_KX8: matmul_kx8_format(COLIBRI_DTYPE_Q6_KX8, y, xq, w, n, cols, rows); break;
    case COLIBRI_DTYPE_IQ4_XSX8: matmul_kx8_format(COLIBRI_DTYPE_IQ4_XSX8, y, xq, w, n, cols, rows); break;
    default: matmul_kx8_format(COLIBRI_DTYPE_MXFP4X8, y, xq, w, n, cols, rows); break;
    }
}

#endif
