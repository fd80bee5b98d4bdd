/* The per-phase profiler: while a session profiles, each phase of the forward pass and the
 * sampler adds the nanoseconds it took to the session's sums; off, no clock is read. */
#include <string.h>

#include "session.h"
#include "../platform.h"

uint64_t colibri_profile_start(const uint64_t *profile) { return profile ? colibri_platform_now_ns() : 0; }

void colibri_profile_add(uint64_t *profile, int32_t phase, uint64_t *since)
{
    uint64_t now;
    if (!profile) return;
    now = colibri_platform_now_ns();
    profile[phase] += now - *since;
    *since = now;
}

const char *colibri_phase_name(int32_t phase)
{
    static const char *const names[COLIBRI_PHASE_COUNT] = {
        "norms", "attention", "router", "dispatch", "experts", "aggregation", "dense_mlp", "lm_head", "sampling",
    };
    return phase >= 0 && phase < COLIBRI_PHASE_COUNT ? names[phase] : "?";
}

colibri_status colibri_profile(const colibri_session *s, uint64_t ns[COLIBRI_PHASE_COUNT])
{
    if (!s || !ns) return COLIBRI_E_ARG;
    memcpy(ns, s->profile_ns, sizeof s->profile_ns);
    return COLIBRI_OK;
}
