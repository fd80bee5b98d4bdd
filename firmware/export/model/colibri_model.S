/* SPDX-License-Identifier: MIT */
/* The model as data for the firmware's linker: weights.bin (64-byte aligned, as
 * colibri_model_load requires), then colibri_model.json, in section `colibri_model`, which
 * the linker script places in flash (KEEP(*(colibri_model)) inside a `. = ALIGN(64)` output
 * section).  The assembler finds the two files through -I (CMakeLists.txt, meson.build pass
 * -Wa,-I<this folder>).  A toolchain without .incbin takes colibri_model.c instead. */
#ifndef COLIBRI_MODEL_SECTION
#define COLIBRI_MODEL_SECTION colibri_model
#endif
    .section COLIBRI_MODEL_SECTION, "a"
    .balign 64
    .global colibri_model_weights
colibri_model_weights:
    .incbin "weights.bin"
    .size colibri_model_weights, . - colibri_model_weights
    .global colibri_model_json
colibri_model_json:
    .incbin "colibri_model.json"
    .size colibri_model_json, . - colibri_model_json
