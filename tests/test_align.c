/*
 * test_align.c — fa_options::align through the C API (issue 13 item 6).
 *
 *   - A caller compiled before align existed (its struct ends after `context`)
 *     still works and gets bottom-right alignment: the same bits as a current
 *     caller with align = FA_ALIGN_BOTTOM_RIGHT.
 *   - FA_ALIGN_TOP_LEFT with seqlen_q > seqlen_k under causal: no row is
 *     empty, row i sees keys 0..min(i, Sk-1) (checked against a plain float64
 *     loop here), and every implementation agrees.
 *   - An align value that is neither is refused (FA_ERR_OPTION).
 * The numeric agreement with an independent model is tests/test_align.py's.
 */
#include "test_util.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

static void test_old_callers_get_bottom_right(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() + 31;
    tu_tensor q = tu_alloc4(FA_F32, 1, 23, 2, 8, 0), k = tu_alloc4(FA_F32, 1, 9, 2, 8, 0);
    tu_tensor v = tu_alloc4(FA_F32, 1, 9, 2, 8, 0);
    tu_tensor o1 = tu_alloc4(FA_F32, 1, 23, 2, 8, 0), o2 = tu_alloc4(FA_F32, 1, 23, 2, 8, 0);
    tu_fill(&q, &rng, -1, 1);
    tu_fill(&k, &rng, -1, 1);
    tu_fill(&v, &rng, -1, 1);
    fa_options old;
    const size_t old_size = offsetof(fa_options, context) + sizeof(fa_context *);
    memset(&old, 0x5a, sizeof old); /* bytes past the old struct must never be read */
    fa_options_init(&old, old_size);
    old.causal = 1;
    assert_int_equal(fa_forward(&q.t, &k.t, &v.t, &o1.t, NULL, &old), FA_OK);
    fa_options cur = fa_options_default();
    cur.causal = 1;
    assert_int_equal(cur.align, FA_ALIGN_BOTTOM_RIGHT);
    assert_int_equal(fa_forward(&q.t, &k.t, &v.t, &o2.t, NULL, &cur), FA_OK);
    assert_memory_equal(o1.mem, o2.mem, o1.bytes);
    /* bottom-right with Sq > Sk: the first Sq - Sk rows are empty (O = 0) */
    const int64_t idx[4] = {0, 0, 1, 3};
    assert_true(tu_get(&o2, idx) == 0.0);
    cur.align = FA_ALIGN_TOP_LEFT;
    assert_int_equal(fa_forward(&q.t, &k.t, &v.t, &o2.t, NULL, &cur), FA_OK);
    assert_true(tu_get(&o2, idx) != 0.0);
    cur.align = 7;
    assert_int_equal(fa_forward(&q.t, &k.t, &v.t, &o2.t, NULL, &cur), FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "align"));
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&o1);
    tu_free(&o2);
}

static void test_top_left_rows_and_implementations(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() + 32;
    const int64_t Sq = 40, Sk = 17, d = 8;
    tu_tensor q = tu_alloc4(FA_F32, 1, Sq, 1, d, 0), k = tu_alloc4(FA_F32, 1, Sk, 1, d, 0);
    tu_tensor v = tu_alloc4(FA_F32, 1, Sk, 1, d, 0);
    tu_fill(&q, &rng, -1, 1);
    tu_fill(&k, &rng, -1, 1);
    tu_fill(&v, &rng, -1, 1);
    fa_options opt = fa_options_default();
    opt.causal = 1;
    opt.align = FA_ALIGN_TOP_LEFT;
    tu_tensor o[3];
    const fa_impl impls[3] = {FA_IMPL_REFERENCE, FA_IMPL_STANDARD, FA_IMPL_FLASH};
    for (int x = 0; x < 3; x++) {
        o[x] = tu_alloc4(FA_F32, 1, Sq, 1, d, 0);
        opt.impl = impls[x];
        assert_int_equal(fa_forward(&q.t, &k.t, &v.t, &o[x].t, NULL, &opt), FA_OK);
    }
    const float *Q = q.mem, *K = k.mem, *V = v.mem, *O = o[0].mem;
    for (int64_t i = 0; i < Sq; i++) {
        const int64_t last = i < Sk - 1 ? i : Sk - 1; /* top-left: keys 0..i */
        double m = -INFINITY, s[64], l = 0.0, acc[8] = {0};
        for (int64_t j = 0; j <= last; j++) {
            double t = 0.0;
            for (int64_t c = 0; c < d; c++) t += (double)Q[i * d + c] * K[j * d + c];
            s[j] = t / sqrt((double)d);
            if (s[j] > m) m = s[j];
        }
        for (int64_t j = 0; j <= last; j++) {
            const double w = exp(s[j] - m);
            l += w;
            for (int64_t c = 0; c < d; c++) acc[c] += w * V[j * d + c];
        }
        for (int64_t c = 0; c < d; c++) assert_true(fabs(O[i * d + c] - acc[c] / l) < 1e-6);
    }
    assert_true(tu_max_abs_diff(&o[0], &o[1], NULL) < 5e-6);
    assert_true(tu_max_abs_diff(&o[0], &o[2], NULL) < 5e-6);
    for (int x = 0; x < 3; x++) tu_free(&o[x]);
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_old_callers_get_bottom_right),
        cmocka_unit_test(test_top_left_rows_and_implementations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
