/* SPDX-License-Identifier: MIT */
/* The encoder on the demo model: the input is the text.  Its ids, decoded with
 * colibri_token_bytes, give back the input byte for byte (a byte-level BPE model: every byte is
 * a token or inside one), up to the first special token written in the text ("<s>": it has no
 * bytes; the BOS first too); a buffer one id short reports the same count.
 *
 * The model is opened once from COLIBRI_FUZZ_MODEL (default: the source tree's
 * colibri/demo/shakespeare, baked in by meson). */
#include <stdio.h>
#include <string.h>

#include "colibri/colibri.h"

#include "fuzz.h"

static colibri_model *model;

int LLVMFuzzerInitialize(int *argc, char **argv[])
{
    colibri_error err;
    const char *dir = fuzz_model_dir("COLIBRI_FUZZ_MODEL", COLIBRI_FUZZ_MODEL_DIR);

    (void)argc;
    (void)argv;
    if (colibri_model_open(dir, 0, &model, &err)) {
        fprintf(stderr, "fuzz_tokenize: cannot open %s: %s\n", dir, err.message);
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    int32_t *ids;
    size_t n = 0, m = 0, k, at = 0, cap = 3 * size + 4;
    int special = 0;
    colibri_error err;

    ids = malloc(cap * sizeof *ids);
    if (!ids) return 0;
    if (colibri_tokenize(model, text, size, ids, cap, &n, &err) != COLIBRI_OK || n > size + 1) __builtin_trap();
    for (k = 0; k < n; k++) {
        const uint8_t *bytes;
        size_t len;
        if (colibri_token_bytes(model, ids[k], &bytes, &len) != COLIBRI_OK) __builtin_trap();
        if (len == 0 && k > 0) special = 1;   /* a special token in the text: its bytes are not the token's */
        if (len > size - at || (!special && memcmp(bytes, data + at, len) != 0)) __builtin_trap();
        at += len;
    }
    if (at != size && !special) __builtin_trap();   /* a byte of the input lost */
    if (n > 0 && (colibri_tokenize(model, text, size, ids, n - 1, &m, &err) != COLIBRI_E_ARG || m != n))
        __builtin_trap();
    (void)colibri_utf8_whole(data, size);
    free(ids);
    return 0;
}
