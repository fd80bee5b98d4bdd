/* colibri on bare metal: no OS, no heap, no file system.  The model is linked into flash,
 * the session lives in the static block the build planned; arguments, text and the
 * optional logits/report files go through semihosting.
 *
 *   qemu-system-arm -M mps2-an386 -nographic -monitor none -serial none \
 *       -semihosting-config enable=on,target=native,arg=fw,arg=ids=1:591:47,arg=max_tokens=20 \
 *       -kernel colibri-firmware.elf
 * Exit status: 0 done, 1 a step failed (printed), 2 bad arguments. */
#include "../app/firmware.h"

/* picolibc's linker script: the stack grows down from __stack (the top of RAM); the image
 * reserves __stack_size bytes for it (model_image.S). */
extern unsigned char __stack[];
extern unsigned char __stack_size[];

static fw_request request;

static size_t stack_used(void)
{
    return fw_stack_used(__stack - (size_t)__stack_size, __stack);
}

int main(int argc, char **argv)
{
    unsigned char here;   /* paint all of the budget below this frame, with a margin for the call */
    fw_stack_paint(__stack - (size_t)__stack_size, (unsigned char *)((uintptr_t)&here - 256));
    if (fw_parse_args(argc, argv, &request)) return 2;
    return fw_generate(&request, NULL, NULL, stack_used);
}
