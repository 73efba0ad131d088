/*
 * npy.h — strict reader and writer for numpy's .npy format (v1.0, v2.0).
 *
 * Accepted element types: '<f4', '<f8', '<f2', and '<u2' (read as bfloat16
 * bit patterns). Only little-endian, C order ('fortran_order': False).
 * Everything is validated: magic, version, header length and padding, the
 * header dict's keys and values, shape (non-negative, no overflow), and the
 * file length, which must equal header + numel * itemsize exactly.
 *
 * Writes go to a temporary file in the same directory which is renamed over
 * the destination only when complete: a failure never leaves a partial file.
 *
 * Errors are returned as fa_status with a message via fa_fail(), which the
 * caller reads with fa_last_error(); messages name the file.
 */
#ifndef FA_NPY_H
#define FA_NPY_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

/* An array loaded from a .npy file; owns its data (free with fa_npy_free). */
typedef struct fa_npy {
    void *data;                   /* numel * itemsize bytes, 64-byte aligned */
    fa_dtype dtype;               /* FA_F32, FA_F64, FA_F16, or FA_BF16 ('<u2') */
    int rank;                     /* 0..FA_MAX_RANK (higher ranks are rejected) */
    int64_t shape[FA_MAX_RANK];
    int64_t numel;
} fa_npy;

/* Load `path`. On error, *arr is zeroed and the message names `path`. */
fa_status fa_npy_load(const char *path, fa_npy *arr);

/* Parse an in-memory .npy image (used by fa_npy_load and the fuzzer). */
fa_status fa_npy_parse(const void *bytes, size_t len, const char *name, fa_npy *arr);

/* Free data owned by arr and zero it. Safe on a zeroed struct. */
void fa_npy_free(fa_npy *arr);

/* C-contiguous fa_tensor view over arr (no copy). */
fa_status fa_npy_as_tensor(const fa_npy *arr, fa_tensor *t);

/*
 * Write a C-contiguous array as .npy v1.0 (v2.0 if the header needs it).
 * FA_BF16 is written as '<u2'. Atomic: temp file + rename.
 */
fa_status fa_npy_save(const char *path, const void *data, fa_dtype dtype,
                      int rank, const int64_t *shape);

/* Index of the first NaN/Inf element (flat, C order), or -1 if all finite. */
int64_t fa_npy_find_nonfinite(const fa_npy *arr);

#endif /* FA_NPY_H */
