/*
 * npy.c — strict reader and writer for numpy's .npy format, versions 1.0 and 2.0.
 *
 * The format (numpy/lib/format.py, NEP 1):
 *
 *   offset 0   "\x93NUMPY"               magic, 6 bytes
 *          6   major, minor              1 byte each: 1.0 or 2.0 accepted here
 *          8   HEADER_LEN                uint16 LE (v1.0) or uint32 LE (v2.0)
 *   10 or 12   header                    HEADER_LEN bytes of latin-1 text: a Python
 *                                        dict literal, padded with spaces, ending '\n'
 *   after it   data                      numel * itemsize bytes, C order, exactly
 *
 * The header is e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * We parse it with a small recursive-descent parser of exactly the literal
 * subset numpy writes (string keys in ' or ", the three keys in any order, an
 * optional trailing comma, whitespace anywhere Python allows it) rather than
 * with pattern matching: anything outside that subset is an error with a
 * message that says what was expected, not a guess.
 *
 * Strictness is the point: a kernel engineer who hands us a half-written
 * file must hear "truncated", not get a silently zero-padded tensor. So the
 * file length must be header + numel * itemsize exactly; shapes are checked
 * for negative extents and for overflow of numel * itemsize; rank is at
 * most FA_MAX_RANK; only little-endian '<f4' '<f8' '<f2' and '<u2' (bfloat16
 * bit patterns: numpy has no bfloat16) are accepted as tensors, and '<i4'
 * (int32 index files) and '|u1' (uint8 code files) as raw integer arrays,
 * which fa_npy_as_tensor refuses. The version-3.0 format
 * (utf-8 headers, for structured dtypes with unicode names) is rejected by
 * name: no array we accept ever needs it.
 *
 * Loading reads the header first and then the data straight into its 64-byte
 * aligned buffer, so a 1 GiB tensor costs 1 GiB, not 2. A regular file's
 * length is checked against the header before anything is allocated; a pipe
 * or device (/dev/stdin, /dev/zero) is read for exactly the bytes its header
 * declares plus one (to tell trailing data from the end), never "until the
 * end", so an endless stream cannot exhaust memory. fa_npy_parse parses an
 * in-memory image (the fuzzer's entry point).
 *
 * Saving (the fa_outfile layer, also used for the bench CSV) first decides
 * what the path names, and never replaces what is not a regular file:
 *   - a character device or a FIFO (/dev/null, a `mknod` node, a named pipe,
 *     /dev/fd/N of a process substitution) is written in place, as a shell
 *     redirection would; nothing is renamed over it;
 *   - a regular file, or a name that does not exist yet, is written to a
 *     temporary ".fa-XXXXXX" in the directory of the path *after* its symbolic
 *     links are resolved (so a link stays a link and its target gets the
 *     data), then renamed over that target: rename(2) within a directory is
 *     atomic, readers see the old file or the complete new one, and a failure
 *     at any step unlinks the temporary. The short temporary name leaves room
 *     for any name the file system accepts (255 bytes). A replaced file keeps
 *     its permission bits (and, when root replaces it, its owner);
 *   - directories, block devices and sockets are refused, and so is an
 *     existing file the caller may not write by its permission bits -- for
 *     root too, who could: a 0444 file is not ours to overwrite.
 * Live temporaries are registered so that fa_outfile_cleanup_signal(), called
 * from a SIGINT/SIGTERM handler, removes them with async-signal-safe unlink(2).
 * The temporary is created with open(O_CREAT | O_EXCL, 0666), not mkstemp(),
 * whose 0600 mode would survive the rename; 0666 honours the umask.
 *
 * This file is the CLI's, not the library's: it uses only the public API,
 * plain malloc/free, and its own thread-local message (fa_npy_last_error()).
 * It never prints: errors are statuses whose message starts with the file name.
 */
#include "npy.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c reads and writes little-endian data in place; big-endian hosts are not supported"
#endif

/* ------------------------------------------------------------------------ */
/* Format constants                                                          */
/* ------------------------------------------------------------------------ */

static const char NPY_MAGIC[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
enum {
    NPY_MAGIC_LEN = 6,
    NPY_PREFIX_V1 = 10,              /* magic + version + uint16 length */
    NPY_PREFIX_V2 = 12,              /* magic + version + uint32 length */
    NPY_ALIGN = 64,                  /* numpy's ARRAY_ALIGN */
    NPY_GROWTH_DIGITS = 21,          /* numpy's GROWTH_AXIS_MAX_DIGITS */
    NPY_MAX_HEADER = 1 << 20,        /* our headers are ~128 bytes; refuse absurd ones */
};

/* The element types, by fa_npy_type: descr as numpy writes it, a name for
 * messages, the item size, and the library's dtype (FA_DTYPE_COUNT: none,
 * an integer array is never an attention tensor). */
static const struct npy_type_info {
    const char *descr, *name;
    size_t size;
    fa_dtype dtype;
} npy_types[FA_NPY_TYPE_COUNT] = {
    [FA_NPY_F32] = {"<f4", "float32", 4, FA_F32},
    [FA_NPY_F64] = {"<f8", "float64", 8, FA_F64},
    [FA_NPY_F16] = {"<f2", "float16", 2, FA_F16},
    [FA_NPY_BF16] = {"<u2", "bfloat16", 2, FA_BF16},
    [FA_NPY_I32] = {"<i4", "int32", 4, FA_DTYPE_COUNT},
    [FA_NPY_U8] = {"|u1", "uint8", 1, FA_DTYPE_COUNT},
};

const char *fa_npy_type_name(fa_npy_type type)
{
    return (unsigned)type < FA_NPY_TYPE_COUNT ? npy_types[type].name : "invalid";
}

const char *fa_npy_type_descr(fa_npy_type type)
{
    return (unsigned)type < FA_NPY_TYPE_COUNT ? npy_types[type].descr : "?";
}

size_t fa_npy_type_size(fa_npy_type type)
{
    return (unsigned)type < FA_NPY_TYPE_COUNT ? npy_types[type].size : 0;
}

fa_status fa_npy_type_of_dtype(fa_dtype dtype, fa_npy_type *type)
{
    for (int i = 0; i < FA_NPY_TYPE_COUNT; i++)
        if (npy_types[i].dtype == dtype && dtype != FA_DTYPE_COUNT) {
            *type = (fa_npy_type)i;
            return FA_OK;
        }
    return FA_ERR_DTYPE;
}

/* ------------------------------------------------------------------------ */
/* Errors: this file's own thread-local message                              */
/* ------------------------------------------------------------------------ */

/*
 * The CLI's file layer is not the library: it keeps its own message (read
 * with fa_npy_last_error()) and returns the public fa_status codes. The
 * library's fa_last_error() is never written here, so a message from one
 * cannot be mistaken for the other's.
 */
static _Thread_local char npy_errbuf[512];

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static fa_status npy_fail(fa_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(npy_errbuf, sizeof npy_errbuf, fmt, ap);
    va_end(ap);
    return status;
}

const char *fa_npy_last_error(void) { return npy_errbuf; }

void fa_npy_clear_error(void) { npy_errbuf[0] = '\0'; }

/* What the header dict says. */
typedef struct npy_header {
    fa_npy_type type;
    int rank;
    int64_t shape[FA_MAX_RANK];
    int64_t numel;
    size_t data_bytes;               /* numel * itemsize, overflow-checked */
} npy_header;

/* ------------------------------------------------------------------------ */
/* The fixed prefix: magic, version, header length                           */
/* ------------------------------------------------------------------------ */

/*
 * Validate the first bytes of a file of `file_len` bytes; `avail` of them are
 * in `buf` (at least min(file_len, 12)). On success *prefix_len is 10 or 12
 * and *header_len the length of the header text that follows it.
 */
static fa_status parse_prefix(const unsigned char *buf, size_t avail, size_t file_len,
                              const char *name, size_t *prefix_len, size_t *header_len)
{
    if (file_len == 0)
        return npy_fail(FA_ERR_FORMAT, "%s: empty file (not a .npy file)", name);
    size_t cmp = avail < NPY_MAGIC_LEN ? avail : NPY_MAGIC_LEN;
    if (memcmp(buf, NPY_MAGIC, cmp) != 0)
        return npy_fail(FA_ERR_FORMAT, "%s: not a .npy file (bad magic; expected \\x93NUMPY)", name);
    if (file_len < NPY_PREFIX_V1)
        return npy_fail(FA_ERR_FORMAT, "%s: truncated: %zu bytes is too short for a .npy header",
                       name, file_len);
    unsigned major = buf[6], minor = buf[7];
    if (major == 1 && minor == 0) {
        *prefix_len = NPY_PREFIX_V1;
        *header_len = (size_t)buf[8] | (size_t)buf[9] << 8;
    } else if (major == 2 && minor == 0) {
        if (file_len < NPY_PREFIX_V2)
            return npy_fail(FA_ERR_FORMAT, "%s: truncated: %zu bytes is too short for a .npy header",
                           name, file_len);
        *prefix_len = NPY_PREFIX_V2;
        *header_len = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 |
                      (size_t)buf[11] << 24;
    } else {
        return npy_fail(FA_ERR_FORMAT, "%s: unsupported .npy format version %u.%u (supported: 1.0, 2.0)",
                       name, major, minor);
    }
    if (*header_len == 0)
        return npy_fail(FA_ERR_FORMAT, "%s: header length is 0", name);
    if (*header_len > NPY_MAX_HEADER)
        return npy_fail(FA_ERR_FORMAT, "%s: header length %zu is implausibly large (limit %d)",
                       name, *header_len, NPY_MAX_HEADER);
    if (*header_len > file_len - *prefix_len)
        return npy_fail(FA_ERR_FORMAT,
                       "%s: truncated: header length %zu runs past the end of the file (%zu bytes)",
                       name, *header_len, file_len);
    return FA_OK;
}

/* ------------------------------------------------------------------------ */
/* The header dict                                                           */
/* ------------------------------------------------------------------------ */

/* A cursor over the header text [p, end). */
typedef struct cursor {
    const char *p, *end;
    const char *name;                /* file name, for messages */
} cursor;

static void skip_ws(cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

/* Consume `ch` (after whitespace) or fail saying what was expected. */
static fa_status expect(cursor *c, char ch, const char *what)
{
    skip_ws(c);
    if (c->p >= c->end || *c->p != ch)
        return npy_fail(FA_ERR_FORMAT, "%s: malformed header: expected '%c' %s", c->name, ch, what);
    c->p++;
    return FA_OK;
}

/* Peek the next non-space character, or 0 at the end. */
static char peek(cursor *c)
{
    skip_ws(c);
    return c->p < c->end ? *c->p : 0;
}

/* A Python string literal in ' or " quotes without escapes, copied to out[cap]. */
static fa_status parse_string(cursor *c, char *out, size_t cap, const char *what)
{
    char q = peek(c);
    if (q != '\'' && q != '"')
        return npy_fail(FA_ERR_FORMAT, "%s: malformed header: expected a quoted string for %s",
                       c->name, what);
    c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || *c->p == '\n')
            return npy_fail(FA_ERR_FORMAT, "%s: malformed header: unsupported character in %s",
                           c->name, what);
        if (n + 1 < cap) out[n] = *c->p;
        n++;
        c->p++;
    }
    if (c->p >= c->end)
        return npy_fail(FA_ERR_FORMAT, "%s: malformed header: unterminated string in %s", c->name, what);
    c->p++;
    if (n + 1 > cap) n = cap - 1; /* too long: truncated copy cannot match any valid value */
    out[n] = '\0';
    return FA_OK;
}

/* True/False. */
static fa_status parse_bool(cursor *c, int *value)
{
    skip_ws(c);
    size_t left = (size_t)(c->end - c->p);
    if (left >= 4 && memcmp(c->p, "True", 4) == 0) {
        c->p += 4;
        *value = 1;
    } else if (left >= 5 && memcmp(c->p, "False", 5) == 0) {
        c->p += 5;
        *value = 0;
    } else {
        return npy_fail(FA_ERR_FORMAT, "%s: malformed header: fortran_order must be True or False",
                       c->name);
    }
    return FA_OK;
}

/*
 * A non-negative decimal integer (an optional trailing 'L' is tolerated: files
 * written by Python 2 numpy say (3L, 4L)). Negative and overflowing extents get
 * their own messages.
 */
static fa_status parse_extent(cursor *c, int64_t *value)
{
    skip_ws(c);
    int negative = 0;
    if (c->p < c->end && (*c->p == '-' || *c->p == '+')) {
        negative = *c->p == '-';
        c->p++;
    }
    if (c->p >= c->end || *c->p < '0' || *c->p > '9')
        return npy_fail(FA_ERR_FORMAT, "%s: malformed header: shape must be a tuple of integers",
                       c->name);
    const char *start = c->p;
    int64_t v = 0;
    int overflow = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        int digit = *c->p - '0';
        if (v > (INT64_MAX - digit) / 10) overflow = 1;
        else v = v * 10 + digit;
        c->p++;
    }
    if (c->p < c->end && *c->p == 'L') c->p++;
    int len = (int)(c->p - start);
    if (negative && !(v == 0 && !overflow))
        return npy_fail(FA_ERR_FORMAT, "%s: negative dimension -%.*s in shape", c->name, len, start);
    if (overflow)
        return npy_fail(FA_ERR_FORMAT, "%s: dimension %.*s in shape overflows a 64-bit integer",
                       c->name, len, start);
    *value = v;
    return FA_OK;
}

/* (a, b, c) with an optional trailing comma; a 1-tuple needs its comma: (3,). */
/*
 * The element count of a shape whose extents are all >= 0, under the one rule the
 * loader and the saver share (so that every array one accepts the other does):
 * any zero extent makes the array empty whatever the others are; otherwise
 * numel * itemsize must fit in both int64 and size_t. Returns 0 if it does not.
 */
static int npy_numel(fa_npy_type type, int rank, const int64_t *shape, int64_t *numel)
{
    uint64_t limit = (uint64_t)INT64_MAX < SIZE_MAX ? (uint64_t)INT64_MAX : (uint64_t)SIZE_MAX;
    limit /= npy_types[type].size;
    for (int i = 0; i < rank; i++)
        if (shape[i] == 0) {
            *numel = 0;
            return 1;
        }
    uint64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (n > limit / (uint64_t)shape[i]) return 0;
        n *= (uint64_t)shape[i];
    }
    *numel = (int64_t)n;
    return 1;
}

static fa_status parse_shape(cursor *c, npy_header *h)
{
    fa_status st;
    if ((st = expect(c, '(', "to open the shape tuple")) != FA_OK) return st;
    int rank = 0, commas = 0;
    for (;;) {
        if (peek(c) == ')') {
            c->p++;
            break;
        }
        if (rank > 0 && commas < rank)
            return npy_fail(FA_ERR_FORMAT, "%s: malformed header: expected ',' or ')' in shape", c->name);
        int64_t extent = 0;
        if ((st = parse_extent(c, &extent)) != FA_OK) return st;
        if (rank < FA_MAX_RANK) h->shape[rank] = extent;
        rank++;
        if (peek(c) == ',') {
            c->p++;
            commas++;
        }
    }
    if (rank == 1 && commas == 0)
        return npy_fail(FA_ERR_FORMAT, "%s: malformed header: shape must be a tuple, e.g. (3,)", c->name);
    if (rank > FA_MAX_RANK)
        return npy_fail(FA_ERR_FORMAT, "%s: rank %d exceeds the maximum rank %d", c->name, rank,
                       FA_MAX_RANK);
    h->rank = rank;
    return FA_OK;
}

/* Map a descr string to a dtype, or explain why not. */
static fa_status parse_descr(const char *descr, const char *name, fa_npy_type *type)
{
    for (int i = 0; i < FA_NPY_TYPE_COUNT; i++) {
        if (strcmp(descr, npy_types[i].descr) == 0) {
            *type = (fa_npy_type)i;
            return FA_OK;
        }
    }
    if (descr[0] == '>')
        return npy_fail(FA_ERR_DTYPE, "%s: big-endian dtype '%s' is not supported (use little-endian '<')",
                       name, descr);
    return npy_fail(FA_ERR_DTYPE,
                   "%s: unsupported dtype '%s' (supported: '<f4', '<f8', '<f2', '<u2' as bfloat16, "
                   "and for index and code files '<i4' and '|u1')",
                   name, descr);
}

/*
 * Parse the header text [text, text + len): the dict, then only spaces, then
 * a final '\n'. Fills h including numel and data_bytes.
 */
static fa_status parse_header(const char *text, size_t len, const char *name, npy_header *h)
{
    if (text[len - 1] != '\n')
        return npy_fail(FA_ERR_FORMAT, "%s: malformed header: does not end with a newline", name);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)text[i];
        if (ch < 0x20 && ch != '\n' && ch != '\t' && ch != '\r')
            return npy_fail(FA_ERR_FORMAT, "%s: malformed header: control character at byte %zu",
                           name, i);
    }
    cursor c = {text, text + len - 1, name};
    fa_status st;
    int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0;
    char descr[32];

    if ((st = expect(&c, '{', "at the start of the header dict")) != FA_OK) return st;
    for (;;) {
        if (peek(&c) == '}') {
            c.p++;
            break;
        }
        char key[32];
        if ((st = parse_string(&c, key, sizeof key, "a header key")) != FA_OK) return st;
        if ((st = expect(&c, ':', "after a header key")) != FA_OK) return st;
        int *seen;
        if (strcmp(key, "descr") == 0) {
            seen = &have_descr;
            if (peek(&c) == '[')
                return npy_fail(FA_ERR_DTYPE, "%s: structured dtypes are not supported", name);
            if ((st = parse_string(&c, descr, sizeof descr, "descr")) != FA_OK) return st;
        } else if (strcmp(key, "fortran_order") == 0) {
            seen = &have_order;
            if ((st = parse_bool(&c, &fortran)) != FA_OK) return st;
        } else if (strcmp(key, "shape") == 0) {
            seen = &have_shape;
            if ((st = parse_shape(&c, h)) != FA_OK) return st;
        } else {
            return npy_fail(FA_ERR_FORMAT, "%s: malformed header: unexpected key '%s'", name, key);
        }
        if (*seen)
            return npy_fail(FA_ERR_FORMAT, "%s: malformed header: duplicate key '%s'", name, key);
        *seen = 1;
        char next = peek(&c);
        if (next == ',') {
            c.p++;
        } else if (next != '}') {
            return npy_fail(FA_ERR_FORMAT, "%s: malformed header: expected ',' or '}' after '%s'",
                           name, key);
        }
    }
    skip_ws(&c);
    if (c.p != c.end)
        return npy_fail(FA_ERR_FORMAT, "%s: malformed header: unexpected text after the dict", name);
    if (!have_descr || !have_order || !have_shape)
        return npy_fail(FA_ERR_FORMAT, "%s: malformed header: missing key '%s'", name,
                       !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    if ((st = parse_descr(descr, name, &h->type)) != FA_OK) return st;
    if (fortran)
        return npy_fail(FA_ERR_FORMAT, "%s: Fortran order not supported (save a C-order array, "
                       "e.g. np.ascontiguousarray)", name);

    if (!npy_numel(h->type, h->rank, h->shape, &h->numel))
        return npy_fail(FA_ERR_FORMAT, "%s: shape is too large: its byte size overflows", name);
    h->data_bytes = (size_t)h->numel * npy_types[h->type].size;
    return FA_OK;
}

/* The data length must match exactly. */
static fa_status check_data_length(const npy_header *h, size_t found, const char *name)
{
    if (found < h->data_bytes)
        return npy_fail(FA_ERR_FORMAT, "%s: truncated: expected %zu data bytes, found %zu",
                       name, h->data_bytes, found);
    if (found > h->data_bytes)
        return npy_fail(FA_ERR_FORMAT,
                       "%s: trailing data after the array: expected %zu data bytes, found %zu",
                       name, h->data_bytes, found);
    return FA_OK;
}

/* Allocate arr's data (at least one byte so that an empty array has a non-NULL pointer). */
static fa_status npy_alloc(const npy_header *h, const char *name, fa_npy *arr)
{
    /* plain posix_memalign: the CLI's arrays are not the library's buffers */
    void *mem = NULL;
    size_t bytes = h->data_bytes > 0 ? h->data_bytes : 1;
    if (posix_memalign(&mem, NPY_ALIGN, bytes) != 0) mem = NULL;
    arr->data = mem;
    if (!arr->data)
        return npy_fail(FA_ERR_NOMEM, "%s: cannot allocate %zu bytes for the array", name, h->data_bytes);
    arr->type = h->type;
    arr->dtype = npy_types[h->type].dtype;
    arr->rank = h->rank;
    for (int i = 0; i < FA_MAX_RANK; i++) arr->shape[i] = i < h->rank ? h->shape[i] : 0;
    arr->numel = h->numel;
    return FA_OK;
}

/* ------------------------------------------------------------------------ */
/* Reading                                                                   */
/* ------------------------------------------------------------------------ */

fa_status fa_npy_parse(const void *bytes, size_t len, const char *name, fa_npy *arr)
{
    if (!arr) return npy_fail(FA_ERR_NULL_ARG, "fa_npy_parse: arr is NULL");
    memset(arr, 0, sizeof *arr);
    if (!name) name = "<memory>";
    if (!bytes && len > 0) return npy_fail(FA_ERR_NULL_ARG, "%s: bytes is NULL", name);
    const unsigned char *buf = bytes;
    size_t prefix_len, header_len;
    fa_status st = parse_prefix(buf, len, len, name, &prefix_len, &header_len);
    if (st != FA_OK) return st;
    npy_header h;
    memset(&h, 0, sizeof h);
    if ((st = parse_header((const char *)buf + prefix_len, header_len, name, &h)) != FA_OK) return st;
    size_t offset = prefix_len + header_len;
    if ((st = check_data_length(&h, len - offset, name)) != FA_OK) return st;
    if ((st = npy_alloc(&h, name, arr)) != FA_OK) return st;
    if (h.data_bytes > 0) memcpy(arr->data, buf + offset, h.data_bytes);
    return FA_OK;
}

/* Read up to n bytes; returns the count read (short only at end of file) or -1. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/*
 * A pipe, a device or another file of unknown size: the header first (so
 * /dev/zero is refused by its magic after 10 bytes), then exactly the data
 * the header declares, straight into place, then one more byte to tell the
 * end of the file from trailing data. Never more than header + data + 1
 * bytes are read, whatever the stream holds.
 */
static fa_status load_stream(int fd, const char *path, fa_npy *arr)
{
    unsigned char prefix[NPY_PREFIX_V2];
    ssize_t r = read_full(fd, prefix, NPY_PREFIX_V1);
    if (r < 0) return npy_fail(FA_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    size_t got = (size_t)r;
    if (got == NPY_PREFIX_V1 && memcmp(prefix, NPY_MAGIC, NPY_MAGIC_LEN) == 0 && prefix[6] == 2) {
        r = read_full(fd, prefix + got, NPY_PREFIX_V2 - NPY_PREFIX_V1);
        if (r < 0) return npy_fail(FA_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        got += (size_t)r;
    }
    size_t prefix_len, header_len;
    /* a short read is the whole stream; otherwise its length is not known yet */
    size_t known = got < NPY_PREFIX_V1 || (prefix[6] == 2 && got < NPY_PREFIX_V2) ? got : SIZE_MAX;
    fa_status st = parse_prefix(prefix, got, known, path, &prefix_len, &header_len);
    if (st != FA_OK) return st;

    char *text = malloc(header_len);
    if (!text) return npy_fail(FA_ERR_NOMEM, "%s: out of memory reading the header", path);
    r = read_full(fd, text, header_len);
    if (r < 0 || (size_t)r != header_len) {
        int e = errno;
        free(text);
        if (r < 0) return npy_fail(FA_ERR_IO, "%s: reading the header failed: %s", path, strerror(e));
        return npy_fail(FA_ERR_FORMAT,
                       "%s: truncated: header length %zu runs past the end of the file (%zu bytes)",
                       path, header_len, prefix_len + (size_t)r);
    }
    npy_header h;
    memset(&h, 0, sizeof h);
    st = parse_header(text, header_len, path, &h);
    free(text);
    if (st != FA_OK) return st;

    if ((st = npy_alloc(&h, path, arr)) != FA_OK) return st;
    r = read_full(fd, arr->data, h.data_bytes);
    if (r < 0 || (size_t)r != h.data_bytes) {
        int e = errno;
        fa_npy_free(arr);
        if (r < 0) return npy_fail(FA_ERR_IO, "%s: reading the data failed: %s", path, strerror(e));
        return npy_fail(FA_ERR_FORMAT, "%s: truncated: expected %zu data bytes, found %zu",
                       path, h.data_bytes, (size_t)r);
    }
    unsigned char extra;
    r = read_full(fd, &extra, 1);
    if (r != 0) {
        int e = errno;
        fa_npy_free(arr);
        if (r < 0) return npy_fail(FA_ERR_IO, "%s: read failed: %s", path, strerror(e));
        return npy_fail(FA_ERR_FORMAT, "%s: trailing data after the array: expected %zu data bytes, found more",
                       path, h.data_bytes);
    }
    return FA_OK;
}

/* A regular file of known size: header first, then the data straight into place. */
static fa_status load_regular(int fd, size_t file_len, const char *path, fa_npy *arr)
{
    unsigned char prefix[NPY_PREFIX_V2];
    size_t want = file_len < sizeof prefix ? file_len : sizeof prefix;
    ssize_t r = read_full(fd, prefix, want);
    if (r < 0) return npy_fail(FA_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    if ((size_t)r != want) return npy_fail(FA_ERR_IO, "%s: file shrank while being read", path);

    size_t prefix_len, header_len;
    fa_status st = parse_prefix(prefix, want, file_len, path, &prefix_len, &header_len);
    if (st != FA_OK) return st;

    char *text = malloc(header_len);
    if (!text) return npy_fail(FA_ERR_NOMEM, "%s: out of memory reading the header", path);
    /* the prefix buffer may already hold the first bytes of the header */
    size_t have = want - prefix_len;
    memcpy(text, prefix + prefix_len, have);
    r = read_full(fd, text + have, header_len - have);
    if (r < 0 || (size_t)r != header_len - have) {
        int e = errno;
        free(text);
        return npy_fail(FA_ERR_IO, "%s: reading the header failed: %s", path,
                       r < 0 ? strerror(e) : "file shrank while being read");
    }
    npy_header h;
    memset(&h, 0, sizeof h);
    st = parse_header(text, header_len, path, &h);
    free(text);
    if (st != FA_OK) return st;

    if ((st = check_data_length(&h, file_len - prefix_len - header_len, path)) != FA_OK) return st;
    if ((st = npy_alloc(&h, path, arr)) != FA_OK) return st;
    r = read_full(fd, arr->data, h.data_bytes);
    if (r < 0 || (size_t)r != h.data_bytes) {
        int e = errno;
        fa_npy_free(arr);
        if (r < 0) return npy_fail(FA_ERR_IO, "%s: reading the data failed: %s", path, strerror(e));
        return npy_fail(FA_ERR_FORMAT, "%s: truncated: expected %zu data bytes, found %zu",
                       path, h.data_bytes, (size_t)r);
    }
    return FA_OK;
}

fa_status fa_npy_load(const char *path, fa_npy *arr)
{
    if (!arr) return npy_fail(FA_ERR_NULL_ARG, "fa_npy_load: arr is NULL");
    memset(arr, 0, sizeof *arr);
    if (!path) return npy_fail(FA_ERR_NULL_ARG, "fa_npy_load: path is NULL");
    int fd;
    do {
        fd = open(path, O_RDONLY);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return npy_fail(FA_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    fa_status st;
    if (fstat(fd, &sb) != 0) {
        st = npy_fail(FA_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        st = npy_fail(FA_ERR_IO, "%s: is a directory, not a .npy file", path);
    } else if (S_ISREG(sb.st_mode)) {
        st = load_regular(fd, (size_t)sb.st_size, path, arr);
    } else {
        st = load_stream(fd, path, arr);
    }
    close(fd);
    if (st != FA_OK) memset(arr, 0, sizeof *arr);
    return st;
}

void fa_npy_free(fa_npy *arr)
{
    if (!arr) return;
    free(arr->data);
    memset(arr, 0, sizeof *arr);
}

fa_status fa_npy_as_tensor(const fa_npy *arr, fa_tensor *t)
{
    if (!arr || !t) return npy_fail(FA_ERR_NULL_ARG, "fa_npy_as_tensor: NULL argument");
    if ((unsigned)arr->type >= FA_NPY_TYPE_COUNT)
        return npy_fail(FA_ERR_DTYPE, "invalid array type %d", (int)arr->type);
    if (npy_types[arr->type].dtype == FA_DTYPE_COUNT)
        return npy_fail(FA_ERR_DTYPE,
                        "unsupported dtype '%s' for an attention tensor: %s arrays are read only as index "
                        "or code files (tensors: '<f4', '<f8', '<f2', or '<u2' as bfloat16)",
                        npy_types[arr->type].descr, npy_types[arr->type].name);
    if (arr->rank < 1)
        return npy_fail(FA_ERR_SHAPE, "a rank-0 (scalar) array cannot be used as a tensor");
    fa_status st = fa_tensor_make(t, arr->data, arr->dtype, arr->rank, arr->shape, NULL);
    if (st != FA_OK) return npy_fail(st, "%s", fa_last_error());
    return FA_OK;
}

int64_t fa_npy_find_nonfinite(const fa_npy *arr)
{
    if (!arr || !arr->data) return -1;
    for (int64_t i = 0; i < arr->numel; i++) {
        int bad;
        switch (arr->type) {
        case FA_NPY_F32: bad = !isfinite(((const float *)arr->data)[i]); break;
        case FA_NPY_F64: bad = !isfinite(((const double *)arr->data)[i]); break;
        case FA_NPY_F16: bad = (((const uint16_t *)arr->data)[i] & 0x7c00u) == 0x7c00u; break;
        case FA_NPY_BF16: bad = (((const uint16_t *)arr->data)[i] & 0x7f80u) == 0x7f80u; break;
        default: return -1; /* integers are always finite */
        }
        if (bad) return i;
    }
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                   */
/* ------------------------------------------------------------------------ */

/*
 * Build the complete header (prefix + dict + padding + '\n') exactly as numpy
 * >= 1.24 writes it, so our files are byte-identical to np.save's: keys sorted,
 * repr() values, 21 - len(repr(shape[0])) spaces of room for growth, then
 * padding so that the data starts at a multiple of 64 (a full 64 spaces when
 * it already would). Version 2.0 only if the length does not fit 16 bits.
 * Returns the length, or 0 if out[cap] is too small.
 */
static size_t build_header(fa_npy_type type, int rank, const int64_t *shape, char *out, size_t cap)
{
    char dict[256];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                     npy_types[type].descr);
    for (int i = 0; i < rank; i++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, i ? ", %lld" : "%lld", (long long)shape[i]);
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%s), }", rank == 1 ? "," : "");
    if (rank > 0) {
        int digits = snprintf(NULL, 0, "%lld", (long long)shape[0]);
        for (int i = digits; i < NPY_GROWTH_DIGITS; i++) dict[n++] = ' ';
    }
    size_t hlen = (size_t)n + 1; /* + '\n' */
    size_t prefix = NPY_PREFIX_V1;
    size_t pad = NPY_ALIGN - (prefix + hlen) % NPY_ALIGN;
    if (hlen + pad > 0xffff) {
        prefix = NPY_PREFIX_V2;
        pad = NPY_ALIGN - (prefix + hlen) % NPY_ALIGN;
    }
    size_t total = prefix + hlen + pad;
    if (total > cap) return 0;
    size_t field = hlen + pad;
    memcpy(out, NPY_MAGIC, NPY_MAGIC_LEN);
    out[6] = prefix == NPY_PREFIX_V1 ? 1 : 2;
    out[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++) out[8 + i] = (char)(field >> (8 * i) & 0xff);
    memcpy(out + prefix, dict, (size_t)n);
    memset(out + prefix + (size_t)n, ' ', pad);
    out[total - 1] = '\n';
    return total;
}

/* ------------------------------------------------------------------------ */
/* Output files                                                              */
/* ------------------------------------------------------------------------ */

/*
 * Signal cleanup. Every temporary that exists is listed here, so that a
 * SIGINT/SIGTERM handler (the CLI's) can remove it with nothing but unlink(2),
 * which is async-signal-safe. A slot is 0 (free), 2 (reserved), 3 (its name
 * is set and the file is being created) or 1 (live: name holds a file of
 * ours). Signals are blocked in this thread while a temporary is created and
 * while it is renamed or removed and unregistered; but a process-directed
 * signal may be handled by another thread (OpenBLAS and OpenMP keep threads
 * of their own), so the handler waits out a creation in progress (state 3)
 * instead of missing the file it is about to produce.
 */
enum { OUT_SLOTS = 16 };
static char out_slot_name[OUT_SLOTS][PATH_MAX];
static atomic_int out_slot_state[OUT_SLOTS];

static void block_signals(sigset_t *old)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGPIPE);
    sigprocmask(SIG_BLOCK, &set, old);
}

static void restore_signals(const sigset_t *old)
{
    sigprocmask(SIG_SETMASK, old, NULL);
}

/* Reserve a free slot; -1 if none is free. */
static int slot_reserve(void)
{
    for (int s = 0; s < OUT_SLOTS; s++) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&out_slot_state[s], &expected, 2)) return s;
    }
    return -1;
}

static void slot_release(int s)
{
    if (s >= 0) atomic_store(&out_slot_state[s], 0);
}

void fa_outfile_cleanup_signal(void)
{
    for (int s = 0; s < OUT_SLOTS; s++) {
        int st;
        /* a creation in progress in another thread ends in microseconds; bounded anyway */
        for (long spin = 0; (st = atomic_load(&out_slot_state[s])) == 3 && spin < 100000000L; spin++)
            continue;
        if (st == 1) unlink(out_slot_name[s]);
    }
}

/* Directory part of `path` ("." if none, "/" for "/x"), malloc'd. */
static char *dir_part(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = '\0';
    return d;
}

char *fa_path_resolve_links(const char *path)
{
    char *cur = strdup(path);
    if (!cur) return NULL;
    for (int hops = 0; hops < 40; hops++) {
        struct stat lsb;
        if (lstat(cur, &lsb) != 0 || !S_ISLNK(lsb.st_mode)) return cur; /* missing, or not a link */
        char link[PATH_MAX];
        ssize_t n = readlink(cur, link, sizeof link - 1);
        if (n < 0) {
            int e = errno;
            free(cur);
            errno = e;
            return NULL;
        }
        link[n] = '\0';
        char *next;
        if (link[0] == '/') {
            next = strdup(link);
        } else { /* relative to the directory holding the link */
            char *dir = dir_part(cur);
            next = dir ? malloc(strlen(dir) + 1 + (size_t)n + 1) : NULL;
            if (next) sprintf(next, "%s/%s", dir, link);
            free(dir);
        }
        free(cur);
        if (!next) {
            errno = ENOMEM;
            return NULL;
        }
        cur = next;
    }
    free(cur);
    errno = ELOOP;
    return NULL;
}

/* Is the caller in group g? */
static int in_group(gid_t g)
{
    if (g == getegid()) return 1;
    gid_t groups[256];
    int n = getgroups(256, groups);
    for (int i = 0; i < n; i++)
        if (groups[i] == g) return 1;
    return 0;
}

/*
 * May the caller write this existing file? The kernel's answer (faccessat
 * with the effective ids: ACLs, read-only mounts), and for root, who passes
 * every permission check, the permission bits read as for anyone else: the
 * owner's bits if root owns the file, the group's if root is in its group,
 * else the others'. A 0444 file is not something to overwrite because root
 * can.
 */
static int may_write(const char *path, const struct stat *sb)
{
    if (faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) != 0) return 0;
    if (geteuid() != 0) return 1;
    if (sb->st_uid == geteuid()) return (sb->st_mode & S_IWUSR) != 0;
    if (in_group(sb->st_gid)) return (sb->st_mode & S_IWGRP) != 0;
    return (sb->st_mode & S_IWOTH) != 0;
}

/*
 * Decide how `path` is written, without touching anything:
 *   *through = 1: an existing character device or FIFO, written in place;
 *   *through = 0: a regular file (existing or new) replaced through a
 *                 temporary beside *target, the path with its symlinks
 *                 resolved (malloc'd); *old is its stat if it exists.
 * Directories, block devices, sockets, files the caller could not write
 * (see may_write) and directories the caller cannot create files in are
 * refused with a message naming `path`.
 */
static fa_status classify(const char *path, int *through, char **target, struct stat *old, int *exists)
{
    *through = 0;
    *target = NULL;
    *exists = 0;
    if (!path) return npy_fail(FA_ERR_NULL_ARG, "output path is NULL");
    if (!*path) return npy_fail(FA_ERR_IO, "empty file name given for an output file");
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) return npy_fail(FA_ERR_IO, "%s: is a directory, not a file name", path);
        if (S_ISBLK(sb.st_mode))
            return npy_fail(FA_ERR_IO, "%s: is a block device; refusing to write a .npy file onto it", path);
        if (!S_ISREG(sb.st_mode) && !S_ISCHR(sb.st_mode) && !S_ISFIFO(sb.st_mode))
            return npy_fail(FA_ERR_IO, "%s: is not a regular file, character device or FIFO; refusing to write to it",
                           path);
        if (!may_write(path, &sb))
            return npy_fail(FA_ERR_IO, "%s: not writable (mode %04o, owner uid %ld); refusing to replace it", path,
                           (unsigned)(sb.st_mode & 07777), (long)sb.st_uid);
        if (!S_ISREG(sb.st_mode)) {
            *through = 1;
            return FA_OK;
        }
        *exists = 1;
        *old = sb;
    } else if (errno != ENOENT) {
        return npy_fail(FA_ERR_IO, "%s: cannot write there: %s", path, strerror(errno));
    }
    char *t = fa_path_resolve_links(path);
    if (!t) return npy_fail(FA_ERR_IO, "%s: cannot resolve its symbolic links: %s", path, strerror(errno));
    char *dir = dir_part(t);
    if (!dir) {
        free(t);
        return npy_fail(FA_ERR_NOMEM, "%s: out of memory", path);
    }
    if (access(dir, W_OK | X_OK) != 0) {
        fa_status st = npy_fail(FA_ERR_IO, "%s: cannot write there: directory '%s': %s", path, dir, strerror(errno));
        free(dir);
        free(t);
        return st;
    }
    free(dir);
    *target = t;
    return FA_OK;
}

/*
 * "/dev/stdout", "/dev/stderr", "/dev/fd/N" and "/proc/self/fd/N" name a stream
 * the caller already opened (`-o /dev/stdout >> log`). Resolving them to the
 * file behind and replacing that file would drop what the shell appended
 * before and after; they are written through the open descriptor instead, at
 * its offset and in its mode. Returns N, or -1 for any other path.
 */
static int open_stream_fd(const char *path)
{
    if (strcmp(path, "/dev/stdout") == 0) return 1;
    if (strcmp(path, "/dev/stderr") == 0) return 2;
    const char *num = NULL;
    if (strncmp(path, "/dev/fd/", 8) == 0) num = path + 8;
    else if (strncmp(path, "/proc/self/fd/", 14) == 0) num = path + 14;
    if (!num || *num < '0' || *num > '9') return -1;
    long n = 0;
    for (const char *c = num; *c; c++) {
        if (*c < '0' || *c > '9' || n > 1000000) return -1;
        n = n * 10 + (*c - '0');
    }
    return (int)n;
}

/* FA_OK if descriptor fd is open for writing. */
static fa_status stream_writable(const char *path, int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) return npy_fail(FA_ERR_IO, "%s: descriptor %d is not open", path, fd);
    if ((fl & O_ACCMODE) == O_RDONLY)
        return npy_fail(FA_ERR_IO, "%s: descriptor %d is open for reading only", path, fd);
    return FA_OK;
}

fa_status fa_outfile_check(const char *path)
{
    int sfd = path ? open_stream_fd(path) : -1;
    if (sfd >= 0) return stream_writable(path, sfd);
    int through, exists;
    char *target;
    struct stat old;
    fa_status st = classify(path, &through, &target, &old, &exists);
    free(target);
    return st;
}

/*
 * Create "<dir of target>/.fa-XXXXXX" exclusively: a short name, so that any
 * target name the file system accepts (up to 255 bytes) leaves room for it.
 * Mode 0666 minus the umask, as for any new file (mkstemp's 0600 would
 * survive the rename), or the mode and owner of the file being replaced.
 */
static int create_temp(fa_outfile *f, const struct stat *old, int exists)
{
    static atomic_uint counter;
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    char *dir = dir_part(f->target);
    if (!dir) return -1;
    size_t cap = strlen(dir) + 16;
    char *name = malloc(cap);
    if (!name) {
        free(dir);
        return -1;
    }
    int fd = -1;
    int slot = slot_reserve();
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_nsec * 0xbf58476d1ce4e5b9ull ^
                     (uint64_t)atomic_fetch_add(&counter, 1u) * 0x94d049bb133111ebull;
        char suffix[7];
        for (int i = 0; i < 6; i++) {
            suffix[i] = alphabet[x % 62];
            x /= 62;
        }
        suffix[6] = '\0';
        snprintf(name, cap, "%s/.fa-%s", dir, suffix);
        sigset_t mask;
        block_signals(&mask);
        const int named = slot >= 0 && strlen(name) < PATH_MAX;
        if (named) {
            memcpy(out_slot_name[slot], name, strlen(name) + 1);
            atomic_store(&out_slot_state[slot], 3);
        }
        fd = open(name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        int e = errno;
        if (named) atomic_store(&out_slot_state[slot], fd >= 0 ? 1 : 2);
        restore_signals(&mask);
        errno = e;
        if (fd < 0 && errno != EEXIST) break;
    }
    free(dir);
    if (fd >= 0 && slot >= 0 && atomic_load(&out_slot_state[slot]) != 1) {
        slot_release(slot); /* a name too long to list: the file lives unlisted, as before */
        slot = -1;
    }
    f->slot = fd >= 0 ? slot : -1;
    if (fd < 0) {
        int e = errno;
        slot_release(slot);
        free(name);
        errno = e;
        return -1;
    }
    if (exists) {
        /* keep the replaced file's permissions, and (root only) its owner */
        if (geteuid() == 0 && (old->st_uid != 0 || old->st_gid != getegid()))
            (void)!fchown(fd, old->st_uid, old->st_gid);
        (void)!fchmod(fd, old->st_mode & 0777);
    }
    f->tmp = name;
    return fd;
}

fa_status fa_outfile_open(fa_outfile *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->slot = -1;
    f->name = path;
    int sfd = path ? open_stream_fd(path) : -1;
    if (sfd >= 0) {
        fa_status sst = stream_writable(path, sfd);
        if (sst != FA_OK) return sst;
        f->fd = fcntl(sfd, F_DUPFD_CLOEXEC, 3);
        if (f->fd < 0) return npy_fail(FA_ERR_IO, "%s: cannot duplicate descriptor %d: %s", path, sfd, strerror(errno));
        f->through = 1;
        return FA_OK;
    }
    struct stat old;
    int exists;
    fa_status st = classify(path, &f->through, &f->target, &old, &exists);
    if (st != FA_OK) return st;
    if (f->through) {
        /* a device or FIFO: written in place (a FIFO waits here for its reader) */
        do {
            f->fd = open(path, O_WRONLY | O_CLOEXEC);
        } while (f->fd < 0 && errno == EINTR);
        if (f->fd < 0) return npy_fail(FA_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
        return FA_OK;
    }
    f->fd = create_temp(f, &old, exists);
    if (f->fd < 0) {
        st = npy_fail(FA_ERR_IO, "%s: cannot create a temporary file beside it: %s", path, strerror(errno));
        free(f->target);
        f->target = NULL;
        return st;
    }
    return FA_OK;
}

fa_status fa_outfile_write(fa_outfile *f, const void *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        size_t chunk = n - done < ((size_t)1 << 30) ? n - done : ((size_t)1 << 30);
        ssize_t w = write(f->fd, (const char *)buf + done, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return npy_fail(FA_ERR_IO, "%s: write failed: %s", f->name, strerror(errno));
        }
        done += (size_t)w;
    }
    return FA_OK;
}

/* Remove the temporary (if any) and forget it; signals blocked meanwhile. */
static void drop_temp(fa_outfile *f)
{
    if (!f->tmp) return;
    sigset_t mask;
    block_signals(&mask);
    unlink(f->tmp);
    slot_release(f->slot);
    restore_signals(&mask);
    f->slot = -1;
    free(f->tmp);
    f->tmp = NULL;
}

fa_status fa_outfile_commit(fa_outfile *f)
{
    fa_status st = FA_OK;
    if (f->fd >= 0) {
        if (!f->through && fsync(f->fd) != 0 && errno != EINVAL && errno != EROFS)
            st = npy_fail(FA_ERR_IO, "%s: fsync failed: %s", f->name, strerror(errno));
        if (close(f->fd) != 0 && st == FA_OK)
            st = npy_fail(FA_ERR_IO, "%s: close failed: %s", f->name, strerror(errno));
        f->fd = -1;
    }
    if (st == FA_OK && f->tmp) {
        sigset_t mask;
        block_signals(&mask);
        int r = rename(f->tmp, f->target);
        int e = errno;
        if (r == 0) slot_release(f->slot);
        restore_signals(&mask);
        if (r != 0) {
            st = npy_fail(FA_ERR_IO, "%s: cannot rename the finished file into place: %s", f->name, strerror(e));
        } else {
            f->slot = -1;
            free(f->tmp);
            f->tmp = NULL;
        }
    }
    if (st != FA_OK) {
        drop_temp(f);
        free(f->target);
        f->target = NULL;
        return st;
    }
    f->committed = 1;
    return FA_OK;
}

void fa_outfile_abort(fa_outfile *f)
{
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    drop_temp(f);
    free(f->target);
    f->target = NULL;
}

void fa_outfile_free(fa_outfile *f)
{
    if (f->fd >= 0 || f->tmp) {
        fa_outfile_abort(f);
        return;
    }
    free(f->target);
    f->target = NULL;
}

/* ------------------------------------------------------------------------ */
/* Saving .npy files                                                         */
/* ------------------------------------------------------------------------ */

/* Validate the arguments of a save; *bytes receives the data size. */
static fa_status check_save_args(const char *name, const void *data, fa_npy_type type, int rank,
                                 const int64_t *shape, size_t *bytes)
{
    if ((unsigned)type >= FA_NPY_TYPE_COUNT)
        return npy_fail(FA_ERR_DTYPE, "%s: invalid array type %d", name, (int)type);
    if (rank < 0 || rank > FA_MAX_RANK)
        return npy_fail(FA_ERR_SHAPE, "%s: rank %d is outside 0..%d", name, rank, FA_MAX_RANK);
    if (rank > 0 && !shape) return npy_fail(FA_ERR_NULL_ARG, "%s: shape is NULL", name);
    for (int i = 0; i < rank; i++)
        if (shape[i] < 0)
            return npy_fail(FA_ERR_SHAPE, "%s: negative extent %lld in shape", name, (long long)shape[i]);
    int64_t numel;
    if (!npy_numel(type, rank, shape, &numel))
        return npy_fail(FA_ERR_SHAPE, "%s: shape is too large: its byte size overflows", name);
    *bytes = (size_t)numel * npy_types[type].size;
    if (*bytes > 0 && !data) return npy_fail(FA_ERR_NULL_ARG, "%s: data is NULL", name);
    return FA_OK;
}

/* The npy type of a library dtype, or a message naming `name`. */
static fa_status type_of_dtype(const char *name, fa_dtype dtype, fa_npy_type *type)
{
    if (fa_npy_type_of_dtype(dtype, type) != FA_OK)
        return npy_fail(FA_ERR_DTYPE, "%s: invalid dtype %d", name, (int)dtype);
    return FA_OK;
}

fa_status fa_npy_write_type(fa_outfile *f, const void *data, fa_npy_type type, int rank, const int64_t *shape)
{
    size_t data_bytes;
    fa_status st = check_save_args(f->name, data, type, rank, shape, &data_bytes);
    if (st != FA_OK) return st;
    char header[512];
    size_t header_len = build_header(type, rank, shape, header, sizeof header);
    assert(header_len > 0); /* rank <= 4 headers are ~128 bytes */
    if ((st = fa_outfile_write(f, header, header_len)) != FA_OK) return st;
    return fa_outfile_write(f, data, data_bytes);
}

fa_status fa_npy_write(fa_outfile *f, const void *data, fa_dtype dtype, int rank, const int64_t *shape)
{
    fa_npy_type type = FA_NPY_F32; /* (type_of_dtype sets it on success; aarch64 gcc warns without) */
    fa_status st = type_of_dtype(f->name, dtype, &type);
    return st != FA_OK ? st : fa_npy_write_type(f, data, type, rank, shape);
}

fa_status fa_npy_save_type(const char *path, const void *data, fa_npy_type type,
                           int rank, const int64_t *shape)
{
    if (!path) return npy_fail(FA_ERR_NULL_ARG, "fa_npy_save: path is NULL");
    size_t data_bytes;
    fa_status st = check_save_args(*path ? path : "fa_npy_save", data, type, rank, shape, &data_bytes);
    if (st != FA_OK) return st;
    fa_outfile f;
    if ((st = fa_outfile_open(&f, path)) != FA_OK) return st;
    if ((st = fa_npy_write_type(&f, data, type, rank, shape)) != FA_OK) {
        fa_outfile_abort(&f);
        return st;
    }
    st = fa_outfile_commit(&f);
    fa_outfile_free(&f);
    return st;
}

fa_status fa_npy_save(const char *path, const void *data, fa_dtype dtype,
                      int rank, const int64_t *shape)
{
    if (!path) return npy_fail(FA_ERR_NULL_ARG, "fa_npy_save: path is NULL");
    fa_npy_type type = FA_NPY_F32; /* (type_of_dtype sets it on success; aarch64 gcc warns without) */
    fa_status st = type_of_dtype(*path ? path : "fa_npy_save", dtype, &type);
    return st != FA_OK ? st : fa_npy_save_type(path, data, type, rank, shape);
}
