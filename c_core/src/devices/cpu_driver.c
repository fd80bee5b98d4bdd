/* SPDX-License-Identifier: MIT */
/* The cpu as a driver (colibri/device.h): a session's experts computed for others, by a remote
 * edge's server or a second session behind a driver; its compute is synchronous, its sync the work. */
#include <string.h>

#include "../runtime/session.h"
#include "../util.h"

colibri_status colibri_experts_check(const colibri_session *s, const colibri_device_task *t, colibri_error *err)
{
    const colibri_hparams *hp;
    int32_t j;
    if (!s || !t) return colibri_fail(err, COLIBRI_E_ARG, "colibri_experts_check: NULL argument");
    hp = &s->model->hp;
    if (t->layer < 0 || t->layer >= hp->n_layers)
        return colibri_fail(err, COLIBRI_E_ARG, "layer %d out of range [0, %d)", t->layer, hp->n_layers);
    if (!s->model->layers[t->layer].moe)
        return colibri_fail(err, COLIBRI_E_ARG, "layer %d is dense: it has no routed experts", t->layer);
    if (t->hidden_size != hp->hidden_size)
        return colibri_fail(err, COLIBRI_E_ARG, "hidden_size %d: the model's is %d", t->hidden_size, hp->hidden_size);
    if (t->n_experts < 1 || t->n_experts > hp->n_experts || !t->experts || !t->rows)
        return colibri_fail(err, COLIBRI_E_ARG, "%d experts: between 1 and %d, with experts and rows", t->n_experts,
                            hp->n_experts);
    if (t->rows[0] != 0 || t->rows[t->n_experts] != t->n_rows || t->n_rows < 1)
        return colibri_fail(err, COLIBRI_E_ARG, "rows must run from 0 to n_rows = %d", t->n_rows);
    for (j = 0; j < t->n_experts; j++) {
        if (t->experts[j] < 0 || t->experts[j] >= hp->n_experts || (j && t->experts[j] <= t->experts[j - 1]))
            return colibri_fail(err, COLIBRI_E_ARG, "experts[%d] = %d: ids in [0, %d), ascending", j, t->experts[j], hp->n_experts);
        if (t->rows[j + 1] <= t->rows[j])
            return colibri_fail(err, COLIBRI_E_ARG, "rows[%d] = %d after %d: each expert needs at least one row", j + 1,
                                t->rows[j + 1], t->rows[j]);
    }
    return COLIBRI_OK;
}

colibri_status colibri_experts_compute(colibri_session *s, colibri_device_task *t, colibri_error *err)
{
    const colibri_hparams *hp;
    int32_t j, r;
    colibri_status st = colibri_experts_check(s, t, err);
    if (st) return st;
    if (!t->x || !t->y) return colibri_fail(err, COLIBRI_E_ARG, "colibri_experts_compute: NULL x or y");
    hp = &s->model->hp;
    const colibri_moe_context c = { .moe = &s->moe, .k = &s->compute, .hp = hp, .lw = &s->model->layers[t->layer],
                                    .b = &s->moe_buf, .stream = s->cache ? &s->stream : NULL,
                                    .layer = t->layer };   /* nothing routed */
    for (j = 0; j < t->n_experts; j++)   /* each expert's rows, n_batch at a time: rows are independent */
        for (r = t->rows[j]; r < t->rows[j + 1]; r += s->n_batch) {
            int32_t m = t->rows[j + 1] - r < s->n_batch ? t->rows[j + 1] - r : s->n_batch;
            size_t at = (size_t)r * hp->hidden_size;
            st = colibri_moe_expert_rows(&c, t->experts[j], t->x + at, m, t->y + at, err);
            if (st) return st;
        }
    return COLIBRI_OK;
}

static colibri_status cpu_compute(void *context, const colibri_device_task *t, colibri_error *err)
{
    (void)context; (void)t; (void)err;
    return COLIBRI_OK;   /* synchronous: the work is sync's */
}

static colibri_status cpu_sync(void *context, colibri_device_task *t, colibri_error *err)
{
    return colibri_experts_compute(context, t, err);
}

void colibri_cpu_driver(colibri_session *s, colibri_device_driver *driver)
{
    memset(driver, 0, sizeof *driver);
    driver->name = "cpu";
    driver->context = s;
    driver->compute = cpu_compute;
    driver->sync = cpu_sync;
}
