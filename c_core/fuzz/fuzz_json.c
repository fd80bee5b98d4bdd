/* SPDX-License-Identifier: MIT */
/* The JSON reader, and the placement parser over the same text.
 *
 * The input is the text, exactly its bytes (no NUL after it, so a read past the end is one ASan
 * sees).  It is tokenised three ways (counted, into an exact array, into a short one), every
 * token is read through the accessors, and the text is applied as a placement file to a session
 * of the fixture model opened once (COLIBRI_FUZZ_FIXTURE: the fixture directory). */
#include <stdio.h>
#include <string.h>

#include "colibri/colibri.h"
#include "colibri/device.h"
#include "model/json.h"

#include "fuzz.h"

static colibri_model *fixture;
static colibri_session *session;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    colibri_session_options options;
    colibri_error err;

    (void)argc;
    (void)argv;
    memset(&options, 0, sizeof options);
    options.n_ctx = 4;
    options.threads = 1;
    if (colibri_model_open(fuzz_model_dir("COLIBRI_FUZZ_FIXTURE", COLIBRI_FUZZ_FIXTURE_DIR), 0, &fixture, &err) ||
        colibri_session_create(fixture, &options, &session, &err))
    {
        fprintf(stderr, "fuzz_json: no fixture session (%s): placement is not fuzzed\n", err.message);
        session = NULL;
    }
    return 0;
}

/* Every accessor over the tokens colibri_json_parse produced, tokens[0 .. n). */
static uint64_t read_tokens(const char *text, const json_token *tokens, uint32_t n)
{
    static const char *const keys[] = { "", "format", "version", "default", "experts", "layer", "device", "a" };
    uint64_t seen = 0;
    uint32_t i, k;

    for (i = 0; i < n; i++) {
        const json_token *t = &tokens[i];
        int64_t v;
        double d;
        if (t->subtree == 0 || t->subtree > n - i) __builtin_trap();   /* a subtree outside the tokens */
        if (t->type == JSON_OBJECT)
            for (k = 0; k < sizeof keys / sizeof keys[0]; k++) {
                int32_t at = colibri_json_object_get(text, tokens, (int32_t)i, keys[k]);
                if (at >= 0 && ((uint32_t)at <= i || (uint32_t)at >= i + t->subtree)) __builtin_trap();
                seen += (uint64_t)(at + 1);
            }
        if (colibri_json_as_int64(text, t, &v)) seen += (uint64_t)v;
        if (colibri_json_as_double(text, t, &d)) seen += d == d;
        seen += (uint64_t)colibri_json_string_equals(text, t, "cpu") + (uint64_t)colibri_json_string_equals(text, t, "");
    }
    return seen;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    json_token few[8];
    json_token *tokens;
    uint32_t n = 0, m = 0;
    colibri_error err;
    volatile uint64_t sink;

    if (colibri_json_parse(text, size, NULL, 0, &n, &err) == COLIBRI_OK && n > 0) {
        tokens = malloc((size_t)n * sizeof *tokens);
        if (!tokens) return 0;
        if (colibri_json_parse(text, size, tokens, n, &m, &err) != COLIBRI_OK || m != n) __builtin_trap();
        sink = read_tokens(text, tokens, n);
        (void)sink;
        free(tokens);
    }
    (void)colibri_json_parse(text, size, few, sizeof few / sizeof few[0], &m, &err);   /* short: must stop, not overrun */

    if (session) {
        size_t scratch_bytes;
        void *scratch;
        if (colibri_placement_scratch_bytes(session, text, size, &scratch_bytes, &err) == COLIBRI_OK &&
            scratch_bytes <= (64u << 20)) {
            scratch = malloc(scratch_bytes ? scratch_bytes : 1);
            if (scratch) {
                (void)colibri_placement_parse(session, text, size, scratch, scratch_bytes, &err);
                free(scratch);
            }
        }
    }
    return 0;
}
