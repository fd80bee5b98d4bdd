/* SPDX-License-Identifier: MIT */
/* The token mixer of LFM2's convolution layers (forward.h). */
#include "forward.h"

/* block_out (n, dim) for LFM2's short convolution: B, C, x = in_proj(x_normed); u = B * x, cached per
 * position; y = C * (causal depthwise convolution of u over the last conv_kernel positions);
 * out_proj(y).  Positions before the first are zeros. */
void colibri_conv_block(colibri_session *s, int32_t layer, const int32_t *pos, const int32_t *row, int32_t n)
{
    const colibri_hparams *hp = &s->model->hp;
    const colibri_weight *w = s->model->layers[layer].w;
    const colibri_compute *k = &s->compute;
    int32_t d = hp->hidden_size, K = hp->conv_kernel, t, c, j;
    float *u = s->k_cache[layer];   /* (n_seq * n_ctx, d) */
    float *y = s->attn;             /* (n, d) */

    colibri_matmul(k, s->conv_in, s->xn, w[L_CONV_IN].data, w[L_CONV_IN].dtype, n, d, 3 * d);   /* (n, 3d): B | C | x */
    if (hp->conv_bias) colibri_add_bias(s->conv_in, w[L_CONV_IN_BIAS], n, 3 * d);
    for (t = 0; t < n; t++) {
        const float *bcx = s->conv_in + (size_t)t * 3 * d;
        for (c = 0; c < d; c++) u[(size_t)row[t] * d + c] = bcx[c] * bcx[2 * d + c];
    }
    for (t = 0; t < n; t++) {
        const float *slot_u = u + (size_t)(row[t] - pos[t]) * d;   /* the row's own sequence */
        const float *gate = s->conv_in + (size_t)t * 3 * d + d;
        for (c = 0; c < d; c++) {
            float acc = hp->conv_bias ? colibri_load_f32(w[L_CONV_KERNEL_BIAS].data, w[L_CONV_KERNEL_BIAS].dtype, (size_t)c) : 0.0f;
            for (j = 0; j < K; j++) {
                int32_t p = pos[t] - (K - 1) + j;
                if (p >= 0) acc += colibri_load_f32(w[L_CONV_KERNEL].data, w[L_CONV_KERNEL].dtype, (size_t)c * K + j) * slot_u[(size_t)p * d + c];
            }
            y[(size_t)t * d + c] = gate[c] * acc;
        }
    }
    colibri_matmul(k, s->block_out, y, w[L_CONV_OUT].data, w[L_CONV_OUT].dtype, n, d, d);
    if (hp->conv_bias) colibri_add_bias(s->block_out, w[L_CONV_OUT_BIAS], n, d);
}
