/* SPDX-License-Identifier: MIT */
/* Strict JSON tokeniser: iterative (no recursion), bounded depth, no allocation. */
#include "json.h"

#include <string.h>

#include "../util.h"

typedef struct json_parser {
    const char *text;
    size_t len;
    size_t pos;
    json_token *tokens;     /* NULL: count only */
    uint32_t cap;
    uint32_t count;
    colibri_error *err;
} json_parser;

static colibri_status json_fail(json_parser *p, colibri_status st, const char *what)
{
    size_t line = 1, col = 1, i;
    for (i = 0; i < p->pos && i < p->len; i++) {
        if (p->text[i] == '\n') { line++; col = 1; } else { col++; }
    }
    return colibri_fail(p->err, st, "colibri_model.json line %lu column %lu: %s",
                        (unsigned long)line, (unsigned long)col, what);
}

static void skip_space(json_parser *p)
{
    while (p->pos < p->len) {
        char c = p->text[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static colibri_status new_token(json_parser *p, json_type type, size_t start, uint32_t *index)
{
    *index = 0;
    if (p->count >= COLIBRI_JSON_MAX_TOKENS)
        return json_fail(p, COLIBRI_E_LIMIT, "more than 1048576 JSON values");
    if (p->tokens) {
        json_token *t;
        if (p->count >= p->cap) return json_fail(p, COLIBRI_E_LIMIT, "token buffer too small");
        t = &p->tokens[p->count];
        t->type = (uint8_t)type;
        t->start = (uint32_t)start;
        t->len = 0;
        t->n_children = 0;
        t->subtree = 1;
    }
    *index = p->count++;
    return COLIBRI_OK;
}

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), or 0 (RFC 3629: no overlongs,
 * no surrogates, nothing above U+10FFFF). */
static size_t utf8_sequence(const unsigned char *s, size_t n)
{
    size_t len, i;
    uint32_t cp;
    if (s[0] < 0x80) return 1;
    if (s[0] >= 0xc2 && s[0] <= 0xdf) { len = 2; cp = s[0] & 0x1fu; }
    else if (s[0] >= 0xe0 && s[0] <= 0xef) { len = 3; cp = s[0] & 0x0fu; }
    else if (s[0] >= 0xf0 && s[0] <= 0xf4) { len = 4; cp = s[0] & 0x07u; }
    else return 0;
    if (n < len) return 0;
    for (i = 1; i < len; i++) {
        if ((s[i] & 0xc0u) != 0x80u) return 0;
        cp = cp << 6 | (s[i] & 0x3fu);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return len;
}

/* A string token: validates escapes and UTF-8, rejects raw control characters. */
static colibri_status parse_string(json_parser *p)
{
    size_t start;
    uint32_t index = 0;
    colibri_status st;
    p->pos++;   /* opening quote */
    start = p->pos;
    while (p->pos < p->len) {
        unsigned char c = (unsigned char)p->text[p->pos];
        if (c == '"') break;
        if (c < 0x20) return json_fail(p, COLIBRI_E_JSON, "control character inside a string");
        if (c == '\\') {
            char e;
            if (p->pos + 1 >= p->len) break;
            e = p->text[p->pos + 1];
            if (e == 'u') {
                int k;
                for (k = 0; k < 4; k++) {
                    if (p->pos + 2 + (size_t)k >= p->len || !is_hex(p->text[p->pos + 2 + (size_t)k]))
                        return json_fail(p, COLIBRI_E_JSON, "bad \\u escape");
                }
                p->pos += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == '\0')
                return json_fail(p, COLIBRI_E_JSON, "bad escape in a string");
            p->pos += 2;
            continue;
        }
        if (c >= 0x80) {
            size_t n = utf8_sequence((const unsigned char *)p->text + p->pos, p->len - p->pos);
            if (n == 0) return json_fail(p, COLIBRI_E_JSON, "invalid UTF-8 in a string");
            p->pos += n;
            continue;
        }
        p->pos++;
    }
    if (p->pos >= p->len) return json_fail(p, COLIBRI_E_JSON, "unterminated string");
    if (p->pos - start > 0xFFFFFFFFu) return json_fail(p, COLIBRI_E_LIMIT, "string too long");
    st = new_token(p, JSON_STRING, start, &index);
    if (st) return st;
    if (p->tokens) p->tokens[index].len = (uint32_t)(p->pos - start);
    p->pos++;   /* closing quote */
    return COLIBRI_OK;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static colibri_status parse_number(json_parser *p)
{
    size_t start = p->pos;
    uint32_t index = 0;
    colibri_status st;
    const char *s = p->text;
    if (p->pos < p->len && s[p->pos] == '-') p->pos++;
    if (p->pos >= p->len || !is_digit(s[p->pos])) return json_fail(p, COLIBRI_E_JSON, "bad number");
    if (s[p->pos] == '0') {
        p->pos++;
    } else {
        while (p->pos < p->len && is_digit(s[p->pos])) p->pos++;
    }
    if (p->pos < p->len && s[p->pos] == '.') {
        p->pos++;
        if (p->pos >= p->len || !is_digit(s[p->pos])) return json_fail(p, COLIBRI_E_JSON, "bad number");
        while (p->pos < p->len && is_digit(s[p->pos])) p->pos++;
    }
    if (p->pos < p->len && (s[p->pos] == 'e' || s[p->pos] == 'E')) {
        p->pos++;
        if (p->pos < p->len && (s[p->pos] == '+' || s[p->pos] == '-')) p->pos++;
        if (p->pos >= p->len || !is_digit(s[p->pos])) return json_fail(p, COLIBRI_E_JSON, "bad number");
        while (p->pos < p->len && is_digit(s[p->pos])) p->pos++;
    }
    st = new_token(p, JSON_NUMBER, start, &index);
    if (st) return st;
    if (p->tokens) p->tokens[index].len = (uint32_t)(p->pos - start);
    return COLIBRI_OK;
}

static colibri_status parse_literal(json_parser *p, const char *word, json_type type)
{
    size_t n = strlen(word);
    uint32_t index = 0;
    colibri_status st;
    if (p->len - p->pos < n || memcmp(p->text + p->pos, word, n) != 0)
        return json_fail(p, COLIBRI_E_JSON, "unexpected character");
    st = new_token(p, type, p->pos, &index);
    if (st) return st;
    if (p->tokens) p->tokens[index].len = (uint32_t)n;
    p->pos += n;
    return COLIBRI_OK;
}

/* The grammar is walked with an explicit stack of open containers. */
colibri_status colibri_json_parse(const char *text, size_t len, json_token *tokens, uint32_t cap,
                                  uint32_t *n_tokens, colibri_error *err)
{
    json_parser p;
    uint32_t stack[COLIBRI_JSON_MAX_DEPTH];        /* open containers' tokens */
    unsigned char is_object[COLIBRI_JSON_MAX_DEPTH];
    int depth = 0;
    colibri_status st;

    p.text = text; p.len = len; p.pos = 0; p.tokens = tokens; p.cap = cap; p.count = 0; p.err = err;
    *n_tokens = 0;
    if (len > COLIBRI_JSON_MAX_BYTES)
        return colibri_fail(err, COLIBRI_E_LIMIT, "colibri_model.json is %lu bytes (limit %u)",
                            (unsigned long)len, COLIBRI_JSON_MAX_BYTES);

    for (;;) {
        /* expect a value */
        char c;
        skip_space(&p);
        if (p.pos >= p.len) return json_fail(&p, COLIBRI_E_JSON, "unexpected end of text");
        c = text[p.pos];
        if (c == '{' || c == '[') {
            uint32_t index = 0;
            if (depth >= COLIBRI_JSON_MAX_DEPTH)
                return json_fail(&p, COLIBRI_E_LIMIT, "nesting deeper than 32");
            st = new_token(&p, c == '{' ? JSON_OBJECT : JSON_ARRAY, p.pos, &index);
            if (st) return st;
            is_object[depth] = c == '{';
            stack[depth++] = index;
            p.pos++;
            skip_space(&p);
            if (p.pos < p.len && text[p.pos] == (c == '{' ? '}' : ']')) {
                p.pos++;
                depth--;
                goto value_done;
            }
            if (c == '{') goto expect_key;
            continue;
        } else if (c == '"') {
            st = parse_string(&p);
        } else if (c == '-' || is_digit(c)) {
            st = parse_number(&p);
        } else if (c == 't') {
            st = parse_literal(&p, "true", JSON_TRUE);
        } else if (c == 'f') {
            st = parse_literal(&p, "false", JSON_FALSE);
        } else if (c == 'n') {
            st = parse_literal(&p, "null", JSON_NULL);
        } else {
            return json_fail(&p, COLIBRI_E_JSON, "unexpected character");
        }
        if (st) return st;

    value_done:
        /* A value ended: close containers or expect the next member. */
        for (;;) {
            json_token *top;
            char sep;
            if (depth == 0) {
                skip_space(&p);
                if (p.pos != p.len) return json_fail(&p, COLIBRI_E_JSON, "text after the JSON value");
                if (tokens) {
                    /* subtree sizes: each container spans up to the next token not inside it */
                    uint32_t i;
                    for (i = p.count; i-- > 0;) {
                        json_token *t = &tokens[i];
                        if (t->type == JSON_OBJECT || t->type == JSON_ARRAY) {
                            uint32_t j = i + 1, k;
                            for (k = 0; k < t->n_children; k++) {
                                if (t->type == JSON_OBJECT) j += 1;   /* key */
                                j += tokens[j].subtree;
                            }
                            t->subtree = j - i;
                        }
                    }
                }
                *n_tokens = p.count;
                return COLIBRI_OK;
            }
            top = tokens ? &tokens[stack[depth - 1]] : NULL;
            if (top) top->n_children++;
            skip_space(&p);
            if (p.pos >= p.len) return json_fail(&p, COLIBRI_E_JSON, "unexpected end of text");
            sep = text[p.pos];
            if (sep == ',') {
                p.pos++;
                if (is_object[depth - 1]) goto expect_key;
                break;  /* next array element */
            }
            if (sep == (is_object[depth - 1] ? '}' : ']')) {
                p.pos++;
                depth--;
                continue;
            }
            return json_fail(&p, COLIBRI_E_JSON,
                             is_object[depth - 1] ? "expected ',' or '}'" : "expected ',' or ']'");
        }
        continue;

    expect_key:
        skip_space(&p);
        if (p.pos >= p.len || text[p.pos] != '"') return json_fail(&p, COLIBRI_E_JSON, "expected a string key");
        st = parse_string(&p);
        if (st) return st;
        skip_space(&p);
        if (p.pos >= p.len || text[p.pos] != ':') return json_fail(&p, COLIBRI_E_JSON, "expected ':'");
        p.pos++;
    }
}

int colibri_json_string_equals(const char *text, const json_token *t, const char *s)
{
    size_t n = strlen(s);
    return t->type == JSON_STRING && t->len == n && memcmp(text + t->start, s, n) == 0;
}

int32_t colibri_json_object_get(const char *text, const json_token *tokens, int32_t obj, const char *key)
{
    const json_token *t = &tokens[obj];
    int32_t j = obj + 1;
    uint32_t k;
    if (t->type != JSON_OBJECT) return -1;
    for (k = 0; k < t->n_children; k++) {
        if (colibri_json_string_equals(text, &tokens[j], key)) return j + 1;
        j += 1 + (int32_t)tokens[j + 1].subtree;
    }
    return -1;
}

int colibri_json_as_int64(const char *text, const json_token *t, int64_t *value)
{
    const char *s = text + t->start;
    uint32_t i = 0;
    int negative = 0;
    uint64_t v = 0;
    if (t->type != JSON_NUMBER) return 0;
    if (s[0] == '-') { negative = 1; i = 1; }
    for (; i < t->len; i++) {
        if (!is_digit(s[i])) return 0;  /* fraction or exponent: not an integer */
        if (v > (UINT64_C(9223372036854775807) - (uint64_t)(s[i] - '0')) / 10) return 0;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *value = negative ? -(int64_t)v : (int64_t)v;
    return 1;
}

/* Decimal to double without the C library (strtod depends on the locale).
 * Exact for the values model configs hold; within a few ulp otherwise. */
int colibri_json_as_double(const char *text, const json_token *t, double *value)
{
    const char *s = text + t->start;
    uint32_t i = 0, n = t->len;
    int negative = 0, exp10 = 0, digits = 0;
    double mantissa = 0.0, scale = 1.0, p = 10.0;
    long e = 0;
    int e_negative = 0, e_abs;
    if (t->type != JSON_NUMBER) return 0;
    if (s[0] == '-') { negative = 1; i = 1; }
    for (; i < n && is_digit(s[i]); i++) {
        if (digits < 19) { mantissa = mantissa * 10.0 + (s[i] - '0'); digits += mantissa > 0.0; }
        else exp10++;
    }
    if (i < n && s[i] == '.') {
        for (i++; i < n && is_digit(s[i]); i++) {
            if (digits < 19) { mantissa = mantissa * 10.0 + (s[i] - '0'); digits += mantissa > 0.0; exp10--; }
        }
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (s[i] == '+' || s[i] == '-') { e_negative = s[i] == '-'; i++; }
        for (; i < n && is_digit(s[i]); i++) if (e < 100000) e = e * 10 + (s[i] - '0');
    }
    e = e_negative ? exp10 - e : exp10 + e;
    e_abs = (int)(e < 0 ? -e : e);
    if (e_abs > 400) e_abs = 400;
    while (e_abs) {   /* 10^|e| by squaring */
        if (e_abs & 1) scale *= p;
        p *= p;
        e_abs >>= 1;
    }
    mantissa = e < 0 ? mantissa / scale : mantissa * scale;
    *value = negative ? -mantissa : mantissa;
    return 1;
}
