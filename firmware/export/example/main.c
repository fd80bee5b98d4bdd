/* SPDX-License-Identifier: MIT */
/* A firmware's whole use of colibri: the model loaded from memory (flash), a session in a
 * static arena of the size colibri_plan.h planned, the prompt encoded with the model's own
 * encoder, then forward and sample until max tokens or EOS.  It prints what `colibri generate
 * --temperature 0` prints on the host.  No heap, no file system; text goes out through the
 * port (port/colibri_port.h).
 *   -DCOLIBRI_EXAMPLE_PROMPT='"ROMEO:"' -DCOLIBRI_EXAMPLE_TOKENS=20 -DCOLIBRI_EXAMPLE_VERBOSE */
#include <string.h>

#include "colibri/colibri.h"
#include "colibri_plan.h"
#include "colibri_port.h"

#ifndef COLIBRI_EXAMPLE_PROMPT
#define COLIBRI_EXAMPLE_PROMPT "ROMEO:"
#endif
#ifndef COLIBRI_EXAMPLE_TOKENS
#define COLIBRI_EXAMPLE_TOKENS 20
#endif
#define MAX_PROMPT 256

static unsigned char ram[COLIBRI_PLAN_RAM_BYTES] COLIBRI_ALIGN64;   /* metadata, then the session arena */
static int32_t prompt[MAX_PROMPT];

static void say(const char *text) { colibri_port_write(text, strlen(text)); }

static void port_write(void *context, const char *bytes, size_t len)
{
    (void)context;
    colibri_port_write(bytes, len);
}

static int failed(const char *step, const colibri_error *err)
{
    say("\ncolibri: ");
    say(step);
    say(" failed: ");
    say(err->message);
    say("\n");
    return 1;
}

#ifdef COLIBRI_EXAMPLE_VERBOSE
static void say_number(uint64_t n)
{
    char digits[21];
    size_t i = sizeof digits;
    do digits[--i] = (char)('0' + n % 10); while ((n /= 10) != 0);
    colibri_port_write(digits + i, sizeof digits - i);
}
#endif

int main(void)
{
    const char *text = COLIBRI_EXAMPLE_PROMPT;
    colibri_model *model;
    colibri_session *session;
    colibri_session_options so;
    colibri_generate_options options;
    colibri_generation g;
    colibri_text_sink out;
    colibri_error err;
    uint64_t t0;
    size_t n_prompt;
    int32_t token;

    if (!colibri_plan_matches(colibri_model_json, COLIBRI_PLAN_JSON_BYTES)) {
        say("colibri: the linked model is not the one colibri_plan.h was planned for (" COLIBRI_PLAN_MODEL ")\n");
        return 1;
    }
    if (colibri_model_load(colibri_model_json, COLIBRI_PLAN_JSON_BYTES, colibri_model_weights,
                           COLIBRI_PLAN_WEIGHTS_BYTES, 0, ram, COLIBRI_PLAN_META_BYTES, &model, &err))
        return failed("load", &err);
    memset(&so, 0, sizeof so);
    so.n_ctx = COLIBRI_PLAN_N_CTX;
    so.n_batch = COLIBRI_PLAN_N_BATCH;
    so.kv_type = COLIBRI_PLAN_KV_TYPE;
    so.arena = ram + COLIBRI_PLAN_META_BYTES;
    so.arena_size = COLIBRI_PLAN_ARENA_BYTES;
    if (colibri_session_create(model, &so, &session, &err)) return failed("session", &err);
    if (colibri_tokenize(model, text, strlen(text), prompt, MAX_PROMPT, &n_prompt, &err))
        return failed("tokenize", &err);

    colibri_text_sink_init(&out, port_write, NULL);
    colibri_text_put(&out, (const uint8_t *)text, strlen(text));
    memset(&options, 0, sizeof options);   /* temperature 0: greedy */
    options.max_tokens = COLIBRI_EXAMPLE_TOKENS;
    options.sampling.top_p = 1.0f;
    options.stop_at_eos = 1;
    t0 = colibri_port_ticks();
    if (colibri_generate_start(&g, session, &options, prompt, n_prompt, &err)) return failed("prefill", &err);
    do {
        if (colibri_generate_next(&g, &token, &err)) return failed("decode", &err);
        if (token >= 0 && g.stop != COLIBRI_STOP_EOS) colibri_text_put_token(&out, model, token);   /* an end id: no text */
    } while (token >= 0);
    colibri_text_flush(&out);
    say("\n");
#ifdef COLIBRI_EXAMPLE_VERBOSE
    say("[");
    say_number((uint64_t)n_prompt);
    say(" prompt tokens, ");
    say_number((uint64_t)g.generated);
    say(" generated in ");
    say_number((colibri_port_ticks() - t0) * 1000u / colibri_port_ticks_per_second());
    say(" ms]\n");
#else
    (void)t0;
#endif
    colibri_session_destroy(session);
    colibri_model_close(model);
    return 0;
}
