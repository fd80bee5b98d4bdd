/* SPDX-License-Identifier: MIT */
/* What the harnesses share: libFuzzer's entry points, and where the bundled models are.
 *
 * COLIBRI_FUZZ_FIXTURE (the fixture model) and COLIBRI_FUZZ_MODEL (the demo model) are model
 * directories: the environment's value when set, else the source tree's, baked in by meson. */
#ifndef COLIBRI_FUZZ_H
#define COLIBRI_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define fuzz_model_dir(env, built_in) (getenv(env) && *getenv(env) ? getenv(env) : (built_in))

#endif
