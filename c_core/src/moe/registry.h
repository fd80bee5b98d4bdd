/* SPDX-License-Identifier: MIT */
/* The registry's entries by index (registry.c), for the loader, which names a model's components by
 * their indices (colibri_hparams.router_kind, expert_kind, aggregator_kind), and for the session. */
#ifndef COLIBRI_MOE_REGISTRY_H
#define COLIBRI_MOE_REGISTRY_H

#include "colibri/moe.h"

/* Entry `index` of a kind, NULL past the last. */
const colibri_router_def *colibri_moe_router_at(int32_t index);
const colibri_expert_def *colibri_moe_expert_at(int32_t index);
const colibri_aggregator_def *colibri_moe_aggregator_at(int32_t index);

extern const colibri_router_def colibri_router_sparsemixer;   /* Phi-3.5-MoE's: always 2 experts */

#endif
