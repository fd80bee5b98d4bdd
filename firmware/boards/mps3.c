/* SPDX-License-Identifier: MIT */
/* Timing on the MPS3 AN547 board: the FPGA I/O block's COUNTER (secure alias), a free running
 * 32-bit count at 20 MHz, widened to 64 bits here (it wraps every 214 s; a token takes far less).
 * Under QEMU's -icount shift=0 one instruction is one nanosecond, so a tick is 50 instructions. */
#include "../app/firmware.h"

#define FPGAIO_COUNTER (*(volatile const uint32_t *)0x59302018u)

uint64_t fw_ticks(void)
{
    static uint32_t last;
    static uint64_t high;
    uint32_t now = FPGAIO_COUNTER;
    if (now < last) high += 1ull << 32;
    last = now;
    return high | now;
}

uint32_t fw_ticks_per_second(void) { return 20000000u; }
