/* SPDX-License-Identifier: MIT */
/* Text into words, as the pre-tokenizers' regular expressions split it (GPT-2's, Llama 3's, Qwen2's,
 * DeepSeek V3's), each written out above its scanner, which matches it by hand: a word's end from
 * its start, looking at most a character or three bytes past it (a whitespace run decides as a
 * whole).  Classes from unicode.c. */
#include "tokenize.h"
#include "text.h"

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
    if (colibri_char_class(cp) == C_NUMBER) {
        for (j = i + len, k = 1; k < 3 && j < e && class_full_at(s, j, e, &len) == C_NUMBER; k++) j += len;
        return j;
    }
    if (is_cjk(cp)) {
        for (j = i + len; j < e && is_cjk(utf8_at(s, j, e, &len)); j += len) {}
        return j;
    }
    for (j = i + len; j < e; j += len) {
        cp = utf8_at(s, j, e, &len);
        if (colibri_char_class(cp) == C_NUMBER || is_cjk(cp)) break;
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

/* ---- the scanner of each pre-tokenizer ---- */

size_t colibri_word_end(int32_t pre, const uint8_t *s, size_t i, size_t e, size_t *piece)
{
    switch (pre) {
    case COLIBRI_PRE_DEEPSEEK:
        if (i >= *piece) *piece = deepseek_piece(s, i, e);
        return deepseek_word(s, i, *piece);
    case COLIBRI_PRE_LLAMA3: return llama3_word(s, i, e, 3);
    case COLIBRI_PRE_QWEN2: return llama3_word(s, i, e, 1);
    default: return gpt2_word(s, i, e);
    }
}
