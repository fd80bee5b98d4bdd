/* SPDX-License-Identifier: MIT */
/* colibri on bare metal: no OS, no heap, no file system.  The model is linked into flash,
 * the session lives in the static block the build planned; arguments, text and the
 * optional logits/report files go through semihosting.
 *
 *   qemu-system-arm -M mps2-an386 -nographic -monitor none -serial none \
 *       -semihosting-config enable=on,target=native,arg=fw,arg=text=ROMEO%3A,arg=max_tokens=20 \
 *       -kernel colibri-firmware.elf
 * Exit status: 0 done, 1 a step failed (printed), 2 bad arguments. */
#include "../app/firmware.h"

/* picolibc's linker script: the stack grows down from __stack (the top of RAM); the image
 * reserves __stack_size bytes for it (model_image.S), above the unused heap (from __heap_start).
 * Up to STACK_GUARD bytes of that heap are painted too, so a stack that outgrows its budget, even
 * by a frame that skips the budget's last bytes, shows as stack_used above stack_reserved. */
extern unsigned char __stack[];
extern unsigned char __stack_size[];
extern unsigned char __heap_start[];

#define STACK_GUARD 65536

static fw_request request;

static unsigned char *paint_bottom(void)
{
    unsigned char *bottom = __stack - (size_t)__stack_size;
    return (size_t)(bottom - __heap_start) > STACK_GUARD ? bottom - STACK_GUARD : __heap_start;
}

static size_t stack_used(void)
{
    return fw_stack_used(paint_bottom(), __stack);
}

int main(int argc, char **argv)
{
    unsigned char here;   /* paint all of the budget below this frame, with a margin for the call */
    fw_stack_paint(paint_bottom(), (unsigned char *)((uintptr_t)&here - 256));
    if (fw_parse_args(argc, argv, &request)) return 2;
    return fw_generate(&request, NULL, NULL, stack_used);
}
