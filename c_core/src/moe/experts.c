/* SPDX-License-Identifier: MIT */
/* Experts: one expert's FFN over the m tokens routed to it. */
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

#define PART(w, kind) ((w)->w[(kind) - L_EXPERT_FIRST])

static void expert_swiglu(const colibri_compute *k, const colibri_hparams *hp, const colibri_expert_weights *w,
                          const float *x, int32_t m, float *h1, float *h3, float *y)
{
    colibri_swiglu(k, hp->activation, PART(w, L_W1), PART(w, L_W3), PART(w, L_W2), hp->hidden_size,
                   hp->intermediate_size, x, m, h1, h3, y);
}

/* gpt-oss: y = W2 @ ((clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)) + b2, with
 * g = min(gate, limit); gate and up with their biases. */
static void expert_swiglu_clamped(const colibri_compute *k, const colibri_hparams *hp, const colibri_expert_weights *w,
                                  const float *x, int32_t m, float *h1, float *h3, float *y)
{
    int32_t d = hp->hidden_size, f = hp->intermediate_size;
    colibri_weight w1 = PART(w, L_W1), w3 = PART(w, L_W3), w2 = PART(w, L_W2);   /* (f, d), (f, d), (d, f) */
    float limit = hp->swiglu_limit;
    size_t i, n = (size_t)m * f;
    colibri_matmul(k, h1, x, w1.data, w1.dtype, m, d, f);   /* (m, f) gate */
    colibri_matmul(k, h3, x, w3.data, w3.dtype, m, d, f);   /* (m, f) up */
    if (hp->expert_bias) {
        add_expert_bias(h1, PART(w, L_B1), m, f);
        add_expert_bias(h3, PART(w, L_B3), m, f);
    }
    for (i = 0; i < n; i++) {
        float g = h1[i] < limit ? h1[i] : limit;
        float u = h3[i] > limit ? limit : h3[i] < -limit ? -limit : h3[i];
        h1[i] = (u + 1.0f) * (g / (1.0f + colibri_expf(-(g * hp->swiglu_alpha))));
    }
    colibri_matmul(k, y, h1, w2.data, w2.dtype, m, f, d);   /* (m, dim) */
    if (hp->expert_bias) add_expert_bias(y, PART(w, L_B2), m, d);
}

const colibri_expert colibri_expert_swiglu = { "swiglu", expert_swiglu };
const colibri_expert colibri_expert_swiglu_clamped = { "swiglu_clamped", expert_swiglu_clamped };
