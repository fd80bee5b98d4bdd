/* SPDX-License-Identifier: MIT */
/* The FreeRTOS configuration of colibri's FreeRTOS image (firmware/freertos/main.c), for a
 * stock FreeRTOS-Kernel checkout (-Dfreertos_kernel=PATH, never copied into this repository).
 *
 * Everything is allocated statically: the kernel has no heap (no heap_*.c is linked), each
 * task's TCB and stack are arrays in main.c, and the session arena is the static block the
 * build planned (model_image.S).  No software timers, so timers.c adds nothing and there is
 * no timer task to give memory to. */
#ifndef FREERTOS_CONFIG_H
#define FREERTOS_CONFIG_H

/* Scheduling: preemptive, so the higher-priority heartbeat runs on every tick while the
 * inference task computes without ever blocking. */
#define configUSE_PREEMPTION                    1
#define configUSE_TIME_SLICING                  1
#define configUSE_PORT_OPTIMISED_TASK_SELECTION 0
#define configUSE_TICKLESS_IDLE                 0
#define configTICK_RATE_HZ                      1000   /* the report's ticks_per_second */
#define configMAX_PRIORITIES                    4
#define configMINIMAL_STACK_SIZE                128    /* words: the idle task's stack */
#define configMAX_TASK_NAME_LEN                 12
#define configIDLE_SHOULD_YIELD                 1
/* 32-bit ticks, the widest a 32-bit port takes: fw_ticks widens them to 64. */
#define configTICK_TYPE_WIDTH_IN_BITS           TICK_TYPE_WIDTH_32_BITS

/* The same type in every V10/V11 prototype of vApplicationGetIdleTaskMemory. */
#define configSTACK_DEPTH_TYPE                  uint32_t

/* Memory: static only. */
#define configSUPPORT_STATIC_ALLOCATION         1
#define configSUPPORT_DYNAMIC_ALLOCATION        0
#define configKERNEL_PROVIDED_STATIC_MEMORY     0      /* main.c gives the idle task its memory */

/* What the image uses of the kernel. */
#define configUSE_TIMERS                        0
#define configUSE_CO_ROUTINES                   0
#define configUSE_MUTEXES                       0
#define configUSE_RECURSIVE_MUTEXES             0
#define configUSE_COUNTING_SEMAPHORES           0
#define configUSE_QUEUE_SETS                    0
#define configQUEUE_REGISTRY_SIZE               0
#define configUSE_TASK_NOTIFICATIONS            1
#define configUSE_IDLE_HOOK                     0
#define configUSE_TICK_HOOK                     0
#define configUSE_MALLOC_FAILED_HOOK            0
#define configUSE_TRACE_FACILITY                0
#define configGENERATE_RUN_TIME_STATS           0
#define configENABLE_BACKWARD_COMPATIBILITY     0
/* Each task's stack is filled with a pattern when created: the overflow check looks at its
 * far end on every switch, and main.c measures the inference task's use (and a guard below it). */
#define configCHECK_FOR_STACK_OVERFLOW          2
#define INCLUDE_vTaskDelay                      1
#define INCLUDE_uxTaskGetStackHighWaterMark     0
#define INCLUDE_vTaskDelete                     0
#define INCLUDE_vTaskSuspend                    0
#define INCLUDE_xTaskGetSchedulerState          0

/* A failed kernel assertion ends the run with the file and line, status 4 (main.c). */
#ifndef __ASSEMBLER__
void colibri_freertos_assert_failed(const char *file, int line);
#endif
#define configASSERT(x) do { if (!(x)) colibri_freertos_assert_failed(__FILE__, __LINE__); } while (0)

#if defined(__arm__)
/* mps2-an386: Cortex-M4F, SysTick counts the 25 MHz system clock. */
#define configCPU_CLOCK_HZ                      25000000
/* The MPS2 boards implement 3 priority bits (QEMU 7.2's NVIC keeps all 8; the values below use
 * only the top 3, so they mean the same on both). */
#define configPRIO_BITS                         3
#define configLIBRARY_LOWEST_INTERRUPT_PRIORITY 7
#define configLIBRARY_MAX_SYSCALL_INTERRUPT_PRIORITY 5
#define configKERNEL_INTERRUPT_PRIORITY      (configLIBRARY_LOWEST_INTERRUPT_PRIORITY << (8 - configPRIO_BITS))
#define configMAX_SYSCALL_INTERRUPT_PRIORITY (configLIBRARY_MAX_SYSCALL_INTERRUPT_PRIORITY << (8 - configPRIO_BITS))
/* picolibc's crt0 owns the vector table and names its entries arm_*_isr (weak): the port's
 * handlers take those names and so fill the table; the port's handler check then passes. */
#define vPortSVCHandler     arm_svc_isr
#define xPortPendSVHandler  arm_pendsv_isr
#define xPortSysTickHandler arm_systick_isr

#elif defined(__riscv)
/* virt-rv32: the tick comes from the CLINT's mtime (10 MHz) and mtimecmp; the port's
 * portASM.S takes traps and needs its own interrupt stack. */
#define configCPU_CLOCK_HZ                      10000000   /* the port programs mtimecmp in mtime counts */
#define configMTIME_BASE_ADDRESS                0x0200BFF8UL
#define configMTIMECMP_BASE_ADDRESS             0x02004000UL
#define configISR_STACK_SIZE_WORDS              512
#endif

#endif
