/* SPDX-License-Identifier: MIT */
/* Sampling from the last logits: logit bias, repetition, presence and frequency penalties,
 * greedy, temperature, top-k, top-p, min-p (in that order: colibri.h), with a caller-held RNG
 * state so that a seed reproduces the same tokens on every platform. */
#include <math.h>
#include <string.h>

#include "sample.h"
#include "../ops/ops.h"
#include "../util.h"

/* splitmix64: a full-period 64-bit generator, integer-only so every platform agrees. */
static uint64_t next_u64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* A uniform float in [0, 1) with 24 random bits. */
static float next_unit(uint64_t *state) { return (float)(next_u64(state) >> 40) * (1.0f / 16777216.0f); }

/* Candidate order: higher probability first, lower id on ties. */
static int before(const float *p, int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); }

/* Heap on ids whose root is the candidate that comes last in order (worst_on_top) or first. */
static void sift_down(const float *p, int32_t *ids, int32_t root, int32_t n, int worst_on_top)
{
    for (;;) {
        int32_t child = 2 * root + 1, tmp;
        if (child >= n) return;
        if (child + 1 < n && before(p, ids[child], ids[child + 1]) == worst_on_top) child++;
        if (before(p, ids[root], ids[child]) != worst_on_top) return;
        tmp = ids[root]; ids[root] = ids[child]; ids[child] = tmp;
        root = child;
    }
}

/* Sorts ids[0..n) into candidate order: heap sort, in place, no allocation. */
static void sort_candidates(const float *p, int32_t *ids, int32_t n)
{
    int32_t i;
    for (i = n / 2; i-- > 0;) sift_down(p, ids, i, n, 1);
    for (i = n - 1; i > 0; i--) {
        int32_t tmp = ids[0]; ids[0] = ids[i]; ids[i] = tmp;
        sift_down(p, ids, 0, i, 1);
    }
}

/* The nucleus of ids[0..n): the fewest first candidates (in candidate order) whose p reach `mass`,
 * all when none do.  Taken one by one off a heap whose root is the best, so only the nucleus is
 * ordered, not all n.  Returns where it starts in ids (it ends at n), in candidate order. */
static int32_t nucleus(const float *p, int32_t *ids, int32_t n, float mass)
{
    int32_t i, end = n, lo, hi;
    float acc = 0.0f;
    for (i = n / 2; i-- > 0;) sift_down(p, ids, i, n, 0);
    while (end > 0) {   /* the best left goes to ids[end - 1] */
        int32_t tmp = ids[0]; ids[0] = ids[end - 1]; ids[end - 1] = tmp;
        sift_down(p, ids, 0, --end, 0);
        acc += p[ids[end]];
        if (acc >= mass) break;
    }
    for (lo = end, hi = n - 1; lo < hi; lo++, hi--) { int32_t tmp = ids[lo]; ids[lo] = ids[hi]; ids[hi] = tmp; }
    return end;
}

/* ids[0..n) drawn by weight p (not normalised), walking them in the order given. */
static int32_t draw(const float *p, const int32_t *ids, int32_t n, uint64_t *rng)
{
    float sum = 0.0f, r, acc = 0.0f;
    int32_t i;
    for (i = 0; i < n; i++) sum += p[ids[i]];
    r = next_unit(rng) * sum;
    for (i = 0; i < n; i++) {
        acc += p[ids[i]];
        if (r < acc) return ids[i];
    }
    return ids[n - 1];   /* rounding left r at the very end */
}

/* The bias and the penalties change the logits: off, the session's logits are sampled as they are. */
static int adjusts(const colibri_sampling *params, int32_t n_window)
{
    int penalised = n_window > 0 && ((params->repeat_penalty != 0.0f && params->repeat_penalty != 1.0f) ||
                                     params->presence_penalty != 0.0f || params->frequency_penalty != 0.0f);
    return penalised || params->n_logit_bias > 0;
}

/* adjusted (V) <- logits with the bias added, then each distinct token of window (n) penalised
 * once: repetition (a positive logit divided, a negative one multiplied), then presence and
 * frequency by its count there.  counts (V) is scratch: only the window's entries are touched. */
static void adjust_logits(const float *logits, int32_t V, float *adjusted, int32_t *counts,
                          const colibri_sampling *params, const int32_t *window, int32_t n)
{
    float repeat = params->repeat_penalty == 0.0f ? 1.0f : params->repeat_penalty;
    int32_t i;
    memcpy(adjusted, logits, (size_t)V * sizeof *adjusted);
    for (i = 0; i < params->n_logit_bias; i++) adjusted[params->logit_bias[i].token] += params->logit_bias[i].bias;
    for (i = 0; i < n; i++) counts[window[i]] = 0;
    for (i = 0; i < n; i++) counts[window[i]]++;
    for (i = 0; i < n; i++) {
        int32_t t = window[i];
        float l = adjusted[t];
        if (counts[t] == 0) continue;   /* penalised already */
        l = l > 0.0f ? l / repeat : l * repeat;
        adjusted[t] = l - params->presence_penalty - params->frequency_penalty * (float)counts[t];
        counts[t] = 0;
    }
}

/* What a caller passed that no step can take: NaN, a negative top_p or repeat_penalty, min_p
 * outside [0, 1], a window below -1, a bias on a token outside the vocabulary or not a number. */
static colibri_status check_params(const colibri_sampling *params, int32_t V, const int32_t *recent, int32_t n_recent,
                                   colibri_error *err)
{
    int32_t i;
    if (!(params->temperature == params->temperature) || !(params->top_p >= 0.0f))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_sample: temperature must not be NaN, top_p must be >= 0");
    if (!(params->min_p >= 0.0f && params->min_p <= 1.0f))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_sample: min_p must be in [0, 1]");
    if (!(params->repeat_penalty >= 0.0f) || !isfinite(params->repeat_penalty) ||
        !isfinite(params->presence_penalty) || !isfinite(params->frequency_penalty))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_sample: repeat_penalty must be finite and >= 0, "
                            "presence_penalty and frequency_penalty finite");
    if (params->penalty_last_n < -1 || n_recent < 0 || (n_recent > 0 && !recent))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_sample: penalty_last_n must be >= -1, n_recent >= 0 "
                            "with as many recent tokens");
    if (params->n_logit_bias < 0 || (params->n_logit_bias > 0 && !params->logit_bias))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_sample: n_logit_bias = %d without as many pairs",
                            params->n_logit_bias);
    for (i = 0; i < params->n_logit_bias; i++) {
        const colibri_logit_bias *b = &params->logit_bias[i];
        if (b->token < 0 || b->token >= V)
            return colibri_fail(err, COLIBRI_E_ARG, "logit_bias[%d]: token %d is outside the vocabulary [0, %d)",
                                i, b->token, V);
        if (!(b->bias < INFINITY))
            return colibri_fail(err, COLIBRI_E_ARG, "logit_bias[%d]: the bias of token %d is NaN or +inf", i, b->token);
    }
    return COLIBRI_OK;
}

/* Temperature alone: one pass of exp and the sum, then the walk in id order; nothing is sorted. */
colibri_status colibri_sample_logits(const float *logits, int32_t V, float *p, int32_t *ids,
                                     const colibri_sampling *params, const int32_t *recent, int32_t n_recent,
                                     uint64_t *rng, int32_t *token, colibri_error *err)
{
    int32_t i, n, from = 0, best = 0, n_window;
    float max, sum = 0.0f, cut, base;
    colibri_status st;

    if ((st = check_params(params, V, recent, n_recent, err)) != COLIBRI_OK) return st;
    for (i = 0; i < V; i++) {
        if (!isfinite(logits[i]))   /* e.g. NaN weights loaded without validation */
            return colibri_fail(err, COLIBRI_E_VALUE, "logit of token %d is not finite", i);
        if (logits[i] > logits[best]) best = i;
    }
    n_window = params->penalty_last_n < 0 || params->penalty_last_n > n_recent ? n_recent : params->penalty_last_n;
    for (i = n_recent - n_window; i < n_recent; i++)
        if (recent[i] < 0 || recent[i] >= V)
            return colibri_fail(err, COLIBRI_E_ARG, "recent token %d is outside the vocabulary [0, %d)", recent[i], V);
    if (adjusts(params, n_window)) {
        /* the adjusted logits live in p: the steps below turn them into weights in place */
        adjust_logits(logits, V, p, ids, params, recent + (n_recent - n_window), n_window);
        logits = p;
        for (i = best = 0; i < V; i++) if (logits[i] > logits[best]) best = i;
        if (logits[best] == -INFINITY) return colibri_fail(err, COLIBRI_E_VALUE, "logit_bias bans every token");
    }
    if (params->temperature <= 0.0f || params->top_k == 1 || params->top_p == 0.0f) { *token = best; return COLIBRI_OK; }

    /* weights at this temperature, exp(l - max) */
    max = logits[best];
    for (i = 0; i < V; i++) { p[i] = colibri_expf((logits[i] - max) / params->temperature); sum += p[i]; }
    if ((params->top_k <= 0 || params->top_k >= V) && params->top_p >= 1.0f && params->min_p == 0.0f) {
        float r = next_unit(rng) * sum, acc = 0.0f;
        for (i = 0; i < V; i++) {
            acc += p[i];
            if (r < acc) { *token = i; return COLIBRI_OK; }
        }
        *token = V - 1;   /* rounding left r at the very end */
        return COLIBRI_OK;
    }
    for (i = 0; i < V; i++) p[i] /= sum;   /* probabilities: top-p compares their mass with top_p */

    if (params->top_k > 0 && params->top_k < V) {
        /* exactly the k most likely: a heap of k whose root is the worst kept so far, then in order */
        n = params->top_k;
        for (i = 0; i < n; i++) ids[i] = i;
        for (i = n / 2; i-- > 0;) sift_down(p, ids, i, n, 1);
        for (i = n; i < V; i++) {
            if (before(p, i, ids[0])) { ids[0] = i; sift_down(p, ids, 0, n, 1); }
        }
        base = 0.0f;
        for (i = 0; i < n; i++) base += p[ids[i]];
        sort_candidates(p, ids, n);
        if (params->top_p < 1.0f) from = nucleus(p, ids, n, params->top_p * base);   /* renormalised, as transformers does */
    } else if (params->top_p < 1.0f) {
        /* top_p < 1: a token below (1 - top_p) / (V - 1) can never be in the nucleus (llama2.c's
         * observation), which keeps the heap small */
        cut = V > 1 ? (1.0f - params->top_p) / (float)(V - 1) : 0.0f;
        if (cut > p[best]) cut = p[best];   /* the most likely token always stays */
        n = 0;
        for (i = 0; i < V; i++) if (p[i] >= cut) ids[n++] = i;
        from = nucleus(p, ids, n, params->top_p);
    } else {
        n = 0;   /* min-p alone: every token, in id order (min-p keeps any order's members) */
        for (i = 0; i < V; i++) ids[n++] = i;
    }
    if (params->min_p > 0.0f) {
        /* min-p: the candidates at least min_p times the most likely, which is always one of them */
        int32_t kept = from;
        cut = params->min_p * p[best];
        for (i = from; i < n; i++) if (p[ids[i]] >= cut) ids[kept++] = ids[i];
        n = kept;
    }
    *token = draw(p, ids + from, n - from, rng);
    return COLIBRI_OK;
}
