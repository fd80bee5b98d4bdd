/* SPDX-License-Identifier: MIT */
/* Test helper: a model directory read with stdio and loaded with colibri_model_load, which
 * works on hosted targets and, through semihosting, on bare-metal boards (where
 * colibri_model_open has no file system to map). */
#ifndef COLIBRI_TEST_MODEL_FILES_H
#define COLIBRI_TEST_MODEL_FILES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri/colibri.h"

/* The file's bytes at `slack` bytes into a buffer of size + slack; NULL when unreadable. */
unsigned char *read_model_file(const char *dir, const char *name, size_t *len, size_t slack);

/* Loads MODEL_DIR from memory (weights moved to a 64-byte boundary); one model at a time:
 * free_model_files after colibri_model_close. */
colibri_status load_model_files(const char *dir, unsigned flags, colibri_model **model, colibri_error *err);
void free_model_files(void);

/* A session; bare metal has no arena to map, so it gets one from the heap (*buffer, to free after
 * destroying the session; NULL elsewhere). */
colibri_status create_session(colibri_model *model, const colibri_session_options *options, colibri_session **s,
                              void **buffer, colibri_error *err);

#endif
