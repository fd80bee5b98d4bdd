/* SPDX-License-Identifier: MIT */
/* Several sequences in one session: mixed batches (a slot's prefill crossing chunk boundaries beside
 * others' single tokens, slots joining late) give each slot the logits of its sequence run alone,
 * bit for bit (reference kernels); a copied prefix continues as the alone run; refused calls (a slot
 * out of range or twice, a token out of range, no room) change nothing; the plan is what the session
 * uses.  Run under ASan/UBSan in CI: every per-row index of the several-sequence path is exercised.
 *
 *   test_sequences MODEL_DIR */
#include "model_files.h"

#define N_SEQ 3
#define CTX 24
#define MAX_LEN 16

static const int32_t seqs[N_SEQ][MAX_LEN] = {
    { 1, 5, 9, 200, 17, 3, 3, 88, 140, 7, 61, 2, 40, 41, 42, 43 },
    { 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12, 13, 14, 15, 16 },
    { 100, 3, 250, 17, 1, 1, 64, 77, 32, 9, 210, 5, 6, 7, 8, 9 },
};

/* (seq, first token, tokens) per entry; calls end with seq -1 */
typedef struct step { int32_t seq, first, n; } step;
static const step calls[][N_SEQ + 1] = {
    { { 0, 0, 7 }, { 1, 0, 1 }, { -1, 0, 0 } },                  /* 8 rows: two chunks of 4 */
    { { 1, 1, 5 }, { 0, 7, 1 }, { 2, 0, 3 }, { -1, 0, 0 } },     /* slot 2 joins */
    { { 2, 3, 1 }, { 1, 6, 1 }, { 0, 8, 8 }, { -1, 0, 0 } },
    { { 2, 4, 9 }, { -1, 0, 0 } },                                /* slot 0 and 1 leave */
};

static int check(colibri_status st, const colibri_error *err, const char *what)
{
    if (st == COLIBRI_OK) return 0;
    fprintf(stderr, "%s: %s (%s)\n", what, err->message, colibri_status_name(st));
    return 1;
}

static int same(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

int main(int argc, char **argv)
{
    colibri_model *model;
    colibri_session *one, *many;
    colibri_session_options so;
    colibri_error err;
    colibri_batch_entry entries[N_SEQ + 1];
    void *buf_one, *buf_many;
    float *alone;   /* (N_SEQ, MAX_LEN, vocab) every position's logits, each sequence alone */
    size_t V, plan;
    colibri_memory_totals totals;
    int32_t q, c, e, bad_token[1];
    int failures = 0;

    if (argc != 2) { fprintf(stderr, "usage: test_sequences MODEL_DIR\n"); return 2; }
    if (check(load_model_files(argv[1], 0, &model, &err), &err, "load")) return 1;
    V = (size_t)colibri_model_hparams(model)->vocab_size;
    alone = malloc((size_t)N_SEQ * MAX_LEN * V * sizeof(float));
    if (!alone) return 1;

    memset(&so, 0, sizeof so);
    so.kernels = COLIBRI_KERNELS_REFERENCE;
    so.n_ctx = CTX;
    so.threads = 1;
    if (check(create_session(model, &so, &one, &buf_one, &err), &err, "one-sequence session")) return 1;
    for (q = 0; q < N_SEQ; q++) {
        colibri_session_reset(one);
        if (check(colibri_forward(one, seqs[q], MAX_LEN, alone + (size_t)q * MAX_LEN * V, &err), &err, "alone")) return 1;
    }

    so.n_seq = N_SEQ;
    so.n_batch = 4;
    if (check(create_session(model, &so, &many, &buf_many, &err), &err, "session of 3 slots")) return 1;
    if (check(colibri_session_plan(model, &so, &plan, &err), &err, "plan")) return 1;
    colibri_memory(many, &totals);
    if (totals.arena_used != plan || colibri_session_n_seq(many) != N_SEQ) {
        fprintf(stderr, "plan %zu, arena used %zu, n_seq %d\n", plan, totals.arena_used, colibri_session_n_seq(many));
        failures++;
    }

    for (c = 0; c < (int32_t)(sizeof calls / sizeof calls[0]); c++) {
        for (e = 0; calls[c][e].seq >= 0; e++) {
            entries[e].seq = calls[c][e].seq;
            entries[e].tokens = seqs[calls[c][e].seq] + calls[c][e].first;
            entries[e].n_tokens = calls[c][e].n;
            entries[e].logits = 1;
        }
        if (check(colibri_forward_batch(many, entries, e, &err), &err, "forward_batch")) return 1;
        for (e = 0; calls[c][e].seq >= 0; e++) {
            int32_t seq = calls[c][e].seq, last = calls[c][e].first + calls[c][e].n - 1;
            if (colibri_seq_position(many, seq) != last + 1 ||
                !same(colibri_seq_logits(many, seq), alone + ((size_t)seq * MAX_LEN + (size_t)last) * V, V)) {
                fprintf(stderr, "call %d: slot %d at position %d differs from its alone run\n", c, seq, last + 1);
                failures++;
            }
        }
    }

    /* slot 0's first 5 positions copied to slot 1, which goes on with slot 0's own next tokens */
    if (check(colibri_seq_truncate(many, 0, 5, &err), &err, "truncate") ||
        check(colibri_seq_copy(many, 0, 1, &err), &err, "copy"))
        return 1;
    entries[0].seq = 1; entries[0].tokens = seqs[0] + 5; entries[0].n_tokens = 6; entries[0].logits = 1;
    if (check(colibri_forward_batch(many, entries, 1, &err), &err, "after the copy")) return 1;
    if (!same(colibri_seq_logits(many, 1), alone + 10 * V, V) || colibri_seq_position(many, 0) != 5) {
        fprintf(stderr, "the copied prefix's continuation differs from the alone run\n");
        failures++;
    }

    /* refused calls: each a status, every slot as it was */
    {
        int32_t before[N_SEQ];
        colibri_status st[4];
        for (q = 0; q < N_SEQ; q++) before[q] = colibri_seq_position(many, q);
        bad_token[0] = (int32_t)V;
        entries[0].seq = 0; entries[0].tokens = seqs[0]; entries[0].n_tokens = 1;
        entries[1].seq = N_SEQ; entries[1].tokens = seqs[1]; entries[1].n_tokens = 1;
        st[0] = colibri_forward_batch(many, entries, 2, &err);
        entries[1].seq = 0;
        st[1] = colibri_forward_batch(many, entries, 2, &err);
        entries[1].seq = 2; entries[1].tokens = bad_token;
        st[2] = colibri_forward_batch(many, entries, 2, &err);
        entries[1].tokens = seqs[1]; entries[1].n_tokens = 12;   /* slot 2 holds 13 of 24 */
        st[3] = colibri_forward_batch(many, entries, 2, &err);
        if (st[0] != COLIBRI_E_ARG || st[1] != COLIBRI_E_ARG || st[2] != COLIBRI_E_TOKEN || st[3] != COLIBRI_E_CONTEXT) {
            fprintf(stderr, "refused calls: statuses %d %d %d %d\n", st[0], st[1], st[2], st[3]);
            failures++;
        }
        for (q = 0; q < N_SEQ; q++)
            if (colibri_seq_position(many, q) != before[q]) {
                fprintf(stderr, "a refused call moved slot %d\n", q);
                failures++;
            }
        if (colibri_seq_position(many, N_SEQ) != -1 || colibri_seq_logits(many, -1) != NULL ||
            colibri_seq_reset(many, N_SEQ, &err) != COLIBRI_E_ARG) {
            fprintf(stderr, "a slot out of range was not refused\n");
            failures++;
        }
    }

    colibri_session_destroy(many);
    colibri_session_destroy(one);
    free(buf_many);
    free(buf_one);
    free(alone);
    colibri_model_close(model);
    free_model_files();
    if (failures) fprintf(stderr, "%d failures\n", failures);
    return failures ? 1 : 0;
}
