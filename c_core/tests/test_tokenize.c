/* SPDX-License-Identifier: MIT */
/* The core's encoder against the `tokenizers` library: each case of CASES (written by
 * tests/test_tokenizer.py from that library: a line of the text's bytes in hex, a line of its ids)
 * tokenized with the model's encoder gives those ids; short buffers report the count; bytes that
 * are not UTF-8 come back as themselves (the concatenated token bytes are the input; not with
 * --cases-only, for a SentencePiece-style model, whose "▁" before the text is a byte of its tokens).
 *
 *   test_tokenize MODEL_DIR CASES [--cases-only] */
#include <string.h>

#include "model_files.h"

#define MAX_TEXT 4096

static int hex(int c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

int main(int argc, char **argv)
{
    static char text[MAX_TEXT];
    static int32_t ids[MAX_TEXT + 1], want[MAX_TEXT + 1];
    static char line[4 * MAX_TEXT];
    static const char invalid[] = "a\xff\xfe b\xc3 \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf z";
    colibri_model *model;
    colibri_error err;
    size_t n, len, n_want, k, cases = 0;
    FILE *f;

    if (argc != 3 && !(argc == 4 && strcmp(argv[3], "--cases-only") == 0)) {
        fprintf(stderr, "usage: test_tokenize MODEL_DIR CASES [--cases-only]\n");
        return 2;
    }
    if (load_model_files(argv[1], 0, &model, &err)) { fprintf(stderr, "%s\n", err.message); return 1; }
    f = fopen(argv[2], "r");
    if (!f) { fprintf(stderr, "cannot read %s\n", argv[2]); return 1; }
    while (fgets(line, sizeof line, f)) {
        char *p;
        for (len = 0; line[2 * len] && line[2 * len] != '\n' && len < MAX_TEXT; len++)
            text[len] = (char)(hex(line[2 * len]) * 16 + hex(line[2 * len + 1]));
        if (!fgets(line, sizeof line, f)) { fprintf(stderr, "case %zu has no ids\n", cases); return 1; }
        for (n_want = 0, p = line; *p && *p != '\n'; n_want++) {
            want[n_want] = (int32_t)strtol(p, &p, 10);
            if (*p == ',') p++;
        }
        if (colibri_tokenize(model, text, len, ids, MAX_TEXT + 1, &n, &err)) {
            fprintf(stderr, "case %zu: %s\n", cases, err.message);
            return 1;
        }
        if (n != n_want || memcmp(ids, want, n * sizeof *ids) != 0) {
            fprintf(stderr, "case %zu (%zu bytes): %zu ids, %zu expected; first difference at %zu\n", cases, len, n,
                    n_want, n);
            for (k = 0; k < n && k < n_want; k++)
                if (ids[k] != want[k]) { fprintf(stderr, "  id %zu: %d != %d\n", k, (int)ids[k], (int)want[k]); break; }
            return 1;
        }
        /* too small a buffer: the count, the first ids, and an error that names it */
        if (n > 1 && (colibri_tokenize(model, text, len, ids, n - 1, &k, &err) != COLIBRI_E_ARG || k != n ||
                      memcmp(ids, want, (n - 1) * sizeof *ids) != 0)) {
            fprintf(stderr, "case %zu: a short buffer did not report %zu tokens\n", cases, n);
            return 1;
        }
        cases++;
    }
    fclose(f);
    if (cases == 0) { fprintf(stderr, "no cases in %s\n", argv[2]); return 1; }

    if (argc == 4) {
        printf("%zu cases tokenized as the tokenizers library does\n", cases);
        colibri_model_close(model);
        free_model_files();
        return 0;
    }
    /* not UTF-8: every byte survives, as its own token or inside one */
    if (colibri_tokenize(model, invalid, sizeof invalid - 1, ids, MAX_TEXT, &n, &err)) {
        fprintf(stderr, "invalid UTF-8: %s\n", err.message);
        return 1;
    }
    for (k = 1, len = 0; k < n; k++) {   /* ids[0]: the BOS, no bytes */
        const uint8_t *b;
        size_t m;
        if (colibri_token_bytes(model, ids[k], &b, &m) || len + m > sizeof invalid - 1 ||
            memcmp(invalid + len, b, m) != 0) {
            fprintf(stderr, "invalid UTF-8: token %zu (%d) is not the input's bytes at %zu\n", k, (int)ids[k], len);
            return 1;
        }
        len += m;
    }
    if (len != sizeof invalid - 1) { fprintf(stderr, "invalid UTF-8: %zu of %zu bytes\n", len, sizeof invalid - 1); return 1; }
    /* streaming decode: a character's first bytes wait for the rest */
    {
        static const struct { const char *s; size_t whole; } utf8[] = {
            { "ab", 2 }, { "a\xc3", 1 }, { "a\xc3\xa9", 3 }, { "\xe2\x82", 0 }, { "\xe2\x82\xac", 3 },
            { "x\xf0\x9f\x98", 1 }, { "\xf0\x9f\x98\x80", 4 }, { "\xff", 1 }, { "\x80\x80", 2 }, { "", 0 },
        };
        for (k = 0; k < sizeof utf8 / sizeof utf8[0]; k++) {
            size_t got = colibri_utf8_whole((const uint8_t *)utf8[k].s, strlen(utf8[k].s));
            if (got != utf8[k].whole) {
                fprintf(stderr, "colibri_utf8_whole case %zu: %zu, expected %zu\n", k, got, utf8[k].whole);
                return 1;
            }
        }
    }
    printf("%zu cases tokenized as the tokenizers library does; invalid UTF-8 kept byte for byte\n", cases);
    colibri_model_close(model);
    free_model_files();
    return 0;
}
