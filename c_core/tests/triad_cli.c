/* SPDX-License-Identifier: MIT */
/* The spec-named experts and aggregators, found in the registry by name and run on numbers from
 * stdin, for tests/test_triad.py to compare with numpy.  f32 weights, the reference kernels.
 *
 *   triad_cli expert NAME < case   NAME "linear" or "mlp"
 *       stdin   dim ffn m activation has_bias, then W1 (rows, dim) with rows dim for linear, ffn
 *               for mlp; mlp: W2 (dim, ffn), with has_bias b1 (ffn) and b2 (dim); then x (m, dim)
 *       stdout  y (m, dim), one row a line
 *   triad_cli aggregate NAME < case   NAME "sparse" or "weighted_sum"
 *       stdin   n dim m, rows (m), gates (m), y (m, dim), out (n, dim)
 *       stdout  out (n, dim) after the aggregator, one row a line
 *
 *   triad_cli stray-router MODEL_DIR   MODEL_DIR's routing.type "stray": a registered router that
 *       chooses expert n_experts for every token; stdout the forward's status and message
 *
 * Numbers print as %.9g (floats round-trip).  Exit 1: bad input or an unknown name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/moe/moe.h"

static int read_number(double *x)
{
    char word[64], *end;
    if (scanf("%63s", word) != 1) return 0;
    *x = strtod(word, &end);
    return *end == '\0';
}

/* count floats from stdin into a new buffer; NULL on bad input */
static float *read_floats(size_t count)
{
    float *v = malloc(count ? count * sizeof *v : 1);
    double x;
    size_t i;
    for (i = 0; v && i < count; i++) {
        if (!read_number(&x)) { free(v); return NULL; }
        v[i] = (float)x;
    }
    return v;
}

static void print_rows(const float *v, int32_t rows, int32_t cols)
{
    int32_t r, c;
    for (r = 0; r < rows; r++)
        for (c = 0; c < cols; c++) printf(c + 1 < cols ? "%.9g " : "%.9g\n", (double)v[(size_t)r * cols + c]);
}

static int run_expert(const char *name)
{
    const colibri_expert_def *expert = colibri_find_expert(name);
    colibri_compute k;
    colibri_hparams hp;
    colibri_expert_weights w;
    double h[5];
    float *w1, *w2 = NULL, *b1 = NULL, *b2 = NULL, *x, *h1, *h3, *y;
    int32_t dim, ffn, m, mlp = strcmp(name, "mlp") == 0, i;

    if (!expert) { fprintf(stderr, "triad_cli: no expert %s\n", name); return 1; }
    for (i = 0; i < 5; i++)
        if (!read_number(&h[i])) { fprintf(stderr, "triad_cli: bad header\n"); return 1; }
    dim = (int32_t)h[0]; ffn = (int32_t)h[1]; m = (int32_t)h[2];
    memset(&hp, 0, sizeof hp);
    hp.hidden_size = dim;
    hp.intermediate_size = ffn;
    hp.activation = (int32_t)h[3];
    w1 = read_floats((size_t)(mlp ? ffn : dim) * dim);
    if (mlp) {
        w2 = read_floats((size_t)dim * ffn);
        if (h[4] != 0.0) { b1 = read_floats((size_t)ffn); b2 = read_floats((size_t)dim); }
    }
    x = read_floats((size_t)m * dim);
    if (!w1 || (mlp && !w2) || (mlp && h[4] != 0.0 && (!b1 || !b2)) || !x) {
        fprintf(stderr, "triad_cli: bad weights or input\n");
        return 1;
    }
    memset(&w, 0, sizeof w);
    w.w[L_W1 - L_EXPERT_FIRST].data = w1;
    w.w[L_W2 - L_EXPERT_FIRST].data = w2;
    w.w[L_B1 - L_EXPERT_FIRST].data = b1;
    w.w[L_B2 - L_EXPERT_FIRST].data = b2;
    for (i = 0; i < L_EXPERT_KINDS; i++) w.w[i].dtype = COLIBRI_DTYPE_F32;
    memset(&k, 0, sizeof k);
    k.kernels = colibri_kernels_named("reference");
    h1 = malloc((size_t)m * ffn * sizeof *h1);
    h3 = malloc((size_t)m * ffn * sizeof *h3);
    y = malloc((size_t)m * dim * sizeof *y);
    if (!k.kernels || !h1 || !h3 || !y) { fprintf(stderr, "triad_cli: out of memory\n"); return 1; }

    colibri_expert_run(expert, &k, &hp, &w, x, m, h1, h3, y);
    print_rows(y, m, dim);
    free(w1); free(w2); free(b1); free(b2); free(x); free(h1); free(h3); free(y);
    return 0;
}

static int run_aggregator(const char *name)
{
    const colibri_aggregator_def *aggregator = colibri_find_aggregator(name);
    double h[3];
    float *rows_f, *gates, *y, *out;
    int32_t n, dim, m, i, *rows;

    if (!aggregator) { fprintf(stderr, "triad_cli: no aggregator %s\n", name); return 1; }
    for (i = 0; i < 3; i++)
        if (!read_number(&h[i])) { fprintf(stderr, "triad_cli: bad header\n"); return 1; }
    n = (int32_t)h[0]; dim = (int32_t)h[1]; m = (int32_t)h[2];
    rows_f = read_floats((size_t)m);
    gates = read_floats((size_t)m);
    y = read_floats((size_t)m * dim);
    out = read_floats((size_t)n * dim);
    rows = malloc((size_t)m * sizeof *rows + 1);
    if (!rows_f || !gates || !y || !out || !rows) { fprintf(stderr, "triad_cli: bad input\n"); return 1; }
    for (i = 0; i < m; i++) {
        rows[i] = (int32_t)rows_f[i];
        if (rows[i] < 0 || rows[i] >= n) { fprintf(stderr, "triad_cli: row %d outside [0, %d)\n", (int)rows[i], (int)n); return 1; }
    }
    aggregator->combine(out, y, rows, gates, m, dim);
    print_rows(out, n, dim);
    free(rows_f); free(gates); free(y); free(out); free(rows);
    return 0;
}

/* A program's router is its own code: one that names an expert past the last must be an error. */
static int32_t stray_experts;
static void route_stray(const colibri_route_call *call, float *logits, int32_t n, void *scratch, int32_t *ids,
                        float *gates)
{
    int32_t i;
    (void)logits; (void)scratch;
    for (i = 0; i < n * call->shape.top_k; i++) {
        ids[i] = call->shape.n_experts;   /* one past the last */
        gates[i] = 1.0f;
    }
    stray_experts = call->shape.n_experts;
}

static int run_stray_router(const char *dir)
{
    static const colibri_router_def stray = { "stray", route_stray, NULL };
    static const int32_t tokens[] = { 1, 5, 9 };
    colibri_model *model;
    colibri_session *s;
    colibri_session_options so;
    colibri_error err;
    colibri_status st;
    if ((st = colibri_register_router(&stray, &err)) != COLIBRI_OK || (st = colibri_model_open(dir, 0, &model, &err)) != COLIBRI_OK) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    memset(&so, 0, sizeof so);
    so.n_ctx = 8;
    if ((st = colibri_session_create(model, &so, &s, &err)) != COLIBRI_OK) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    st = colibri_forward(s, tokens, 3, NULL, &err);
    printf("%s %d: %s\n", colibri_status_name(st), (int)stray_experts, st ? err.message : "");
    colibri_session_destroy(s);
    colibri_model_close(model);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "stray-router") == 0) return run_stray_router(argv[2]);
    if (argc == 3 && strcmp(argv[1], "expert") == 0) return run_expert(argv[2]);
    if (argc == 3 && strcmp(argv[1], "aggregate") == 0) return run_aggregator(argv[2]);
    fprintf(stderr, "usage: triad_cli expert linear|mlp | triad_cli aggregate sparse|weighted_sum (case on stdin)\n");
    return 1;
}
