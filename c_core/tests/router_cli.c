/* SPDX-License-Identifier: MIT */
/* The top-k router on logits from stdin, for tests/test_router_modes.py to compare with numpy.
 *
 *   stdin   E K score weights groups topk_groups group_score normalize normalize_eps scale has_bias n
 *           then the selection bias (E numbers) when has_bias, then the logits (n x E numbers)
 *   stdout  per token one line: its K ids, then its K gates (%.9g, so floats round-trip)
 *
 *   router_cli < case.txt   (exit 1: the input could not be read) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/moe/moe.h"

/* Tokens through strtod rather than scanf's %f: small libcs may leave float scanf out. */
static int read_number(double *x)
{
    char word[64], *end;
    if (scanf("%63s", word) != 1) return 0;
    *x = strtod(word, &end);
    return *end == '\0';
}

static int read_floats(float *v, size_t count)
{
    double x;
    size_t i;
    for (i = 0; i < count; i++) {
        if (!read_number(&x)) return 0;
        v[i] = (float)x;
    }
    return 1;
}

int main(void)
{
    double header[12];
    colibri_hparams hp;
    colibri_layer_weights lw;
    float *bias, *logits, *scratch, *gates;
    int32_t *ids, n, t, j;
    int i;

    for (i = 0; i < 12; i++)
        if (!read_number(&header[i])) { fprintf(stderr, "router_cli: bad header\n"); return 1; }
    memset(&hp, 0, sizeof hp);
    memset(&lw, 0, sizeof lw);
    hp.n_experts = (int32_t)header[0];
    hp.top_k = (int32_t)header[1];
    hp.router_score = (int32_t)header[2];
    hp.router_weights = (int32_t)header[3];
    hp.n_groups = (int32_t)header[4];
    hp.topk_groups = (int32_t)header[5];
    hp.group_score = (int32_t)header[6];
    hp.normalize_topk = (int32_t)header[7];
    hp.normalize_eps = (float)header[8];
    hp.routed_scale = (float)header[9];
    hp.router_selection_bias = (int32_t)header[10];
    n = (int32_t)header[11];

    bias = malloc((size_t)hp.n_experts * sizeof *bias);
    logits = malloc((size_t)n * hp.n_experts * sizeof *logits);
    scratch = malloc((size_t)(hp.n_experts + hp.n_groups) * sizeof *scratch);
    ids = malloc((size_t)n * hp.top_k * sizeof *ids);
    gates = malloc((size_t)n * hp.top_k * sizeof *gates);
    if (!bias || !logits || !scratch || !ids || !gates) { fprintf(stderr, "router_cli: out of memory\n"); return 1; }
    if ((hp.router_selection_bias && !read_floats(bias, (size_t)hp.n_experts))
        || !read_floats(logits, (size_t)n * hp.n_experts)) {
        fprintf(stderr, "router_cli: bad bias or logits\n");
        return 1;
    }
    lw.w[L_SELECTION_BIAS].data = hp.router_selection_bias ? bias : NULL;
    lw.w[L_SELECTION_BIAS].dtype = COLIBRI_DTYPE_F32;
    lw.moe = 1;

    colibri_router_run(&colibri_router_topk, &hp, &lw, NULL, logits, n, scratch, ids, gates);
    for (t = 0; t < n; t++) {
        for (j = 0; j < hp.top_k; j++) printf("%d ", (int)ids[(size_t)t * hp.top_k + j]);
        for (j = 0; j < hp.top_k; j++) printf(j + 1 < hp.top_k ? "%.9g " : "%.9g\n", (double)gates[(size_t)t * hp.top_k + j]);
    }
    free(bias); free(logits); free(scratch); free(ids); free(gates);
    return 0;
}
