/*
 * test_cli_npy.c — the CLI's loaders of integer files (src/cli/cli_common.c):
 * cli_load_index (int32 '<i4' index files: cu_seqlens, cache_seqlens, block
 * tables) and cli_load_codes (uint8 '|u1' code files: FP8/FP4/INT8 codes,
 * keep-masks), and cli_load_array's refusal of such files where a float array
 * belongs.
 *
 * Each refusal must be exit status 2 and ONE line on stderr that names the
 * file, the role, the expected type and shape, and what was found; nothing
 * stays loaded. The files are numpy's (tests/data/npy/, make_fixtures.py).
 * This suite links the CLI's cli_common.o and npy.o beside libflashattn.a.
 *
 * Tests run from the repository root (tests/run_tests.sh does), or with
 * FA_NPY_FIXTURES pointing at tests/data/npy.
 */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

static const char *fixture(const char *name)
{
    static char path[512];
    const char *dir = getenv("FA_NPY_FIXTURES");
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : "tests/data/npy", name);
    return path;
}

/* stderr of one call, captured through a temporary file. */
static int saved_fd = -1;
static FILE *capture;

static void capture_begin(void)
{
    fflush(stderr);
    capture = tmpfile();
    assert_non_null(capture);
    saved_fd = dup(2);
    assert_true(saved_fd >= 0);
    assert_true(dup2(fileno(capture), 2) >= 0);
}

/* Restore stderr; the captured text (malloc'd). */
static char *capture_end(void)
{
    fflush(stderr);
    assert_true(dup2(saved_fd, 2) >= 0);
    close(saved_fd);
    saved_fd = -1;
    long n = ftell(capture);
    assert_true(n >= 0);
    char *text = calloc(1, (size_t)n + 1);
    assert_non_null(text);
    rewind(capture);
    assert_int_equal(fread(text, 1, (size_t)n, capture), (size_t)n);
    fclose(capture);
    capture = NULL;
    return text;
}

/* The text is one line ending in '\n' and contains every needle (NULL-terminated). */
static void assert_one_line_with(const char *text, const char *const *needles)
{
    size_t len = strlen(text);
    if (len == 0 || text[len - 1] != '\n' || strchr(text, '\n') != text + len - 1)
        fail_msg("expected one line on stderr, got \"%s\"", text);
    for (const char *const *n = needles; *n; n++)
        if (!strstr(text, *n)) fail_msg("stderr \"%s\" lacks \"%s\"", text, *n);
}

typedef int (*int_loader)(const char *, const char *, int, const int64_t *, fa_npy *);

/* Load `file` with `load` expecting a refusal whose line contains the needles. */
static void expect_refused(int_loader load, const char *file, const char *role, int rank,
                           const int64_t *shape, const char *const *needles)
{
    fa_npy arr;
    memset(&arr, 0x5A, sizeof arr);
    capture_begin();
    int rc = load(fixture(file), role, rank, shape, &arr);
    char *text = capture_end();
    if (rc != CLI_EXIT_USAGE) fail_msg("%s: exit %d, want %d (stderr \"%s\")", file, rc, CLI_EXIT_USAGE, text);
    assert_one_line_with(text, needles);
    assert_null(arr.data); /* nothing left loaded */
    assert_int_equal(arr.numel, 0);
    free(text);
}

/* Ensure an int32 index file of the expected rank and shape loads, with its values. */
static void test_index_loads_with_expected_shape(void **state)
{
    (void)state;
    const int64_t exact[2] = {2, 3}, any_rows[2] = {-1, 3};
    const int64_t *shapes[3] = {exact, any_rows, NULL};
    for (int i = 0; i < 3; i++) {
        fa_npy arr;
        capture_begin();
        int rc = cli_load_index(fixture("i4_2x3.npy"), "--block-table [batch, max_pages]", 2, shapes[i], &arr);
        char *text = capture_end();
        assert_int_equal(rc, 0);
        assert_string_equal(text, "");
        free(text);
        assert_int_equal(arr.type, FA_NPY_I32);
        assert_int_equal(arr.rank, 2);
        const int32_t want[6] = {INT32_MIN, -1, 0, 1, 7, INT32_MAX};
        assert_memory_equal(arr.data, want, sizeof want);
        fa_npy_free(&arr);
    }
    fa_npy arr; /* any rank */
    assert_int_equal(cli_load_index(fixture("i4_3.npy"), "an index file", -1, NULL, &arr), 0);
    assert_int_equal(arr.rank, 1);
    assert_int_equal(((const int32_t *)arr.data)[2], 2);
    fa_npy_free(&arr);
    const int64_t zero[1] = {0}; /* batch 0: cache_seqlens [0] */
    assert_int_equal(cli_load_index(fixture("i4_0.npy"), "--cache-seqlens [batch]", 1, zero, &arr), 0);
    assert_int_equal(arr.numel, 0);
    fa_npy_free(&arr);
}

/* Ensure a float file given as an index file is refused naming both types. */
static void test_index_refuses_a_float_file(void **state)
{
    (void)state;
    const int64_t shape[2] = {2, 3};
    const char *const needles[] = {"f32_2x3.npy", "--block-table [batch, max_pages]",
                                   "must be int32 ('<i4') of shape [2, 3]",
                                   "found float32 ('<f4') of shape [2, 3]", NULL};
    expect_refused(cli_load_index, "f32_2x3.npy", "--block-table [batch, max_pages]", 2, shape, needles);
}

/* Ensure an index file of the wrong rank is refused naming both shapes. */
static void test_index_refuses_wrong_rank(void **state)
{
    (void)state;
    const int64_t shape[1] = {-1};
    const char *const needles[] = {"i4_2x3.npy", "--cu-seqlens-q [batch + 1]", "of shape [*]",
                                   "found int32 ('<i4') of shape [2, 3]", NULL};
    expect_refused(cli_load_index, "i4_2x3.npy", "--cu-seqlens-q [batch + 1]", 1, shape, needles);
}

/* Ensure an index file one entry short is refused naming the expected length. */
static void test_index_refuses_wrong_length(void **state)
{
    (void)state;
    const int64_t shape[1] = {4};
    const char *const needles[] = {"i4_3.npy", "--cu-seqlens-k [batch + 1]", "of shape [4]",
                                   "found int32 ('<i4') of shape [3]", NULL};
    expect_refused(cli_load_index, "i4_3.npy", "--cu-seqlens-k [batch + 1]", 1, shape, needles);
    const int64_t cols[2] = {2, 4};
    const char *const needles2[] = {"i4_2x3.npy", "of shape [2, 4]", "found int32 ('<i4') of shape [2, 3]", NULL};
    expect_refused(cli_load_index, "i4_2x3.npy", "--block-table", 2, cols, needles2);
}

/* Ensure big-endian int32 ('>i4'), uint8 and missing files are refused by name. */
static void test_index_refuses_big_endian_uint8_and_missing_files(void **state)
{
    (void)state;
    const char *const big[] = {"i4_big_3.npy", "big-endian dtype '>i4'", NULL};
    expect_refused(cli_load_index, "i4_big_3.npy", "--seqused-k [batch]", 1, NULL, big);
    const char *const u8[] = {"u1_4.npy", "must be int32 ('<i4')", "found uint8 ('|u1') of shape [4]", NULL};
    expect_refused(cli_load_index, "u1_4.npy", "--seqused-k [batch]", 1, NULL, u8);
    const char *const missing[] = {"no_such_file.npy", "cannot open", NULL};
    expect_refused(cli_load_index, "no_such_file.npy", "--seqused-k [batch]", 1, NULL, missing);
}

/* Ensure a uint8 code file loads, and int32/float files or wrong shapes as codes are refused. */
static void test_codes_load_and_refuse(void **state)
{
    (void)state;
    const int64_t shape[4] = {1, 2, 3, 2};
    fa_npy arr;
    assert_int_equal(cli_load_codes(fixture("u1_1x2x3x2.npy"), "Q codes", 4, shape, &arr), 0);
    assert_int_equal(arr.type, FA_NPY_U8);
    assert_int_equal(arr.numel, 12);
    assert_int_equal(((const uint8_t *)arr.data)[11], (uint8_t)(11 * 21 + 3));
    fa_npy_free(&arr);
    const int64_t wider[4] = {1, 2, 3, 4};
    const char *const shape_needles[] = {"u1_1x2x3x2.npy", "Q codes", "must be uint8 ('|u1') of shape [1, 2, 3, 4]",
                                         "found uint8 ('|u1') of shape [1, 2, 3, 2]", NULL};
    expect_refused(cli_load_codes, "u1_1x2x3x2.npy", "Q codes", 4, wider, shape_needles);
    const char *const int_needles[] = {"i4_3.npy", "must be uint8 ('|u1')", "found int32 ('<i4') of shape [3]", NULL};
    expect_refused(cli_load_codes, "i4_3.npy", "--dropout-mask", -1, NULL, int_needles);
    const char *const f_needles[] = {"f16_4.npy", "of any shape", "found float16 ('<f2') of shape [4]", NULL};
    expect_refused(cli_load_codes, "f16_4.npy", "--dropout-mask", -1, NULL, f_needles);
}

/* Ensure cli_load_array (Q, K, V, ALiBi, outputs under check) refuses an
 * integer file by name instead of reading it as a tensor. */
static void test_float_loader_refuses_integer_files(void **state)
{
    (void)state;
    const char *files[2] = {"i4_3.npy", "u1_4.npy"};
    const char *descr[2] = {"unsupported dtype '<i4'", "unsupported dtype '|u1'"};
    for (int i = 0; i < 2; i++) {
        fa_npy arr;
        fa_tensor t;
        capture_begin();
        int rc = cli_load_array(fixture(files[i]), 0, 1, "ALiBi slopes [heads]", &arr, &t);
        char *text = capture_end();
        assert_int_equal(rc, CLI_EXIT_USAGE);
        const char *const needles[] = {files[i], descr[i], "ALiBi slopes [heads]", NULL};
        assert_one_line_with(text, needles);
        assert_null(arr.data);
        free(text);
    }
}

/* A -q/-k parse as the commands do it: 0, or -1 on a refusal. */
static int parse_qk(int argc, char **argv, const char **q, const char **k)
{
    *q = *k = NULL;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_opt_value(argc, argv, &i, "-q", q)) < 0) return -1;
        if (r) continue;
        if ((r = cli_opt_value(argc, argv, &i, "-k", k)) < 0) return -1;
    }
    return 0;
}

/* cli_opt_value's repeat scan: an argument an earlier option took as its value (a file
 * named -k) is not an earlier -k, a real repeat is refused, and nothing depends on the
 * command line parsed before in the same argv array (the fuzzer reuses one). */
static void test_repeat_scan_walks_the_values(void **state)
{
    (void)state;
    char *argv[6];
    const char *q, *k;
    char *const value_like[6] = {"run", "-q", "-k", "-k", "k.npy", NULL};
    memcpy(argv, value_like, sizeof argv);
    assert_int_equal(parse_qk(5, argv, &q, &k), 0);
    assert_string_equal(q, "-k");
    assert_string_equal(k, "k.npy");
    char *const first[6] = {"run", "-q", "a", "-k", "b", "c"};
    char *const repeat[6] = {"run", "x", "-k", "y", "-k", "z"};
    memcpy(argv, first, sizeof argv);
    capture_begin();
    assert_int_equal(parse_qk(6, argv, &q, &k), 0);
    free(capture_end());
    memcpy(argv, repeat, sizeof argv); /* the same array, refilled */
    capture_begin();
    assert_int_equal(parse_qk(6, argv, &q, &k), -1);
    char *text = capture_end();
    const char *const needles[] = {"-k given twice (arguments 2 and 4)", NULL};
    assert_one_line_with(text, needles);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_index_loads_with_expected_shape),
        cmocka_unit_test(test_index_refuses_a_float_file),
        cmocka_unit_test(test_index_refuses_wrong_rank),
        cmocka_unit_test(test_index_refuses_wrong_length),
        cmocka_unit_test(test_index_refuses_big_endian_uint8_and_missing_files),
        cmocka_unit_test(test_codes_load_and_refuse),
        cmocka_unit_test(test_float_loader_refuses_integer_files),
        cmocka_unit_test(test_repeat_scan_walks_the_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
