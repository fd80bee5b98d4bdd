/* SPDX-License-Identifier: MIT */
/* colibri in a FreeRTOS task: the bare-metal image's generation (firmware/app), run by a task
 * that FreeRTOS schedules, while a higher-priority heartbeat task keeps running.
 *
 * Nothing is allocated at run time: the kernel has no heap (configSUPPORT_DYNAMIC_ALLOCATION 0),
 * both tasks' TCBs and stacks and the idle task's are static arrays here, and the model's
 * tables and session live in the static block the build planned (model_image.S).
 *
 *   qemu-system-arm -M mps2-an386 -nographic -monitor none -serial none -chardev stdio,id=out \
 *       -semihosting-config enable=on,target=native,chardev=out,arg=text=ROMEO%3A,arg=max_tokens=20,arg=report=r.txt \
 *       -kernel colibri-freertos.elf
 *
 * The text is the bare-metal image's.  The report (report=FILE) gets, after the app's lines:
 *   heartbeats: heartbeat task runs from the start of the generation to its last token
 *   heartbeats_min_per_token: the fewest in any one token's interval (the first token's
 *       interval holds loading and prefill)
 * Timing is the FreeRTOS tick (ticks_per_second: configTICK_RATE_HZ).  stack_reserved is the
 * inference task's stack (-Dfirmware_stack), stack_used its high-water mark (a guard below it
 * shows an overflow).  picolibc's main
 * stack, of the same size, is main's only until the scheduler starts: then the Cortex-M port
 * takes it for interrupts, while the RISC-V port has its own (configISR_STACK_SIZE_WORDS).
 *
 * Exit status: 0 done, 1 a step failed (printed), 2 bad arguments, 3 the heartbeat stood
 * still while a token was computed, 4 a kernel assertion, a stack overflow or no scheduler. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "FreeRTOS.h"
#include "task.h"

#include "../app/firmware.h"

/* The inference runs below the heartbeat, so every tick preempts it: if the heartbeat counts
 * while tokens are computed, the rest of the system had the CPU too. */
#define INFERENCE_PRIORITY  (tskIDLE_PRIORITY + 1)
#define HEARTBEAT_PRIORITY  (tskIDLE_PRIORITY + 2)
#define HEARTBEAT_PERIOD    1   /* ticks */
#define HEARTBEAT_STACK_WORDS configMINIMAL_STACK_SIZE

/* The stack budget the build planned (-Dfirmware_stack), the same number as the image's
 * __stack_size and colibri_fw_image.stack_bytes. */
#define INFERENCE_STACK_WORDS (COLIBRI_FW_STACK_BYTES / sizeof(StackType_t))

/* Below the inference task's stack (both ports' stacks grow down), a guard painted as the kernel
 * fills a new stack: a stack that outgrows its budget, even by a frame that skips the budget's
 * last words (the kernel's overflow check looks at those only), shows as stack_used above
 * stack_reserved, which fw_generate reports. */
#define STACK_GUARD_WORDS (4096 / sizeof(StackType_t))

static StaticTask_t inference_tcb, heartbeat_tcb, idle_tcb;
static struct {
    StackType_t guard[STACK_GUARD_WORDS];
    StackType_t stack[INFERENCE_STACK_WORDS];
} inference;
static StackType_t heartbeat_stack[HEARTBEAT_STACK_WORDS];
static StackType_t idle_stack[configMINIMAL_STACK_SIZE];

/* main never resumes once the scheduler starts, and on Cortex-M its stack is reused for
 * interrupts: what the task needs from main lives here. */
static fw_request request;

static volatile uint32_t heartbeats;   /* written by the heartbeat task only */

static void heartbeat_task(void *unused)
{
    (void)unused;
    for (;;) {
        vTaskDelay(HEARTBEAT_PERIOD);
        heartbeats++;
    }
}

typedef struct liveness {
    uint32_t at_start;        /* heartbeats when the generation began */
    uint32_t at_last_token;
    uint32_t min_per_token;   /* fewest heartbeats between one token and the next */
    int32_t tokens;
} liveness;

static void on_token(int32_t index, void *context)
{
    liveness *l = context;
    uint32_t now = heartbeats, during = now - l->at_last_token;
    if (index == 0 || during < l->min_per_token) l->min_per_token = during;
    l->at_last_token = now;
    l->tokens = index + 1;
}

static size_t inference_stack_used(void)
{
    return fw_stack_used((const unsigned char *)inference.guard, (const unsigned char *)(inference.stack +
                                                                                        INFERENCE_STACK_WORDS));
}

/* Appends to the report fw_generate wrote; returns nonzero if it could not. */
static int append_report(const char *path, const liveness *l)
{
    char text[128];
    int fd, n = snprintf(text, sizeof text, "heartbeats: %lu\nheartbeats_min_per_token: %lu\n",
                         (unsigned long)(l->at_last_token - l->at_start), (unsigned long)l->min_per_token);
    if ((fd = open(path, O_WRONLY | O_APPEND)) < 0) return 1;
    /* QEMU 7.2's semihosting opens mode "a" as O_WRONLY|O_CREAT, without O_APPEND, so a write
     * would land at offset 0: seek to the end */
    if (lseek(fd, 0, SEEK_END) < 0) n = -1;
    if (n <= 0 || write(fd, text, (size_t)n) != n) n = -1;
    return close(fd) != 0 || n < 0;
}

static void inference_task(void *unused)
{
    liveness l = {0, 0, 0, 0};
    int status;
    (void)unused;
    l.at_start = l.at_last_token = heartbeats;
    status = fw_generate(&request, on_token, &l, inference_stack_used);
    if (status == 0 && l.tokens > 0 && l.min_per_token == 0) {
        printf("colibri freertos: the heartbeat stood still while a token was computed (%lu heartbeats in all)\n",
               (unsigned long)(l.at_last_token - l.at_start));
        status = 3;
    }
    if (status == 0 && request.report_path && append_report(request.report_path, &l)) {
        printf("cannot append to %s\n", request.report_path);
        status = 1;
    }
    exit(status);   /* semihosting ends QEMU: the scheduler never returns to main */
}

/* The tick count, widened to 64 bits.  Only the inference task reads it (fw_generate, before
 * and after prefill and after the last token): right as long as two reads are less than one
 * wrap of the 32-bit count apart, 49 days at 1 kHz. */
uint64_t fw_ticks(void)
{
    static TickType_t last;
    static uint64_t wrapped;
    TickType_t now = xTaskGetTickCount();
    if (now < last) wrapped += (uint64_t)portMAX_DELAY + 1;
    last = now;
    return wrapped + now;
}

uint32_t fw_ticks_per_second(void) { return configTICK_RATE_HZ; }

void vApplicationGetIdleTaskMemory(StaticTask_t **tcb, StackType_t **stack, configSTACK_DEPTH_TYPE *words)
{
    *tcb = &idle_tcb;
    *stack = idle_stack;
    *words = configMINIMAL_STACK_SIZE;
}

void vApplicationStackOverflowHook(TaskHandle_t task, char *name)
{
    (void)task;
    printf("\ncolibri freertos: task %s overflowed its stack\n", name);
    exit(4);
}

void colibri_freertos_assert_failed(const char *file, int line)
{
    printf("\ncolibri freertos: kernel assertion failed at %s:%d\n", file, line);
    exit(4);
}

#if defined(__riscv)
/* The port's trap entry (portASM.S): the tick is its machine timer interrupt. */
extern void freertos_risc_v_trap_handler(void);
#endif

int main(int argc, char **argv)
{
    if (colibri_fw_image.stack_bytes != sizeof inference.stack) {   /* the report's stack_reserved would lie */
        printf("colibri freertos: the image plans a %lu-byte stack, the task has %lu\n",
               (unsigned long)colibri_fw_image.stack_bytes, (unsigned long)sizeof inference.stack);
        return 4;
    }
    if (fw_parse_args(argc, argv, &request)) return 2;
    fw_stack_paint((unsigned char *)inference.guard, (unsigned char *)inference.stack);   /* 0xA5, the kernel's fill */
    xTaskCreateStatic(heartbeat_task, "heartbeat", HEARTBEAT_STACK_WORDS, NULL, HEARTBEAT_PRIORITY, heartbeat_stack,
                      &heartbeat_tcb);
    xTaskCreateStatic(inference_task, "colibri", INFERENCE_STACK_WORDS, NULL, INFERENCE_PRIORITY, inference.stack,
                      &inference_tcb);
#if defined(__riscv)
    __asm__ volatile("csrw mtvec, %0" : : "r"(freertos_risc_v_trap_handler));   /* crt0 left its own */
#endif   /* Cortex-M: the port's handlers fill picolibc's vector table by name (FreeRTOSConfig.h) */
    vTaskStartScheduler();
    printf("colibri freertos: the scheduler did not start\n");
    return 4;
}
