/* SPDX-License-Identifier: MIT */
/* The kernel variants c_core/arch/ compiles, and the CPU probes that say whether they run: what
 * arch/dispatch.c registers.  Each exists only in builds for its architecture (meson defines
 * COLIBRI_HAVE_<variant> for the ones it compiles).  A variant's table names only the kernels it
 * has: dispatch.c fills its empty slots from its base. */
#ifndef COLIBRI_ARCH_H
#define COLIBRI_ARCH_H

#include "../src/ops/ops.h"

/* For the variants' int8 k-quant kernels (x86/q8_x86.h, arm/q8_neon.h). */
/* A q4_k / q5_k block's 12 scale bytes as 8 scales then 8 mins (6 bits each): bytes s and s + 4
 * for s < 4; for s >= 4 the low nibbles of bytes 8..11 and the top two bits of bytes 0..7. */
static inline void k4_unpack(const uint8_t *scales, uint8_t out[16])
{
    uint32_t u[4], lo_mins;
    memcpy(u, scales, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    lo_mins = u[1] & 0x3f3f3f3fu;
    u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = lo_mins;
    u[0] &= 0x3f3f3f3fu;
    memcpy(out, u, 16);
}

/* A q3_k block's 12 scale bytes as its 16 6-bit scales, 32 not yet taken off: scale k's low
 * nibble is byte k's (k < 8) or byte k - 8's high one, its top two bits those of byte 8 + k % 4 at
 * 2 (k / 4). */
static inline void k3_unpack(const uint8_t *scales, uint8_t out[16])
{
    uint32_t u[4], high;
    memcpy(u, scales, 12);
    high = u[2];
    u[2] = ((u[0] >> 4) & 0x0f0f0f0fu) | (((high >> 4) & 0x03030303u) << 4);
    u[3] = ((u[1] >> 4) & 0x0f0f0f0fu) | (((high >> 6) & 0x03030303u) << 4);
    u[0] = (u[0] & 0x0f0f0f0fu) | ((high & 0x03030303u) << 4);
    u[1] = (u[1] & 0x0f0f0f0fu) | (((high >> 2) & 0x03030303u) << 4);
    memcpy(out, u, 16);
}

const colibri_kernels *colibri_kernels_avx2(void);
const colibri_kernels *colibri_kernels_avx512(void);
const colibri_kernels *colibri_kernels_avx512_bf16(void);
const colibri_kernels *colibri_kernels_neon(void);
const colibri_kernels *colibri_kernels_neon_dotprod(void);
const colibri_kernels *colibri_kernels_mve(void);
const colibri_kernels *colibri_kernels_mve_int8(void);
const colibri_kernels *colibri_kernels_rvv(void);
const colibri_kernels *colibri_kernels_rvv_int8(void);

int colibri_cpu_has_avx2(void);
int colibri_cpu_has_avx512_vnni(void);
int colibri_cpu_has_avx512_bf16(void);
int colibri_cpu_has_dotprod(void);
int colibri_cpu_has_rvv(void);

#endif
