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

/* Heap on ids whose root is the candidate that comes last in order. */
static void sift_down(const float *p, int32_t *ids, int32_t root, int32_t n)
{
    for (;;) {
        int32_t child = 2 * root + 1, tmp;
        if (child >= n) return;
        if (child + 1 < n && before(p, ids[child], ids[child + 1])) child++;
        if (!before(p, ids[root], ids[child])) return;
        tmp = ids[root]; ids[root] = ids[child]; ids[child] = tmp;
        root = child;
    }
}

/* Sorts ids[0..n) into candidate order: heap sort, in place, no allocation. */
static void sort_candidates(const float *p, int32_t *ids, int32_t n)
{
    int32_t i;
    for (i = n / 2; i-- > 0;) sift_down(p, ids, i, n);
    for (i = n - 1; i > 0; i--) {
        int32_t tmp = ids[0]; ids[0] = ids[i]; ids[i] = tmp;
        sift_down(p, ids, 0, i);
    }
}

colibri_status colibri_sample_logits(const float *logits, int32_t V, float *p, int32_t *ids,
                                     const colibri_sampling *params, uint64_t *rng, int32_t *token, colibri_error *err)
{
    int32_t i, n, best = 0;
    float max, sum = 0.0f, cut, acc, base;

    if (!(params->temperature == params->temperature) || !(params->top_p >= 0.0f))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_sample: temperature must not be NaN, top_p must be >= 0");
    for (i = 0; i < V; i++) {
        if (!isfinite(logits[i]))   /* e.g. NaN weights loaded without validation */
            return colibri_fail(err, COLIBRI_E_VALUE, "logit of token %d is not finite", i);
        if (logits[i] > logits[best]) best = i;
    }
    if (params->temperature <= 0.0f || params->top_k == 1 || params->top_p == 0.0f) { *token = best; return COLIBRI_OK; }

    /* probabilities at this temperature */
    max = logits[best];
    for (i = 0; i < V; i++) { p[i] = colibri_expf((logits[i] - max) / params->temperature); sum += p[i]; }
    for (i = 0; i < V; i++) p[i] /= sum;

    if (params->top_k > 0 && params->top_k < V) {
        /* exactly the k most likely: a heap of k whose root is the worst kept so far */
        n = params->top_k;
        for (i = 0; i < n; i++) ids[i] = i;
        for (i = n / 2; i-- > 0;) sift_down(p, ids, i, n);
        for (i = n; i < V; i++) {
            if (before(p, i, ids[0])) { ids[0] = i; sift_down(p, ids, 0, n); }
        }
        base = 0.0f;
        for (i = 0; i < n; i++) base += p[ids[i]];
    } else {
        /* With top_p < 1, a token below (1 - top_p) / (V - 1) can never be in the nucleus
         * (llama2.c's observation), which keeps the sort short. */
        cut = params->top_p < 1.0f && V > 1 ? (1.0f - params->top_p) / (float)(V - 1) : 0.0f;
        if (cut > p[best]) cut = p[best];   /* the most likely token always stays */
        n = 0;
        for (i = 0; i < V; i++) if (p[i] >= cut) ids[n++] = i;
        base = 1.0f;
    }
    sort_candidates(p, ids, n);
    if (params->top_p < 1.0f) {   /* the nucleus of the kept tokens, renormalised (as transformers does) */
        float mass = 0.0f;
        for (i = 0; i < n; i++) {
            mass += p[ids[i]];
            if (mass >= params->top_p * base) { n = i + 1; break; }
        }
    }
    sum = 0.0f;
    for (i = 0; i < n; i++) sum += p[ids[i]];
    {
        float r = next_unit(rng) * sum;
        acc = 0.0f;
        for (i = 0; i < n; i++) {
            acc += p[ids[i]];
            if (r < acc) { *token = ids[i]; return COLIBRI_OK; }
        }
    }
    *token = ids[n - 1];   /* rounding left r at the very end */
    return COLIBRI_OK;
}
