/*
 * test_diagnose.c — fa_diagnose()'s C API (issue 13 item 1).
 *
 * The per-class injections live in tests/test_diagnose.py (an independent
 * numpy model per mistake); here: the API on strided (BHSD) views, a fitted
 * parameter checked against the one injected, a correct output gets no
 * diagnosis, and bad arguments get a status, never a crash.
 * Seeded random inputs (seed printed; FA_TEST_SEED replays).
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct prob {
    tu_tensor q, k, v, o, lse;
} prob;

static void make(prob *P, int bhsd, uint64_t *rng)
{
    P->q = tu_alloc4(FA_F32, 2, 29, 4, 16, bhsd);
    P->k = tu_alloc4(FA_F32, 2, 41, 2, 16, bhsd);
    P->v = tu_alloc4(FA_F32, 2, 41, 2, 16, bhsd);
    P->o = tu_alloc4(FA_F32, 2, 29, 4, 16, bhsd);
    const int64_t ls[3] = {2, 4, 29};
    P->lse = tu_alloc(FA_F32, 3, ls);
    tu_fill(&P->q, rng, -1.5, 1.5);
    tu_fill(&P->k, rng, -1.5, 1.5);
    tu_fill(&P->v, rng, -1.0, 1.0);
}

static void drop(prob *P)
{
    tu_free(&P->q);
    tu_free(&P->k);
    tu_free(&P->v);
    tu_free(&P->o);
    tu_free(&P->lse);
}

/* A kernel that used twice the scale, on BHSD views: diagnosed as `scale`, factor ~2. */
static void test_scale_mistake_on_strided_views(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() + 11;
    prob P;
    make(&P, 1, &rng);
    fa_options opt = fa_options_default();
    opt.causal = 1;
    opt.impl = FA_IMPL_REFERENCE;
    opt.scale = 2.0 / sqrt(16.0);
    assert_int_equal(fa_forward(&P.q.t, &P.k.t, &P.v.t, &P.o.t, &P.lse.t, &opt), FA_OK);
    opt.scale = 0.0; /* what the kernel should have used */
    fa_diagnose_options dopt;
    fa_diagnose_options_init(&dopt, sizeof dopt);
    dopt.sample_rows = 6;
    fa_diagnose_report rep = fa_diagnose_report_init();
    assert_int_equal(fa_diagnose(&P.q.t, &P.k.t, &P.v.t, &P.o.t, &P.lse.t, &opt, &dopt, &rep), FA_OK);
    assert_true(rep.n >= 1);
    assert_string_equal(rep.items[0].id, "scale");
    assert_true(fabs(rep.items[0].param - 2.0) < 0.01);
    assert_true(rep.items[0].explained > 0.99);
    assert_int_equal(rep.rows_sampled, 2 * 4 * 6);
    assert_int_equal(rep.n_heads, 4);
    assert_int_equal(rep.n_batch, 2);
    assert_true(rep.out_significant && rep.lse_significant);
    /* snprintf-like text */
    const size_t len = fa_diagnose_report_format(&rep, NULL, 0);
    char small[16];
    assert_int_equal(fa_diagnose_report_format(&rep, small, sizeof small), len);
    assert_int_equal(strlen(small), sizeof small - 1);
    char *text = malloc(len + 1);
    assert_non_null(text);
    fa_diagnose_report_format(&rep, text, len + 1);
    assert_non_null(strstr(text, "diagnosis: scale (explains "));
    assert_non_null(strstr(text, "error by head"));
    free(text);
    fa_diagnose_report_free(&rep);
    assert_null(rep.head_rel_rms);
    drop(&P);
}

/* The flash path's own output: nothing to diagnose. */
static void test_correct_output_gets_none(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() + 12;
    prob P;
    make(&P, 0, &rng);
    fa_options opt = fa_options_default();
    opt.window_left = 7;
    opt.window_right = 2;
    assert_int_equal(fa_forward(&P.q.t, &P.k.t, &P.v.t, &P.o.t, &P.lse.t, &opt), FA_OK);
    fa_diagnose_report rep = fa_diagnose_report_init();
    assert_int_equal(fa_diagnose(&P.q.t, &P.k.t, &P.v.t, &P.o.t, &P.lse.t, &opt, NULL, &rep), FA_OK);
    assert_int_equal(rep.n, 0);
    assert_false(rep.out_significant);
    assert_false(rep.lse_significant);
    assert_int_equal(rep.rows_sampled, 2 * 4 * 29);
    char buf[256];
    fa_diagnose_report_format(&rep, buf, sizeof buf);
    assert_non_null(strstr(buf, "diagnosis: none"));
    fa_diagnose_report_free(&rep);
    drop(&P);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() + 13;
    prob P;
    make(&P, 0, &rng);
    fa_diagnose_report rep = fa_diagnose_report_init();
    assert_int_equal(fa_diagnose(&P.q.t, &P.k.t, &P.v.t, &P.o.t, NULL, NULL, NULL, NULL), FA_ERR_NULL_ARG);
    assert_int_equal(fa_diagnose(&P.q.t, &P.k.t, &P.v.t, NULL, NULL, NULL, NULL, &rep), FA_ERR_NULL_ARG);
    rep.struct_size = 3;
    assert_int_equal(fa_diagnose(&P.q.t, &P.k.t, &P.v.t, &P.o.t, NULL, NULL, NULL, &rep), FA_ERR_OPTION);
    rep = fa_diagnose_report_init();
    fa_diagnose_options dopt;
    fa_diagnose_options_init(&dopt, sizeof dopt);
    dopt.struct_size = 5;
    assert_int_equal(fa_diagnose(&P.q.t, &P.k.t, &P.v.t, &P.o.t, NULL, NULL, &dopt, &rep), FA_ERR_OPTION);
    fa_diagnose_options_init(&dopt, sizeof dopt);
    dopt.sample_rows = -1;
    assert_int_equal(fa_diagnose(&P.q.t, &P.k.t, &P.v.t, &P.o.t, NULL, NULL, &dopt, &rep), FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "sample_rows"));
    fa_diagnose_options_init(&dopt, sizeof dopt);
    dopt.min_explained = NAN;
    assert_int_equal(fa_diagnose(&P.q.t, &P.k.t, &P.v.t, &P.o.t, NULL, NULL, &dopt, &rep), FA_ERR_OPTION);
    /* an output of the wrong shape: the validator's message */
    tu_tensor bad = tu_alloc4(FA_F32, 2, 28, 4, 16, 0);
    assert_int_equal(fa_diagnose(&P.q.t, &P.k.t, &P.v.t, &bad.t, NULL, NULL, NULL, &rep), FA_ERR_SHAPE);
    tu_free(&bad);
    fa_diagnose_report_free(&rep);
    fa_diagnose_report_free(NULL);
    drop(&P);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scale_mistake_on_strided_views),
        cmocka_unit_test(test_correct_output_gets_none),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
