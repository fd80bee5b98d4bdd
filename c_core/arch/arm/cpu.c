/* AArch64 feature probe: NEON is in the base architecture; the dot-product extension is
 * announced by the kernel (Linux: HWCAP_ASIMDDP). */
#include "../../src/ops/ops.h"

#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
int colibri_cpu_has_dotprod(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
#else
int colibri_cpu_has_dotprod(void) { return 0; }
#endif
