/* SPDX-License-Identifier: MIT */
/* RISC-V feature probe, compiled without V so it runs on every rv64gc CPU: the vector
 * extension is the OS's to report (platform.h), as it must also save the vector registers. */
#include "../../src/platform.h"
#include "../arch.h"

int colibri_cpu_has_rvv(void) { return colibri_platform_riscv_vector(); }
