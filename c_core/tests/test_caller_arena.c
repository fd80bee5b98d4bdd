/* SPDX-License-Identifier: MIT */
/* A session in a caller-owned buffer (the bare-metal way) needs exactly colibri_session_plan
 * bytes when 64-byte aligned, refuses a buffer one byte short with COLIBRI_E_NOMEM, and
 * computes bit-for-bit what a session elsewhere in memory computes: a mapped one on hosted
 * targets, one at another alignment on bare metal (which has no arena to map).
 *
 *   test_caller_arena MODEL_DIR */
#include "model_files.h"

#define N_TOKENS 12

static int check(colibri_status st, const colibri_error *err, const char *what)
{
    if (st == COLIBRI_OK) return 0;
    fprintf(stderr, "%s: %s (%s)\n", what, err->message, colibri_status_name(st));
    return 1;
}

int main(int argc, char **argv)
{
    colibri_model *model;
    colibri_session *other, *owned;
    colibri_session_options so;
    colibri_error err;
    int32_t tokens[N_TOKENS] = { 1, 5, 9, 200, 17, 3, 3, 88, 140, 7, 61, 2 };
    size_t need, vocab;
    float *a, *b;
    void *buffer, *other_buffer = NULL;
    colibri_status st;

    if (argc != 2) { fprintf(stderr, "usage: test_caller_arena MODEL_DIR\n"); return 2; }
    if (check(load_model_files(argv[1], 0, &model, &err), &err, "load")) return 1;
    vocab = (size_t)colibri_model_hparams(model)->vocab_size;
    memset(&so, 0, sizeof so);
    so.n_ctx = 32;
    so.n_batch = 5;
    if (check(colibri_session_plan(model, &so, &need, &err), &err, "plan")) return 1;

    /* a 64-byte aligned buffer one byte short of the plan: refused, naming the size it needs */
    buffer = malloc(need + 128);   /* room for the plan at 64 or at 16 bytes past a boundary */
    so.arena = (char *)buffer + (64 - (uintptr_t)buffer % 64) % 64;
    so.arena_size = need - 1;
    st = colibri_session_create(model, &so, &owned, &err);
    if (st != COLIBRI_E_NOMEM || !strstr(err.message, "too small")) {
        fprintf(stderr, "a short buffer gave status %s: %s\n", colibri_status_name(st), err.message);
        return 1;
    }
    /* 16 bytes past a boundary: the plan plus the 48 bytes up to the next one */
    so.arena = (char *)so.arena + 16;
    so.arena_size = need + 47;
    if (colibri_session_create(model, &so, &owned, &err) != COLIBRI_E_NOMEM) {
        fprintf(stderr, "a buffer 16 bytes past a boundary was accepted 1 byte short\n");
        return 1;
    }
    so.arena_size = need + 48;
#ifdef COLIBRI_BARE_METAL
    /* no arena to map here: the reference is this session, 16 bytes past a boundary */
    if (check(colibri_session_create(model, &so, &other, &err), &err, "create 16 bytes past a boundary")) return 1;
    other_buffer = buffer;   /* kept by `other` */
    buffer = malloc(need + 64);
#else
    if (check(colibri_session_create(model, &so, &other, &err), &err, "create 16 bytes past a boundary")) return 1;
    colibri_session_destroy(other);
    so.arena = NULL;
    so.arena_size = 0;
    if (check(colibri_session_create(model, &so, &other, &err), &err, "create mapped")) return 1;
#endif
    so.arena = (char *)buffer + (64 - (uintptr_t)buffer % 64) % 64;
    so.arena_size = need;   /* exactly the plan */
    if (check(colibri_session_create(model, &so, &owned, &err), &err, "create in caller buffer")) return 1;

    a = malloc(N_TOKENS * vocab * sizeof(float));
    b = malloc(N_TOKENS * vocab * sizeof(float));
    if (check(colibri_forward(owned, tokens, N_TOKENS, a, &err), &err, "forward (caller buffer)")) return 1;
    if (check(colibri_forward(other, tokens, N_TOKENS, b, &err), &err, "forward (other)")) return 1;
    if (memcmp(a, b, N_TOKENS * vocab * sizeof(float)) != 0) {
        fprintf(stderr, "logits differ between two placements of the arena\n");
        return 1;
    }
    printf("caller arena of exactly the planned %zu bytes: logits identical to another placement's\n", need);
    colibri_session_destroy(owned);
    colibri_session_destroy(other);
    colibri_model_close(model);
    free_model_files();
    free(buffer);
    free(other_buffer);
    free(a);
    free(b);
    return 0;
}
