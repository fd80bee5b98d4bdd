/* SPDX-License-Identifier: MIT */
/* What text/'s files share: unicode.c answers what a code point is (the one file that includes the
 * generated unicode_tables.h), pretokenize.c splits text into words, nfc.c normalizes it, and
 * tokenize.c merges the words into tokens.  Internal to c_core/src/text, which depends on util.h
 * and the public headers only. */
#ifndef COLIBRI_TEXT_H
#define COLIBRI_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* unicode_tables.h's classes; GPT-2's and Llama 3's expressions see marks, punctuation and symbols as other */
enum { C_OTHER = 0, C_LETTER = 1, C_NUMBER = 2, C_SPACE = 3, C_MARK = 4, C_PUNCT = 5, C_SYMBOL = 6 };

enum { HANGUL_S = 0xac00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11a7, HANGUL_SN = 11172 };

/* ---- unicode.c: the character data ---- */

int colibri_char_class(uint32_t cp);                  /* C_*; an invalid byte (0x110000 + byte): other */
int colibri_is_word_char(uint32_t cp);                /* Rust regex's \w */
int colibri_ccc(uint32_t cp);                         /* the canonical combining class */
int colibri_decompose(uint32_t cp, uint32_t d[4]);    /* the full canonical decomposition: its length */
uint32_t colibri_compose(uint32_t a, uint32_t b);     /* the primary composite of (a, b), or 0 */
int colibri_second_starter(uint32_t cp);              /* a starter that composes with one before it */

/* The code point at s[i] (i < e) and its length; an invalid byte is itself, 0x110000 + byte.
 * Inline: the scanners call it for every character. */
static inline uint32_t utf8_at(const uint8_t *s, size_t i, size_t e, size_t *len)
{
    uint32_t c = s[i], cp, min;
    size_t n, k;
    *len = 1;
    if (c < 0x80) return c;
    if (c >= 0xc2 && c <= 0xdf) { n = 2; cp = c & 0x1f; min = 0x80; }
    else if (c >= 0xe0 && c <= 0xef) { n = 3; cp = c & 0x0f; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { n = 4; cp = c & 0x07; min = 0x10000; }
    else return 0x110000 + c;
    if (e - i < n) return 0x110000 + c;
    for (k = 1; k < n; k++) {
        if ((s[i + k] & 0xc0) != 0x80) return 0x110000 + c;
        cp = cp << 6 | (s[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0x110000 + c;
    *len = n;
    return cp;
}

static inline int class_full_at(const uint8_t *s, size_t i, size_t e, size_t *len)
{
    return colibri_char_class(utf8_at(s, i, e, len));
}

/* The class the GPT-2 and Llama 3 expressions see: letter, number, space or other. */
static inline int class_at(const uint8_t *s, size_t i, size_t e, size_t *len)
{
    int c = class_full_at(s, i, e, len);
    return c > C_SPACE ? C_OTHER : c;
}

/* ---- pretokenize.c: words ---- */

/* The end of the word that starts at s[i] (i < e) under pre-tokenizer `pre` (COLIBRI_PRE_*, not
 * METASPACE, which tokenize.c splits as it merges); DeepSeek: *piece, the end of the piece i is in,
 * found once for all its words (0: find it). */
size_t colibri_word_end(int32_t pre, const uint8_t *s, size_t i, size_t e, size_t *piece);

/* ---- nfc.c: the NFC normalizer ---- */

/* A place in a chunk's decomposition: element t of the n that the character at byte k gives. */
typedef struct nfc_pos {
    size_t k, len;
    int t, n;
    uint32_t d[4];
} nfc_pos;

/* The chunk's decomposition in canonical order, one code point at a time. */
typedef struct nfc_walk {
    const uint8_t *s;
    size_t e;
    nfc_pos at;          /* outside a run: the next element; inside one: the run's first */
    nfc_pos scan, end;   /* inside a run: the next element to look at, and the run's end */
    int cls;             /* inside a run: the class being given out; 0: outside */
} nfc_walk;

/* A chunk being normalized: its walk, the starter and what was kept since, and a code point that
 * did not fit in the output yet.  active 0: none (the state before the first call). */
typedef struct nfc_chunk {
    nfc_walk w;
    uint32_t starter, pending;
    int have_starter, last, has_pending, active;
    size_t end;   /* the chunk's end in the raw text */
} nfc_chunk;

/* Raw text s[*i, e) normalized onto out[*n, cap) while a character fits; c: the chunk at *i, when
 * one was left part written.  Returns whether raw text is left. */
int colibri_nfc_fill(const uint8_t *s, size_t e, size_t *i, nfc_chunk *c, uint8_t *out, size_t *n, size_t cap);

#endif
