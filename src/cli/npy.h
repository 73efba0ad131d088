/*
 * npy.h — the CLI's strict reader and writer for numpy's .npy format (v1.0, v2.0).
 *
 * This is the command-line tool's file layer, not part of libflashattn: it
 * uses only the public API (include/flashattn.h), plain malloc/free, and an
 * error message of its own (fa_npy_last_error()). The library never reads or
 * writes files.
 *
 * Accepted element types: the attention tensors' '<f4', '<f8', '<f2', and
 * '<u2' (read as bfloat16 bit patterns), and two integer types that are read
 * as raw arrays, never as attention tensors: '<i4' (int32 index files:
 * cu_seqlens, cache_seqlens, block tables) and '|u1' (uint8 code files:
 * FP8/FP4/INT8 codes, dropout keep-masks). Only little-endian, C order
 * ('fortran_order': False).
 * Everything is validated: magic, version, header length and padding, the
 * header dict's keys and values, shape (non-negative, no overflow), and the
 * file length, which must equal header + numel * itemsize exactly.
 *
 * Writes go to a temporary file beside the destination (symlinks resolved)
 * which is renamed over it only when complete: a failure never leaves a
 * partial file. Character devices and FIFOs are written in place, never
 * replaced; directories, block devices, sockets and files the caller may not
 * write (by permission bits, even as root) are refused.
 *
 * Errors are returned as the public fa_status codes (FA_ERR_IO, FA_ERR_FORMAT,
 * FA_ERR_DTYPE, ...) with a message the caller reads with fa_npy_last_error()
 * (thread-local, this file's own: fa_last_error() is the library's and is never
 * written here); messages name the file.
 */
#ifndef FA_NPY_H
#define FA_NPY_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The element types a .npy file may hold. */
typedef enum fa_npy_type {
    FA_NPY_F32,         /* '<f4' */
    FA_NPY_F64,         /* '<f8' */
    FA_NPY_F16,         /* '<f2' */
    FA_NPY_BF16,        /* '<u2', bfloat16 bit patterns */
    FA_NPY_I32,         /* '<i4', int32: index files, never a tensor */
    FA_NPY_U8,          /* '|u1', uint8: code files, never a tensor */
    FA_NPY_TYPE_COUNT
} fa_npy_type;

/* "float32", "int32", "uint8", ... / "<f4", "<i4", "|u1", ... */
const char *fa_npy_type_name(fa_npy_type type);
const char *fa_npy_type_descr(fa_npy_type type);
/* Bytes per element (0 for an invalid type). */
size_t fa_npy_type_size(fa_npy_type type);

/* The npy type that stores library dtype `dtype`; FA_ERR_DTYPE (no message) if none. */
fa_status fa_npy_type_of_dtype(fa_dtype dtype, fa_npy_type *type);

/* The message of the last failed fa_npy_* / fa_outfile_* call on this thread. */
const char *fa_npy_last_error(void);
void fa_npy_clear_error(void);

/* An array loaded from a .npy file; owns its data (free with fa_npy_free). */
typedef struct fa_npy {
    void *data;                   /* numel * itemsize bytes, 64-byte aligned */
    fa_dtype dtype;               /* float arrays: FA_F32, FA_F64, FA_F16, or FA_BF16 ('<u2');
                                   * integer arrays: FA_DTYPE_COUNT (no library dtype) */
    fa_npy_type type;             /* what the file holds (all six types) */
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

/* C-contiguous fa_tensor view over arr (no copy). Integer arrays are refused
 * (FA_ERR_DTYPE: they are index or code files, not attention tensors). */
fa_status fa_npy_as_tensor(const fa_npy *arr, fa_tensor *t);

/*
 * Write a C-contiguous array as .npy v1.0 (v2.0 if the header needs it),
 * byte-identical to numpy's np.save. FA_BF16 is written as '<u2'. Atomic for
 * regular files (see fa_outfile). fa_npy_save_type writes any fa_npy_type
 * (int32 as '<i4', uint8 as '|u1').
 */
fa_status fa_npy_save(const char *path, const void *data, fa_dtype dtype,
                      int rank, const int64_t *shape);
fa_status fa_npy_save_type(const char *path, const void *data, fa_npy_type type,
                           int rank, const int64_t *shape);

/* ---- Output files: atomic replace, or write-through for devices and FIFOs ---- */

typedef struct fa_outfile {
    int fd;             /* open descriptor (the temporary, or the device/FIFO), -1 when closed */
    int through;        /* 1: an existing character device or FIFO, written in place */
    int slot;           /* signal-cleanup registration of the temporary, -1 if none */
    int committed;      /* 1 after a successful fa_outfile_commit */
    char *target;       /* replace mode: the path with its symlinks resolved (renamed onto) */
    char *tmp;          /* replace mode: the temporary beside target, until committed */
    const char *name;   /* the caller's spelling of the path, for messages */
} fa_outfile;

/* Would fa_outfile_open accept `path`? Checks only (empty name, directory,
 * block device, socket, not writable, directory not writable); creates nothing. */
fa_status fa_outfile_check(const char *path);

/* Start writing `path`: create the temporary, or open the device/FIFO (a FIFO
 * blocks until a reader opens it). On error nothing was created. */
fa_status fa_outfile_open(fa_outfile *f, const char *path);

/* Append n bytes. */
fa_status fa_outfile_write(fa_outfile *f, const void *buf, size_t n);

/* Finish: fsync, close and rename the temporary over the target (or close the
 * device/FIFO). On error the temporary is removed and the target untouched. */
fa_status fa_outfile_commit(fa_outfile *f);

/* Give up: close and remove the temporary; the target is untouched. */
void fa_outfile_abort(fa_outfile *f);

/* Release what a committed (or aborted) fa_outfile still holds. */
void fa_outfile_free(fa_outfile *f);

/* Remove every live temporary with unlink(2) only: safe to call from a signal handler. */
void fa_outfile_cleanup_signal(void);

/* `path` with the symbolic links of its last component followed (also dangling
 * ones, up to 40 hops), malloc'd; NULL with errno set on failure. */
char *fa_path_resolve_links(const char *path);

/* Write the .npy header and data of a C-contiguous array to an open fa_outfile. */
fa_status fa_npy_write(fa_outfile *f, const void *data, fa_dtype dtype, int rank, const int64_t *shape);
fa_status fa_npy_write_type(fa_outfile *f, const void *data, fa_npy_type type, int rank, const int64_t *shape);

/* Index of the first NaN/Inf element (flat, C order), or -1 if all finite
 * (always -1 for integer arrays). */
int64_t fa_npy_find_nonfinite(const fa_npy *arr);

#endif /* FA_NPY_H */
