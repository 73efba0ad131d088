/*
 * test_npy.c — the CLI's .npy reader and writer (src/cli/npy.c; not part of
 * the library: this suite links its object beside libflashattn.a).
 *
 * Three kinds of evidence:
 *   1. Files numpy wrote (tests/data/npy/, made by make_fixtures.py) load with
 *      the right type, shape and bit-exact values, and what we write for the
 *      same arrays is byte-identical to numpy's files — the float types and
 *      the integer ones ('<i4' index files, '|u1' code files), which load as
 *      raw arrays and are refused as attention tensors.
 *   2. Every type round-trips through fa_npy_save_type / fa_npy_load on random data.
 *   3. Malformed files, built here byte by byte from a valid one, are each
 *      refused with the right status and a one-line message naming the file;
 *      a pipe is read only as far as its header says; a failed save leaves no
 *      file behind; a save writes FIFOs in place, follows symlinks, keeps a
 *      replaced file's mode, takes 255-byte names and refuses read-only files.
 *
 * Tests run from the repository root (tests/run_tests.sh does), or with
 * FA_NPY_FIXTURES pointing at tests/data/npy.
 */
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/npy.h"
#include "tensor.h" /* fa_f32_to_f16 / fa_f32_to_bf16, to build test data */

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

static char tmpdir[256];           /* fresh directory per test run */

static int group_setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "%s/fa_test_npy_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(tmpdir) ? 0 : -1;
}

/* Remove everything in tmpdir, then tmpdir itself. */
static int group_teardown(void **state)
{
    (void)state;
    DIR *d = opendir(tmpdir);
    if (!d) return 0;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", tmpdir, e->d_name);
        if (rmdir(path) != 0) unlink(path);
    }
    closedir(d);
    rmdir(tmpdir);
    return 0;
}

static const char *fixture(const char *name)
{
    static char path[512];
    const char *dir = getenv("FA_NPY_FIXTURES");
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : "tests/data/npy", name);
    return path;
}

static const char *tmp_path(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    return path;
}

/* Read a whole file into a malloc'd buffer. */
static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char *buf = malloc(1 << 20);
    assert_non_null(buf);
    *len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

static void write_bytes(const char *path, const void *bytes, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Number of entries (other than . and ..) in a directory. */
static int dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

/*
 * Build a .npy image: magic, version major.minor, the header text padded with
 * spaces + '\n' to a multiple of `align` (0: no padding and no newline added),
 * then `data_len` bytes of data. Returns the malloc'd image, length in *len.
 */
static unsigned char *make_npy(int major, int minor, const char *dict, size_t align,
                               const void *data, size_t data_len, size_t *len)
{
    size_t prefix = major == 1 ? 10 : 12;
    size_t hlen = strlen(dict);
    size_t pad = 0;
    if (align) {
        hlen += 1;
        pad = (align - (prefix + hlen) % align) % align;
    }
    size_t total = prefix + hlen + pad + data_len;
    unsigned char *buf = calloc(1, total + 1);
    assert_non_null(buf);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = (unsigned char)minor;
    size_t field = hlen + pad;
    for (size_t i = 0; i < prefix - 8; i++) buf[8 + i] = (unsigned char)(field >> (8 * i));
    memcpy(buf + prefix, dict, strlen(dict));
    if (align) {
        memset(buf + prefix + strlen(dict), ' ', pad);
        buf[prefix + hlen + pad - 1] = '\n';
    }
    if (data_len) memcpy(buf + prefix + hlen + pad, data, data_len);
    *len = total;
    return buf;
}

/* A valid v1.0 header dict for '<f4' (2, 3); 24 data bytes follow it. */
#define DICT_F32_2x3 "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
static const float data_2x3[6] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f};

/*
 * Write `bytes` to tmpdir/name, load it, and assert the status and that the
 * message names the file and contains `needle`.
 */
static void assert_load_fails(const char *name, const void *bytes, size_t len,
                              fa_status want, const char *needle)
{
    const char *path = tmp_path(name);
    write_bytes(path, bytes, len);
    fa_npy arr;
    fa_status st = fa_npy_load(path, &arr);
    const char *msg = fa_npy_last_error();
    if (st != want || !strstr(msg, path) || !strstr(msg, needle) || strchr(msg, '\n'))
        fail_msg("%s: status %d (want %d), message \"%s\" (want the path and \"%s\")",
                 name, (int)st, (int)want, msg, needle);
    assert_null(arr.data);
    assert_int_equal(arr.numel, 0);
    /* the in-memory parser must agree */
    assert_int_equal(fa_npy_parse(bytes, len, name, &arr), want);
    assert_non_null(strstr(fa_npy_last_error(), name));
    unlink(path);
}

/* The same, for a header dict with 24 bytes of f32 data after it. */
static void assert_dict_fails(const char *name, const char *dict, fa_status want, const char *needle)
{
    size_t len;
    unsigned char *img = make_npy(1, 0, dict, 64, data_2x3, sizeof data_2x3, &len);
    assert_load_fails(name, img, len, want, needle);
    free(img);
}

/* ------------------------------------------------------------------------ */
/* Files numpy wrote                                                         */
/* ------------------------------------------------------------------------ */

/* Ensure a float32 array numpy saved loads with its shape and exact values. */
static void test_npy_reads_f32_written_by_numpy(void **state)
{
    (void)state;
    fa_npy a;
    assert_int_equal(fa_npy_load(fixture("f32_2x3.npy"), &a), FA_OK);
    assert_int_equal(a.dtype, FA_F32);
    assert_int_equal(a.rank, 2);
    assert_int_equal(a.shape[0], 2);
    assert_int_equal(a.shape[1], 3);
    assert_int_equal(a.numel, 6);
    assert_memory_equal(a.data, data_2x3, sizeof data_2x3);
    assert_int_equal((uintptr_t)a.data % 64, 0);
    fa_npy_free(&a);
    assert_null(a.data);
}

/* Ensure a rank-4 float64 array numpy saved loads exactly. */
static void test_npy_reads_f64_rank4_written_by_numpy(void **state)
{
    (void)state;
    fa_npy a;
    assert_int_equal(fa_npy_load(fixture("f64_1x2x3x4.npy"), &a), FA_OK);
    assert_int_equal(a.dtype, FA_F64);
    assert_int_equal(a.rank, 4);
    int64_t want_shape[4] = {1, 2, 3, 4};
    for (int i = 0; i < 4; i++) assert_int_equal(a.shape[i], want_shape[i]);
    for (int i = 0; i < 24; i++) assert_true(((double *)a.data)[i] == i / 4.0 - 3.0);
    fa_npy_free(&a);
}

/* Ensure float16 loads bit-exactly, including the smallest subnormal and the largest normal. */
static void test_npy_reads_f16_written_by_numpy(void **state)
{
    (void)state;
    fa_npy a;
    assert_int_equal(fa_npy_load(fixture("f16_4.npy"), &a), FA_OK);
    assert_int_equal(a.dtype, FA_F16);
    assert_int_equal(a.rank, 1);
    assert_int_equal(a.shape[0], 4);
    const uint16_t *h = a.data;
    assert_true(fa_f16_to_f32(h[0]) == 1.0f);
    assert_true(fa_f16_to_f32(h[1]) == -2.5f);
    assert_true(fa_f16_to_f32(h[2]) == ldexpf(1.0f, -24));
    assert_true(fa_f16_to_f32(h[3]) == 65504.0f);
    fa_npy_free(&a);
}

/* Ensure '<u2' is read as bfloat16 bit patterns. */
static void test_npy_reads_bf16_as_u2_written_by_numpy(void **state)
{
    (void)state;
    fa_npy a;
    assert_int_equal(fa_npy_load(fixture("bf16_2x2.npy"), &a), FA_OK);
    assert_int_equal(a.dtype, FA_BF16);
    assert_int_equal(a.rank, 2);
    const float want[4] = {1.0f, -2.0f, 0.5f, 3.140625f};
    for (int i = 0; i < 4; i++) assert_true(fa_bf16_to_f32(((uint16_t *)a.data)[i]) == want[i]);
    fa_npy_free(&a);
}

/* Ensure format version 2.0 (uint32 header length) is read. */
static void test_npy_reads_version_2_0(void **state)
{
    (void)state;
    fa_npy a;
    assert_int_equal(fa_npy_load(fixture("f32_v2.npy"), &a), FA_OK);
    assert_int_equal(a.rank, 1);
    assert_int_equal(a.shape[0], 4);
    for (int i = 0; i < 4; i++) assert_true(((float *)a.data)[i] == (float)i);
    fa_npy_free(&a);
}

/* Ensure rank-0 and zero-size arrays load (and the empty one has a non-NULL buffer). */
static void test_npy_reads_scalar_and_empty_arrays(void **state)
{
    (void)state;
    fa_npy a;
    assert_int_equal(fa_npy_load(fixture("f32_scalar.npy"), &a), FA_OK);
    assert_int_equal(a.rank, 0);
    assert_int_equal(a.numel, 1);
    assert_true(((float *)a.data)[0] == 7.0f);
    fa_tensor t;
    assert_int_not_equal(fa_npy_as_tensor(&a, &t), FA_OK);
    fa_npy_free(&a);

    assert_int_equal(fa_npy_load(fixture("f32_0x3.npy"), &a), FA_OK);
    assert_int_equal(a.rank, 2);
    assert_int_equal(a.shape[0], 0);
    assert_int_equal(a.shape[1], 3);
    assert_int_equal(a.numel, 0);
    assert_non_null(a.data);
    fa_npy_free(&a);
}

/* Ensure what we write is byte-identical to what numpy wrote for the same array. */
static void test_npy_writes_files_identical_to_numpy(void **state)
{
    (void)state;
    static const char *names[] = {"f32_2x3.npy", "f64_1x2x3x4.npy", "f16_4.npy", "bf16_2x2.npy",
                                  "f32_scalar.npy", "f32_0x3.npy", "i4_3.npy", "i4_2x3.npy",
                                  "i4_0.npy", "u1_4.npy", "u1_1x2x3x2.npy"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        fa_npy a;
        assert_int_equal(fa_npy_load(fixture(names[i]), &a), FA_OK);
        const char *out = tmp_path("copy.npy");
        assert_int_equal(fa_npy_save_type(out, a.data, a.type, a.rank, a.shape), FA_OK);
        size_t n1, n2;
        unsigned char *ours = slurp(out, &n1), *theirs = slurp(fixture(names[i]), &n2);
        if (n1 != n2 || memcmp(ours, theirs, n1) != 0) fail_msg("%s: our file differs from numpy's", names[i]);
        free(ours);
        free(theirs);
        unlink(out);
        fa_npy_free(&a);
    }
}

/* Ensure an int32 index file numpy wrote loads as raw int32 with its extremes intact. */
static void test_npy_reads_i4_written_by_numpy(void **state)
{
    (void)state;
    fa_npy a;
    assert_int_equal(fa_npy_load(fixture("i4_2x3.npy"), &a), FA_OK);
    assert_int_equal(a.type, FA_NPY_I32);
    assert_int_equal(a.dtype, FA_DTYPE_COUNT); /* no library dtype: not a tensor */
    assert_int_equal(a.rank, 2);
    assert_int_equal(a.shape[0], 2);
    assert_int_equal(a.shape[1], 3);
    assert_int_equal(a.numel, 6);
    const int32_t want[6] = {INT32_MIN, -1, 0, 1, 7, INT32_MAX};
    assert_memory_equal(a.data, want, sizeof want);
    assert_int_equal(fa_npy_find_nonfinite(&a), -1);
    fa_npy_free(&a);
    assert_int_equal(fa_npy_load(fixture("i4_3.npy"), &a), FA_OK);
    assert_int_equal(a.type, FA_NPY_I32);
    const int32_t want3[3] = {0, 1, 2};
    assert_memory_equal(a.data, want3, sizeof want3);
    fa_npy_free(&a);
    assert_int_equal(fa_npy_load(fixture("i4_0.npy"), &a), FA_OK); /* batch 0: an empty index file */
    assert_int_equal(a.type, FA_NPY_I32);
    assert_int_equal(a.rank, 1);
    assert_int_equal(a.numel, 0);
    assert_non_null(a.data);
    fa_npy_free(&a);
}

/* Ensure a uint8 code file numpy wrote loads as raw bytes, every bit pattern intact. */
static void test_npy_reads_u1_written_by_numpy(void **state)
{
    (void)state;
    fa_npy a;
    assert_int_equal(fa_npy_load(fixture("u1_4.npy"), &a), FA_OK);
    assert_int_equal(a.type, FA_NPY_U8);
    assert_int_equal(a.dtype, FA_DTYPE_COUNT);
    assert_int_equal(a.rank, 1);
    assert_int_equal(a.shape[0], 4);
    const uint8_t want[4] = {0, 1, 127, 255};
    assert_memory_equal(a.data, want, sizeof want);
    fa_npy_free(&a);
    assert_int_equal(fa_npy_load(fixture("u1_1x2x3x2.npy"), &a), FA_OK);
    assert_int_equal(a.type, FA_NPY_U8);
    assert_int_equal(a.rank, 4);
    assert_int_equal(a.numel, 12);
    for (int i = 0; i < 12; i++) assert_int_equal(((const uint8_t *)a.data)[i], (uint8_t)(i * 21 + 3));
    fa_npy_free(&a);
}

/* Ensure integer arrays are never attention tensors: fa_npy_as_tensor refuses
 * them with FA_ERR_DTYPE and a message saying what they are. */
static void test_npy_as_tensor_refuses_integer_arrays(void **state)
{
    (void)state;
    static const char *names[] = {"i4_2x3.npy", "u1_1x2x3x2.npy"};
    static const char *descr[] = {"'<i4'", "'|u1'"};
    for (int i = 0; i < 2; i++) {
        fa_npy a;
        assert_int_equal(fa_npy_load(fixture(names[i]), &a), FA_OK);
        fa_tensor t;
        memset(&t, 0, sizeof t);
        assert_int_equal(fa_npy_as_tensor(&a, &t), FA_ERR_DTYPE);
        const char *msg = fa_npy_last_error();
        if (!strstr(msg, descr[i]) || !strstr(msg, "index or code files") || strchr(msg, '\n'))
            fail_msg("%s: message \"%s\"", names[i], msg);
        assert_null(t.data);
        fa_npy_free(&a);
    }
}

/* ------------------------------------------------------------------------ */
/* Round trips                                                               */
/* ------------------------------------------------------------------------ */

/* Ensure every type (the four float dtypes, int32, uint8) and rank 0..4
 * round-trips bit-exactly on random data; float arrays get a tensor view,
 * integer arrays none. */
static void test_npy_round_trips_every_dtype(void **state)
{
    (void)state;
    uint64_t rng = tu_seed();
    for (int ty = 0; ty < FA_NPY_TYPE_COUNT; ty++) {
        for (int rank = 0; rank <= 4; rank++) {
            int64_t shape[4] = {3, 5, 2, 7};
            int64_t numel = 1;
            for (int i = 0; i < rank; i++) numel *= shape[i];
            size_t bytes = (size_t)numel * fa_npy_type_size((fa_npy_type)ty);
            unsigned char *data = malloc(bytes);
            assert_non_null(data);
            for (size_t i = 0; i < bytes; i++) data[i] = (unsigned char)tu_next(&rng);
            const char *path = tmp_path("round.npy");
            assert_int_equal(fa_npy_save_type(path, data, (fa_npy_type)ty, rank, shape), FA_OK);
            fa_npy a;
            assert_int_equal(fa_npy_load(path, &a), FA_OK);
            assert_int_equal(a.type, ty);
            assert_int_equal(a.rank, rank);
            for (int i = 0; i < rank; i++) assert_int_equal(a.shape[i], shape[i]);
            assert_int_equal(a.numel, numel);
            assert_memory_equal(a.data, data, bytes);
            fa_npy_type back;
            if (fa_npy_type_of_dtype(a.dtype, &back) == FA_OK) { /* a float type: the same through fa_npy_save */
                assert_int_equal(back, ty);
                const char *path2 = tmp_path("round2.npy");
                assert_int_equal(fa_npy_save(path2, data, a.dtype, rank, shape), FA_OK);
                size_t n1, n2;
                unsigned char *f1 = slurp(path, &n1), *f2 = slurp(path2, &n2);
                assert_true(n1 == n2 && memcmp(f1, f2, n1) == 0);
                free(f1);
                free(f2);
                unlink(path2);
            }
            fa_tensor t;
            if (ty == FA_NPY_I32 || ty == FA_NPY_U8) {
                assert_int_equal(a.dtype, FA_DTYPE_COUNT);
                assert_int_equal(fa_npy_as_tensor(&a, &t), FA_ERR_DTYPE);
            } else if (rank > 0) {
                assert_int_equal(fa_npy_as_tensor(&a, &t), FA_OK);
                assert_ptr_equal(t.data, a.data);
                assert_int_equal(t.stride[rank - 1], 1);
            }
            fa_npy_free(&a);
            free(data);
            unlink(path);
        }
    }
}

/* Ensure loading through a pipe (no file size known) gives the same array. */
static void test_npy_reads_from_a_pipe(void **state)
{
    (void)state;
    size_t len;
    unsigned char *img = slurp(fixture("f32_2x3.npy"), &len);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(write(fds[1], img, len), (ssize_t)len); /* 152 bytes fit the pipe buffer */
    close(fds[1]);
    char path[64];
    snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
    fa_npy a;
    assert_int_equal(fa_npy_load(path, &a), FA_OK);
    assert_memory_equal(a.data, data_2x3, sizeof data_2x3);
    fa_npy_free(&a);
    close(fds[0]);
    free(img);
}

/*
 * Ensure a pipe is read for exactly what its header declares: trailing bytes
 * after the data are refused (the reader stops one byte past the data, so an
 * endless stream cannot exhaust memory), and a stream that is not .npy is
 * refused after its first bytes, with the pipe still holding the rest (the
 * write end is closed, so an old reader that read "to the end" would finish).
 */
static void test_npy_reads_a_pipe_only_as_far_as_its_header_says(void **state)
{
    (void)state;
    size_t len;
    unsigned char *img = slurp(fixture("f32_2x3.npy"), &len);
    int fds[2];
    char path[64];
    fa_npy a;
    static const unsigned char extra[4096] = {0};

    assert_int_equal(pipe(fds), 0);
    assert_int_equal(write(fds[1], img, len), (ssize_t)len);
    assert_int_equal(write(fds[1], extra, sizeof extra), (ssize_t)sizeof extra);
    close(fds[1]);
    snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
    assert_int_equal(fa_npy_load(path, &a), FA_ERR_FORMAT);
    assert_non_null(strstr(fa_npy_last_error(), "trailing data"));
    /* the reader took header + data + 1 byte, no more */
    char rest[8192];
    assert_int_equal(fcntl(fds[0], F_SETFL, O_NONBLOCK), 0);
    assert_int_equal(read(fds[0], rest, sizeof rest), (ssize_t)sizeof extra - 1);
    close(fds[0]);

    assert_int_equal(pipe(fds), 0);
    assert_int_equal(write(fds[1], extra, sizeof extra), (ssize_t)sizeof extra); /* zeros */
    close(fds[1]);
    snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
    assert_int_equal(fa_npy_load(path, &a), FA_ERR_FORMAT);
    assert_non_null(strstr(fa_npy_last_error(), "not a .npy file"));
    assert_int_equal(fcntl(fds[0], F_SETFL, O_NONBLOCK), 0);
    assert_int_equal(read(fds[0], rest, sizeof rest), (ssize_t)sizeof extra - 10);
    close(fds[0]);
    free(img);
}

/* Ensure headers other writers produce (any key order, double quotes, no trailing comma,
 * extra spaces, 16-byte alignment of old numpy, Python 2 'L' suffixes) are accepted. */
static void test_npy_accepts_header_variants(void **state)
{
    (void)state;
    static const struct { const char *dict; size_t align; } ok[] = {
        {"{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}", 64},
        {"{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}", 64},
        {"{ 'descr' : '<f4' ,'fortran_order':False,'shape':( 2 ,3 , ) , }", 64},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", 16},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 1},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        size_t len;
        unsigned char *img = make_npy(1, 0, ok[i].dict, ok[i].align, data_2x3, sizeof data_2x3, &len);
        fa_npy a;
        if (fa_npy_parse(img, len, "variant.npy", &a) != FA_OK)
            fail_msg("variant %zu refused: %s", i, fa_npy_last_error());
        assert_int_equal(a.rank, 2);
        assert_int_equal(a.shape[1], 3);
        assert_memory_equal(a.data, data_2x3, sizeof data_2x3);
        fa_npy_free(&a);
        free(img);
    }
}

/* ------------------------------------------------------------------------ */
/* Malformed files                                                           */
/* ------------------------------------------------------------------------ */

/* Ensure an empty file is refused as not a .npy file. */
static void test_npy_rejects_empty_file(void **state)
{
    (void)state;
    assert_load_fails("empty.npy", "", 0, FA_ERR_FORMAT, "empty file");
}

/* Ensure a file without the \x93NUMPY magic is refused. */
static void test_npy_rejects_bad_magic(void **state)
{
    (void)state;
    size_t len;
    unsigned char *img = make_npy(1, 0, DICT_F32_2x3, 64, data_2x3, sizeof data_2x3, &len);
    img[1] = 'X';
    assert_load_fails("magic.npy", img, len, FA_ERR_FORMAT, "bad magic");
    assert_load_fails("text.npy", "hello, world\n", 13, FA_ERR_FORMAT, "bad magic");
    assert_load_fails("short.npy", "\x93NUM", 4, FA_ERR_FORMAT, "truncated");
    free(img);
}

/* Ensure format versions other than 1.0 and 2.0 (including numpy's own 3.0) are refused by number. */
static void test_npy_rejects_bad_version(void **state)
{
    (void)state;
    size_t len;
    unsigned char *img = make_npy(1, 0, DICT_F32_2x3, 64, data_2x3, sizeof data_2x3, &len);
    img[7] = 1;
    assert_load_fails("v11.npy", img, len, FA_ERR_FORMAT, "version 1.1");
    img[6] = 4;
    img[7] = 0;
    assert_load_fails("v40.npy", img, len, FA_ERR_FORMAT, "version 4.0");
    free(img);

    size_t n;
    unsigned char *v3 = slurp(fixture("f32_v3.npy"), &n);
    assert_load_fails("v3.npy", v3, n, FA_ERR_FORMAT, "version 3.0");
    free(v3);
}

/* Ensure a header length running past the end of the file is refused, for v1.0 and v2.0. */
static void test_npy_rejects_header_past_end(void **state)
{
    (void)state;
    size_t len;
    unsigned char *img = make_npy(1, 0, DICT_F32_2x3, 64, data_2x3, sizeof data_2x3, &len);
    img[8] = 0xff;
    img[9] = 0x7f;
    assert_load_fails("hdr1.npy", img, len, FA_ERR_FORMAT, "runs past the end");
    assert_load_fails("hdrcut.npy", img, 40, FA_ERR_FORMAT, "runs past the end");
    free(img);
    img = make_npy(2, 0, DICT_F32_2x3, 64, data_2x3, sizeof data_2x3, &len);
    img[10] = 0x01; /* 64 KiB + 116 */
    assert_load_fails("hdr2.npy", img, len, FA_ERR_FORMAT, "runs past the end");
    img[11] = 0x40; /* 1 GiB: refused before anything is allocated */
    assert_load_fails("hdr2big.npy", img, len, FA_ERR_FORMAT, "implausibly large");
    free(img);
}

/* Ensure a file cut short in the data names how many bytes were expected and found. */
static void test_npy_rejects_truncated_file(void **state)
{
    (void)state;
    size_t len;
    unsigned char *img = make_npy(1, 0, DICT_F32_2x3, 64, data_2x3, sizeof data_2x3, &len);
    assert_load_fails("trunc.npy", img, len - 4, FA_ERR_FORMAT,
                      "truncated: expected 24 data bytes, found 20");
    assert_load_fails("nodata.npy", img, len - 24, FA_ERR_FORMAT,
                      "truncated: expected 24 data bytes, found 0");
    free(img);
}

/* Ensure bytes after the data are refused, not ignored. */
static void test_npy_rejects_trailing_bytes(void **state)
{
    (void)state;
    unsigned char data[25];
    memcpy(data, data_2x3, 24);
    data[24] = 0;
    size_t len;
    unsigned char *img = make_npy(1, 0, DICT_F32_2x3, 64, data, sizeof data, &len);
    assert_load_fails("trailing.npy", img, len, FA_ERR_FORMAT, "trailing data after the array: expected 24 data bytes, found 25");
    free(img);
}

/* Ensure dtypes other than <f4 <f8 <f2 <u2 <i4 |u1 get FA_ERR_DTYPE naming the
 * dtype: big-endian ones ('>i4' too), other integer widths, unsigned int32, int8. */
static void test_npy_rejects_unsupported_dtype(void **state)
{
    (void)state;
    size_t n;
    unsigned char *img = slurp(fixture("i4_big_3.npy"), &n);
    assert_load_fails("i4big.npy", img, n, FA_ERR_DTYPE, "big-endian dtype '>i4'");
    free(img);
    img = slurp(fixture("f4_big_3.npy"), &n);
    assert_load_fails("big.npy", img, n, FA_ERR_DTYPE, "big-endian dtype '>f4'");
    free(img);
    assert_dict_fails("u4.npy", "{'descr': '<u4', 'fortran_order': False, 'shape': (6,), }",
                      FA_ERR_DTYPE, "unsupported dtype '<u4'");
    assert_dict_fails("i8.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
                      FA_ERR_DTYPE, "unsupported dtype '<i8'");
    assert_dict_fails("i1.npy", "{'descr': '|i1', 'fortran_order': False, 'shape': (24,), }",
                      FA_ERR_DTYPE, "unsupported dtype '|i1'");
    assert_dict_fails("b1.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (24,), }",
                      FA_ERR_DTYPE, "unsupported dtype '|b1'");
    assert_dict_fails("struct.npy",
                      "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }",
                      FA_ERR_DTYPE, "structured");
}

/* Ensure Fortran-order arrays numpy wrote are refused with a clear message. */
static void test_npy_rejects_fortran_order(void **state)
{
    (void)state;
    size_t n;
    unsigned char *img = slurp(fixture("f32_fortran.npy"), &n);
    assert_load_fails("fortran.npy", img, n, FA_ERR_FORMAT, "Fortran order not supported");
    free(img);
}

/* Ensure a negative extent is refused. */
static void test_npy_rejects_negative_shape(void **state)
{
    (void)state;
    assert_dict_fails("neg.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }",
                      FA_ERR_FORMAT, "negative dimension -2");
}

/* Ensure shapes whose byte size overflows 64 bits are refused, however they overflow. */
static void test_npy_rejects_overflowing_shape(void **state)
{
    (void)state;
    assert_dict_fails("ovf1.npy",
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }",
                      FA_ERR_FORMAT, "overflows");
    assert_dict_fails("ovf2.npy",
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
                      FA_ERR_FORMAT, "overflows");
    assert_dict_fails("ovf3.npy",
                      "{'descr': '<f8', 'fortran_order': False, 'shape': (65536, 65536, 65536, 65536), }",
                      FA_ERR_FORMAT, "overflows");
    /* a huge shape with a zero extent is merely empty, so the 24 data bytes are trailing */
    assert_dict_fails("zero.npy",
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 0), }",
                      FA_ERR_FORMAT, "trailing data");
}

/* Ensure rank 5 and above is refused, naming the rank. */
static void test_npy_rejects_rank_5(void **state)
{
    (void)state;
    assert_dict_fails("rank5.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 1, 3, 4), }",
                      FA_ERR_FORMAT, "rank 5 exceeds");
}

/* Ensure header dicts outside numpy's grammar are refused, each with a specific message. */
static void test_npy_rejects_malformed_header_dict(void **state)
{
    (void)state;
    static const struct { const char *dict; const char *needle; } bad[] = {
        {"{'descr': '<f4', 'fortran_order': False}", "missing key 'shape'"},
        {"{'descr': '<f4', 'shape': (2, 3)}", "missing key 'fortran_order'"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", "duplicate key"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", "unexpected key 'x'"},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3)}", "True or False"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': 6}", "expected '('"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (6)}", "must be a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", "expected ',' or ')'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3.0)}", "expected ',' or ')'"},
        {"{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3)}", "expected ',' or '}'"},
        {"{'descr': <f4, 'fortran_order': False, 'shape': (2, 3)}", "quoted string"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3)}", "malformed header"},
        {"['descr', '<f4']", "expected '{'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} x", "unexpected text after"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "dict%zu.npy", i);
        assert_dict_fails(name, bad[i].dict, FA_ERR_FORMAT, bad[i].needle);
    }
    /* a header without its final newline */
    size_t len;
    unsigned char *img = make_npy(1, 0, DICT_F32_2x3 "   ", 0, data_2x3, sizeof data_2x3, &len);
    assert_load_fails("nonl.npy", img, len, FA_ERR_FORMAT, "newline");
    free(img);
}

/* Ensure a missing file and a directory are I/O errors naming the path. */
static void test_npy_rejects_missing_file_and_directory(void **state)
{
    (void)state;
    fa_npy a;
    const char *path = tmp_path("does_not_exist.npy");
    assert_int_equal(fa_npy_load(path, &a), FA_ERR_IO);
    assert_non_null(strstr(fa_npy_last_error(), path));
    assert_non_null(strstr(fa_npy_last_error(), "cannot open"));
    assert_int_equal(fa_npy_load(tmpdir, &a), FA_ERR_IO);
    assert_non_null(strstr(fa_npy_last_error(), "is a directory"));
    assert_int_equal(fa_npy_load(NULL, &a), FA_ERR_NULL_ARG);
}

/* ------------------------------------------------------------------------ */
/* Saving                                                                    */
/* ------------------------------------------------------------------------ */

/* Ensure a save into a nonexistent directory fails with FA_ERR_IO and creates nothing. */
static void test_npy_save_leaves_no_file_when_directory_missing(void **state)
{
    (void)state;
    int64_t shape[2] = {2, 3};
    const char *path = tmp_path("no_such_dir/out.npy");
    int before = dir_entries(tmpdir);
    assert_int_equal(fa_npy_save(path, data_2x3, FA_F32, 2, shape), FA_ERR_IO);
    assert_non_null(strstr(fa_npy_last_error(), path));
    assert_false(file_exists(path));
    assert_int_equal(dir_entries(tmpdir), before);
}

/* Ensure a save whose final rename fails (the destination is a directory) removes its temporary. */
static void test_npy_save_leaves_no_file_when_rename_fails(void **state)
{
    (void)state;
    char sub[512];
    snprintf(sub, sizeof sub, "%s", tmp_path("subdir"));
    assert_int_equal(mkdir(sub, 0755), 0);
    char dest[600];
    snprintf(dest, sizeof dest, "%s/dest.npy", sub);
    assert_int_equal(mkdir(dest, 0755), 0); /* a directory where the file should go */
    int64_t shape[2] = {2, 3};
    assert_int_equal(fa_npy_save(dest, data_2x3, FA_F32, 2, shape), FA_ERR_IO);
    assert_non_null(strstr(fa_npy_last_error(), dest));
    assert_int_equal(dir_entries(sub), 1); /* only dest/ itself: no temporary left */
    rmdir(dest);
    rmdir(sub);
}

/* Ensure a save into a read-only directory fails and creates nothing (skipped as root). */
static void test_npy_save_leaves_no_file_when_directory_not_writable(void **state)
{
    (void)state;
    if (geteuid() == 0) skip(); /* root writes anyway */
    char sub[512];
    snprintf(sub, sizeof sub, "%s", tmp_path("readonly"));
    assert_int_equal(mkdir(sub, 0555), 0);
    char dest[600];
    snprintf(dest, sizeof dest, "%s/out.npy", sub);
    int64_t shape[2] = {2, 3};
    assert_int_equal(fa_npy_save(dest, data_2x3, FA_F32, 2, shape), FA_ERR_IO);
    assert_non_null(strstr(fa_npy_last_error(), dest));
    assert_int_equal(dir_entries(sub), 0);
    rmdir(sub);
}

/* Ensure saving over an existing file replaces it whole and leaves no temporary. */
static void test_npy_save_replaces_existing_file(void **state)
{
    (void)state;
    const char *path = tmp_path("replace.npy");
    write_bytes(path, "old contents", 12);
    int before = dir_entries(tmpdir);
    int64_t shape[2] = {2, 3};
    assert_int_equal(fa_npy_save(path, data_2x3, FA_F32, 2, shape), FA_OK);
    assert_int_equal(dir_entries(tmpdir), before);
    fa_npy a;
    assert_int_equal(fa_npy_load(path, &a), FA_OK);
    assert_memory_equal(a.data, data_2x3, sizeof data_2x3);
    fa_npy_free(&a);
    unlink(path);
}

/* Ensure a FIFO is written in place, never replaced by a regular file. */
static void test_npy_save_writes_through_a_fifo(void **state)
{
    (void)state;
    const char *path = tmp_path("fifo.npy");
    assert_int_equal(mkfifo(path, 0644), 0);
    int rd = open(path, O_RDONLY | O_NONBLOCK); /* a reader, so the writer's open does not wait */
    assert_true(rd >= 0);
    int64_t shape[2] = {2, 3};
    assert_int_equal(fa_npy_save(path, data_2x3, FA_F32, 2, shape), FA_OK);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_true(S_ISFIFO(sb.st_mode));
    size_t len;
    unsigned char *want = slurp(fixture("f32_2x3.npy"), &len);
    unsigned char got[1024];
    assert_int_equal(read(rd, got, sizeof got), (ssize_t)len);
    assert_memory_equal(got, want, len);
    free(want);
    close(rd);
    unlink(path);
}

/* Ensure a symlink stays a symlink (also a dangling one) and its target gets the data. */
static void test_npy_save_follows_symlinks(void **state)
{
    (void)state;
    char target[512], link[512], dangling[512], fresh[512];
    snprintf(target, sizeof target, "%s", tmp_path("target.npy"));
    snprintf(link, sizeof link, "%s", tmp_path("link.npy"));
    snprintf(dangling, sizeof dangling, "%s", tmp_path("dangling.npy"));
    snprintf(fresh, sizeof fresh, "%s", tmp_path("fresh.npy"));
    write_bytes(target, "old", 3);
    assert_int_equal(symlink("target.npy", link), 0);
    assert_int_equal(symlink("fresh.npy", dangling), 0);
    int64_t shape[2] = {2, 3};
    assert_int_equal(fa_npy_save(link, data_2x3, FA_F32, 2, shape), FA_OK);
    assert_int_equal(fa_npy_save(dangling, data_2x3, FA_F32, 2, shape), FA_OK);
    struct stat sb;
    assert_int_equal(lstat(link, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_int_equal(lstat(dangling, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    const char *files[2] = {target, fresh};
    for (int i = 0; i < 2; i++) {
        fa_npy a;
        assert_int_equal(fa_npy_load(files[i], &a), FA_OK);
        assert_memory_equal(a.data, data_2x3, sizeof data_2x3);
        fa_npy_free(&a);
    }
    unlink(link);
    unlink(dangling);
    unlink(target);
    unlink(fresh);
}

/* Ensure a file the caller may not write by its permission bits is refused, unchanged (root too). */
static void test_npy_save_refuses_a_read_only_file(void **state)
{
    (void)state;
    const char *path = tmp_path("readonly.npy");
    write_bytes(path, "keep", 4);
    assert_int_equal(chmod(path, 0444), 0);
    int64_t shape[2] = {2, 3};
    assert_int_equal(fa_npy_save(path, data_2x3, FA_F32, 2, shape), FA_ERR_IO);
    assert_non_null(strstr(fa_npy_last_error(), "not writable"));
    size_t len;
    unsigned char *got = slurp(path, &len);
    assert_int_equal(len, 4);
    assert_memory_equal(got, "keep", 4);
    free(got);
    unlink(path);
}

/* Ensure the longest names a file system takes (255 bytes) can be saved: the temporary name is short. */
static void test_npy_save_accepts_255_byte_names(void **state)
{
    (void)state;
    char name[256];
    memset(name, 'x', 251);
    memcpy(name + 251, ".npy", 5);
    int64_t shape[2] = {2, 3};
    int before = dir_entries(tmpdir);
    assert_int_equal(fa_npy_save(tmp_path(name), data_2x3, FA_F32, 2, shape), FA_OK);
    assert_int_equal(dir_entries(tmpdir), before + 1);
    unlink(tmp_path(name));
}

/* Ensure a replaced file keeps its permission bits. */
static void test_npy_save_keeps_the_mode_of_a_replaced_file(void **state)
{
    (void)state;
    const char *path = tmp_path("mode.npy");
    write_bytes(path, "old", 3);
    assert_int_equal(chmod(path, 0640), 0);
    int64_t shape[2] = {2, 3};
    assert_int_equal(fa_npy_save(path, data_2x3, FA_F32, 2, shape), FA_OK);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0640);
    unlink(path);
}

/* Ensure invalid save arguments are refused before anything is created. */
static void test_npy_save_rejects_bad_arguments(void **state)
{
    (void)state;
    const char *path = tmp_path("bad.npy");
    int64_t shape[5] = {2, 3, 1, 1, 1}, neg[2] = {2, -3};
    assert_int_equal(fa_npy_save(path, data_2x3, FA_F32, 5, shape), FA_ERR_SHAPE);
    assert_int_equal(fa_npy_save(path, data_2x3, FA_F32, 2, neg), FA_ERR_SHAPE);
    assert_int_equal(fa_npy_save(path, data_2x3, FA_DTYPE_COUNT, 2, shape), FA_ERR_DTYPE);
    assert_int_equal(fa_npy_save_type(path, data_2x3, FA_NPY_TYPE_COUNT, 2, shape), FA_ERR_DTYPE);
    assert_int_equal(fa_npy_save_type(path, data_2x3, FA_NPY_I32, 5, shape), FA_ERR_SHAPE);
    assert_int_equal(fa_npy_save_type(path, NULL, FA_NPY_U8, 2, shape), FA_ERR_NULL_ARG);
    assert_int_equal(fa_npy_save(path, NULL, FA_F32, 2, shape), FA_ERR_NULL_ARG);
    assert_int_equal(fa_npy_save(NULL, data_2x3, FA_F32, 2, shape), FA_ERR_NULL_ARG);
    assert_false(file_exists(path));
}

/*
 * Ensure the saver and the loader share one size rule (a libFuzzer find: the loader
 * accepted an empty array whose other extent was near INT64_MAX, the saver refused
 * to write it back): any zero extent makes an array empty, whatever the others are;
 * a non-empty shape whose byte size overflows is refused by both.
 */
static void test_npy_save_and_load_agree_on_huge_extents(void **state)
{
    (void)state;
    const char *path = tmp_path("huge_empty.npy");
    int64_t empty[4] = {INT64_C(7709648557549551617), 0, 1, 1};
    assert_int_equal(fa_npy_save(path, NULL, FA_F32, 4, empty), FA_OK);
    fa_npy a;
    assert_int_equal(fa_npy_load(path, &a), FA_OK);
    assert_int_equal(a.numel, 0);
    assert_true(a.shape[0] == empty[0] && a.shape[1] == 0);
    fa_npy_free(&a);

    int64_t over[2] = {INT64_C(1) << 40, INT64_C(1) << 22}; /* 2^62 elements * 4 bytes */
    const char *bad = tmp_path("huge_full.npy");
    assert_int_equal(fa_npy_save(bad, data_2x3, FA_F32, 2, over), FA_ERR_SHAPE);
    assert_false(file_exists(bad));
    static const char hdr[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 4194304), }";
    assert_dict_fails("huge_full.npy", hdr, FA_ERR_FORMAT, "overflows");
}

/* ------------------------------------------------------------------------ */
/* Non-finite scan                                                           */
/* ------------------------------------------------------------------------ */

/* Ensure the first NaN or Inf is found at its flat index in every dtype, and -1 when all finite. */
static void test_npy_find_nonfinite_reports_first_bad_index(void **state)
{
    (void)state;
    float f32[5] = {1, 2, 3, 4, 5};
    double f64[5] = {1, 2, 3, 4, 5};
    uint16_t f16[5], bf16[5];
    for (int i = 0; i < 5; i++) {
        f16[i] = fa_f32_to_f16(f32[i]);
        bf16[i] = fa_f32_to_bf16(f32[i]);
    }
    fa_npy a;
    memset(&a, 0, sizeof a);
    a.rank = 1;
    a.shape[0] = a.numel = 5;
    void *bufs[4] = {f32, f64, f16, bf16};
    for (int dt = 0; dt < FA_DTYPE_COUNT; dt++) {
        a.dtype = (fa_dtype)dt;
        assert_int_equal(fa_npy_type_of_dtype(a.dtype, &a.type), FA_OK);
        a.data = bufs[dt];
        assert_int_equal(fa_npy_find_nonfinite(&a), -1);
    }
    f32[3] = NAN;
    f32[4] = INFINITY;
    f64[2] = -INFINITY;
    f16[4] = fa_f32_to_f16(NAN);
    f16[1] = fa_f32_to_f16(1e6f); /* overflows to +inf in half */
    bf16[3] = fa_f32_to_bf16(-INFINITY);
    const int64_t want[4] = {3, 2, 1, 3};
    for (int dt = 0; dt < FA_DTYPE_COUNT; dt++) {
        a.dtype = (fa_dtype)dt;
        assert_int_equal(fa_npy_type_of_dtype(a.dtype, &a.type), FA_OK);
        a.data = bufs[dt];
        assert_int_equal(fa_npy_find_nonfinite(&a), want[dt]);
    }
    /* integers are finite whatever their bits (0xff.. is a NaN pattern as float) */
    uint32_t ones[5] = {~0u, ~0u, 0x7f800000u, 0x7fc00000u, 0};
    a.dtype = FA_DTYPE_COUNT;
    a.data = ones;
    a.type = FA_NPY_I32;
    assert_int_equal(fa_npy_find_nonfinite(&a), -1);
    a.type = FA_NPY_U8;
    assert_int_equal(fa_npy_find_nonfinite(&a), -1);
    a.data = NULL;
    assert_int_equal(fa_npy_find_nonfinite(&a), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_npy_reads_f32_written_by_numpy),
        cmocka_unit_test(test_npy_reads_f64_rank4_written_by_numpy),
        cmocka_unit_test(test_npy_reads_f16_written_by_numpy),
        cmocka_unit_test(test_npy_reads_bf16_as_u2_written_by_numpy),
        cmocka_unit_test(test_npy_reads_version_2_0),
        cmocka_unit_test(test_npy_reads_scalar_and_empty_arrays),
        cmocka_unit_test(test_npy_writes_files_identical_to_numpy),
        cmocka_unit_test(test_npy_reads_i4_written_by_numpy),
        cmocka_unit_test(test_npy_reads_u1_written_by_numpy),
        cmocka_unit_test(test_npy_as_tensor_refuses_integer_arrays),
        cmocka_unit_test(test_npy_round_trips_every_dtype),
        cmocka_unit_test(test_npy_reads_from_a_pipe),
        cmocka_unit_test(test_npy_reads_a_pipe_only_as_far_as_its_header_says),
        cmocka_unit_test(test_npy_accepts_header_variants),
        cmocka_unit_test(test_npy_rejects_empty_file),
        cmocka_unit_test(test_npy_rejects_bad_magic),
        cmocka_unit_test(test_npy_rejects_bad_version),
        cmocka_unit_test(test_npy_rejects_header_past_end),
        cmocka_unit_test(test_npy_rejects_truncated_file),
        cmocka_unit_test(test_npy_rejects_trailing_bytes),
        cmocka_unit_test(test_npy_rejects_unsupported_dtype),
        cmocka_unit_test(test_npy_rejects_fortran_order),
        cmocka_unit_test(test_npy_rejects_negative_shape),
        cmocka_unit_test(test_npy_rejects_overflowing_shape),
        cmocka_unit_test(test_npy_rejects_rank_5),
        cmocka_unit_test(test_npy_rejects_malformed_header_dict),
        cmocka_unit_test(test_npy_rejects_missing_file_and_directory),
        cmocka_unit_test(test_npy_save_leaves_no_file_when_directory_missing),
        cmocka_unit_test(test_npy_save_leaves_no_file_when_rename_fails),
        cmocka_unit_test(test_npy_save_leaves_no_file_when_directory_not_writable),
        cmocka_unit_test(test_npy_save_replaces_existing_file),
        cmocka_unit_test(test_npy_save_writes_through_a_fifo),
        cmocka_unit_test(test_npy_save_follows_symlinks),
        cmocka_unit_test(test_npy_save_refuses_a_read_only_file),
        cmocka_unit_test(test_npy_save_accepts_255_byte_names),
        cmocka_unit_test(test_npy_save_keeps_the_mode_of_a_replaced_file),
        cmocka_unit_test(test_npy_save_rejects_bad_arguments),
        cmocka_unit_test(test_npy_save_and_load_agree_on_huge_extents),
        cmocka_unit_test(test_npy_find_nonfinite_reports_first_bad_index),
    };
    return cmocka_run_group_tests_name("npy", tests, group_setup, group_teardown);
}
