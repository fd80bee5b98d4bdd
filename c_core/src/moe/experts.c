/* Experts: one expert's FFN over the m tokens routed to it. */
#include "moe.h"

/* Expert e of a stacked weight (n_experts, rows, cols): base + e * stride. */
static const void *expert_slice(colibri_weight w, int32_t e, int32_t rows, int32_t cols)
{
    return (const uint8_t *)w.data + (size_t)e * rows * cols * colibri_dtype_size(w.dtype);
}

/* y (m, dim) = W2[e] @ (silu(W1[e] @ x) * (W3[e] @ x)),  x (m, dim) */
static void expert_swiglu(const colibri_kernels *k, const colibri_hparams *hp, const colibri_layer_weights *lw,
                          int32_t e, const float *x, int32_t m, float *h1, float *h3, float *y)
{
    int32_t d = hp->hidden_size, f = hp->intermediate_size;
    k->matmul(h1, x, expert_slice(lw->w1, e, f, d), lw->w1.dtype, m, d, f);   /* (m, ffn) */
    k->matmul(h3, x, expert_slice(lw->w3, e, f, d), lw->w3.dtype, m, d, f);   /* (m, ffn) */
    colibri_silu_mul(h1, h3, (size_t)m * f);
    k->matmul(y, h1, expert_slice(lw->w2, e, d, f), lw->w2.dtype, m, f, d);   /* (m, dim) */
}

const colibri_expert colibri_expert_swiglu = { "swiglu", expert_swiglu };
