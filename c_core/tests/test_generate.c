/* SPDX-License-Identifier: MIT */
/* colibri_generate_start/_next give the tokens, the stop and the sampler state of the loop every
 * caller wrote by hand before (prefill, then sample, stop at EOS / max_tokens / a full context,
 * else feed the token back), greedy and sampled, with the prompt fed by the generation or by the
 * caller; and the text sink hands on every byte, never a write that splits a UTF-8 character,
 * however a text is cut into tokens.
 *
 *   test_generate MODEL_DIR */
#include <math.h>

#include "model_files.h"

#define N_PROMPT 5
#define MAX_STEPS 64
#define CTX 32

static const int32_t prompt[N_PROMPT] = { 1, 5, 9, 200, 17 };

static int check(colibri_status st, const colibri_error *err, const char *what)
{
    if (st == COLIBRI_OK) return 0;
    fprintf(stderr, "%s: %s (%s)\n", what, err->message, colibri_status_name(st));
    return 1;
}

/* The loop as colibri-infer and Session.stream ran it: tokens into out, the stop as the generation
 * names it; *rng: the sampler's state after. */
static int hand_run(colibri_session *s, const colibri_generate_options *o, int32_t eos, int32_t *out, int *n,
                    colibri_stop *stop, uint64_t *rng)
{
    colibri_error err;
    int32_t token, seen[N_PROMPT + MAX_STEPS];   /* the sequence so far, what the penalties count */
    *rng = o->seed;
    *n = 0;
    *stop = COLIBRI_STOP_MAX_TOKENS;
    memcpy(seen, prompt, sizeof prompt);
    if (check(colibri_forward(s, prompt, N_PROMPT, NULL, &err), &err, "hand prefill")) return 1;
    while (*n < o->max_tokens) {
        if (check(colibri_sample_after(s, &o->sampling, seen, N_PROMPT + *n, rng, &token, &err), &err, "hand sample"))
            return 1;
        seen[N_PROMPT + *n] = token;
        out[(*n)++] = token;
        if (o->stop_at_eos && token == eos) { *stop = COLIBRI_STOP_EOS; break; }
        if (*n == o->max_tokens) break;
        if (colibri_session_position(s) >= colibri_session_n_ctx(s)) { *stop = COLIBRI_STOP_CONTEXT_FULL; break; }
        if (check(colibri_forward(s, &token, 1, NULL, &err), &err, "hand decode")) return 1;
    }
    return 0;
}

/* The generation's tokens, with the prompt fed by it or (caller_prefill) before it, position by
 * position; eos >= 0 stands in for the model's end-of-sequence id. */
static int generated_run(colibri_session *s, const colibri_generate_options *o, int caller_prefill, int32_t eos,
                         int32_t *out, int *n, colibri_stop *stop, uint64_t *rng)
{
    colibri_generation g;
    colibri_error err;
    int32_t token;
    int i;
    *n = 0;
    for (i = 0; caller_prefill && i < N_PROMPT; i++)
        if (check(colibri_forward(s, &prompt[i], 1, NULL, &err), &err, "caller prefill")) return 1;
    if (check(colibri_generate_start(&g, s, o, caller_prefill ? NULL : prompt, caller_prefill ? 0 : N_PROMPT, &err),
              &err, "start"))
        return 1;
    if (colibri_session_position(s) != N_PROMPT) { fprintf(stderr, "prompt not prefilled\n"); return 1; }
    if (eos >= 0) {   /* the stand-in second, after an id the run never makes: any end id stops it */
        g.eos_token_ids[0] = -1;   /* an id no token is */
        g.eos_token_ids[1] = eos;
        g.n_eos_token_ids = 2;
    }
    for (;;) {
        if (check(colibri_generate_next(&g, &token, &err), &err, "next")) return 1;
        if (token < 0) break;
        if (*n == MAX_STEPS) { fprintf(stderr, "more tokens than max_tokens\n"); return 1; }
        out[(*n)++] = token;
        if (g.generated != *n) { fprintf(stderr, "generated %d after %d tokens\n", (int)g.generated, *n); return 1; }
    }
    if (colibri_generate_next(&g, &token, &err) != COLIBRI_OK || token != -1) {   /* stopped stays stopped */
        fprintf(stderr, "a call after the stop gave token %d\n", (int)token);
        return 1;
    }
    *stop = g.stop;
    *rng = g.rng;
    return 0;
}

static int same_run(colibri_model *model, const colibri_generate_options *o, int caller_prefill, int32_t eos,
                    const char *what)
{
    colibri_session_options so;
    colibri_session *s;
    void *buffer;
    colibri_error err;
    int32_t want[MAX_STEPS], got[MAX_STEPS];
    int n_want, n_got, i;
    colibri_stop want_stop, got_stop;
    uint64_t want_rng, got_rng;
    memset(&so, 0, sizeof so);
    so.n_ctx = CTX;
    if (check(create_session(model, &so, &s, &buffer, &err), &err, "create")) return 1;
    if (hand_run(s, o, eos >= 0 ? eos : colibri_model_hparams(model)->eos_token_id, want, &n_want, &want_stop, &want_rng))
        return 1;
    colibri_session_reset(s);
    if (generated_run(s, o, caller_prefill, eos, got, &n_got, &got_stop, &got_rng)) return 1;
    colibri_session_destroy(s);
    free(buffer);
    if (n_got != n_want || got_stop != want_stop || got_rng != want_rng) {
        fprintf(stderr, "%s: %d tokens, stop %d, rng %llx; the hand-run loop: %d, stop %d, rng %llx\n", what, n_got,
                (int)got_stop, (unsigned long long)got_rng, n_want, (int)want_stop, (unsigned long long)want_rng);
        return 1;
    }
    for (i = 0; i < n_want; i++)
        if (got[i] != want[i]) {
            fprintf(stderr, "%s: token %d is %d, the hand-run loop's %d\n", what, i, (int)got[i], (int)want[i]);
            return 1;
        }
    printf("%s: %d tokens, stop %d\n", what, n_got, (int)got_stop);
    return 0;
}

static int generation_tests(colibri_model *model)
{
    static const colibri_logit_bias bias[] = { { 5, 2.0f }, { 9, -INFINITY } };
    colibri_generate_options greedy = { 10, { .temperature = 0.0f, .top_p = 1.0f }, 0, 1 };
    colibri_generate_options sampled = { 20, { .temperature = 0.9f, .top_k = 10, .top_p = 1.0f }, 7, 1 };
    colibri_generate_options nucleus = { 20, { .temperature = 1.2f, .top_p = 0.8f }, 3, 1 };
    colibri_generate_options to_the_end = { MAX_STEPS, { .temperature = 1.0f, .top_p = 1.0f }, 11, 0 };   /* the context fills */
    colibri_generate_options none = { 0, { .temperature = 0.0f, .top_p = 1.0f }, 0, 1 };
    colibri_generate_options penalised = { 30, { .temperature = 0.8f, .top_p = 0.95f, .min_p = 0.05f,
                                                 .repeat_penalty = 1.3f, .presence_penalty = 0.5f,
                                                 .frequency_penalty = 0.25f, .penalty_last_n = 8,
                                                 .logit_bias = bias, .n_logit_bias = 2 }, 5, 0 };
    colibri_generate_options penalised_greedy = { 30, { .repeat_penalty = 1.5f, .penalty_last_n = -1 }, 0, 0 };
    int32_t first[MAX_STEPS], n, fails = 0;
    colibri_stop stop;
    uint64_t rng;
    colibri_session_options so;
    colibri_session *s;
    void *buffer;
    colibri_error err;
    int count;

    fails += same_run(model, &greedy, 0, -1, "greedy");
    fails += same_run(model, &sampled, 0, -1, "top_k sampled");
    fails += same_run(model, &nucleus, 0, -1, "top_p sampled");
    fails += same_run(model, &nucleus, 1, -1, "prompt fed by the caller");
    fails += same_run(model, &to_the_end, 0, -1, "to a full context");
    fails += same_run(model, &none, 0, -1, "max_tokens 0");
    fails += same_run(model, &penalised, 0, -1, "penalties, bias and min_p");
    fails += same_run(model, &penalised_greedy, 0, -1, "greedy with a repetition penalty");

    /* EOS: a token the sampled run produces stands in for the model's end of sequence */
    memset(&so, 0, sizeof so);
    so.n_ctx = CTX;
    if (check(create_session(model, &so, &s, &buffer, &err), &err, "create")) return 1;
    if (generated_run(s, &sampled, 0, -2, first, &count, &stop, &rng)) return 1;
    colibri_session_destroy(s);
    free(buffer);
    n = count > 3 ? 3 : count - 1;
    fails += same_run(model, &sampled, 0, first[n], "stop at eos");
    sampled.stop_at_eos = 0;
    fails += same_run(model, &sampled, 0, first[n], "eos ignored");
    return fails;
}

/* ---- the text sink -------------------------------------------------------------------------- */

typedef struct captured {
    char bytes[256];
    size_t len;
    size_t ends[256];               /* where each write ended */
    size_t n_writes;
} captured;

static void capture(void *context, const char *bytes, size_t len)
{
    captured *c = context;
    memcpy(c->bytes + c->len, bytes, len);
    c->len += len;
    c->ends[c->n_writes++] = c->len;
}

/* 1 where a character starts (or the text ends): no continuation byte (10xxxxxx) there. */
static int boundary(const uint8_t *text, size_t len, size_t at)
{
    return at == len || (text[at] & 0xC0) != 0x80;
}

/* `text` cut at a and b (0 <= a <= b <= len) into three tokens' bytes: every byte comes out in
 * order, and for valid UTF-8 every write ends where a character does. */
static int sink_test(const uint8_t *text, size_t len, int valid)
{
    size_t a, b, w;
    for (a = 0; a <= len; a++)
        for (b = a; b <= len; b++) {
            captured c;
            colibri_text_sink sink;
            memset(&c, 0, sizeof c);
            colibri_text_sink_init(&sink, capture, &c);
            colibri_text_put(&sink, text, a);
            colibri_text_put(&sink, text + a, b - a);
            colibri_text_put(&sink, text + b, len - b);
            colibri_text_flush(&sink);
            if (c.len != len || memcmp(c.bytes, text, len) != 0) {
                fprintf(stderr, "text sink: cut at %zu, %zu: %zu bytes out of %zu, or others\n", a, b, c.len, len);
                return 1;
            }
            for (w = 0; valid && w < c.n_writes; w++)
                if (!boundary(text, len, c.ends[w])) {
                    fprintf(stderr, "text sink: cut at %zu, %zu: a write ends inside a character, at %zu\n", a, b, c.ends[w]);
                    return 1;
                }
        }
    return 0;
}

/* The reference: how many bytes of `text` come before the first stop string to be completed (the
 * longest of those the same byte completes); len when none is. */
static size_t reference_cut(const uint8_t *text, size_t len, const char *const *stops, int n_stops)
{
    size_t end, best;
    int i;
    for (end = 1; end <= len; end++) {
        for (best = 0, i = 0; i < n_stops; i++) {
            size_t k = strlen(stops[i]);
            if (k <= end && k > best && memcmp(text + end - k, stops[i], k) == 0) best = k;
        }
        if (best) return end - best;
    }
    return len;
}

/* `text` cut at a and b into three tokens' bytes through a text stream with stop strings: the
 * reference's bytes come out, and the stream says a stop string was found exactly when one was. */
static int stop_test(const uint8_t *text, size_t len, const char *const *stops, int n_stops)
{
    size_t a, b, want = reference_cut(text, len, stops, n_stops);
    for (a = 0; a <= len; a++)
        for (b = a; b <= len; b++) {
            captured c;
            colibri_text_stream ts;
            colibri_error err;
            int found;
            memset(&c, 0, sizeof c);
            if (check(colibri_text_stream_init(&ts, stops, n_stops, capture, &c, &err), &err, "text stream")) return 1;
            found = colibri_text_stream_put(&ts, text, a);
            found = found || colibri_text_stream_put(&ts, text + a, b - a);
            found = found || colibri_text_stream_put(&ts, text + b, len - b);
            colibri_text_stream_finish(&ts);
            if (c.len != want || memcmp(c.bytes, text, want) != 0 || found != (want < len) || (ts.matched >= 0) != found) {
                fprintf(stderr, "text stream: cut at %zu, %zu: %zu bytes out, the reference %zu\n", a, b, c.len, want);
                return 1;
            }
        }
    return 0;
}

static int text_tests(void)
{
    /* 1-, 2-, 3- and 4-byte characters: "a é € 𝄞 b" */
    static const uint8_t mixed[] = { 'a', 0xC3, 0xA9, ' ', 0xE2, 0x82, 0xAC, ' ', 0xF0, 0x9D, 0x84, 0x9E, 'b', 0xE2, 0x82, 0xAC };
    /* a stray continuation byte, a character cut short and left unfinished at the end */
    static const uint8_t broken[] = { 'x', 0x80, 0xE2, 0x82, 'y', 0xF0, 0x9D, 0x84 };
    /* a prefix of "aab" twice before it, two stops the same byte completes, one inside a character */
    static const char text[] = "xaaxaaab\xE2\x82\xAC" "cd";
    static const char *const overlapping[] = { "aab", "zz" }, *const together[] = { "ab", "aab" },
                             *const inside[] = { "\x82\xAC" }, *const none[] = { "aaa", "d!" };
    int fails = sink_test(mixed, sizeof mixed, 1) + sink_test(broken, sizeof broken, 0);
    fails += stop_test((const uint8_t *)text, strlen(text), overlapping, 2) +
             stop_test((const uint8_t *)text, strlen(text), together, 2) +
             stop_test((const uint8_t *)text, strlen(text), inside, 1) +
             stop_test((const uint8_t *)text, strlen(text), none, 2);
    if (!fails) printf("text sink: every cut of %zu + %zu bytes; text stream: every cut against 4 sets of stops\n",
                       sizeof mixed, sizeof broken);
    return fails;
}

int main(int argc, char **argv)
{
    colibri_model *model;
    colibri_error err;
    int fails;
    if (argc != 2) { fprintf(stderr, "usage: test_generate MODEL_DIR\n"); return 2; }
    if (check(load_model_files(argv[1], 0, &model, &err), &err, "load")) return 1;
    fails = generation_tests(model) + text_tests();
    colibri_model_close(model);
    free_model_files();
    return fails ? 1 : 0;
}
