/* SPDX-License-Identifier: MIT */
/* Sampling from the last logits: greedy, temperature, top-k, top-p, with a caller-held
 * RNG state so that a seed reproduces the same tokens on every platform. */
#include <math.h>

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

/* Temperature alone: one pass of exp and the sum, then the walk in id order; nothing is sorted. */
colibri_status colibri_sample_logits(const float *logits, int32_t V, float *p, int32_t *ids,
                                     const colibri_sampling *params, uint64_t *rng, int32_t *token, colibri_error *err)
{
    int32_t i, n, from = 0, best = 0;
    float max, sum = 0.0f, cut, base;

    if (!(params->temperature == params->temperature) || !(params->top_p >= 0.0f))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_sample: temperature must not be NaN, top_p must be >= 0");
    for (i = 0; i < V; i++) {
        if (!isfinite(logits[i]))   /* e.g. NaN weights loaded without validation */
            return colibri_fail(err, COLIBRI_E_VALUE, "logit of token %d is not finite", i);
        if (logits[i] > logits[best]) best = i;
    }
    if (params->temperature <= 0.0f || params->top_k == 1 || params->top_p == 0.0f) { *token = best; return COLIBRI_OK; }

    /* weights at this temperature, exp(l - max) */
    max = logits[best];
    for (i = 0; i < V; i++) { p[i] = colibri_expf((logits[i] - max) / params->temperature); sum += p[i]; }
    if ((params->top_k <= 0 || params->top_k >= V) && params->top_p >= 1.0f) {
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
    } else {
        /* top_p < 1: a token below (1 - top_p) / (V - 1) can never be in the nucleus (llama2.c's
         * observation), which keeps the heap small */
        cut = V > 1 ? (1.0f - params->top_p) / (float)(V - 1) : 0.0f;
        if (cut > p[best]) cut = p[best];   /* the most likely token always stays */
        n = 0;
        for (i = 0; i < V; i++) if (p[i] >= cut) ids[n++] = i;
        from = nucleus(p, ids, n, params->top_p);
    }
    *token = draw(p, ids + from, n - from, rng);
    return COLIBRI_OK;
}
