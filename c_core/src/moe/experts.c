/* SPDX-License-Identifier: MIT */
/* Experts: one expert's FFN over the m tokens routed to it, each a colibri_expert_def (colibri/moe.h):
 * the models' gated FFNs (SwiGLU, gpt-oss's clamped one), and the spec's dense linear and non-gated
 * MLP experts. */
#include "moe.h"

void colibri_swiglu(const colibri_compute *k, int activation, colibri_weight w1, colibri_weight w3, colibri_weight w2,
                    int32_t dim, int32_t f, const float *x, int32_t m, float *h1, float *h3, float *y)
{
    colibri_matmul(k, h1, x, w1.data, w1.dtype, m, dim, f);   /* (m, f) */
    colibri_matmul(k, h3, x, w3.data, w3.dtype, m, dim, f);   /* (m, f) */
    if (activation == COLIBRI_ACT_SILU) k->kernels->silu_mul(h1, h3, (size_t)m * f);
    else colibri_act_mul(activation, h1, h3, (size_t)m * f);
    colibri_matmul(k, y, h1, w2.data, w2.dtype, m, f, dim);   /* (m, dim) */
}

/* rows (m, cols) += expert e's bias (cols) */
static void add_expert_bias(float *rows, colibri_weight bias, int32_t m, int32_t cols)
{
    int32_t t, i;
    for (t = 0; t < m; t++)
        for (i = 0; i < cols; i++)
            rows[(size_t)t * cols + i] += colibri_load_f32(bias.data, bias.dtype, (size_t)i);
}

static colibri_weight weight_of(colibri_expert_tensor p)
{
    colibri_weight w;
    w.data = p.data;
    w.dtype = p.dtype;
    return w;
}

static colibri_expert_tensor part_of(const colibri_expert_weights *w, int kind)
{
    colibri_expert_tensor p;
    p.data = w->w[kind - L_EXPERT_FIRST].data;
    p.dtype = w->w[kind - L_EXPERT_FIRST].dtype;
    return p;
}

void colibri_expert_run(const colibri_expert_def *expert, const colibri_compute *k, const colibri_hparams *hp,
                        const colibri_expert_weights *w, const float *x, int32_t m, float *h1, float *h3, float *y)
{
    colibri_expert_core core;
    colibri_expert_call call;
    core.k = k;
    core.hp = hp;
    call.shape = colibri_moe_shape_of(hp);
    call.w1 = part_of(w, L_W1); call.w3 = part_of(w, L_W3); call.w2 = part_of(w, L_W2);
    call.b1 = part_of(w, L_B1); call.b3 = part_of(w, L_B3); call.b2 = part_of(w, L_B2);
    call.core = &core;
    expert->forward(&call, x, m, h1, h3, y);
}

void colibri_expert_matmul(const colibri_expert_call *call, const colibri_expert_tensor *w, const float *x,
                           int32_t m, int32_t cols, int32_t rows, float *y)
{
    const colibri_expert_core *core = call->core;
    colibri_matmul(core->k, y, x, w->data, w->dtype, m, cols, rows);
}

#define CORE(call) ((const colibri_expert_core *)(call)->core)

static void expert_swiglu(const colibri_expert_call *call, const float *x, int32_t m, float *h1, float *h3, float *y)
{
    colibri_swiglu(CORE(call)->k, CORE(call)->hp->activation, weight_of(call->w1), weight_of(call->w3),
                   weight_of(call->w2), call->shape.dim, call->shape.ffn, x, m, h1, h3, y);
}

/* gpt-oss: y = W2 @ ((clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)) + b2, with
 * g = min(gate, limit); gate and up with their biases. */
static void expert_swiglu_clamped(const colibri_expert_call *call, const float *x, int32_t m, float *h1, float *h3,
                                  float *y)
{
    const colibri_compute *k = CORE(call)->k;
    const colibri_hparams *hp = CORE(call)->hp;
    int32_t d = call->shape.dim, f = call->shape.ffn;
    colibri_weight w1 = weight_of(call->w1), w3 = weight_of(call->w3), w2 = weight_of(call->w2);   /* (f, d), (f, d), (d, f) */
    float limit = hp->swiglu_limit;
    size_t i, n = (size_t)m * f;
    colibri_matmul(k, h1, x, w1.data, w1.dtype, m, d, f);   /* (m, f) gate */
    colibri_matmul(k, h3, x, w3.data, w3.dtype, m, d, f);   /* (m, f) up */
    if (hp->expert_bias) {
        add_expert_bias(h1, weight_of(call->b1), m, f);
        add_expert_bias(h3, weight_of(call->b3), m, f);
    }
    for (i = 0; i < n; i++) {
        float g = h1[i] < limit ? h1[i] : limit;
        float u = h3[i] > limit ? limit : h3[i] < -limit ? -limit : h3[i];
        h1[i] = (u + 1.0f) * (g / (1.0f + colibri_expf(-(g * hp->swiglu_alpha))));
    }
    colibri_matmul(k, y, h1, w2.data, w2.dtype, m, f, d);   /* (m, dim) */
    if (hp->expert_bias) add_expert_bias(y, weight_of(call->b2), m, d);
}

/* y (m, dim) = x (m, dim) @ W1 (dim, dim)^T: the spec's dense linear expert; h1, h3 unused. */
static void expert_linear(const colibri_expert_call *call, const float *x, int32_t m, float *h1, float *h3, float *y)
{
    (void)h1; (void)h3;
    colibri_expert_matmul(call, &call->w1, x, m, call->shape.dim, call->shape.dim, y);
}

/* y (m, dim) = act(x @ W1^T (+ b1)) @ W2^T (+ b2), W1 (ffn, dim), W2 (dim, ffn): a non-gated MLP
 * expert, act the model's activation (ops' gated one with an all-ones gate: act(h) * 1 = act(h)). */
static void expert_mlp(const colibri_expert_call *call, const float *x, int32_t m, float *h1, float *h3, float *y)
{
    int32_t d = call->shape.dim, f = call->shape.ffn;
    size_t i, n = (size_t)m * f;
    colibri_expert_matmul(call, &call->w1, x, m, d, f, h1);   /* (m, f) */
    if (call->b1.data) add_expert_bias(h1, weight_of(call->b1), m, f);
    for (i = 0; i < n; i++) h3[i] = 1.0f;
    colibri_act_mul(CORE(call)->hp->activation, h1, h3, n);
    colibri_expert_matmul(call, &call->w2, h1, m, f, d, y);   /* (m, dim) */
    if (call->b2.data) add_expert_bias(y, weight_of(call->b2), m, d);
}

const colibri_expert_def colibri_expert_swiglu = { "swiglu", expert_swiglu };
const colibri_expert_def colibri_expert_swiglu_clamped = { "swiglu_clamped", expert_swiglu_clamped };
const colibri_expert_def colibri_expert_linear = { "linear", expert_linear };
const colibri_expert_def colibri_expert_mlp = { "mlp", expert_mlp };
