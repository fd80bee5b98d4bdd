/* SPDX-License-Identifier: MIT */
/* Aggregators: combine expert outputs into the layer output (colibri_aggregator_def, colibri/moe.h). */
#include "moe.h"

/* out (n, dim): row rows[i] += gates[i] * y (i, :) */
static void combine_weighted(float *out, const float *y, const int32_t *rows, const float *gates,
                             int32_t m, int32_t dim)
{
    int32_t i, c;
    for (i = 0; i < m; i++) {
        float *o = out + (size_t)rows[i] * dim;
        const float *yi = y + (size_t)i * dim;
        for (c = 0; c < dim; c++) o[c] += yi[c] * gates[i];
    }
}

/* out (n, dim): row rows[i] += gates[i] * y (i, :) where gates[i] != 0; a zero gate's y is not read */
static void combine_sparse(float *out, const float *y, const int32_t *rows, const float *gates,
                           int32_t m, int32_t dim)
{
    int32_t i, c;
    for (i = 0; i < m; i++) {
        float *o = out + (size_t)rows[i] * dim;
        const float *yi = y + (size_t)i * dim;
        if (gates[i] == 0.0f) continue;
        for (c = 0; c < dim; c++) o[c] += yi[c] * gates[i];
    }
}

const colibri_aggregator_def colibri_aggr_weighted = { "weighted_sum", combine_weighted };
const colibri_aggregator_def colibri_aggr_sparse = { "sparse", combine_sparse };
