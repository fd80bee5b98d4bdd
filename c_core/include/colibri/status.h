/* SPDX-License-Identifier: MIT */
/* Status codes and error details.
 *
 * Every fallible call returns a colibri_status and, when given a non-NULL
 * colibri_error, fills it with a message naming what was wrong (the field,
 * the tensor, the index).  The library never exits, aborts or prints. */
#ifndef COLIBRI_STATUS_H
#define COLIBRI_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum colibri_status {
    COLIBRI_OK = 0,
    COLIBRI_E_ARG,          /* invalid argument from the caller */
    COLIBRI_E_IO,           /* a file cannot be opened, read or mapped */
    COLIBRI_E_JSON,         /* colibri_model.json is not valid JSON */
    COLIBRI_E_LIMIT,        /* JSON too large, too deep, too many values */
    COLIBRI_E_VERSION,      /* unknown format or version */
    COLIBRI_E_MISSING,      /* a required field is absent */
    COLIBRI_E_TYPE,         /* a field has the wrong JSON type */
    COLIBRI_E_VALUE,        /* a field's value is out of range or unknown */
    COLIBRI_E_DTYPE,        /* unknown tensor dtype */
    COLIBRI_E_TENSOR,       /* a tensor is missing, duplicated or unknown */
    COLIBRI_E_SHAPE,        /* a tensor's shape disagrees with the hyper-parameters */
    COLIBRI_E_SIZE,         /* file_size != product(shape) * sizeof(dtype) */
    COLIBRI_E_ALIGN,        /* file_offset not aligned */
    COLIBRI_E_BOUNDS,       /* a tensor lies (partly) past the end of weights.bin */
    COLIBRI_E_OVERLAP,      /* two tensors share bytes */
    COLIBRI_E_CHECKSUM,     /* tensor bytes do not match their checksum */
    COLIBRI_E_NOMEM,        /* the arena (or the model's metadata block) cannot be had */
    COLIBRI_E_CONTEXT,      /* the session's context is full */
    COLIBRI_E_TOKEN,        /* a token id outside [0, vocab) */
    COLIBRI_E_DEVICE,       /* a device failed to compute (strict mode, or nothing to fall back to) */
    COLIBRI_STATUS_COUNT
} colibri_status;

#define COLIBRI_ERROR_MESSAGE_SIZE 256

typedef struct colibri_error {
    colibri_status status;
    char message[COLIBRI_ERROR_MESSAGE_SIZE];   /* NUL-terminated detail */
} colibri_error;

/* A short fixed description of a status, e.g. "tensor shape mismatch". */
const char *colibri_strerror(colibri_status status);

/* The enumerator's name, e.g. "COLIBRI_E_SHAPE". */
const char *colibri_status_name(colibri_status status);

#ifdef __cplusplus
}
#endif
#endif
