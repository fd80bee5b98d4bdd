/* SPDX-License-Identifier: MIT */
/* Timing on QEMU's RISC-V `virt` board: the CLINT's 64-bit mtime, 10 MHz. */
#include "../app/firmware.h"

#define MTIME_LO (*(volatile const uint32_t *)0x0200BFF8u)
#define MTIME_HI (*(volatile const uint32_t *)0x0200BFFCu)

uint64_t fw_ticks(void)
{
    uint32_t hi, lo;
    do {   /* a 32-bit core reads the halves apart: retry when the low half carried in between */
        hi = MTIME_HI;
        lo = MTIME_LO;
    } while (hi != MTIME_HI);
    return ((uint64_t)hi << 32) | lo;
}

uint32_t fw_ticks_per_second(void) { return 10000000u; }
