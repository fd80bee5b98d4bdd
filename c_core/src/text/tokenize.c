/* SPDX-License-Identifier: MIT */
/* Text to token ids, as the model's own tokenizer encodes it: added tokens matched first (exact
 * bytes, leftmost, longest first; those `tokenizers` matches after normalizing, in a second pass),
 * the rest normalized (NFC, or nothing) and split into words by the pre-tokenizer's regular
 * expressions (hand-written scanners: GPT-2's, Llama 3's, Qwen2's, DeepSeek V3's), each word's
 * bytes merged by BPE rank.  Normalized text (or text given a prefix space) passes through a window
 * on the stack, the unfinished word at its end carried into the next.
 *
 * Byte-level BPE (GPT-2): a word starts as one token per byte (byte_ids) and the pair of
 * neighbours with the lowest merge rank merges, leftmost first, until no pair has a rank.  A
 * binary heap of (rank, position) makes that O(w log w) for a word of w bytes, and a word is at
 * most COLIBRI_WORD_BYTES bytes: a longer one is encoded in pieces of at most that many bytes,
 * cut at a UTF-8 character boundary.  That, and the stack, are the bounds: no allocation, O(log)
 * work per byte beyond the added-token scan (n_added first-byte tests per byte, then memcmp).
 *
 * Text is UTF-8; a byte that does not start a valid sequence (truncated, overlong, a surrogate,
 * past U+10FFFF) is one character of class "other" on its own and is encoded as its byte. */
#include <string.h>

#include "tokenize.h"
#include "unicode_tables.h"
#include "../model/loader.h"
#include "../util.h"

#define COLIBRI_WORD_BYTES 256      /* positions fit the heap key's low 8 bits */
#define COLIBRI_WINDOW 512          /* normalized text pre-tokenized at a time: a word of COLIBRI_WORD_BYTES and more */
#define COLIBRI_LOOKAHEAD 16        /* bytes past a word's end its scanner may have looked at, and then some */

/* unicode_tables.h's classes; GPT-2's and Llama 3's expressions see marks, punctuation and symbols as other */
enum { C_OTHER = 0, C_LETTER = 1, C_NUMBER = 2, C_SPACE = 3, C_MARK = 4, C_PUNCT = 5, C_SYMBOL = 6 };

/* ---- characters ---- */

/* The code point at s[i] (i < e) and its length; an invalid byte is itself, 0x110000 + byte. */
static uint32_t utf8_at(const uint8_t *s, size_t i, size_t e, size_t *len)
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

static int char_class(uint32_t cp)
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
static int is_word(uint32_t cp)
{
    int cls = char_class(cp), flip = 0;
    size_t lo = 0, hi = COLIBRI_WORD_FLIPS;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < colibri_word_flips[mid][0]) hi = mid;
        else if (cp > colibri_word_flips[mid][1]) lo = mid + 1;
        else { flip = 1; break; }
    }
    return (cls == C_LETTER || cls == C_MARK || cls == C_NUMBER) != flip;
}

static int class_full_at(const uint8_t *s, size_t i, size_t e, size_t *len)
{
    return char_class(utf8_at(s, i, e, len));
}

static int class_at(const uint8_t *s, size_t i, size_t e, size_t *len)
{
    int c = class_full_at(s, i, e, len);
    return c > C_SPACE ? C_OTHER : c;
}

/* ---- the GPT-2 pre-tokenizer ----
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * The end of the word that starts at s[i] (i < e). */

static size_t run_of(const uint8_t *s, size_t j, size_t e, int cls)
{
    size_t len;
    while (j < e && class_at(s, j, e, &len) == cls) j += len;
    return j;
}

static int is_crlf(uint8_t c) { return c == '\r' || c == '\n'; }

/* The whitespace word at s[i]: \s*[\r\n]+ up to the run's last CR or LF (`to_crlf`: Llama 3's and
 * DeepSeek's), else \s+(?!\S): the run, less its last character when a non-space follows; else \s+:
 * one character. */
static size_t space_word(const uint8_t *s, size_t i, size_t e, int to_crlf)
{
    size_t len, j, last = i, crlf = e;
    for (j = i; j < e && class_at(s, j, e, &len) == C_SPACE; j += len) {
        if (to_crlf && is_crlf(s[j])) crlf = j;
        last = j;
    }
    if (crlf < e) return crlf + 1;
    if (j == e || last == i) return j;
    return last;
}

static size_t gpt2_word(const uint8_t *s, size_t i, size_t e)
{
    size_t len;
    int cls;
    if (s[i] == '\'' && e - i >= 2) {
        uint8_t a = s[i + 1], b = e - i >= 3 ? s[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    cls = class_at(s, i, e, &len);
    if (s[i] == ' ' && i + 1 < e) {   /* " ?" before a letter, number or other run */
        size_t next_len;
        int next = class_at(s, i + 1, e, &next_len);
        if (next != C_SPACE) return run_of(s, i + 1 + next_len, e, next);
    }
    if (cls != C_SPACE) return run_of(s, i + len, e, cls);
    return space_word(s, i, e, 0);
}

/* ---- the Llama 3 pre-tokenizer ----
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * (the contractions case-insensitive in ASCII) */

static size_t crlf_run(const uint8_t *s, size_t j, size_t e)
{
    while (j < e && is_crlf(s[j])) j++;
    return j;
}

/* Qwen2's is Llama 3's with \p{N} for \p{N}{1,3}: each digit a word of its own (max_digits 1). */
static size_t llama3_word(const uint8_t *s, size_t i, size_t e, int max_digits)
{
    size_t len, next_len = 0, j;
    int cls, next = -1, k;
    if (s[i] == '\'' && e - i >= 2) {   /* 'S and 's alike: the letters differ by 0x20 alone */
        uint8_t a = s[i + 1] | 0x20, b = e - i >= 3 ? s[i + 2] | 0x20 : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    cls = class_at(s, i, e, &len);
    if (i + len < e) next = class_at(s, i + len, e, &next_len);
    if (cls == C_LETTER) return run_of(s, i + len, e, C_LETTER);
    if (cls != C_NUMBER && !is_crlf(s[i]) && next == C_LETTER) return run_of(s, i + len + next_len, e, C_LETTER);
    if (cls == C_NUMBER) {
        for (j = i + len, k = 1; k < max_digits && j < e && class_at(s, j, e, &len) == C_NUMBER; k++) j += len;
        return j;
    }
    if (s[i] == ' ' && next == C_OTHER) return crlf_run(s, run_of(s, i + 1 + next_len, e, C_OTHER), e);
    if (cls == C_OTHER) return crlf_run(s, run_of(s, i + len, e, C_OTHER), e);
    return space_word(s, i, e, 1);
}

/* ---- the DeepSeek V3 pre-tokenizer: three isolating splits in turn ----
 * \p{N}{1,3}, then [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+, then
 * [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+
 * Each keeps its matches and the text between them as words of their own. */

static int is_cjk(uint32_t cp)
{
    return (cp >= 0x4e00 && cp <= 0x9fa5) || (cp >= 0x3040 && cp <= 0x30ff);
}

static int is_ascii_letter(uint8_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }

static size_t run_of_either(const uint8_t *s, size_t j, size_t e, int a, int b)
{
    size_t len;
    int c;
    while (j < e && ((c = class_full_at(s, j, e, &len)) == a || c == b)) j += len;
    return j;
}

/* The end of the third split's match at s[i], or i when none starts there. */
static size_t deepseek_match(const uint8_t *s, size_t i, size_t e)
{
    size_t len, next_len = 0, j;
    int cls = class_full_at(s, i, e, &len), next = -1;
    if (i + len < e) next = class_full_at(s, i + len, e, &next_len);
    if (s[i] < 0x80 && (cls == C_PUNCT || cls == C_SYMBOL) && i + 1 < e && is_ascii_letter(s[i + 1])) {
        for (j = i + 1; j < e && is_ascii_letter(s[j]); j++) {}
        return j;
    }
    if (cls == C_LETTER || cls == C_MARK) return run_of_either(s, i + len, e, C_LETTER, C_MARK);
    if (!is_crlf(s[i]) && cls != C_PUNCT && cls != C_SYMBOL && (next == C_LETTER || next == C_MARK))
        return run_of_either(s, i + len + next_len, e, C_LETTER, C_MARK);
    if (s[i] == ' ' && (next == C_PUNCT || next == C_SYMBOL))
        return crlf_run(s, run_of_either(s, i + 1 + next_len, e, C_PUNCT, C_SYMBOL), e);
    if (cls == C_PUNCT || cls == C_SYMBOL) return crlf_run(s, run_of_either(s, i + len, e, C_PUNCT, C_SYMBOL), e);
    if (cls != C_SPACE) return i;
    return space_word(s, i, e, 1);   /* class_at's spaces are class_full_at's */
}

/* The end of the first two splits' piece at s[i]: a number of up to three digits, a CJK run, or the
 * text before the next number or CJK character. */
static size_t deepseek_piece(const uint8_t *s, size_t i, size_t e)
{
    size_t len, j, k;
    uint32_t cp = utf8_at(s, i, e, &len);
    if (char_class(cp) == C_NUMBER) {
        for (j = i + len, k = 1; k < 3 && j < e && class_full_at(s, j, e, &len) == C_NUMBER; k++) j += len;
        return j;
    }
    if (is_cjk(cp)) {
        for (j = i + len; j < e && is_cjk(utf8_at(s, j, e, &len)); j += len) {}
        return j;
    }
    for (j = i + len; j < e; j += len) {
        cp = utf8_at(s, j, e, &len);
        if (char_class(cp) == C_NUMBER || is_cjk(cp)) break;
    }
    return j;
}

/* The end of the word at s[i] inside its piece [.., end): the third split's match, or the text up
 * to where one starts. */
static size_t deepseek_word(const uint8_t *s, size_t i, size_t end)
{
    size_t j = deepseek_match(s, i, end), len;
    if (j > i) return j;
    for (; j < end && deepseek_match(s, j, end) == j; j += len) utf8_at(s, j, end, &len);
    return j;
}

/* ---- the NFC normalizer ----
 * Canonical decomposition, canonical ordering and composition (UAX #15), with the tables of
 * unicode_tables.h.  The text splits into chunks at safe starts: a character whose decomposition
 * begins with a starter (class 0) that composes with nothing before it; a chunk's NFC is
 * independent of the rest.  A chunk is normalized with no buffer, straight from the input: its
 * decomposition is walked in place, a run of non-starters given out class by class (lowest first,
 * each class in text order: the stable sort), and each starter's final composite found by a look
 * ahead over the same walk before it is written.  A chunk longer than the space left is written
 * in parts, its state kept between them. */

enum { HANGUL_S = 0xac00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11a7, HANGUL_SN = 11172 };

static int ccc_of(uint32_t cp)
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
static int decompose(uint32_t cp, uint32_t d[4])
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
static uint32_t compose(uint32_t a, uint32_t b)
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

/* Whether a chunk may start at cp: nothing before it reorders or composes with it. */
static int safe_start(uint32_t cp)
{
    uint32_t d[4];
    size_t lo = 0, hi = COLIBRI_SECOND_STARTERS;
    if (cp < 0x300 || cp > 0x10ffff) return 1;
    decompose(cp, d);
    if (ccc_of(d[0]) || d[0] - HANGUL_V < 21 || d[0] - HANGUL_T - 1 < 27) return 0;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (colibri_second_starters[mid] == d[0]) return 0;
        if (colibri_second_starters[mid] < d[0]) lo = mid + 1; else hi = mid;
    }
    return 1;
}

/* A place in a chunk's decomposition: element t of the n that the character at byte k gives. */
typedef struct nfc_pos {
    size_t k, len;
    int t, n;
    uint32_t d[4];
} nfc_pos;

static void pos_load(const uint8_t *s, size_t e, nfc_pos *p)
{
    p->t = 0;
    if (p->k < e) p->n = decompose(utf8_at(s, p->k, e, &p->len), p->d);
}

static void pos_next(const uint8_t *s, size_t e, nfc_pos *p)
{
    if (++p->t < p->n) return;
    p->k += p->len;
    pos_load(s, e, p);
}

static int pos_equal(const nfc_pos *a, const nfc_pos *b) { return a->k == b->k && a->t == b->t; }

/* The chunk's decomposition in canonical order, one code point at a time. */
typedef struct nfc_walk {
    const uint8_t *s;
    size_t e;
    nfc_pos at;          /* outside a run: the next element; inside one: the run's first */
    nfc_pos scan, end;   /* inside a run: the next element to look at, and the run's end */
    int cls;             /* inside a run: the class being given out; 0: outside */
} nfc_walk;

static int walk_next(nfc_walk *w, uint32_t *out)
{
    nfc_pos p;
    for (;;) {
        if (!w->cls) {
            int lowest = 256, c;
            if (w->at.k >= w->e) return 0;
            if (!ccc_of(w->at.d[w->at.t])) {
                *out = w->at.d[w->at.t];
                pos_next(w->s, w->e, &w->at);
                return 1;
            }
            for (p = w->at; p.k < w->e && (c = ccc_of(p.d[p.t])) != 0; pos_next(w->s, w->e, &p))
                if (c < lowest) lowest = c;
            w->end = p;
            w->scan = w->at;
            w->cls = lowest;
        }
        while (!pos_equal(&w->scan, &w->end)) {
            uint32_t cp = w->scan.d[w->scan.t];
            pos_next(w->s, w->e, &w->scan);
            if (ccc_of(cp) == w->cls) { *out = cp; return 1; }
        }
        {   /* the next class up, or the run is done */
            int next = 256, c;
            for (p = w->at; !pos_equal(&p, &w->end); pos_next(w->s, w->e, &p))
                if ((c = ccc_of(p.d[p.t])) > w->cls && c < next) next = c;
            if (next == 256) { w->at = w->end; w->cls = 0; }
            else { w->cls = next; w->scan = w->at; }
        }
    }
}

/* Whether c, after the starter s with `last` the class of the last character kept since it (-1:
 * none), composes with it; *s becomes the composite. */
static int composes(uint32_t *s, int last, uint32_t c, int cls)
{
    uint32_t x;
    if (!(last < 0 || (last > 0 && last < cls)) || !(x = compose(*s, c))) return 0;
    *s = x;
    return 1;
}

static int put_utf8(uint8_t *out, size_t *n, size_t cap, uint32_t cp)
{
    if (cap - *n < 4) return 0;
    if (cp >= 0x110000) out[(*n)++] = (uint8_t)(cp - 0x110000);   /* an invalid byte: itself */
    else if (cp < 0x80) out[(*n)++] = (uint8_t)cp;
    else if (cp < 0x800) { out[(*n)++] = (uint8_t)(0xc0 | cp >> 6); out[(*n)++] = (uint8_t)(0x80 | (cp & 0x3f)); }
    else {
        if (cp < 0x10000) out[(*n)++] = (uint8_t)(0xe0 | cp >> 12);
        else { out[(*n)++] = (uint8_t)(0xf0 | cp >> 18); out[(*n)++] = (uint8_t)(0x80 | (cp >> 12 & 0x3f)); }
        out[(*n)++] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
        out[(*n)++] = (uint8_t)(0x80 | (cp & 0x3f));
    }
    return 1;
}

/* A chunk being normalized: its walk, the starter and what was kept since, and a code point that
 * did not fit in the output yet. */
typedef struct nfc_chunk {
    nfc_walk w;
    uint32_t starter, pending;
    int have_starter, last, has_pending, active;
    size_t end;   /* the chunk's end in the raw text */
} nfc_chunk;

/* Chunk s[0, e)'s NFC onto out[*n, cap), from where it stopped (c->active) or its start; returns
 * whether it is all written. */
static int nfc_chunk_write(nfc_chunk *c, const uint8_t *s, size_t e, uint8_t *out, size_t *n, size_t cap)
{
    uint32_t cp;
    int cls;
    if (!c->active) {
        memset(&c->w, 0, sizeof c->w);
        c->w.s = s; c->w.e = e;
        pos_load(s, e, &c->w.at);
        c->have_starter = c->has_pending = 0;
        c->last = -1;
        c->active = 1;
    }
    if (c->has_pending) {
        if (!put_utf8(out, n, cap, c->pending)) return 0;
        c->has_pending = 0;
    }
    while (walk_next(&c->w, &cp)) {
        cls = ccc_of(cp);
        if (c->have_starter && composes(&c->starter, c->last, cp, cls)) continue;
        if (cls == 0) {   /* a new starter: written as what it composes into */
            nfc_walk ahead = c->w;
            uint32_t final = cp, d;
            int l = -1, dc;
            while (walk_next(&ahead, &d)) {
                dc = ccc_of(d);
                if (composes(&final, l, d, dc)) continue;
                if (!dc) break;
                l = dc;
            }
            c->starter = cp; c->have_starter = 1; c->last = -1;
            cp = final;
        } else {
            c->last = cls;
        }
        if (!put_utf8(out, n, cap, cp)) { c->pending = cp; c->has_pending = 1; return 0; }
    }
    c->active = 0;
    return 1;
}

/* Raw text s[*i, e) normalized onto out[*n, cap) while a character fits; c: the chunk at *i, when
 * one was left part written.  Returns whether raw text is left. */
static int nfc_fill(const uint8_t *s, size_t e, size_t *i, nfc_chunk *c, uint8_t *out, size_t *n, size_t cap)
{
    while (*i < e) {
        size_t len;
        if (cap - *n < 4) return 1;
        if (!c->active && s[*i] < 0x80 && (*i + 1 == e || s[*i + 1] < 0x80)) {   /* ASCII: as is */
            out[(*n)++] = s[(*i)++];
            continue;
        }
        if (!c->active) {
            utf8_at(s, *i, e, &len);
            for (c->end = *i + len; c->end < e && !safe_start(utf8_at(s, c->end, e, &len)); c->end += len) {}
        }
        if (!nfc_chunk_write(c, s + *i, c->end - *i, out, n, cap)) return 1;
        *i = c->end;
    }
    return 0;
}

/* ---- BPE ---- */

/* The token whose bytes are s[0, n), or -1: a binary search of vocab_order. */
static int32_t token_of(const colibri_model *m, const uint8_t *s, size_t n)
{
    const colibri_encoder *enc = &m->enc;
    int32_t lo = 0, hi = enc->n_vocab_order;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2, t = enc->vocab_order[mid];
        size_t tn = (size_t)(m->token_offsets[t + 1] - m->token_offsets[t]);
        int c = memcmp(m->token_bytes + m->token_offsets[t], s, tn < n ? tn : n);
        if (c == 0) c = tn < n ? -1 : tn > n;
        if (c == 0) return t;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return -1;
}

/* The rank of merging (left, right), or -1: a binary search of merge_order. */
static int32_t merge_rank(const colibri_encoder *enc, int32_t left, int32_t right)
{
    int32_t lo = 0, hi = enc->n_merges;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2, r = enc->merge_order[mid];
        const int32_t *m = enc->merges + 3 * (size_t)r;
        if (m[0] == left && m[1] == right) return r;
        if (m[0] < left || (m[0] == left && m[1] < right)) lo = mid + 1; else hi = mid;
    }
    return -1;
}

typedef struct bpe_word {
    int32_t id[COLIBRI_WORD_BYTES];
    int32_t rank[COLIBRI_WORD_BYTES];   /* of the pair (i, next[i]); -1: none */
    int16_t prev[COLIBRI_WORD_BYTES], next[COLIBRI_WORD_BYTES];   /* -1: none; prev -2: merged away */
    uint32_t heap[2 * COLIBRI_WORD_BYTES];   /* rank << 8 | position: the first pairs, then each merge pops 1, pushes at most 2 */
    int32_t n_heap;
} bpe_word;

static void heap_push(bpe_word *w, uint32_t key)
{
    int32_t i = w->n_heap++;
    while (i > 0 && w->heap[(i - 1) / 2] > key) { w->heap[i] = w->heap[(i - 1) / 2]; i = (i - 1) / 2; }
    w->heap[i] = key;
}

static uint32_t heap_pop(bpe_word *w)
{
    uint32_t top = w->heap[0], key = w->heap[--w->n_heap];
    int32_t i = 0, n = w->n_heap;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1] < w->heap[c]) c++;
        if (w->heap[c] >= key) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    w->heap[i] = key;
    return top;
}

static void set_pair(const colibri_encoder *enc, bpe_word *w, int32_t i)
{
    w->rank[i] = w->next[i] >= 0 ? merge_rank(enc, w->id[i], w->id[w->next[i]]) : -1;
    if (w->rank[i] >= 0) heap_push(w, (uint32_t)w->rank[i] << 8 | (uint32_t)i);
}

typedef struct sink {
    int32_t *ids;
    size_t cap, n;
} sink;

static void emit(sink *out, int32_t id)
{
    if (out->n < out->cap) out->ids[out->n] = id;
    out->n++;
}

/* The tokens of bytes s[0, n), n <= COLIBRI_WORD_BYTES. */
/* The tokens of the word's first `count` symbols, w->id[0, count), merged. */
static void bpe_merge(const colibri_encoder *enc, bpe_word *w, int32_t count, sink *out)
{
    int32_t i;
    for (i = 0; i < count; i++) {
        w->prev[i] = (int16_t)(i - 1);
        w->next[i] = (int16_t)(i + 1 < count ? i + 1 : -1);
    }
    w->n_heap = 0;
    for (i = 0; i < count; i++) set_pair(enc, w, i);
    while (w->n_heap) {
        uint32_t key = heap_pop(w);
        int32_t r = (int32_t)(key >> 8), j;
        i = (int32_t)(key & 0xff);
        if (w->prev[i] == -2 || w->rank[i] != r) continue;   /* stale: that pair changed since */
        j = w->next[i];
        w->id[i] = enc->merges[3 * (size_t)r + 2];
        w->next[i] = w->next[j];
        if (w->next[j] >= 0) w->prev[w->next[j]] = (int16_t)i;
        w->prev[j] = -2;
        set_pair(enc, w, i);
        if (w->prev[i] >= 0) set_pair(enc, w, w->prev[i]);
    }
    for (i = count ? 0 : -1; i >= 0; i = w->next[i]) emit(out, w->id[i]);
}

static void bpe(const colibri_encoder *enc, const uint8_t *s, size_t n, bpe_word *w, sink *out)
{
    int32_t count = 0;
    size_t k;
    for (k = 0; k < n; k++) {
        int32_t id = enc->byte_ids[s[k]];
        if (id >= 0) w->id[count++] = id;   /* else not in the vocabulary, no unknown token: dropped, as `tokenizers` does */
    }
    bpe_merge(enc, w, count, out);
}

/* SentencePiece-style BPE (Llama 2, Mixtral): spaces are U+2581, one before the text; a symbol per
 * character, its own token or (byte fallback) its bytes' tokens; a word starts at each U+2581 that
 * follows another character (the converter checked no token holds U+2581 after another character,
 * so no merge crosses there), and a longer one is merged in pieces of COLIBRI_WORD_BYTES symbols. */
static const uint8_t metaspace[3] = { 0xe2, 0x96, 0x81 };   /* U+2581, which the vocabulary stores as " " */

/* One character of bytes [0, n) (a space: U+2581) onto the word; the word merged first when the
 * character starts a new one or would overfill it. */
static void spm_char(const colibri_model *m, bpe_word *w, int32_t *count, int *after_char, const uint8_t *bytes,
                     size_t n, int space, sink *out)
{
    const colibri_encoder *enc = &m->enc;
    int32_t id = space ? token_of(m, (const uint8_t *)" ", 1) : token_of(m, bytes, n);
    size_t k;
    if (space) { bytes = metaspace; n = 3; }
    if ((space && (*after_char || enc->split_spaces) && *count) || *count + (id >= 0 ? 1 : (int32_t)n) > COLIBRI_WORD_BYTES) {
        bpe_merge(enc, w, *count, out);
        *count = 0;
    }
    if (id >= 0) w->id[(*count)++] = id;
    else for (k = 0; k < n; k++) w->id[(*count)++] = enc->byte_ids[bytes[k]];   /* all 256 exist (load) */
    *after_char = !space;
}

/* The U+2581 before a stretch: always (the Prepend normalizer's form), or Metaspace's schemes: when
 * the stretch does not start with a space, "first" only for the text's first stretch. */
static void encode_spm(const colibri_model *m, const uint8_t *s, size_t e, int first, bpe_word *w, sink *out)
{
    const colibri_encoder *enc = &m->enc;
    int32_t count = 0;
    int after_char = 0, starts_with_space = e >= 1 && (s[0] == ' ' || (e >= 3 && memcmp(s, metaspace, 3) == 0));
    size_t i, len;
    if (e == 0) return;
    if (enc->prepend == COLIBRI_PREPEND_NORMALIZER ||
        (!starts_with_space && (enc->prepend == COLIBRI_PREPEND_ALWAYS || (enc->prepend == COLIBRI_PREPEND_FIRST && first))))
        spm_char(m, w, &count, &after_char, metaspace, 3, 1, out);
    for (i = 0; i < e; i += len) {
        uint32_t cp = utf8_at(s, i, e, &len);
        spm_char(m, w, &count, &after_char, s + i, len, cp == ' ' || cp == 0x2581, out);
    }
    bpe_merge(&m->enc, w, count, out);
}

/* The end of the word at s[i] (i < e); DeepSeek: *piece, the end of the piece i is in, found once
 * for all its words (0: find it). */
static size_t word_end(const colibri_encoder *enc, const uint8_t *s, size_t i, size_t e, size_t *piece)
{
    switch (enc->pre_tokenizer) {
    case COLIBRI_PRE_DEEPSEEK:
        if (i >= *piece) *piece = deepseek_piece(s, i, e);
        return deepseek_word(s, i, *piece);
    case COLIBRI_PRE_LLAMA3: return llama3_word(s, i, e, 3);
    case COLIBRI_PRE_QWEN2: return llama3_word(s, i, e, 1);
    default: return gpt2_word(s, i, e);
    }
}

/* The word s[i, end): its token (ignore_merges) or its BPE, in pieces of at most COLIBRI_WORD_BYTES. */
static void encode_word(const colibri_model *m, const uint8_t *s, size_t i, size_t end, bpe_word *w, sink *out)
{
    int32_t whole = m->enc.ignore_merges ? token_of(m, s + i, end - i) : -1;   /* Llama 3: a word that is a token */
    if (whole >= 0) { emit(out, whole); return; }
    while (i < end) {
        size_t cut = end - i <= COLIBRI_WORD_BYTES ? end : i + COLIBRI_WORD_BYTES;
        while (cut < end && cut > i + 1 && (s[cut] & 0xc0) == 0x80) cut--;   /* not inside a character */
        bpe(&m->enc, s + i, cut - i, w, out);
        i = cut;
    }
}

/* Text the pre-tokenizer sees through a window (NFC, or a prefix space): the window holds a part
 * of the normalized text, and a word that ends, or whose whitespace run reaches, within
 * COLIBRI_LOOKAHEAD bytes of its end waits for the next part (the scanners look at most a
 * character or three bytes past a word, but a whitespace run decides as a whole).  A window with
 * no finished word (a word that long is encoded in pieces anyway) gives its first pieces. */
static void encode_windowed(const colibri_model *m, const uint8_t *s, size_t e, bpe_word *w, sink *out)
{
    const colibri_encoder *enc = &m->enc;
    uint8_t win[COLIBRI_WINDOW];
    nfc_chunk chunk;
    size_t i = 0, n = 0, at, len;
    int more = 1;
    chunk.active = 0;
    if (enc->prefix_space && e && s[0] != ' ') win[n++] = ' ';
    while (more) {
        size_t piece = 0;
        if (enc->normalizer == COLIBRI_NORM_NFC) {
            more = nfc_fill(s, e, &i, &chunk, win, &n, sizeof win);
        } else {
            size_t k = e - i < sizeof win - n ? e - i : sizeof win - n;
            if (k < e - i) k = colibri_utf8_whole(s + i, k);   /* whole characters, but for the text's last bytes */
            memcpy(win + n, s + i, k);
            n += k; i += k;
            more = i < e;
        }
        for (at = 0; at < n;) {
            size_t end = word_end(enc, win, at, n, &piece), j;
            if (more) {
                for (j = at; j < n && class_at(win, j, n, &len) == C_SPACE; j += len) {}
                if (end + COLIBRI_LOOKAHEAD > n || (j > at && j + COLIBRI_LOOKAHEAD > n)) break;
            }
            encode_word(m, win, at, end, w, out);
            at = end;
        }
        if (more && at == 0) {   /* one unfinished word fills the window: its first pieces */
            at = COLIBRI_WORD_BYTES;   /* as encode_word cuts it */
            while (at > 1 && (win[at] & 0xc0) == 0x80) at--;
            encode_word(m, win, 0, at, w, out);
        }
        memmove(win, win + at, n - at);
        n -= at;
    }
}

/* A stretch of text between added tokens (`first`: it starts the text): words, each in pieces of
 * at most COLIBRI_WORD_BYTES. */
static void encode_text(const colibri_model *m, const uint8_t *s, size_t e, int first, bpe_word *w, sink *out)
{
    const colibri_encoder *enc = &m->enc;
    size_t i = 0, piece = 0;
    if (enc->kind == COLIBRI_ENCODER_SENTENCEPIECE_BPE) {
        encode_spm(m, s, e, first, w, out);
        return;
    }
    if (enc->normalizer != COLIBRI_NORM_NONE || enc->prefix_space) {
        encode_windowed(m, s, e, w, out);
        return;
    }
    while (i < e) {
        size_t end = word_end(enc, s, i, e, &piece);
        encode_word(m, s, i, end, w, out);
        i = end;
    }
}

#define ADDED_LENGTH(row) ((size_t)((row)[2] & ((1 << COLIBRI_ADDED_LENGTH_BITS) - 1)))
#define ADDED_FLAGS(row) ((row)[2] >> COLIBRI_ADDED_LENGTH_BITS)

/* The added token of the pass (`normalized`: the second) starting at s[i], longest first, or -1. */
static int32_t added_at(const colibri_encoder *enc, const uint8_t *first, const uint8_t *s, size_t i, size_t e,
                        int normalized)
{
    int32_t k;
    if (!(first[s[i] >> 3] & (1u << (s[i] & 7)))) return -1;
    for (k = 0; k < enc->n_added; k++) {
        const int32_t *a = enc->added + 3 * (size_t)k;
        size_t len = ADDED_LENGTH(a);
        if (!(ADDED_FLAGS(a) & COLIBRI_ADDED_NORMALIZED) == !normalized && len <= e - i &&
            memcmp(s + i, enc->added_bytes + a[1], len) == 0)
            return k;
    }
    return -1;
}

typedef struct added_pass {
    uint8_t first[2][32];   /* each pass's tokens' first bytes, a bit each */
    int two;                /* some tokens are matched in the second pass */
} added_pass;

/* Whether a word character (\w) ends s[start, i) or starts s[i, e). */
static int word_before(const uint8_t *s, size_t start, size_t i)
{
    size_t p = i - 1, len;
    if (i == start) return 0;
    while (p > start && i - p < 4 && (s[p] & 0xc0) == 0x80) p--;   /* back to the last character's lead byte */
    return is_word(utf8_at(s, p, i, &len)) && p + len == i;
}

static int word_after(const uint8_t *s, size_t i, size_t e)
{
    size_t len;
    return i < e && is_word(utf8_at(s, i, e, &len));
}

/* s[start, e) with the added tokens of a pass (`normalized`: the second) split out, as `tokenizers`
 * extracts them: leftmost, longest first, and grown over the whitespace before (lstrip) or after
 * (rstrip) them; the text between them goes on to the second pass, or is encoded. */
static void split_added(const colibri_model *m, const added_pass *ap, const uint8_t *s, size_t start, size_t e,
                        int normalized, bpe_word *w, sink *out)
{
    const colibri_encoder *enc = &m->enc;
    size_t i = start, from = start;
    for (;;) {
        int32_t k = i < e && enc->n_added ? added_at(enc, ap->first[normalized], s, i, e, normalized) : -1;
        const int32_t *row;
        size_t a, b, len;
        if (k < 0 && i < e) { i++; continue; }
        a = b = i;
        if (k >= 0) {
            row = enc->added + 3 * (size_t)k;
            b = i + ADDED_LENGTH(row);
            if ((ADDED_FLAGS(row) & COLIBRI_ADDED_SINGLE_WORD) && (word_before(s, start, i) || word_after(s, b, e))) {
                i = b;   /* not a word of its own: passed over, the search goes on after it */
                continue;
            }
            if (ADDED_FLAGS(row) & COLIBRI_ADDED_LSTRIP)
                while (a > from) {   /* back over whole whitespace characters, not past the last token */
                    size_t p = a - 1;
                    while (p > from && a - p < 4 && (s[p] & 0xc0) == 0x80) p--;
                    if (class_at(s, p, a, &len) != C_SPACE || p + len != a) break;
                    a = p;
                }
            if (ADDED_FLAGS(row) & COLIBRI_ADDED_RSTRIP)
                while (b < e && class_at(s, b, e, &len) == C_SPACE) b += len;
        }
        if (!normalized && ap->two) split_added(m, ap, s, from, a, 1, w, out);
        else encode_text(m, s + from, a - from, from == 0, w, out);
        if (k < 0) return;
        emit(out, enc->added[3 * (size_t)k]);
        i = from = b;
    }
}

colibri_status colibri_tokenize(const colibri_model *model, const char *text, size_t len, int32_t *ids, size_t cap,
                                size_t *n, colibri_error *err)
{
    const colibri_encoder *enc;
    added_pass ap;
    bpe_word w;
    sink out;
    int32_t k;
    if (!model || !n || (!text && len) || (!ids && cap))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_tokenize: NULL argument");
    enc = &model->enc;
    if (enc->kind == COLIBRI_ENCODER_NONE)
        return colibri_fail(err, COLIBRI_E_TENSOR, "this model carries no encoder: reconvert it with colibri convert");
    out.ids = ids; out.cap = cap; out.n = 0;
    if (enc->bos >= 0) emit(&out, enc->bos);
    memset(&ap, 0, sizeof ap);
    for (k = 0; k < enc->n_added; k++) {
        const int32_t *row = enc->added + 3 * (size_t)k;
        int pass = (ADDED_FLAGS(row) & COLIBRI_ADDED_NORMALIZED) != 0;
        uint8_t b = enc->added_bytes[row[1]];
        ap.first[pass][b >> 3] = (uint8_t)(ap.first[pass][b >> 3] | 1u << (b & 7));
        ap.two |= pass;
    }
    split_added(model, &ap, (const uint8_t *)text, 0, len, 0, &w, &out);
    *n = out.n;
    if (out.n > cap)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_tokenize: the text is %zu tokens, ids holds %zu", out.n, cap);
    return COLIBRI_OK;
}

size_t colibri_utf8_whole(const uint8_t *s, size_t len)
{
    size_t j = len, need;
    while (j > 0 && len - j < 3 && (s[j - 1] & 0xc0) == 0x80) j--;   /* back over continuation bytes */
    if (j == 0 || s[j - 1] < 0xc2 || s[j - 1] > 0xf4) return len;   /* no lead byte there: nothing to wait for */
    need = s[j - 1] >= 0xf0 ? 4 : s[j - 1] >= 0xe0 ? 3 : 2;
    return len - (j - 1) < need ? j - 1 : len;
}

/* ---- loading: the "encoder" object and its tensors ---- */

static const char *const pre_names[] = { [COLIBRI_PRE_GPT2] = "gpt2", [COLIBRI_PRE_LLAMA3] = "llama3",
                                         [COLIBRI_PRE_DEEPSEEK] = "deepseek", [COLIBRI_PRE_METASPACE] = "metaspace",
                                         [COLIBRI_PRE_QWEN2] = "qwen2" };
COLIBRI_TABLE_CHECK(pre_names, COLIBRI_PRE_COUNT);

static colibri_status table_fail(loader *L, const char *name, const char *fmt, int64_t a, int64_t b)
{
    char what[160];
    colibri_format(what, sizeof what, fmt, (long long)a, (long long)b);
    return colibri_fail(L->err, COLIBRI_E_VALUE, "tensor `tokenizer.%s`: %s", name, what);
}

static size_t token_len(const colibri_model *m, int32_t t)
{
    return (size_t)(m->token_offsets[t + 1] - m->token_offsets[t]);
}

static colibri_status check_tables(loader *L, colibri_model *m, size_t added_bytes)
{
    const colibri_encoder *enc = &m->enc;
    int32_t V = m->hp.vocab_size, i;
    if (enc->n_merges >= (1 << 23))
        return table_fail(L, "merges", "%lld merges, at most %lld", enc->n_merges, (1 << 23) - 1);
    for (i = 0; i < 256; i++)
        if (enc->byte_ids[i] < -1 || enc->byte_ids[i] >= V)
            return table_fail(L, "byte_ids", "entry %lld is %lld, outside [-1, vocab)", i, enc->byte_ids[i]);
    for (i = 0; i < 3 * enc->n_merges; i++)
        if (enc->merges[i] < 0 || enc->merges[i] >= V)
            return table_fail(L, "merges", "entry %lld is %lld, outside [0, vocab)", i, enc->merges[i]);
    for (i = 0; i < enc->n_merges; i++) {   /* a merged token's bytes are its parts' */
        const int32_t *r = enc->merges + 3 * (size_t)i;
        size_t a = token_len(m, r[0]), b = token_len(m, r[1]);
        const uint8_t *t = m->token_bytes + m->token_offsets[r[2]];
        if (token_len(m, r[2]) != a + b || memcmp(t, m->token_bytes + m->token_offsets[r[0]], a) != 0 ||
            memcmp(t + a, m->token_bytes + m->token_offsets[r[1]], b) != 0)
            return table_fail(L, "merges", "rank %lld: token %lld is not its two parts' bytes", i, r[2]);
    }
    /* strictly increasing keys: distinct ranks, so a permutation, and no pair twice */
    for (i = 0; i < enc->n_merges; i++) {
        int32_t r = enc->merge_order[i];
        if (r < 0 || r >= enc->n_merges)
            return table_fail(L, "merge_order", "entry %lld is %lld, not a rank", i, r);
        if (i) {
            const int32_t *p = enc->merges + 3 * (size_t)enc->merge_order[i - 1], *q = enc->merges + 3 * (size_t)r;
            if (p[0] > q[0] || (p[0] == q[0] && p[1] >= q[1]))
                return table_fail(L, "merge_order", "entries %lld and %lld are not in (left, right) order", i - 1, i);
        }
    }
    for (i = 0; i < enc->n_vocab_order; i++) {   /* sorted by bytes: memcmp, a prefix first */
        int32_t t = enc->vocab_order[i], p;
        size_t n, pn;
        int cmp;
        if (t < 0 || t >= V) return table_fail(L, "vocab_order", "entry %lld is %lld, outside [0, vocab)", i, t);
        if (!i) continue;
        p = enc->vocab_order[i - 1];
        n = token_len(m, t); pn = token_len(m, p);
        cmp = memcmp(m->token_bytes + m->token_offsets[p], m->token_bytes + m->token_offsets[t], pn < n ? pn : n);
        if (cmp > 0 || (cmp == 0 && pn > n))
            return table_fail(L, "vocab_order", "entries %lld and %lld are not in byte order", i - 1, i);
    }
    for (i = 0; i < enc->n_added; i++) {
        const int32_t *a = enc->added + 3 * (size_t)i;
        if (a[0] < 0 || a[0] >= V) return table_fail(L, "added", "row %lld: id %lld outside [0, vocab)", i, a[0]);
        if (a[2] < 0 || ADDED_FLAGS(a) & ~(COLIBRI_ADDED_LSTRIP | COLIBRI_ADDED_RSTRIP | COLIBRI_ADDED_NORMALIZED |
                                         COLIBRI_ADDED_SINGLE_WORD))
            return table_fail(L, "added", "row %lld: flags %lld, only lstrip 1, rstrip 2, normalized 4 and single_word 8 exist", i,
                              a[2] >> COLIBRI_ADDED_LENGTH_BITS);
        if (ADDED_LENGTH(a) < 1 || a[1] < 0 || (size_t)a[1] > added_bytes || ADDED_LENGTH(a) > added_bytes - (size_t)a[1])
            return table_fail(L, "added", "row %lld: bytes outside tokenizer.added_bytes (%lld)", i, (int64_t)added_bytes);
        if (i && ADDED_LENGTH(a) > ADDED_LENGTH(a - 3))
            return table_fail(L, "added", "row %lld is longer than row %lld (longest first)", i, i - 1);
    }
    return COLIBRI_OK;
}

static colibri_status read_flag(loader *L, int32_t obj, const char *key, int32_t *flag)
{
    int32_t i = colibri_json_object_get(L->text, L->tok, obj, key);
    if (i >= 0 && L->tok[i].type != JSON_TRUE && L->tok[i].type != JSON_FALSE)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "model.encoder.%s must be a boolean", key);
    *flag = i >= 0 && L->tok[i].type == JSON_TRUE;
    return COLIBRI_OK;
}

/* byte_level_bpe's "normalizer" and "prefix_space", sentencepiece_bpe's "prepend_scheme" and "split". */
static colibri_status read_options(loader *L, int32_t obj, int32_t kind, colibri_encoder *enc, const char *const *schemes)
{
    int spm = kind == COLIBRI_ENCODER_SENTENCEPIECE_BPE;
    int32_t i = colibri_json_object_get(L->text, L->tok, obj, "normalizer"), k;
    colibri_status st;
    enc->normalizer = COLIBRI_NORM_NONE;
    if (i >= 0) {
        if (spm || L->tok[i].type != JSON_STRING || !colibri_json_string_equals(L->text, &L->tok[i], "nfc"))
            return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder.normalizer must be \"nfc\" (byte_level_bpe only)");
        enc->normalizer = COLIBRI_NORM_NFC;
    }
    enc->prepend = COLIBRI_PREPEND_NORMALIZER;
    i = colibri_json_object_get(L->text, L->tok, obj, "prepend_scheme");
    if (i >= 0) {
        for (k = 0; schemes[k] && (L->tok[i].type != JSON_STRING || !colibri_json_string_equals(L->text, &L->tok[i], schemes[k])); k++) {}
        if (!spm || !schemes[k])
            return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder.prepend_scheme must be \"always\", \"first\" or "
                                "\"never\" (sentencepiece_bpe only)");
        enc->prepend = COLIBRI_PREPEND_ALWAYS + k;
    }
    if ((st = read_flag(L, obj, "prefix_space", &enc->prefix_space)) || (st = read_flag(L, obj, "split", &enc->split_spaces)))
        return st;
    if ((enc->prefix_space && spm) || (enc->split_spaces && !spm))
        return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder: prefix_space goes with byte_level_bpe, split with "
                            "sentencepiece_bpe");
    return COLIBRI_OK;
}

colibri_status colibri_read_encoder(loader *L, int32_t root, colibri_model *m)
{
    static const char *const keys[] = { "kind", "pre_tokenizer", "bos", "ignore_merges", "normalizer", "prefix_space",
                                        "prepend_scheme", "split", NULL };
    static const char *const schemes[] = { "always", "first", "never", NULL };
    colibri_encoder *enc = &m->enc;
    int32_t obj = colibri_json_object_get(L->text, L->tok, root, "encoder"), i, k, kind = COLIBRI_ENCODER_BYTE_LEVEL_BPE;
    size_t added_bytes = 0, n_merge_order = 0;
    int64_t v;
    colibri_status st;
    for (k = 0; k < m->n_tensors; k++) {
        if (m->tensors[k].slot == G_ADDED_BYTES) added_bytes = (size_t)m->tensors[k].shape[0];
        if (m->tensors[k].slot == G_MERGE_ORDER) n_merge_order = (size_t)m->tensors[k].shape[0];
    }
    if (obj < 0) {
        if (enc->merges || enc->merge_order || enc->byte_ids || enc->added || enc->added_bytes || enc->vocab_order)
            return colibri_fail(L->err, COLIBRI_E_TENSOR, "the model carries encoder tensors (tokenizer.merges, ...) but no \"encoder\"");
        enc->kind = COLIBRI_ENCODER_NONE;
        return COLIBRI_OK;
    }
    if (L->tok[obj].type != JSON_OBJECT) return colibri_fail(L->err, COLIBRI_E_TYPE, "model.encoder must be an object");
    st = colibri_check_keys(L, obj, "model.encoder", keys);
    if (st) return st;
    st = colibri_get_field(L, obj, "model.encoder", "kind", JSON_STRING, &i);
    if (st) return st;
    if (colibri_json_string_equals(L->text, &L->tok[i], "sentencepiece_bpe")) kind = COLIBRI_ENCODER_SENTENCEPIECE_BPE;
    else if (!colibri_json_string_equals(L->text, &L->tok[i], "byte_level_bpe"))
        return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder.kind must be \"byte_level_bpe\" or \"sentencepiece_bpe\"");
    st = colibri_get_field(L, obj, "model.encoder", "pre_tokenizer", JSON_STRING, &i);
    if (st) return st;
    for (k = 0; k < COLIBRI_PRE_COUNT; k++)
        if (colibri_json_string_equals(L->text, &L->tok[i], pre_names[k])) break;
    if (k == COLIBRI_PRE_COUNT)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder.pre_tokenizer must be \"gpt2\", \"llama3\", \"deepseek\", "
                            "\"qwen2\" or \"metaspace\"");
    enc->pre_tokenizer = k;
    if ((kind == COLIBRI_ENCODER_SENTENCEPIECE_BPE) != (k == COLIBRI_PRE_METASPACE))
        return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder: pre_tokenizer \"metaspace\" goes with kind "
                            "\"sentencepiece_bpe\", and only with it");
    st = colibri_get_field(L, obj, "model.encoder", "bos", JSON_NUMBER, &i);
    if (st) return st;
    if (!colibri_json_as_int64(L->text, &L->tok[i], &v) || v < -1 || v >= m->hp.vocab_size)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder.bos must be -1 or a token id below %d",
                            m->hp.vocab_size);
    enc->bos = (int32_t)v;
    st = read_flag(L, obj, "ignore_merges", &enc->ignore_merges);
    if (!st) st = read_options(L, obj, kind, enc, schemes);
    if (st) return st;
    if ((enc->ignore_merges || kind == COLIBRI_ENCODER_SENTENCEPIECE_BPE) != (enc->vocab_order != NULL))
        return colibri_fail(L->err, COLIBRI_E_TENSOR, "tensor `tokenizer.vocab_order` goes with model.encoder.ignore_merges "
                            "or kind \"sentencepiece_bpe\", and only with them");
    if (!m->token_offsets || !enc->merges || !enc->merge_order || !enc->byte_ids)
        return colibri_fail(L->err, COLIBRI_E_TENSOR, "model.encoder needs tensors tokenizer.token_bytes, token_offsets, "
                            "merges, merge_order and byte_ids");
    if (!enc->added != !enc->added_bytes)
        return colibri_fail(L->err, COLIBRI_E_TENSOR, "tensors tokenizer.added and tokenizer.added_bytes go together");
    if (n_merge_order != (size_t)enc->n_merges)
        return colibri_fail(L->err, COLIBRI_E_SHAPE, "tensor `tokenizer.merge_order`: %zu entries for %d merges",
                            n_merge_order, enc->n_merges);
    st = check_tables(L, m, added_bytes);
    if (st) return st;
    for (k = 0; k < 256 && kind == COLIBRI_ENCODER_SENTENCEPIECE_BPE; k++)
        if (enc->byte_ids[k] < 0)   /* byte fallback needs every byte's token */
            return colibri_fail(L->err, COLIBRI_E_VALUE, "tensor `tokenizer.byte_ids`: byte %d has no token (sentencepiece_bpe "
                                "falls back on bytes)", (int)k);
    enc->kind = kind;
    return COLIBRI_OK;
}
