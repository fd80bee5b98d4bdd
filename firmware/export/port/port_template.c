/* SPDX-License-Identifier: MIT */
/* The port to fill in for a board of your own (see colibri_port.h). */
#include "colibri_port.h"

uint64_t colibri_port_ticks(void)
{
    return 0;   /* e.g. a timer widened to 64 bits */
}

uint32_t colibri_port_ticks_per_second(void)
{
    return 1;
}

void colibri_port_write(const char *bytes, size_t len)
{
    (void)bytes;   /* e.g. each byte to a UART's data register */
    (void)len;
}
