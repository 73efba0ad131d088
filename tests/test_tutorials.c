/*
 * test_tutorials.c — the tutorials' cache simulator follows cachegrind's
 * model, and the softmax lesson of step 01 holds.
 *
 * The simulator's rules (LRU, write-allocate, bit-selection sets, L2 looked up
 * only on an L1 miss, a straddling access = one access and at most one miss)
 * are each pinned by a small hand-computed case. Agreement with valgrind
 * itself, and the scaling lessons (misses ~ N^2, ~ N^2 d^2 / M), are checked
 * end to end by tests/test_tutorials.sh.
 *
 * Step 01 is compiled into this suite (its main renamed) so that the test
 * exercises the tutorial's own softmax functions, not a copy of them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#define main tutorial_01_main
#include "../tutorials/01_softmax.c"
#undef main

/* A one-level cache: `sets` sets of `ways` ways, 64-byte lines. */
static cachesim *small_cache(int sets, int ways)
{
    cachesim_config c;
    memset(&c, 0, sizeof c);
    c.l1 = (cachesim_level){(size_t)sets * ways * 64, ways, 64};
    cachesim *cs = cachesim_create(&c);
    assert_non_null(cs);
    return cs;
}

/* A line-aligned address for line number `line` (never dereferenced). */
static const void *line_addr(uint64_t line) { return (const void *)(uintptr_t)(0x100000 + line * 64); }

/* Ensure the least recently used line is the one evicted when a set overflows. */
static void test_cachesim_evicts_least_recently_used_line(void **state)
{
    (void)state;
    cachesim *cs = small_cache(1, 4);
    for (uint64_t l = 0; l < 4; l++) cachesim_access(cs, line_addr(l), 4, 0);   /* 4 cold misses */
    cachesim_access(cs, line_addr(0), 4, 0);   /* hit: line 0 becomes most recent, 1 is LRU */
    cachesim_access(cs, line_addr(4), 4, 0);   /* miss: evicts line 1 */
    assert_int_equal(cachesim_misses(cs, 1), 5);
    cachesim_access(cs, line_addr(0), 4, 0);   /* still there */
    cachesim_access(cs, line_addr(2), 4, 0);   /* still there */
    assert_int_equal(cachesim_misses(cs, 1), 5);
    cachesim_access(cs, line_addr(1), 4, 0);   /* was evicted */
    assert_int_equal(cachesim_misses(cs, 1), 6);
    cachesim_free(cs);
}

/* Ensure a write miss allocates the line, so a following read hits. */
static void test_cachesim_allocates_on_write_miss(void **state)
{
    (void)state;
    cachesim *cs = small_cache(4, 2);
    cachesim_access(cs, line_addr(7), 4, 1);
    cachesim_access(cs, line_addr(7), 4, 0);
    cachesim_stats s;
    cachesim_get_stats(cs, 1, &s);
    assert_int_equal(s.writes, 1);
    assert_int_equal(s.write_misses, 1);
    assert_int_equal(s.reads, 1);
    assert_int_equal(s.read_misses, 0);
    cachesim_free(cs);
}

/* Ensure an access straddling two lines counts once, misses once, and fills both lines. */
static void test_cachesim_counts_straddling_access_once(void **state)
{
    (void)state;
    cachesim *cs = small_cache(4, 2);
    const char *base = line_addr(8);
    cachesim_access(cs, base + 60, 8, 0);      /* bytes 60..67: lines 8 and 9 */
    cachesim_stats s;
    cachesim_get_stats(cs, 1, &s);
    assert_int_equal(s.reads, 1);
    assert_int_equal(s.read_misses, 1);
    assert_int_equal(s.fills, 2);
    cachesim_access(cs, base, 4, 0);           /* both lines are now cached */
    cachesim_access(cs, base + 64, 4, 0);
    assert_int_equal(cachesim_misses(cs, 1), 1);
    cachesim_free(cs);
}

/* Ensure lines map to sets by plain bit selection: lines `sets` apart conflict, neighbours do not. */
static void test_cachesim_maps_sets_by_bit_selection(void **state)
{
    (void)state;
    cachesim *cs = small_cache(8, 1);          /* direct-mapped, 8 sets */
    cachesim_access(cs, line_addr(0), 4, 0);
    cachesim_access(cs, line_addr(1), 4, 0);   /* set 1: no conflict with line 0 */
    cachesim_access(cs, line_addr(0), 4, 0);
    assert_int_equal(cachesim_misses(cs, 1), 2);
    cachesim_access(cs, line_addr(8), 4, 0);   /* set 0 again: evicts line 0 */
    cachesim_access(cs, line_addr(0), 4, 0);
    assert_int_equal(cachesim_misses(cs, 1), 4);
    cachesim_free(cs);
}

/* Ensure dirty evictions are counted as write-backs and enter the traffic, clean ones not. */
static void test_cachesim_counts_writebacks_of_dirty_lines(void **state)
{
    (void)state;
    cachesim *cs = small_cache(1, 1);
    cachesim_access(cs, line_addr(0), 4, 1);   /* dirty */
    cachesim_access(cs, line_addr(1), 4, 0);   /* evicts dirty line 0: one write-back */
    cachesim_access(cs, line_addr(2), 4, 0);   /* evicts clean line 1: none */
    cachesim_stats s;
    cachesim_get_stats(cs, 1, &s);
    assert_int_equal(s.writebacks, 1);
    assert_int_equal(s.fills, 3);
    assert_int_equal(cachesim_traffic_bytes(cs, 1), 4 * 64);
    cachesim_free(cs);
}

/* Ensure L2 is looked up exactly on L1 misses and keeps what L1 evicted. */
static void test_cachesim_looks_up_l2_only_on_l1_miss(void **state)
{
    (void)state;
    cachesim_config c;
    memset(&c, 0, sizeof c);
    c.l1 = (cachesim_level){2 * 64, 2, 64};    /* 2 lines */
    c.l2 = (cachesim_level){16 * 64, 4, 64};   /* 16 lines */
    cachesim *cs = cachesim_create(&c);
    assert_non_null(cs);
    for (int rep = 0; rep < 3; rep++)
        for (uint64_t l = 0; l < 4; l++) cachesim_access(cs, line_addr(l), 4, 0);
    assert_int_equal(cachesim_misses(cs, 1), 12);      /* 4 lines cycle through 2: always miss */
    assert_int_equal(cachesim_accesses(cs, 2), 12);    /* every L1 miss asks L2 */
    assert_int_equal(cachesim_misses(cs, 2), 4);       /* L2 holds all 4 after the first round */
    cachesim_reset(cs);
    assert_int_equal(cachesim_accesses(cs, 1), 0);
    cachesim_access(cs, line_addr(0), 4, 0);
    assert_int_equal(cachesim_misses(cs, 2), 1);       /* reset means cold */
    cachesim_free(cs);
}

/* Ensure geometries parse as documented and ones cachegrind would refuse are refused. */
static void test_cachesim_parses_and_checks_geometries(void **state)
{
    (void)state;
    cachesim_config c;
    const char *err = NULL;
    assert_int_equal(cachesim_config_parse("48K,12,64:1M,16,64", &c, &err), 0);
    assert_int_equal(c.l1.size_bytes, 49152);
    assert_int_equal(c.l1.ways, 12);
    assert_int_equal(c.l2.size_bytes, 1 << 20);
    char buf[64];
    cachesim_config_format(&c, buf, sizeof buf);
    assert_string_equal(buf, "48K,12,64:1M,16,64");
    assert_int_equal(cachesim_config_parse("teaching", &c, &err), 0);
    assert_int_equal(c.l1.size_bytes, 32768);
    assert_int_equal(cachesim_config_parse("48K,8,64", &c, &err), -1);   /* 96 sets: not a power of two */
    assert_non_null(err);
    assert_int_equal(cachesim_config_parse("32K,8", &c, &err), -1);
    assert_int_equal(cachesim_config_parse("32K,8,48", &c, &err), -1);  /* line not a power of two */
}

/* Ensure online softmax equals safe softmax within 1e-5 of max p, also where naive overflows. */
static void test_online_softmax_equals_safe_softmax(void **state)
{
    (void)state;
    uint64_t seed = tu_seed();
    const int sizes[] = {1, 7, 64, 1000, 100000};
    const float shifts[] = {0.0f, 80.0f, 1000.0f};   /* 1000: e^x overflows float32 */
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (size_t h = 0; h < sizeof shifts / sizeof shifts[0]; h++) {
            int n = sizes[si];
            float *x = malloc((size_t)n * 4), *ps = malloc((size_t)n * 4), *po = malloc((size_t)n * 4);
            assert_non_null(x);
            tut_fill(x, (size_t)n, seed + si, -10, 10);
            for (int j = 0; j < n; j++) x[j] += shifts[h];
            softmax_safe(n, x, ps);
            softmax_online(n, x, po);
            double e = 0, big = 0, sum = 0;
            for (int j = 0; j < n; j++) {
                e = fmax(e, fabs((double)po[j] - ps[j]));
                big = fmax(big, ps[j]);
                sum += po[j];
            }
            assert_true(e <= 1e-5 * big);
            assert_true(fabs(sum - 1.0) < 1e-3);
            free(x); free(ps); free(po);
        }
}

/* Ensure naive softmax overflows to NaN above ln(FLT_MAX) ~ 88.72, as step 01 teaches. */
static void test_naive_softmax_overflows_above_88_72(void **state)
{
    (void)state;
    float x[2] = {88.0f, 87.0f}, p[2];
    softmax_naive(2, x, p);
    assert_false(isnan(p[0]));
    x[0] = 89.0f;
    softmax_naive(2, x, p);
    assert_true(isnan(p[0]));
    softmax_online(2, x, p);
    assert_false(isnan(p[0]));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cachesim_evicts_least_recently_used_line),
        cmocka_unit_test(test_cachesim_allocates_on_write_miss),
        cmocka_unit_test(test_cachesim_counts_straddling_access_once),
        cmocka_unit_test(test_cachesim_maps_sets_by_bit_selection),
        cmocka_unit_test(test_cachesim_counts_writebacks_of_dirty_lines),
        cmocka_unit_test(test_cachesim_looks_up_l2_only_on_l1_miss),
        cmocka_unit_test(test_cachesim_parses_and_checks_geometries),
        cmocka_unit_test(test_online_softmax_equals_safe_softmax),
        cmocka_unit_test(test_naive_softmax_overflows_above_88_72),
    };
    return cmocka_run_group_tests_name("tutorials", tests, NULL, NULL);
}
