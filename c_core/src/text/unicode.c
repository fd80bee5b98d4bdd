/* SPDX-License-Identifier: MIT */
/* What a code point is, from the tables gen_unicode.py generates (unicode_tables.h, included here
 * only): its class as the pre-tokenizers' regular expressions see it, whether it is a word
 * character, and what NFC needs (canonical combining class, decomposition, composition; Hangul by
 * arithmetic).  Binary searches over sorted runs: no state, no allocation. */
#include <string.h>

#include "text.h"
#include "unicode_tables.h"

/* ---- classes ---- */

int colibri_char_class(uint32_t cp)
{
    size_t lo = 0, hi = COLIBRI_UNICODE_RUNS;
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return C_LETTER;
        if (cp >= '0' && cp <= '9') return C_NUMBER;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d)) return C_SPACE;
        if (cp < 0x20 || cp == 0x7f) return C_OTHER;
        return strchr("$+<=>^`|~", (int)cp) ? C_SYMBOL : C_PUNCT;
    }
    if (cp > 0x10ffff) return C_OTHER;
    while (hi - lo > 1) {   /* the last run starting at or before cp */
        size_t mid = (lo + hi) / 2;
        if ((colibri_unicode_runs[mid] >> 3) <= cp) lo = mid; else hi = mid;
    }
    return (int)(colibri_unicode_runs[lo] & 7);
}

/* Rust regex's \w, which `tokenizers` tests single_word tokens' neighbours with. */
int colibri_is_word_char(uint32_t cp)
{
    int cls = colibri_char_class(cp), flip = 0;
    size_t lo = 0, hi = COLIBRI_WORD_FLIPS;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < colibri_word_flips[mid][0]) hi = mid;
        else if (cp > colibri_word_flips[mid][1]) lo = mid + 1;
        else { flip = 1; break; }
    }
    return (cls == C_LETTER || cls == C_MARK || cls == C_NUMBER) != flip;
}

/* ---- canonical classes, decompositions, compositions (NFC) ---- */

int colibri_ccc(uint32_t cp)
{
    size_t lo = 0, hi = COLIBRI_CCC_RUNS;
    if (cp < 0x300 || cp > 0x10ffff) return 0;   /* the first run starts at U+0300 */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if ((colibri_ccc_runs[mid] >> 8) <= cp) lo = mid; else hi = mid;
    }
    return (int)(colibri_ccc_runs[lo] & 0xff);
}

/* The index of cp's entry in colibri_decompositions, or -1. */
static int32_t decomposition_of(uint32_t cp)
{
    int32_t lo = 0, hi = COLIBRI_DECOMPOSITIONS;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        uint32_t key = (uint32_t)(colibri_decompositions[mid] >> 43);
        if (key == cp) return mid;
        if (key < cp) lo = mid + 1; else hi = mid;
    }
    return -1;
}

static uint32_t part(int32_t k, int second)
{
    return (uint32_t)(colibri_decompositions[k] >> (second ? 0 : 21)) & 0x1fffff;
}

/* cp's full canonical decomposition into d (at most 4 code points); an invalid byte is itself. */
int colibri_decompose(uint32_t cp, uint32_t d[4])
{
    uint32_t tail[3];
    int n = 0, k;
    int32_t at;
    if (cp - HANGUL_S < HANGUL_SN) {
        uint32_t i = cp - HANGUL_S;
        d[0] = HANGUL_L + i / 588;
        d[1] = HANGUL_V + i % 588 / 28;
        if (i % 28 == 0) return 2;
        d[2] = HANGUL_T + i % 28;
        return 3;
    }
    while (n < 3 && (at = decomposition_of(cp)) >= 0) {   /* only the first part decomposes further */
        if (part(at, 1)) tail[n++] = part(at, 1);
        cp = part(at, 0);
    }
    d[0] = cp;
    for (k = 0; k < n; k++) d[1 + k] = tail[n - 1 - k];
    return 1 + n;
}

/* The primary composite of (a, b), or 0. */
uint32_t colibri_compose(uint32_t a, uint32_t b)
{
    int32_t lo = 0, hi = COLIBRI_COMPOSITIONS;
    if (a - HANGUL_L < 19 && b - HANGUL_V < 21) return HANGUL_S + ((a - HANGUL_L) * 21 + b - HANGUL_V) * 28;
    if (a - HANGUL_S < HANGUL_SN && (a - HANGUL_S) % 28 == 0 && b - HANGUL_T - 1 < 27) return a + b - HANGUL_T;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2, k = colibri_compositions[mid];
        uint32_t x = part(k, 0), y = part(k, 1);
        if (x == a && y == b) return (uint32_t)(colibri_decompositions[k] >> 43);
        if (x < a || (x == a && y < b)) lo = mid + 1; else hi = mid;
    }
    return 0;
}

/* Whether cp is a starter some composition takes as its second part, so that a chunk cannot start
 * at it (nfc.c). */
int colibri_second_starter(uint32_t cp)
{
    size_t lo = 0, hi = COLIBRI_SECOND_STARTERS;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (colibri_second_starters[mid] == cp) return 1;
        if (colibri_second_starters[mid] < cp) lo = mid + 1; else hi = mid;
    }
    return 0;
}
