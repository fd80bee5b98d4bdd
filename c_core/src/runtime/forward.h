/* SPDX-License-Identifier: MIT */
/* What the runtime's files share (c_core/src/runtime/): session.c lays the session out and
 * fills its RoPE tables (rope.c); forward.c runs each layer's token mixer, one of
 * attention.c's two or conv.c's, then the MoE block or a dense MLP. */
#ifndef COLIBRI_FORWARD_H
#define COLIBRI_FORWARD_H

#include "session.h"

/* rope_cos, rope_sin (n_ctx, rope_dim / 2) <- the model's angle tables, times its attention factor */
void colibri_rope_tables_fill(colibri_session *s);

/* block_out (n, dim) = the layer's token mixer over x_normed (n, dim), for n rows each at its own
 * position pos[t] in its sequence, its keys and values (or convolution inputs) written into cache row
 * row[t] (its slot's first row is row[t] - pos[t]), each attending over its own slot's rows:
 * grouped-query attention, DeepSeek's latent attention, LFM2's short convolution. */
void colibri_attention(colibri_session *s, int32_t layer, const int32_t *pos, const int32_t *row, int32_t n);
void colibri_attention_latent(colibri_session *s, int32_t layer, const int32_t *pos, const int32_t *row, int32_t n);
void colibri_conv_block(colibri_session *s, int32_t layer, const int32_t *pos, const int32_t *row, int32_t n);

/* Expert streaming's guess of the next MoE layer's experts (colibri_moe_stream.guess_next). */
void colibri_guess_next_layer(void *context);

/* rows (n, cols) += bias (cols) */
void colibri_add_bias(float *rows, colibri_weight bias, int32_t n, int32_t cols);

#endif
