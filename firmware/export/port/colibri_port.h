/* SPDX-License-Identifier: MIT */
/* What the example firmware (example/main.c) needs of the platform: a clock and a way out for
 * text.  The core itself needs neither.  Fill in port_template.c, or take the board's port. */
#ifndef COLIBRI_PORT_H
#define COLIBRI_PORT_H

#include <stddef.h>
#include <stdint.h>

/* A free-running count and its rate: only differences are used (timing of a generation). */
uint64_t colibri_port_ticks(void);
uint32_t colibri_port_ticks_per_second(void);

/* Text out (a UART, semihosting, a display): `len` bytes, UTF-8, never split inside a character. */
void colibri_port_write(const char *bytes, size_t len);

#endif
