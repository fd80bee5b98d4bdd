/* SPDX-License-Identifier: MIT */
/* Timing on the MPS2 boards (mps2-an386, mps2-an500): the FPGA I/O block's COUNTER, a free
 * running 32-bit count of the 25 MHz system clock, widened to 64 bits here (it wraps every
 * 171 s; a token takes far less). */
#include "../app/firmware.h"

#define FPGAIO_COUNTER (*(volatile const uint32_t *)0x40028018u)

uint64_t fw_ticks(void)
{
    static uint32_t last;
    static uint64_t high;
    uint32_t now = FPGAIO_COUNTER;
    if (now < last) high += 1ull << 32;
    last = now;
    return high | now;
}

uint32_t fw_ticks_per_second(void) { return 25000000u; }
