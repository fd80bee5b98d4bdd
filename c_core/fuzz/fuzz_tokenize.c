/* SPDX-License-Identifier: MIT */
/* The encoder on the demo model: the input's first byte picks the encoder's variant, the rest is
 * the text.  Variant: bits 0-1 the pre-tokenizer (GPT-2, Llama 3, DeepSeek V3, Qwen2), bit 2 NFC,
 * bit 3 a prefix space, bit 4 Llama 3's ignore_merges, each over the demo's byte-level vocabulary.
 * The ids, decoded with colibri_token_bytes, give back the text byte for byte (a byte-level BPE
 * model: every byte is a token or inside one), up to the first special token written in the text
 * ("<s>": it has no bytes; the BOS first too); with NFC or a prefix space, which change the bytes,
 * the decoded text encodes to the same ids again (both are idempotent).  A buffer one id short
 * reports the same count.
 *
 * The model is opened once from COLIBRI_FUZZ_MODEL (default: the source tree's
 * colibri/demo/shakespeare, baked in by meson). */
#include <stdio.h>
#include <string.h>

#include "colibri/colibri.h"
#include "model/model.h"

#include "fuzz.h"

static colibri_model *model;
static int32_t *vocab_order;   /* the token ids sorted by their bytes, which ignore_merges looks words up in */

static int by_bytes(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t nx = (size_t)(model->token_offsets[x + 1] - model->token_offsets[x]);
    size_t ny = (size_t)(model->token_offsets[y + 1] - model->token_offsets[y]);
    int c = memcmp(model->token_bytes + model->token_offsets[x], model->token_bytes + model->token_offsets[y],
                   nx < ny ? nx : ny);
    return c ? c : (nx > ny) - (nx < ny);
}

int LLVMFuzzerInitialize(int *argc, char **argv[])
{
    colibri_error err;
    int32_t i;
    const char *dir = fuzz_model_dir("COLIBRI_FUZZ_MODEL", COLIBRI_FUZZ_MODEL_DIR);

    (void)argc;
    (void)argv;
    if (colibri_model_open(dir, 0, &model, &err)) {
        fprintf(stderr, "fuzz_tokenize: cannot open %s: %s\n", dir, err.message);
        exit(1);
    }
    vocab_order = malloc((size_t)model->hp.vocab_size * sizeof *vocab_order);
    if (!vocab_order) exit(1);
    for (i = 0; i < model->hp.vocab_size; i++) vocab_order[i] = i;
    qsort(vocab_order, (size_t)model->hp.vocab_size, sizeof *vocab_order, by_bytes);
    return 0;
}

static const int32_t pre_tokenizers[4] = { COLIBRI_PRE_GPT2, COLIBRI_PRE_LLAMA3, COLIBRI_PRE_DEEPSEEK, COLIBRI_PRE_QWEN2 };

static void set_variant(uint8_t v)
{
    colibri_encoder *enc = &model->enc;
    enc->pre_tokenizer = pre_tokenizers[v & 3];
    enc->normalizer = v & 4 ? COLIBRI_NORM_NFC : COLIBRI_NORM_NONE;
    enc->prefix_space = (v >> 3) & 1;
    enc->ignore_merges = (v >> 4) & 1;
    enc->vocab_order = enc->ignore_merges ? vocab_order : NULL;
    enc->n_vocab_order = enc->ignore_merges ? model->hp.vocab_size : 0;
}

/* The bytes of ids[1, n) (the first is the BOS) into out (malloc'd); *special: one has no bytes. */
static uint8_t *decode(const int32_t *ids, size_t n, size_t *len, int *special)
{
    size_t k, total = 0;
    uint8_t *out;
    const uint8_t *bytes;
    size_t l;
    *special = 0;
    for (k = 1; k < n; k++) {
        if (colibri_token_bytes(model, ids[k], &bytes, &l) != COLIBRI_OK) __builtin_trap();
        if (l == 0) *special = 1;
        total += l;
    }
    out = malloc(total + 1);
    if (!out) return NULL;
    for (k = 1, *len = 0; k < n; k++) {
        colibri_token_bytes(model, ids[k], &bytes, &l);
        memcpy(out + *len, bytes, l);
        *len += l;
    }
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text;
    int32_t *ids, *again;
    size_t n = 0, m = 0, k, at = 0, cap, len = 0;
    int special = 0, rewrites;
    uint8_t *decoded;
    colibri_error err;

    if (size == 0) return 0;
    set_variant(data[0]);
    rewrites = (data[0] & 4) || (data[0] & 8);
    data++;
    size--;
    text = (const char *)data;
    cap = 5 * size + 4;   /* NFC writes at most 3 bytes per byte; a prefix space at most one more */
    ids = malloc(cap * sizeof *ids);
    again = malloc(cap * sizeof *again);
    if (!ids || !again) { free(ids); free(again); return 0; }
    if (colibri_tokenize(model, text, size, ids, cap, &n, &err) != COLIBRI_OK || n > cap - 1) __builtin_trap();
    if (!rewrites && n > size + 1) __builtin_trap();
    if (rewrites) {
        decoded = decode(ids, n, &len, &special);
        if (decoded && !special) {
            if (colibri_tokenize(model, (const char *)decoded, len, again, cap, &m, &err) != COLIBRI_OK || m != n ||
                memcmp(again, ids, n * sizeof *ids) != 0)
                __builtin_trap();
        }
        free(decoded);
    } else {
        for (k = 0; k < n; k++) {
            const uint8_t *bytes;
            size_t l;
            if (colibri_token_bytes(model, ids[k], &bytes, &l) != COLIBRI_OK) __builtin_trap();
            if (l == 0 && k > 0) special = 1;   /* a special token in the text: its bytes are not the token's */
            if (l > size - at || (!special && memcmp(bytes, data + at, l) != 0)) __builtin_trap();
            at += l;
        }
        if (at != size && !special) __builtin_trap();   /* a byte of the input lost */
    }
    if (n > 0 && (colibri_tokenize(model, text, size, ids, n - 1, &m, &err) != COLIBRI_E_ARG || m != n))
        __builtin_trap();
    (void)colibri_utf8_whole(data, size);
    free(ids);
    free(again);
    return 0;
}
