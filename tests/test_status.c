/*
 * test_status.c — every status code of the public API, reached on purpose.
 *
 * For each fa_status there is a test that provokes it through a public entry
 * point and checks three things: the status returned, a non-empty message
 * from fa_last_error() that names the culprit, and that a following success
 * clears the message. A last test checks fa_status_string() covers every code.
 *
 * FA_ERR_IO and FA_ERR_FORMAT belong to files, which the library never touches:
 * they come from the CLI's .npy layer (src/cli/npy.c, linked into this suite),
 * whose message is its own (fa_npy_last_error()) and leaves fa_last_error() alone.
 *
 * Order matters once: FA_ERR_ISA can only be provoked before the kernel table
 * is chosen (the choice is made once per process), so it runs first.
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/npy.h"

/* Small valid problem: q [1][5][4][8], k/v [1][6][2][8], o [1][5][4][8], lse [1][4][5]. */
typedef struct fixture {
    tu_tensor q, k, v, o, lse;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    uint64_t rng = tu_seed() ^ 0x57a7;
    f->q = tu_alloc4(FA_F32, 1, 5, 4, 8, 0);
    f->k = tu_alloc4(FA_F32, 1, 6, 2, 8, 0);
    f->v = tu_alloc4(FA_F32, 1, 6, 2, 8, 0);
    f->o = tu_alloc4(FA_F32, 1, 5, 4, 8, 0);
    int64_t ls[3] = {1, 4, 5};
    f->lse = tu_alloc(FA_F32, 3, ls);
    tu_fill(&f->q, &rng, -1, 1);
    tu_fill(&f->k, &rng, -1, 1);
    tu_fill(&f->v, &rng, -1, 1);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tu_free(&f->q); tu_free(&f->k); tu_free(&f->v); tu_free(&f->o); tu_free(&f->lse);
    free(f);
    return 0;
}

/* The status is `want`, the message mentions `needle`, and a success clears it. */
static void expect_status(fa_status got, fa_status want, const char *needle, fixture *f)
{
    if (got != want)
        fail_msg("got %s (%s), want %s", fa_status_string(got), fa_last_error(), fa_status_string(want));
    const char *msg = fa_last_error();
    if (!msg[0]) fail_msg("%s came with an empty message", fa_status_string(want));
    if (needle && !strstr(msg, needle)) fail_msg("message '%s' does not mention '%s'", msg, needle);
    assert_int_equal(fa_forward(&f->q.t, &f->k.t, &f->v.t, &f->o.t, &f->lse.t, NULL), FA_OK);
    assert_string_equal(fa_last_error(), "");
}

static fa_status forward_with(fixture *f, const fa_options *opt)
{
    return fa_forward(&f->q.t, &f->k.t, &f->v.t, &f->o.t, &f->lse.t, opt);
}

/* Ensure FA_ERR_ISA when FA_ISA names an unknown instruction set (before the first choice). */
static void test_isa_is_reported_when_forced_isa_is_unknown(void **state)
{
    fixture *f = *state;
    setenv("FA_ISA", "mmx", 1);
    fa_cpu_info info;
    fa_status st = fa_get_cpu_info(&info);
    fa_status st2 = forward_with(f, NULL);
    unsetenv("FA_ISA");
    if (st != FA_ERR_ISA) fail_msg("fa_get_cpu_info with FA_ISA=mmx: %s", fa_status_string(st));
    expect_status(st2, FA_ERR_ISA, "mmx", f);
}

/* Ensure FA_OK and an empty message after a successful call. */
static void test_ok_when_the_problem_is_valid(void **state)
{
    fixture *f = *state;
    for (int impl = 0; impl < FA_IMPL_COUNT; impl++) {
        fa_options opt = fa_options_default();
        opt.impl = (fa_impl)impl;
        assert_int_equal(forward_with(f, &opt), FA_OK);
        assert_string_equal(fa_last_error(), "");
    }
}

/* Ensure FA_ERR_NULL_ARG when a required tensor or output pointer is NULL. */
static void test_null_arg_when_a_tensor_is_null(void **state)
{
    fixture *f = *state;
    expect_status(fa_forward(NULL, &f->k.t, &f->v.t, &f->o.t, NULL, NULL), FA_ERR_NULL_ARG, "q", f);
    expect_status(fa_forward(&f->q.t, &f->k.t, &f->v.t, NULL, NULL, NULL), FA_ERR_NULL_ARG, "o", f);
    fa_tensor k = f->k.t;
    k.data = NULL;
    expect_status(fa_forward(&f->q.t, &k, &f->v.t, &f->o.t, NULL, NULL), FA_ERR_NULL_ARG, "k", f);
    expect_status(fa_get_cpu_info(NULL), FA_ERR_NULL_ARG, NULL, f);
    int bq;
    expect_status(fa_block_sizes(8, 8, NULL, &bq, NULL), FA_ERR_NULL_ARG, NULL, f);
    expect_status(fa_strip_rows(8, 8, NULL, NULL), FA_ERR_NULL_ARG, NULL, f);
    expect_status(fa_strip_rows(0, 8, NULL, &bq), FA_ERR_SHAPE, "head dims", f);
    expect_status(fa_workspace_bytes(&f->q.t, &f->k.t, &f->v.t, NULL, NULL), FA_ERR_NULL_ARG, NULL, f);
    fa_impl impl;
    expect_status(fa_impl_from_name(NULL, &impl), FA_ERR_NULL_ARG, NULL, f);
}

/* Ensure FA_ERR_DTYPE for an invalid dtype and for an f16 LSE. */
static void test_dtype_when_dtype_is_invalid_or_disallowed(void **state)
{
    fixture *f = *state;
    fa_tensor t;
    int64_t shape[1] = {3};
    float x[3];
    expect_status(fa_tensor_make(&t, x, (fa_dtype)42, 1, shape, NULL), FA_ERR_DTYPE, NULL, f);
    fa_tensor v = f->v.t;
    v.dtype = FA_DTYPE_COUNT;
    expect_status(fa_forward(&f->q.t, &f->k.t, &v, &f->o.t, NULL, NULL), FA_ERR_DTYPE, "v", f);
    fa_tensor lse = f->lse.t;
    lse.dtype = FA_F16;
    expect_status(fa_forward(&f->q.t, &f->k.t, &f->v.t, &f->o.t, &lse, NULL), FA_ERR_DTYPE, "lse", f);
}

/* Ensure FA_ERR_SHAPE for inconsistent shapes, wrong ranks, negative extents and overflow. */
static void test_shape_when_shapes_are_inconsistent(void **state)
{
    fixture *f = *state;
    fa_tensor k = f->k.t;
    k.shape[3] = 7; /* d of k != d of q */
    expect_status(fa_forward(&f->q.t, &k, &f->v.t, &f->o.t, NULL, NULL), FA_ERR_SHAPE, "k", f);
    fa_tensor v = f->v.t;
    v.shape[1] = 5; /* seqlen of v != seqlen of k */
    expect_status(fa_forward(&f->q.t, &f->k.t, &v, &f->o.t, NULL, NULL), FA_ERR_SHAPE, "v", f);
    fa_tensor o = f->o.t;
    o.shape[2] = 3;
    expect_status(fa_forward(&f->q.t, &f->k.t, &f->v.t, &o, NULL, NULL), FA_ERR_SHAPE, "o", f);
    fa_tensor q = f->q.t;
    q.rank = 3;
    expect_status(fa_forward(&q, &f->k.t, &f->v.t, &f->o.t, NULL, NULL), FA_ERR_SHAPE, "q", f);
    fa_tensor t;
    int64_t neg[2] = {2, -1}, huge[4] = {INT64_MAX / 2, 4, 1, 1};
    float x[4];
    expect_status(fa_tensor_make(&t, x, FA_F32, 2, neg, NULL), FA_ERR_SHAPE, "negative", f);
    expect_status(fa_tensor_make(&t, x, FA_F32, 4, huge, NULL), FA_ERR_SHAPE, "overflow", f);
    expect_status(fa_tensor_make(&t, x, FA_F32, 5, huge, NULL), FA_ERR_SHAPE, "rank", f);
    /* any zero extent makes a tensor empty, whatever the others (a fuzz find: the
     * .npy reader accepted such arrays and the tensor view refused them) */
    int64_t empty_huge[4] = {2, INT64_MAX / 2, 0, 3};
    assert_int_equal(fa_tensor_make(&t, x, FA_F32, 4, empty_huge, NULL), FA_OK);
    assert_int_equal(fa_tensor_numel(&t), 0);
    fa_tensor bad = t;
    bad.shape[2] = 2; /* now (2, INT64_MAX/2, 2, 3): the product overflows */
    assert_int_equal(fa_tensor_numel(&bad), -1);
    bad.shape[2] = -1;
    assert_int_equal(fa_tensor_numel(&bad), -1);
    int bq, bk;
    expect_status(fa_block_sizes(0, 8, NULL, &bq, &bk), FA_ERR_SHAPE, NULL, f);
}

/* Ensure FA_ERR_HEADS when heads is not a multiple of heads_k. */
static void test_heads_when_heads_is_not_a_multiple_of_heads_k(void **state)
{
    fixture *f = *state;
    tu_tensor k3 = tu_alloc4(FA_F32, 1, 6, 3, 8, 0), v3 = tu_alloc4(FA_F32, 1, 6, 3, 8, 0);
    expect_status(fa_forward(&f->q.t, &k3.t, &v3.t, &f->o.t, NULL, NULL), FA_ERR_HEADS, "heads", f);
    tu_free(&k3);
    tu_free(&v3);
}

/* Ensure FA_ERR_STRIDE for a negative stride. */
static void test_stride_when_a_stride_is_negative(void **state)
{
    fixture *f = *state;
    fa_tensor q = f->q.t;
    q.stride[1] = -q.stride[1];
    expect_status(fa_forward(&q, &f->k.t, &f->v.t, &f->o.t, NULL, NULL), FA_ERR_STRIDE, "q", f);
}

/* Ensure FA_ERR_OPTION for out-of-range scale, softcap, threads and block sizes. */
static void test_option_when_an_option_is_out_of_range(void **state)
{
    fixture *f = *state;
    fa_options opt = fa_options_default();
    opt.scale = NAN;
    expect_status(forward_with(f, &opt), FA_ERR_OPTION, "scale", f);
    opt = fa_options_default();
    opt.softcap = -1.0;
    expect_status(forward_with(f, &opt), FA_ERR_OPTION, "softcap", f);
    opt = fa_options_default();
    opt.softcap = INFINITY;
    expect_status(forward_with(f, &opt), FA_ERR_OPTION, "softcap", f);
    opt = fa_options_default();
    opt.num_threads = -2;
    expect_status(forward_with(f, &opt), FA_ERR_OPTION, "num_threads", f);
    opt = fa_options_default();
    opt.num_threads = FA_MAX_THREADS + 1; /* an OpenMP runtime would end the process, not fail */
    expect_status(forward_with(f, &opt), FA_ERR_OPTION, "num_threads", f);
    {
        double g = 1.0;
        assert_int_equal(fa_measure_fma_peak("scalar", FA_MAX_THREADS + 1, 0.0, &g), FA_ERR_OPTION);
        assert_non_null(strstr(fa_last_error(), "threads must be in [0, 4096]"));
    }
    opt = fa_options_default();
    opt.block_q = 100000;
    expect_status(forward_with(f, &opt), FA_ERR_OPTION, "block_q", f);
    opt = fa_options_default();
    opt.block_k = -5;
    expect_status(forward_with(f, &opt), FA_ERR_OPTION, "block_k", f);
}

/* Ensure FA_ERR_ALIBI for slopes of the wrong shape, rank, dtype, or with a NaN. */
static void test_alibi_when_slopes_are_wrong(void **state)
{
    fixture *f = *state;
    float s3[3] = {0.5f, 0.25f, 0.125f}, s4[4] = {0.5f, NAN, 0.1f, 0.2f};
    uint16_t h4[4] = {0};
    fa_tensor a;
    int64_t n3[1] = {3}, n4[1] = {4}, n14[3] = {1, 4, 1};
    fa_options opt = fa_options_default();
    opt.alibi_slopes = &a;
    assert_int_equal(fa_tensor_make(&a, s3, FA_F32, 1, n3, NULL), FA_OK);
    expect_status(forward_with(f, &opt), FA_ERR_ALIBI, "alibi", f);
    assert_int_equal(fa_tensor_make(&a, s4, FA_F32, 1, n4, NULL), FA_OK);
    expect_status(forward_with(f, &opt), FA_ERR_ALIBI, "non-finite", f);
    assert_int_equal(fa_tensor_make(&a, s4, FA_F32, 3, n14, NULL), FA_OK);
    expect_status(forward_with(f, &opt), FA_ERR_ALIBI, "rank", f);
    assert_int_equal(fa_tensor_make(&a, h4, FA_F16, 1, n4, NULL), FA_OK);
    expect_status(forward_with(f, &opt), FA_ERR_ALIBI, "dtype", f);
}

/* Ensure FA_ERR_IMPL for an unknown implementation, by number and by name. */
static void test_impl_when_implementation_is_unknown(void **state)
{
    fixture *f = *state;
    fa_options opt = fa_options_default();
    opt.impl = (fa_impl)17;
    expect_status(forward_with(f, &opt), FA_ERR_IMPL, NULL, f);
    fa_impl impl;
    expect_status(fa_impl_from_name("fastest", &impl), FA_ERR_IMPL, "fastest", f);
}

/*
 * Ensure FA_ERR_NOMEM when scratch cannot be allocated: the reference keeps
 * one row of scores (seqlen_k doubles) per thread, and a zero-stride K/V view
 * with seqlen_k = 2^42 asks for 32 TiB of it.
 */
static void test_nomem_when_scratch_cannot_be_allocated(void **state)
{
    fixture *f = *state;
    float kv[8] = {0};
    fa_tensor k, v;
    int64_t shape[4] = {1, (int64_t)1 << 42, 2, 8}, zero[4] = {0, 0, 0, 1};
    assert_int_equal(fa_tensor_make(&k, kv, FA_F32, 4, shape, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&v, kv, FA_F32, 4, shape, zero), FA_OK);
    fa_options opt = fa_options_default();
    opt.impl = FA_IMPL_REFERENCE;
    opt.num_threads = 1;
    expect_status(fa_forward(&f->q.t, &k, &v, &f->o.t, NULL, &opt), FA_ERR_NOMEM, "allocate", f);
}

/* Ensure FA_ERR_TOO_LARGE when standard's S would exceed its (settable) cap. */
static void test_too_large_when_standard_exceeds_its_cap(void **state)
{
    fixture *f = *state;
    fa_options opt = fa_options_default();
    opt.impl = FA_IMPL_STANDARD;
    opt.standard_max_bytes = 16; /* S is 5 x 16 floats at least */
    fa_alloc_stats before, after;
    fa_alloc_stats_get(&before);
    expect_status(forward_with(f, &opt), FA_ERR_TOO_LARGE, "cap", f);
    fa_alloc_stats_get(&after);
    assert_int_equal(after.current_bytes, before.current_bytes);
}

/* The .npy layer's status is `want`, its own message mentions `needle`, and
 * the library's message (cleared by a success just before) was not touched. */
static void expect_npy_status(fa_status got, fa_status want, const char *needle)
{
    if (got != want)
        fail_msg("got %s (%s), want %s", fa_status_string(got), fa_npy_last_error(), fa_status_string(want));
    const char *msg = fa_npy_last_error();
    if (!msg[0]) fail_msg("%s came with an empty message", fa_status_string(want));
    if (needle && !strstr(msg, needle)) fail_msg("message '%s' does not mention '%s'", msg, needle);
    assert_string_equal(fa_last_error(), "");
}

/* Ensure FA_ERR_IO when a file cannot be opened, and FA_ERR_FORMAT when it is malformed
 * (the CLI's .npy layer, with its own message). */
static void test_io_and_format_when_files_are_missing_or_malformed(void **state)
{
    fixture *f = *state;
    assert_int_equal(forward_with(f, NULL), FA_OK); /* clears the library's message */
    fa_npy arr;
    expect_npy_status(fa_npy_load("/nonexistent/dir/q.npy", &arr), FA_ERR_IO, "q.npy");
    const char junk[] = "\x93NUMPY\x01\x00\x04\x00{}\n\n";
    expect_npy_status(fa_npy_parse(junk, sizeof junk - 1, "junk.npy", &arr), FA_ERR_FORMAT, "junk.npy");
    float x[2] = {1, 2};
    int64_t shape[1] = {2};
    expect_npy_status(fa_npy_save("/nonexistent/dir/o.npy", x, FA_F32, 1, shape), FA_ERR_IO, "o.npy");
}

/* Ensure FA_ERR_NONFINITE when fa_check is given a NaN input. */
static void test_nonfinite_when_check_inputs_contain_nan(void **state)
{
    fixture *f = *state;
    float *q = f->q.mem;
    float saved = q[7];
    q[7] = NAN;
    fa_check_report report = fa_check_report_init();
    fa_status st = fa_check(&f->q.t, &f->k.t, &f->v.t, &f->o.t, NULL, NULL, NULL, &report);
    q[7] = saved;
    fa_check_report_free(&report);
    expect_status(st, FA_ERR_NONFINITE, "NaN", f);
}

/* Ensure fa_backward reports FA_ERR_IMPL for standard, FA_ERR_NULL_ARG and FA_ERR_SHAPE for bad gradients. */
static void test_backward_reports_impl_null_and_shape_errors(void **state)
{
    fixture *f = *state;
    tu_tensor dq = tu_alloc4(FA_F32, 1, 5, 4, 8, 0), dk = tu_alloc4(FA_F32, 1, 6, 2, 8, 0);
    tu_tensor dv = tu_alloc4(FA_F32, 1, 6, 2, 8, 0), dout = tu_alloc4(FA_F32, 1, 5, 4, 8, 0);
    fa_options opt = fa_options_default();
    assert_int_equal(fa_backward(&f->q.t, &f->k.t, &f->v.t, NULL, NULL, &dout.t, &dq.t, &dk.t, &dv.t, &opt), FA_OK);
    opt.impl = FA_IMPL_STANDARD;
    expect_status(fa_backward(&f->q.t, &f->k.t, &f->v.t, NULL, NULL, &dout.t, &dq.t, &dk.t, &dv.t, &opt),
                  FA_ERR_IMPL, "standard", f);
    opt.impl = FA_IMPL_FLASH;
    expect_status(fa_backward(&f->q.t, &f->k.t, &f->v.t, NULL, NULL, &dout.t, NULL, &dk.t, &dv.t, &opt),
                  FA_ERR_NULL_ARG, NULL, f);
    fa_tensor bad = dk.t;
    bad.shape[1] = 5;
    expect_status(fa_backward(&f->q.t, &f->k.t, &f->v.t, NULL, NULL, &dout.t, &dq.t, &bad, &dv.t, &opt),
                  FA_ERR_SHAPE, NULL, f);
    tu_free(&dq); tu_free(&dk); tu_free(&dv); tu_free(&dout);
}

/* Ensure FA_ERR_STRIDE when an output overlaps an input or another output: the header
 * has always promised it, and with shared storage one element is written by one row and
 * read by another (issue 10). */
static void test_stride_when_an_output_overlaps_an_input_or_an_output(void **state)
{
    fixture *f = *state;
    /* o written over q (same shape: [1][5][4][8]) */
    fa_tensor o_on_q = f->o.t;
    o_on_q.data = f->q.t.data;
    expect_status(fa_forward(&f->q.t, &f->k.t, &f->v.t, &o_on_q, &f->lse.t, NULL), FA_ERR_STRIDE, "o: overlaps q", f);
    /* o overlapping v only in its last element */
    tu_tensor big = tu_alloc4(FA_F32, 1, 12, 4, 8, 0);
    fa_tensor o_part = f->o.t, v_part = f->v.t;
    o_part.data = big.mem;
    v_part.data = (float *)big.mem + 5 * 4 * 8 - 1;
    expect_status(fa_forward(&f->q.t, &f->k.t, &v_part, &o_part, &f->lse.t, NULL), FA_ERR_STRIDE, "overlaps v", f);
    /* adjacent but disjoint: fine */
    v_part.data = (float *)big.mem + 5 * 4 * 8;
    assert_int_equal(fa_forward(&f->q.t, &f->k.t, &v_part, &o_part, &f->lse.t, NULL), FA_OK);
    /* lse inside o */
    fa_tensor lse_in_o = f->lse.t;
    lse_in_o.data = (float *)f->o.mem + 8;
    expect_status(fa_forward(&f->q.t, &f->k.t, &f->v.t, &f->o.t, &lse_in_o, NULL), FA_ERR_STRIDE, "overlaps", f);
    tu_free(&big);
    /* backward: dk written over dv */
    tu_tensor dout = tu_alloc4(FA_F32, 1, 5, 4, 8, 0), dq = tu_alloc4(FA_F32, 1, 5, 4, 8, 0);
    tu_tensor dk = tu_alloc4(FA_F32, 1, 6, 2, 8, 0);
    uint64_t rng = tu_seed() ^ 0x0fe;
    tu_fill(&dout, &rng, -1, 1);
    fa_tensor dv_on_dk = dk.t;
    expect_status(fa_backward(&f->q.t, &f->k.t, &f->v.t, NULL, NULL, &dout.t, &dq.t, &dk.t, &dv_on_dk, NULL),
                  FA_ERR_STRIDE, "dk: overlaps dv", f);
    expect_status(fa_backward(&f->q.t, &f->k.t, &f->v.t, NULL, NULL, &dout.t, &dout.t, &dk.t, &f->v.t, NULL),
                  FA_ERR_STRIDE, "dq: overlaps", f);
    tu_free(&dout); tu_free(&dq); tu_free(&dk);
}

/* Ensure FA_ERR_STRIDE when an output has a zero stride on a dimension longer than 1
 * (several rows, and several threads, would write one element); a zero stride on an
 * extent-1 dimension is harmless and accepted. */
static void test_stride_when_an_output_has_a_zero_stride(void **state)
{
    fixture *f = *state;
    for (int r = 1; r < 4; r++) {
        fa_tensor o = f->o.t;
        o.stride[r] = 0;
        expect_status(fa_forward(&f->q.t, &f->k.t, &f->v.t, &o, NULL, NULL), FA_ERR_STRIDE, "stride", f);
    }
    fa_tensor lse = f->lse.t;
    lse.stride[2] = 0;
    expect_status(fa_forward(&f->q.t, &f->k.t, &f->v.t, &f->o.t, &lse, NULL), FA_ERR_STRIDE, "lse: stride 2 is 0", f);
    fa_tensor o = f->o.t;
    o.stride[0] = 0; /* batch is 1 */
    assert_int_equal(fa_forward(&f->q.t, &f->k.t, &f->v.t, &o, &f->lse.t, NULL), FA_OK);
}

/* Ensure FA_ERR_STRIDE when an output overlaps ITSELF through non-zero strides (two indices
 * reach one element, written by several rows and threads), and that valid permuted
 * layouts are still accepted. */
static void test_stride_when_an_output_overlaps_itself(void **state)
{
    fixture *f = *state;
    /* o [1][5][4][8] with seqlen stride 1 and d stride 1: (s=1, c=0) and (s=0, c=1) collide */
    fa_tensor o = f->o.t;
    o.stride[0] = 160; o.stride[1] = 1; o.stride[2] = 8; o.stride[3] = 1;
    expect_status(fa_forward(&f->q.t, &f->k.t, &f->v.t, &o, NULL, NULL), FA_ERR_STRIDE, "o: stride", f);
    /* heads stride 7 < 8 = d's reach + 1 */
    o = f->o.t;
    o.stride[0] = 160; o.stride[1] = 32; o.stride[2] = 7; o.stride[3] = 1;
    expect_status(fa_forward(&f->q.t, &f->k.t, &f->v.t, &o, NULL, NULL), FA_ERR_STRIDE, "o: stride 2", f);
    /* lse [1][4][5] with heads stride 1 and seqlen stride 1 */
    fa_tensor lse = f->lse.t;
    lse.stride[0] = 20; lse.stride[1] = 1; lse.stride[2] = 1;
    expect_status(fa_forward(&f->q.t, &f->k.t, &f->v.t, &f->o.t, &lse, NULL), FA_ERR_STRIDE, "lse: stride", f);
    /* backward: dq self-overlapping */
    tu_tensor dout = tu_alloc4(FA_F32, 1, 5, 4, 8, 0), dq = tu_alloc4(FA_F32, 1, 5, 4, 8, 0);
    tu_tensor dk = tu_alloc4(FA_F32, 1, 6, 2, 8, 0), dv = tu_alloc4(FA_F32, 1, 6, 2, 8, 0);
    uint64_t rng = tu_seed() ^ 0x0ff;
    tu_fill(&dout, &rng, -1, 1);
    fa_tensor dq_bad = dq.t;
    dq_bad.stride[1] = 1; dq_bad.stride[3] = 1;
    expect_status(fa_backward(&f->q.t, &f->k.t, &f->v.t, NULL, NULL, &dout.t, &dq_bad, &dk.t, &dv.t, NULL),
                  FA_ERR_STRIDE, "dq: stride", f);
    tu_free(&dout); tu_free(&dq); tu_free(&dk); tu_free(&dv);
    /* valid, not C-order: seqlen fastest, then d, then heads (column-major), and BHSD */
    o = f->o.t;
    o.stride[0] = 160; o.stride[1] = 1; o.stride[2] = 40; o.stride[3] = 5;
    assert_int_equal(fa_forward(&f->q.t, &f->k.t, &f->v.t, &o, &f->lse.t, NULL), FA_OK);
    o.stride[1] = 8; o.stride[2] = 40; o.stride[3] = 1;
    assert_int_equal(fa_forward(&f->q.t, &f->k.t, &f->v.t, &o, &f->lse.t, NULL), FA_OK);
}

/* Ensure the limits are checked with clear statuses: head dims above FA_HEAD_DIM_MAX
 * (they reach int kernel parameters; with a zero-stride view a huge d costs no memory),
 * a strided view whose largest offset overflows, and a standard-path seqlen_k beyond int. */
static void test_limits_of_head_dims_offsets_and_seqlen(void **state)
{
    fixture *f = *state;
    float one[8] = {0.5f, -0.25f, 0.125f, 1, 0, 0, 0, 0};
    float out[64];
    const int64_t zero[4] = {0, 0, 0, 0};
    /* d = 2^40 through zero strides: SHAPE, not an int overflow in the block rule */
    const int64_t huge_d = (int64_t)1 << 40;
    const int64_t qs[4] = {1, 2, 1, huge_d}, vs[4] = {1, 2, 1, 4}, os[4] = {1, 2, 1, 4};
    fa_tensor q, k, v, o;
    assert_int_equal(fa_tensor_make(&q, one, FA_F32, 4, qs, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&k, one, FA_F32, 4, qs, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&v, one, FA_F32, 4, vs, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&o, out, FA_F32, 4, os, NULL), FA_OK);
    expect_status(fa_forward(&q, &k, &v, &o, NULL, NULL), FA_ERR_SHAPE, "head dim d must be in 1..4096", f);
    /* d_v = FA_HEAD_DIM_MAX + 1 */
    const int64_t qs2[4] = {1, 2, 1, 4}, vs2[4] = {1, 2, 1, FA_HEAD_DIM_MAX + 1};
    assert_int_equal(fa_tensor_make(&q, one, FA_F32, 4, qs2, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&k, one, FA_F32, 4, qs2, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&v, one, FA_F32, 4, vs2, zero), FA_OK);
    expect_status(fa_forward(&q, &k, &v, &o, NULL, NULL), FA_ERR_SHAPE, "d_v", f);
    int br, bc;
    expect_status(fa_block_sizes(64, (int64_t)1 << 40, NULL, &br, &bc), FA_ERR_SHAPE, "head dims", f);
    /* a view whose last element lies beyond 2^63 bytes */
    const int64_t big_stride[4] = {0, (int64_t)1 << 61, 0, 1};
    assert_int_equal(fa_tensor_make(&q, one, FA_F32, 4, qs2, big_stride), FA_OK);
    assert_int_equal(fa_tensor_make(&k, one, FA_F32, 4, qs2, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&v, one, FA_F32, 4, vs, zero), FA_OK);
    expect_status(fa_forward(&q, &k, &v, &o, NULL, NULL), FA_ERR_STRIDE, "q: the largest offset", f);
    /* standard with seqlen_k beyond INT_MAX (zero-stride K and V: no memory) */
    const int64_t ks3[4] = {1, ((int64_t)1 << 31) + 1, 1, 4};
    assert_int_equal(fa_tensor_make(&q, one, FA_F32, 4, qs2, NULL), FA_OK);
    assert_int_equal(fa_tensor_make(&k, one, FA_F32, 4, ks3, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&v, one, FA_F32, 4, ks3, zero), FA_OK);
    fa_options opt = fa_options_default();
    opt.impl = FA_IMPL_STANDARD;
    expect_status(fa_forward(&q, &k, &v, &o, NULL, &opt), FA_ERR_TOO_LARGE, "seqlen_k", f);
    /* and seqlen_q beyond INT_MAX with no keys (S would be empty) */
    const int64_t qs4[4] = {1, ((int64_t)1 << 31) + 1, 1, 4}, ks4[4] = {1, 0, 1, 4};
    fa_tensor o4;
    assert_int_equal(fa_tensor_make(&q, one, FA_F32, 4, qs4, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&k, one, FA_F32, 4, ks4, NULL), FA_OK);
    assert_int_equal(fa_tensor_make(&v, one, FA_F32, 4, ks4, NULL), FA_OK);
    assert_int_equal(fa_tensor_make(&o4, out, FA_F32, 4, qs4, NULL), FA_OK); /* not written: refused first */
    expect_status(fa_forward(&q, &k, &v, &o4, NULL, &opt), FA_ERR_TOO_LARGE, "seqlen_q", f);
}

/* Ensure every status has its own name, and an out-of-range one is "unknown". */
static void test_every_status_has_a_distinct_name(void **state)
{
    (void)state;
    for (int s = 0; s < FA_STATUS_COUNT; s++) {
        const char *name = fa_status_string((fa_status)s);
        assert_non_null(name);
        assert_true(name[0] != '\0');
        assert_null(strstr(name, "unknown status"));
        for (int t = 0; t < s; t++) assert_string_not_equal(name, fa_status_string((fa_status)t));
    }
    assert_non_null(strstr(fa_status_string(FA_STATUS_COUNT), "unknown"));
    assert_non_null(strstr(fa_status_string((fa_status)-1), "unknown"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isa_is_reported_when_forced_isa_is_unknown),
        cmocka_unit_test(test_ok_when_the_problem_is_valid),
        cmocka_unit_test(test_null_arg_when_a_tensor_is_null),
        cmocka_unit_test(test_dtype_when_dtype_is_invalid_or_disallowed),
        cmocka_unit_test(test_shape_when_shapes_are_inconsistent),
        cmocka_unit_test(test_heads_when_heads_is_not_a_multiple_of_heads_k),
        cmocka_unit_test(test_stride_when_a_stride_is_negative),
        cmocka_unit_test(test_option_when_an_option_is_out_of_range),
        cmocka_unit_test(test_alibi_when_slopes_are_wrong),
        cmocka_unit_test(test_impl_when_implementation_is_unknown),
        cmocka_unit_test(test_nomem_when_scratch_cannot_be_allocated),
        cmocka_unit_test(test_too_large_when_standard_exceeds_its_cap),
        cmocka_unit_test(test_io_and_format_when_files_are_missing_or_malformed),
        cmocka_unit_test(test_nonfinite_when_check_inputs_contain_nan),
        cmocka_unit_test(test_backward_reports_impl_null_and_shape_errors),
        cmocka_unit_test(test_stride_when_an_output_overlaps_an_input_or_an_output),
        cmocka_unit_test(test_stride_when_an_output_has_a_zero_stride),
        cmocka_unit_test(test_stride_when_an_output_overlaps_itself),
        cmocka_unit_test(test_limits_of_head_dims_offsets_and_seqlen),
        cmocka_unit_test(test_every_status_has_a_distinct_name),
    };
    tu_seed();
    return cmocka_run_group_tests_name("status", tests, setup, teardown);
}
