/* SPDX-License-Identifier: MIT */
/* The per-phase profiler: while a session profiles, each phase of the forward pass and the
 * sampler adds the nanoseconds it took to the session's sums (the clock is util.c's); off, no
 * clock is read. */
#include <string.h>

#include "session.h"
#include "../util.h"

static const char *const phase_names[] = {
    [COLIBRI_PHASE_NORMS] = "norms", [COLIBRI_PHASE_ATTENTION] = "attention", [COLIBRI_PHASE_ROUTER] = "router",
    [COLIBRI_PHASE_DISPATCH] = "dispatch", [COLIBRI_PHASE_EXPERTS] = "experts", [COLIBRI_PHASE_AGGREGATION] = "aggregation",
    [COLIBRI_PHASE_DENSE] = "dense_mlp", [COLIBRI_PHASE_LM_HEAD] = "lm_head", [COLIBRI_PHASE_SAMPLING] = "sampling",
    [COLIBRI_PHASE_EXPERT_IO] = "expert_io_wait",
};
COLIBRI_TABLE_CHECK(phase_names, COLIBRI_PHASE_COUNT);

const char *colibri_phase_name(int32_t phase)
{
    return phase >= 0 && phase < COLIBRI_PHASE_COUNT ? phase_names[phase] : "?";
}

colibri_status colibri_profile(const colibri_session *s, uint64_t ns[COLIBRI_PHASE_COUNT])
{
    if (!s || !ns) return COLIBRI_E_ARG;
    memcpy(ns, s->profile_ns, sizeof s->profile_ns);
    return COLIBRI_OK;
}
