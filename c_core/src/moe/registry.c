/* SPDX-License-Identifier: MIT */
/* The registry of routers, experts and aggregators by name (colibri/moe.h): static tables that start
 * with the core's own components and take a program's after them.  A loaded model holds its
 * components' indices (colibri_hparams.router_kind, expert_kind, aggregator_kind), which stay put:
 * entries are only ever added. */
#include <string.h>

#include "moe.h"
#include "../util.h"

/* The core's own, in the order of COLIBRI_EXPERT_* and of the loader's message listing routing.type's
 * names. */
static const colibri_router_def *routers[COLIBRI_MOE_REGISTRY_SIZE] = {
    &colibri_router_topk_softmax, &colibri_router_topk, &colibri_router_sparsemixer,
};
static const colibri_expert_def *experts[COLIBRI_MOE_REGISTRY_SIZE] = {
    [COLIBRI_EXPERT_SWIGLU] = &colibri_expert_swiglu, [COLIBRI_EXPERT_SWIGLU_CLAMPED] = &colibri_expert_swiglu_clamped,
    &colibri_expert_linear, &colibri_expert_mlp,
};
static const colibri_aggregator_def *aggregators[COLIBRI_MOE_REGISTRY_SIZE] = {
    &colibri_aggr_weighted, &colibri_aggr_sparse,
};
static int32_t n_routers = 3, n_experts = 4, n_aggregators = 2;

/* index = that of the entry of table[0 .. count) named `wanted`; -1 when none is. */
#define FIND(table, count, wanted, index)                                        \
    do {                                                                         \
        for (index = 0; index < (count); index++)                                \
            if (strcmp((table)[index]->name, (wanted)) == 0) break;              \
        if (index == (count)) index = -1;                                        \
    } while (0)

static colibri_status check_new(const char *kind, const char *name, int has_function, int found, int32_t count,
                                colibri_error *err)
{
    if (!name || !has_function)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_register_%s: NULL definition, name or function", kind);
    if (!name[0] || strlen(name) > COLIBRI_MOE_NAME_MAX)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_register_%s: name \"%s\" is empty or longer than %d bytes",
                            kind, name, COLIBRI_MOE_NAME_MAX);
    if (found >= 0) return colibri_fail(err, COLIBRI_E_VALUE, "%s \"%s\" is registered already", kind, name);
    if (count == COLIBRI_MOE_REGISTRY_SIZE)
        return colibri_fail(err, COLIBRI_E_NOMEM, "%s \"%s\": the registry holds %d %ss, all taken", kind, name,
                            COLIBRI_MOE_REGISTRY_SIZE, kind);
    return COLIBRI_OK;
}

colibri_status colibri_register_router(const colibri_router_def *def, colibri_error *err)
{
    int32_t i = -1;
    colibri_status st;
    if (def && def->name) FIND(routers, n_routers, def->name, i);
    st = check_new("router", def ? def->name : NULL, def && def->route, i, n_routers, err);
    if (!st) routers[n_routers++] = def;
    return st;
}

colibri_status colibri_register_expert(const colibri_expert_def *def, colibri_error *err)
{
    int32_t i = -1;
    colibri_status st;
    if (def && def->name) FIND(experts, n_experts, def->name, i);
    st = check_new("expert", def ? def->name : NULL, def && def->forward, i, n_experts, err);
    if (!st) experts[n_experts++] = def;
    return st;
}

colibri_status colibri_register_aggregator(const colibri_aggregator_def *def, colibri_error *err)
{
    int32_t i = -1;
    colibri_status st;
    if (def && def->name) FIND(aggregators, n_aggregators, def->name, i);
    st = check_new("aggregator", def ? def->name : NULL, def && def->combine, i, n_aggregators, err);
    if (!st) aggregators[n_aggregators++] = def;
    return st;
}

const colibri_router_def *colibri_find_router(const char *name)
{
    int32_t i = -1;
    if (name) FIND(routers, n_routers, name, i);
    return i < 0 ? NULL : routers[i];
}

const colibri_expert_def *colibri_find_expert(const char *name)
{
    int32_t i = -1;
    if (name) FIND(experts, n_experts, name, i);
    return i < 0 ? NULL : experts[i];
}

const colibri_aggregator_def *colibri_find_aggregator(const char *name)
{
    int32_t i = -1;
    if (name) FIND(aggregators, n_aggregators, name, i);
    return i < 0 ? NULL : aggregators[i];
}

const colibri_router_def *colibri_moe_router_at(int32_t index)
{
    return index >= 0 && index < n_routers ? routers[index] : NULL;
}

const colibri_expert_def *colibri_moe_expert_at(int32_t index)
{
    return index >= 0 && index < n_experts ? experts[index] : NULL;
}

const colibri_aggregator_def *colibri_moe_aggregator_at(int32_t index)
{
    return index >= 0 && index < n_aggregators ? aggregators[index] : NULL;
}
