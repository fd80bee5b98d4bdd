/* SPDX-License-Identifier: MIT */
/* AArch64 feature probe: NEON is in the base architecture; the dot-product extension is the OS's
 * to report (platform.h). */
#include "../../src/platform.h"
#include "../arch.h"

int colibri_cpu_has_dotprod(void) { return colibri_platform_arm_dotprod(); }
