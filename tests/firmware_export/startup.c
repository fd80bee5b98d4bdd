/* A firmware's own start-up for a Cortex-M (none of colibri's board files): the vector table,
 * .data from flash, .bss zeroed, the FPU on, then main; its status leaves through semihosting. */
#include <stdint.h>
#include <string.h>

#include "semihost.h"

extern uint32_t _sidata[], _sdata[], _edata[], _sbss[], _ebss[], _estack[];
int main(void);

void reset_handler(void)
{
    memcpy(_sdata, _sidata, (size_t)((char *)_edata - (char *)_sdata));
    memset(_sbss, 0, (size_t)((char *)_ebss - (char *)_sbss));
    *(volatile uint32_t *)0xE000ED88u |= 0xFu << 20;   /* CPACR: CP10 and CP11, the FPU */
    __asm__ volatile("dsb\n\tisb");
    semihost_exit(main());
}

static void fault_handler(void) { semihost_exit(99); }

__attribute__((section(".vectors"), used)) static const uintptr_t vectors[16] = {
    (uintptr_t)_estack, (uintptr_t)reset_handler, (uintptr_t)fault_handler, (uintptr_t)fault_handler,
    (uintptr_t)fault_handler, (uintptr_t)fault_handler, (uintptr_t)fault_handler, 0, 0, 0, 0,
    (uintptr_t)fault_handler, (uintptr_t)fault_handler, 0, (uintptr_t)fault_handler, (uintptr_t)fault_handler,
};
