/* SPDX-License-Identifier: MIT */
/* The model loader from memory, a session, a few forward steps and a sample.
 *
 * Input: a 4-byte little-endian length n, then n bytes of colibri_model.json, then weights.bin
 * (moved to a 64-byte boundary, in a buffer of exactly its size).  make_corpus.py writes seeds
 * in this form.  The session is tiny (4 positions, chunks of 2) so an execution stays cheap. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>

#include "colibri/colibri.h"

#include "fuzz.h"

#define MAX_BYTES (64u << 20)   /* metadata or arena beyond this: refused, as a host would */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static void run_session(colibri_model *model)
{
    const colibri_hparams *hp = colibri_model_hparams(model);
    colibri_session_options options;
    colibri_session *session;
    colibri_sampling greedy = { .temperature = 0.0f, .top_k = 0, .top_p = 1.0f },
                     nucleus = { .temperature = 0.8f, .top_k = 8, .top_p = 0.9f };
    colibri_error err;
    size_t arena_bytes;
    void *arena = NULL;
    int32_t tokens[3], token;
    uint64_t rng = 1;
    int32_t i, vocab = hp->vocab_size > 0 ? hp->vocab_size : 1;

    memset(&options, 0, sizeof options);
    options.n_ctx = 4;
    options.n_batch = 2;
    options.threads = 1;
    if (colibri_session_plan(model, &options, &arena_bytes, &err) || arena_bytes > MAX_BYTES) return;
    if (posix_memalign(&arena, 64, arena_bytes ? arena_bytes : 1) != 0) return;
    options.arena = arena;
    options.arena_size = arena_bytes;
    if (colibri_session_create(model, &options, &session, &err) == COLIBRI_OK) {
        for (i = 0; i < 3; i++) tokens[i] = (hp->bos_token_id + 5 * i) % vocab;
        if (tokens[0] < 0) tokens[0] = 0;
        if (colibri_forward(session, tokens, 2, NULL, &err) == COLIBRI_OK &&
            colibri_sample(session, &greedy, &rng, &token, &err) == COLIBRI_OK &&
            colibri_forward(session, &token, 1, NULL, &err) == COLIBRI_OK)
            (void)colibri_sample(session, &nucleus, &rng, &token, &err);
        (void)colibri_forward(session, tokens + 2, 1, NULL, &err);
        colibri_session_reset(session);
        (void)colibri_forward(session, tokens, 1, NULL, &err);
        colibri_session_destroy(session);
    }
    free(arena);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t json_len, weights_len, meta_bytes;
    char *json;
    void *weights = NULL, *meta = NULL;
    colibri_model *model;
    colibri_error err;

    if (size < 4) return 0;
    json_len = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
    if (json_len > size - 4) json_len = size - 4;
    weights_len = size - 4 - json_len;
    json = malloc(json_len ? json_len : 1);
    if (!json) return 0;
    memcpy(json, data + 4, json_len);
    if (posix_memalign(&weights, 64, weights_len ? weights_len : 1) != 0) { free(json); return 0; }
    memcpy(weights, data + 4 + json_len, weights_len);

    if (colibri_model_meta_bytes(json, json_len, &meta_bytes, &err) == COLIBRI_OK && meta_bytes <= MAX_BYTES &&
        posix_memalign(&meta, 64, meta_bytes ? meta_bytes : 1) == 0) {
        if (colibri_model_load(json, json_len, weights, weights_len, 0, meta, meta_bytes, &model, &err) == COLIBRI_OK) {
            run_session(model);
            colibri_model_close(model);
        }
        free(meta);
    }
    free(weights);
    free(json);
    return 0;
}
