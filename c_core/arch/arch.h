/* The kernel variants c_core/arch/ compiles, and the CPU probes that say whether they run: what
 * arch/dispatch.c registers.  Each exists only in builds for its architecture (meson defines
 * COLIBRI_HAVE_<variant> for the ones it compiles).  A variant's table names only the kernels it
 * has: dispatch.c fills its empty slots from its base. */
#ifndef COLIBRI_ARCH_H
#define COLIBRI_ARCH_H

#include "../src/ops/ops.h"

const colibri_kernels *colibri_kernels_avx2(void);
const colibri_kernels *colibri_kernels_avx512(void);
const colibri_kernels *colibri_kernels_neon(void);
const colibri_kernels *colibri_kernels_neon_dotprod(void);

int colibri_cpu_has_avx2(void);
int colibri_cpu_has_avx512_vnni(void);
int colibri_cpu_has_dotprod(void);

#endif
