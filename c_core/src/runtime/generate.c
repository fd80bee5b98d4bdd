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

/* g readied on slot seq: options, the sampler's state, the penalties' window from the prompt. */
static void ready(colibri_generation *g, colibri_session *s, int32_t seq, const colibri_generate_options *options,
                  const int32_t *prompt, size_t n_prompt)
{
    memset(g, 0, sizeof *g);
    g->session = s;
    g->seq = seq;
    g->prompt = prompt;
    g->n_prompt = (int32_t)n_prompt;
    g->options = *options;
    g->rng = options->seed;
    g->n_eos_token_ids = s->model->hp.n_eos_token_ids;
    memcpy(g->eos_token_ids, s->model->hp.eos_token_ids, sizeof g->eos_token_ids);
    remember(g, prompt, n_prompt);
    g->last = -1;
}

colibri_status colibri_generate_start(colibri_generation *g, colibri_session *session,
                                      const colibri_generate_options *options, const int32_t *prompt,
                                      size_t n_prompt, colibri_error *err)
{
    colibri_status st;
    if (!g || !session || !options || (n_prompt && !prompt))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_generate_start: NULL argument");
    ready(g, session, 0, options, prompt, n_prompt);
    if ((n_prompt || session->seq[0].pending >= 0) && (st = colibri_forward(session, prompt, n_prompt, NULL, err)) != COLIBRI_OK) {
        g->stop = COLIBRI_STOP_ERROR;
        return st;
    }
    g->prompt_done = g->n_prompt;
    /* the prompt is prefilled even when no token is asked for (its KV cache is the caller's) */
    if (options->max_tokens <= 0) g->stop = COLIBRI_STOP_MAX_TOKENS;
    return COLIBRI_OK;
}

colibri_status colibri_generate_begin(colibri_generation *g, colibri_session *s, int32_t seq,
                                      const colibri_generate_options *options, const int32_t *prompt,
                                      size_t n_prompt, colibri_error *err)
{
    const colibri_seq *q;
    const int32_t *held;
    if (!g || !s || !options || (n_prompt && !prompt))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_generate_begin: NULL argument");
    if (seq < 0 || seq >= s->n_seq)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_generate_begin: sequence %d outside [0, %d)", seq, s->n_seq);
    if (n_prompt > (size_t)s->n_ctx)
        return colibri_fail(err, COLIBRI_E_CONTEXT, "a prompt of %zu tokens does not fit a context of %d positions",
                            n_prompt, s->n_ctx);
    q = &s->seq[seq];
    held = s->tokens + (size_t)seq * s->n_ctx;
    if (q->pending >= 0 || (size_t)q->position > n_prompt ||
        (q->position && memcmp(held, prompt, (size_t)q->position * sizeof *held) != 0))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_generate_begin: sequence %d holds %d tokens%s that are not the "
                            "prompt's first ones (reset it, or truncate it to what it shares with the prompt)", seq,
                            q->position, q->pending >= 0 ? " and a pending one" : "");
    ready(g, s, seq, options, prompt, n_prompt);
    g->prompt_done = q->position;   /* the slot's tokens are the prompt's first ones: computed already */
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
    if (g->session->seq[g->seq].position >= g->session->n_ctx) return COLIBRI_STOP_CONTEXT_FULL;
    return COLIBRI_STOP_NONE;
}

/* The last token's bytes to the generation's text (not an end id's: the end of a turn is no text);
 * a completed stop string ends the generation. */
static void take_text(colibri_generation *g)
{
    const uint8_t *bytes;
    size_t len;
    if (g->stop != COLIBRI_STOP_EOS && colibri_token_bytes(g->session->model, g->last, &bytes, &len) == COLIBRI_OK &&
        colibri_text_stream_put(g->text, bytes, len))
        g->stop = COLIBRI_STOP_STRING;
    if (g->stop != COLIBRI_STOP_NONE) colibri_text_stream_finish(g->text);
}

/* The next token from the slot's logits; it is left pending on the slot. */
static colibri_status sample_next(colibri_generation *g, colibri_error *err)
{
    colibri_status st = colibri_seq_sample(g->session, g->seq, &g->options.sampling, g->recent, g->n_recent, &g->rng,
                                           &g->last, err);
    if (st != COLIBRI_OK) {
        g->stop = COLIBRI_STOP_ERROR;
        return st;
    }
    remember(g, &g->last, 1);
    g->generated++;
    g->fresh = 1;
    g->session->seq[g->seq].pending = g->last;
    g->stop = stop_after(g, g->last);
    if (g->text) take_text(g);
    return COLIBRI_OK;
}

/* What a running generation does this step: feed its last token back (decode), feed prompt tokens
 * (prefill; the slot's pending token, if any, goes first), or only sample (its prompt was fed). */
enum { ROLE_DECODE, ROLE_PREFILL, ROLE_SAMPLE };

static int role(const colibri_generation *g)
{
    if (g->generated > 0) return ROLE_DECODE;
    if (g->prompt_done < g->n_prompt || g->session->seq[g->seq].pending >= 0) return ROLE_PREFILL;
    return ROLE_SAMPLE;
}

colibri_status colibri_generate_step(colibri_session *s, colibri_generation *const *gens, int32_t n_gens,
                                     colibri_error *err)
{
    colibri_batch_entry *entries;
    int32_t i, n_entries = 0, budget, pass;
    colibri_status st = COLIBRI_OK, first = COLIBRI_OK;
    if (!s || (n_gens && !gens) || n_gens < 0)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_generate_step: NULL argument or a negative count");
    if (n_gens > s->n_seq)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_generate_step: %d generations for %d sequence slots", n_gens,
                            s->n_seq);
    entries = s->entries;
    budget = s->n_batch;
    for (i = 0; i < n_gens; i++) {
        if (!gens[i] || gens[i]->session != s)
            return colibri_fail(err, COLIBRI_E_ARG, "colibri_generate_step: generation %d is not this session's", i);
        gens[i]->fresh = 0;
    }
    for (pass = ROLE_DECODE; pass <= ROLE_PREFILL; pass++)   /* decode rows first, then prompt chunks in what is left */
        for (i = 0; i < n_gens; i++) {
            colibri_generation *g = gens[i];
            colibri_batch_entry *e = &entries[n_entries];
            int32_t left, pending;
            if (g->stop != COLIBRI_STOP_NONE || role(g) != pass) continue;
            pending = s->seq[g->seq].pending >= 0;
            e->seq = g->seq;
            e->tokens = NULL;
            e->n_tokens = 0;
            e->logits = 1;
            if (pass == ROLE_PREFILL) {
                left = g->n_prompt - g->prompt_done;
                e->n_tokens = left < budget - pending ? left : budget - pending;
                if (e->n_tokens < 1 && left) e->n_tokens = 1;   /* a prompt always moves on */
                e->tokens = g->prompt + g->prompt_done;
                e->logits = e->n_tokens == left;
            }
            budget -= pending + e->n_tokens;
            n_entries++;
        }
    if (n_entries && (st = colibri_forward_batch(s, entries, n_entries, err)) != COLIBRI_OK) return st;
    for (i = 0; i < n_gens; i++) {   /* the prompts fed, then every generation whose logits came out samples */
        colibri_generation *g = gens[i];
        int32_t e, fed = 0, done;
        if (g->stop != COLIBRI_STOP_NONE) continue;
        for (e = 0; e < n_entries; e++) if (entries[e].seq == g->seq) break;
        if (e < n_entries) fed = entries[e].n_tokens;
        else if (role(g) != ROLE_SAMPLE) continue;   /* waits for a later step */
        g->prompt_done += fed;
        done = g->prompt_done == g->n_prompt;
        if (!done) continue;
        if (g->generated == 0 && g->options.max_tokens <= 0) {   /* the prompt prefilled, no token asked for */
            g->stop = COLIBRI_STOP_MAX_TOKENS;
            if (g->text) colibri_text_stream_finish(g->text);
            continue;
        }
        st = sample_next(g, err);
        if (st && !first) first = st;
    }
    return first;
}

colibri_status colibri_generate_next(colibri_generation *g, int32_t *token, colibri_error *err)
{
    colibri_status st;
    if (!g || !g->session || !token) return colibri_fail(err, COLIBRI_E_ARG, "colibri_generate_next: NULL argument");
    *token = -1;
    if (g->stop != COLIBRI_STOP_NONE) return COLIBRI_OK;
    /* the first token comes from the prompt's logits; each later one from feeding the last back
     * (the slot's pending token) */
    st = colibri_generate_step(g->session, &g, 1, err);
    if (st != COLIBRI_OK) {
        g->stop = COLIBRI_STOP_ERROR;
        return st;
    }
    if (g->fresh) *token = g->last;
    return COLIBRI_OK;
}

void colibri_text_sink_init(colibri_text_sink *sink, colibri_write_fn write, void *context)
{
    memset(sink, 0, sizeof *sink);
    sink->write = write;
    sink->context = context;
}

/* Bytes go out as they come, but an unfinished UTF-8 character (at most 3 bytes) waits in `held`
 * for the bytes that complete it, so no write splits a character: a put writes the character it
 * completes, then the rest in one write. */
void colibri_text_put(colibri_text_sink *sink, const uint8_t *bytes, size_t len)
{
    size_t whole;
    while (len > 0 && sink->n_held > 0) {   /* the held character, completed (or found invalid) byte by byte */
        sink->held[sink->n_held++] = *bytes++;
        len--;
        whole = colibri_utf8_whole(sink->held, sink->n_held);
        if (whole) sink->write(sink->context, (const char *)sink->held, whole);
        memmove(sink->held, sink->held + whole, sink->n_held - whole);
        sink->n_held -= whole;
    }
    if (len == 0) return;
    whole = colibri_utf8_whole(bytes, len);
    if (whole) sink->write(sink->context, (const char *)bytes, whole);
    memcpy(sink->held, bytes + whole, len - whole);
    sink->n_held = len - whole;
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

colibri_status colibri_text_stream_init(colibri_text_stream *text, const char *const *stops, int32_t n_stops,
                                        colibri_write_fn write, void *context, colibri_error *err)
{
    int32_t i;
    if (!text || !write || (n_stops && !stops))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_text_stream_init: NULL argument");
    if (n_stops < 0 || n_stops > COLIBRI_MAX_STOPS)
        return colibri_fail(err, COLIBRI_E_ARG, "%d stop strings: at most %d", n_stops, COLIBRI_MAX_STOPS);
    memset(text, 0, sizeof *text);
    for (i = 0; i < n_stops; i++) {
        size_t len = stops[i] ? strlen(stops[i]) : 0;
        if (len == 0) return colibri_fail(err, COLIBRI_E_ARG, "stop string %d is empty", i);
        if (len > COLIBRI_STOP_MAX_BYTES)
            return colibri_fail(err, COLIBRI_E_ARG, "stop string %d is %zu bytes long: at most %d", i, len,
                                COLIBRI_STOP_MAX_BYTES);
        text->stop_len[i] = len;
    }
    colibri_text_sink_init(&text->sink, write, context);
    text->stops = stops;
    text->n_stops = n_stops;
    text->matched = -1;
    return COLIBRI_OK;
}

/* The text seen so far, from what was released: the held bytes, then the token's `bytes`.
 * Whether its `len` bytes from `from` are the first `len` of `stop`. */
static int text_matches(const colibri_text_stream *text, const uint8_t *bytes, size_t from, const char *stop, size_t len)
{
    size_t i;
    for (i = 0; i < len; i++) {
        size_t at = from + i;
        if ((at < text->n_held ? text->held[at] : bytes[at - text->n_held]) != (uint8_t)stop[i]) return 0;
    }
    return 1;
}

/* The longest stop string that the text's first `end` bytes end with, -1: none. */
static int32_t completed_stop(const colibri_text_stream *text, const uint8_t *bytes, size_t end)
{
    int32_t i, found = -1;
    for (i = 0; i < text->n_stops; i++) {
        size_t len = text->stop_len[i];
        if (len <= end && text_matches(text, bytes, end - len, text->stops[i], len) &&
            (found < 0 || len > text->stop_len[found]))
            found = i;
    }
    return found;
}

/* The longest tail of the text's first `end` bytes that begins a stop string and is shorter than it. */
static size_t open_tail(const colibri_text_stream *text, const uint8_t *bytes, size_t end)
{
    size_t tail = end < COLIBRI_STOP_MAX_BYTES ? end : COLIBRI_STOP_MAX_BYTES - 1;
    int32_t i;
    for (; tail > 0; tail--)
        for (i = 0; i < text->n_stops; i++)
            if (tail < text->stop_len[i] && text_matches(text, bytes, end - tail, text->stops[i], tail)) return tail;
    return 0;
}

/* Writes the text's bytes [0, upto) out (the held ones, then the token's) and holds [upto, upto + keep). */
static void release(colibri_text_stream *text, const uint8_t *bytes, size_t upto, size_t keep)
{
    size_t from_held = upto < text->n_held ? upto : text->n_held, k;
    uint8_t tail[COLIBRI_STOP_MAX_BYTES];
    colibri_text_put(&text->sink, text->held, from_held);
    colibri_text_put(&text->sink, bytes, upto - from_held);
    for (k = 0; k < keep; k++) {
        size_t at = upto + k;
        tail[k] = at < text->n_held ? text->held[at] : bytes[at - text->n_held];
    }
    memcpy(text->held, tail, keep);
    text->n_held = keep;
}

/* Each byte is checked for a stop string it completes, so the first one found is the first in the
 * text; what may still begin one is held (shorter than the longest: at most 63 bytes), the rest
 * written at once. */
int colibri_text_stream_put(colibri_text_stream *text, const uint8_t *bytes, size_t len)
{
    size_t i, end;
    if (text->matched >= 0) return 1;
    for (i = 0; i < len; i++) {
        end = text->n_held + i + 1;
        text->matched = completed_stop(text, bytes, end);
        if (text->matched >= 0) {   /* the text before it goes out; it, and what follows, never */
            release(text, bytes, end - text->stop_len[text->matched], 0);
            return 1;
        }
    }
    end = text->n_held + len;
    i = open_tail(text, bytes, end);
    release(text, bytes, end - i, i);
    return 0;
}

void colibri_text_stream_finish(colibri_text_stream *text)
{
    release(text, NULL, text->n_held, 0);
    colibri_text_flush(&text->sink);
}

colibri_status colibri_generate_text(colibri_generation *g, colibri_text_stream *text, colibri_error *err)
{
    const uint8_t *bytes;
    size_t len;
    if (!g || !g->session || !text) return colibri_fail(err, COLIBRI_E_ARG, "colibri_generate_text: NULL argument");
    if (colibri_token_bytes(g->session->model, 0, &bytes, &len) == COLIBRI_E_TENSOR)
        return colibri_fail(err, COLIBRI_E_TENSOR, "the model carries no vocabulary (tokenizer.token_bytes): no text to match");
    g->text = text;
    if (g->stop != COLIBRI_STOP_NONE) colibri_text_stream_finish(text);
    return COLIBRI_OK;
}
