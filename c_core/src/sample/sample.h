/* SPDX-License-Identifier: MIT */
/* The sampler (sample/sample.c) over one row of logits, with buffers its caller hands in (the
 * session's arena): colibri_sample passes the session's last logits. */
#ifndef COLIBRI_SAMPLE_H
#define COLIBRI_SAMPLE_H

#include "colibri/colibri.h"

/* token <- a draw from logits (vocab) under params after the sequence's recent tokens (n_recent,
 * oldest first: what the penalties count), advancing rng; probs (vocab) and candidates (vocab)
 * are scratch. */
colibri_status colibri_sample_logits(const float *logits, int32_t vocab, float *probs, int32_t *candidates,
                                     const colibri_sampling *params, const int32_t *recent, int32_t n_recent,
                                     uint64_t *rng, int32_t *token, colibri_error *err);

#endif
