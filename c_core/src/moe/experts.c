/* Experts: one expert's FFN over the m tokens routed to it. */
#include "moe.h"

void colibri_swiglu(const colibri_kernels *k, colibri_weight w1, colibri_weight w3, colibri_weight w2,
                    int32_t dim, int32_t f, const float *x, int32_t m, float *h1, float *h3, float *y)
{
    k->matmul(h1, x, w1.data, w1.dtype, m, dim, f);   /* (m, f) */
    k->matmul(h3, x, w3.data, w3.dtype, m, dim, f);   /* (m, f) */
    colibri_silu_mul(h1, h3, (size_t)m * f);
    k->matmul(y, h1, w2.data, w2.dtype, m, f, dim);   /* (m, dim) */
}

/* Expert e of a stacked weight (n_experts, rows, cols): base + e * stride. */
static colibri_weight expert_slice(colibri_weight w, int32_t e, int32_t rows, int32_t cols)
{
    colibri_weight slice;
    slice.data = (const uint8_t *)w.data + (size_t)e * rows * cols * colibri_dtype_size(w.dtype);
    slice.dtype = w.dtype;
    return slice;
}

static void expert_swiglu(const colibri_kernels *k, const colibri_hparams *hp, const colibri_layer_weights *lw,
                          int32_t e, const float *x, int32_t m, float *h1, float *h3, float *y)
{
    int32_t d = hp->hidden_size, f = hp->intermediate_size;
    colibri_swiglu(k, expert_slice(lw->w[L_W1], e, f, d), expert_slice(lw->w[L_W3], e, f, d),
                   expert_slice(lw->w[L_W2], e, d, f), d, f, x, m, h1, h3, y);
}

const colibri_expert colibri_expert_swiglu = { "swiglu", expert_swiglu };
