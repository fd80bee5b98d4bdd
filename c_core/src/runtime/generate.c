/* SPDX-License-Identifier: MIT */
/* Generation, one token at a time: the one step-and-stop loop colibri-infer, the firmware app,
 * the export example and Session.stream drive, and the one writer of streamed text that never
 * splits a UTF-8 character.  Caller-owned state, no allocation, no callbacks in the loop. */
#include <string.h>

#include "colibri/colibri.h"
#include "session.h"
#include "../util.h"

/* The penalties' window: the latest COLIBRI_PENALTY_WINDOW tokens of the sequence, oldest first. */
static void remember(colibri_generation *g, const int32_t *tokens, size_t n)
{
    size_t keep = n < COLIBRI_PENALTY_WINDOW ? n : COLIBRI_PENALTY_WINDOW;
    size_t drop = (size_t)g->n_recent + keep > COLIBRI_PENALTY_WINDOW ? (size_t)g->n_recent + keep - COLIBRI_PENALTY_WINDOW : 0;
    if (keep == 0) return;
    memmove(g->recent, g->recent + drop, ((size_t)g->n_recent - drop) * sizeof *g->recent);
    memcpy(g->recent + (g->n_recent - (int32_t)drop), tokens + (n - keep), keep * sizeof *tokens);
    g->n_recent += (int32_t)keep - (int32_t)drop;
}

colibri_status colibri_generate_start(colibri_generation *g, colibri_session *session,
                                      const colibri_generate_options *options, const int32_t *prompt,
                                      size_t n_prompt, colibri_error *err)
{
    colibri_status st;
    if (!g || !session || !options || (n_prompt && !prompt))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_generate_start: NULL argument");
    memset(g, 0, sizeof *g);
    g->session = session;
    g->options = *options;
    g->rng = options->seed;
    g->n_eos_token_ids = session->model->hp.n_eos_token_ids;
    memcpy(g->eos_token_ids, session->model->hp.eos_token_ids, sizeof g->eos_token_ids);
    remember(g, prompt, n_prompt);
    g->last = -1;
    if (n_prompt && (st = colibri_forward(session, prompt, n_prompt, NULL, err)) != COLIBRI_OK) {
        g->stop = COLIBRI_STOP_ERROR;
        return st;
    }
    /* the prompt is prefilled even when no token is asked for (its KV cache is the caller's) */
    if (options->max_tokens <= 0) g->stop = COLIBRI_STOP_MAX_TOKENS;
    return COLIBRI_OK;
}

/* Why the generation ends with the token just sampled, if it does: one of the model's end ids
 * first (it chose to stop), then the count, then a context with no room to feed the token back. */
static colibri_stop stop_after(const colibri_generation *g, int32_t token)
{
    int32_t i;
    for (i = 0; g->options.stop_at_eos && i < g->n_eos_token_ids; i++)
        if (token == g->eos_token_ids[i]) return COLIBRI_STOP_EOS;
    if (g->generated >= g->options.max_tokens) return COLIBRI_STOP_MAX_TOKENS;
    if (colibri_session_position(g->session) >= colibri_session_n_ctx(g->session)) return COLIBRI_STOP_CONTEXT_FULL;
    return COLIBRI_STOP_NONE;
}

colibri_status colibri_generate_next(colibri_generation *g, int32_t *token, colibri_error *err)
{
    colibri_status st;
    if (!g || !g->session || !token) return colibri_fail(err, COLIBRI_E_ARG, "colibri_generate_next: NULL argument");
    *token = -1;
    if (g->stop != COLIBRI_STOP_NONE) return COLIBRI_OK;
    /* the first token comes from the prompt's logits; each later one from feeding the last back */
    st = g->generated == 0 ? COLIBRI_OK : colibri_forward(g->session, &g->last, 1, NULL, err);
    if (st == COLIBRI_OK)
        st = colibri_sample_after(g->session, &g->options.sampling, g->recent, g->n_recent, &g->rng, &g->last, err);
    if (st == COLIBRI_OK) remember(g, &g->last, 1);
    if (st != COLIBRI_OK) {
        g->stop = COLIBRI_STOP_ERROR;
        return st;
    }
    g->generated++;
    g->stop = stop_after(g, g->last);
    *token = g->last;
    return COLIBRI_OK;
}

void colibri_text_sink_init(colibri_text_sink *sink, colibri_write_fn write, void *context)
{
    memset(sink, 0, sizeof *sink);
    sink->write = write;
    sink->context = context;
}

/* Bytes go out as they come, but an unfinished UTF-8 character (at most 3 bytes) waits in `held`
 * for the bytes that complete it, so no write splits a character. */
void colibri_text_put(colibri_text_sink *sink, const uint8_t *bytes, size_t len)
{
    while (len > 0) {
        size_t room = sizeof sink->held - sink->n_held, take = len < room ? len : room, whole;
        memcpy(sink->held + sink->n_held, bytes, take);
        sink->n_held += take;
        bytes += take;
        len -= take;
        whole = colibri_utf8_whole(sink->held, sink->n_held);
        if (whole) sink->write(sink->context, (const char *)sink->held, whole);
        memmove(sink->held, sink->held + whole, sink->n_held - whole);
        sink->n_held -= whole;
    }
}

colibri_status colibri_text_put_token(colibri_text_sink *sink, const colibri_model *model, int32_t token)
{
    const uint8_t *bytes;
    size_t len;
    colibri_status st = colibri_token_bytes(model, token, &bytes, &len);
    if (st == COLIBRI_OK) colibri_text_put(sink, bytes, len);
    return st;
}

void colibri_text_flush(colibri_text_sink *sink)
{
    if (sink->n_held) sink->write(sink->context, (const char *)sink->held, sink->n_held);
    sink->n_held = 0;
}
