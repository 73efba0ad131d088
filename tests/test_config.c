/*
 * test_config.c — the environment is read once, strictly.
 *
 * Its own process: the first library call of this program happens with
 * FA_FLASH_SHARED_MAX=16MB in the environment (not a byte count: "16M" or
 * "16MiB" is). Every call that depends on the environment must then refuse
 * with FA_ERR_OPTION naming the variable — before this rule, "16M" was read
 * as 16 bytes and "16MB" likewise, silently — and go on refusing after the
 * variable is fixed (read once). The byte parser itself is checked on its
 * own: K/M/G are binary units, anything else is refused.
 */
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "internal.h"

/* Ensure byte counts parse strictly, with binary units. */
static void test_byte_counts_parse_strictly(void **state)
{
    (void)state;
    size_t b = 0;
    assert_int_equal(fa_parse_bytes("16M", &b), 0);
    assert_int_equal(b, (size_t)16 << 20);
    assert_int_equal(fa_parse_bytes("16MiB", &b), 0);
    assert_int_equal(b, (size_t)16 << 20);
    assert_int_equal(fa_parse_bytes("64k", &b), 0);
    assert_int_equal(b, (size_t)64 << 10);
    assert_int_equal(fa_parse_bytes("1G", &b), 0);
    assert_int_equal(b, (size_t)1 << 30);
    assert_int_equal(fa_parse_bytes("0", &b), 0);
    assert_int_equal(b, 0);
    assert_int_equal(fa_parse_bytes("4096", &b), 0);
    assert_int_equal(b, 4096);
    const char *bad[] = {"", "16MB", "16 M", "-1", "+5", "1.5M", "M", "12x", "0x10",
                         "18446744073709551616", "17179869184G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (fa_parse_bytes(bad[i], &b) == 0) fail_msg("'%s' parsed as %zu bytes", bad[i], b);
}

/* Ensure fa_even_block keeps the block count, a multiple of the row block, and no sliver. */
static void test_even_blocks_leave_no_sliver(void **state)
{
    (void)state;
    assert_int_equal(fa_even_block(1024, 204, 6), 174); /* 5 x 174 + 154, not 5 x 204 + 4 */
    assert_int_equal(fa_even_block(1024, 256, 8), 256); /* divides: unchanged */
    assert_int_equal(fa_even_block(100, 256, 8), 256);  /* one block: unchanged */
    for (int64_t n = 1; n <= 3000; n += 7)
        for (int blk = 1; blk <= 512; blk += 13)
            for (int rb = 1; rb <= 16; rb *= 2) {
                const int e = fa_even_block(n, blk, rb);
                const int64_t nb = (n + blk - 1) / blk, ne = (n + e - 1) / e;
                if (e > blk || e < 1 || ne != nb || (e != blk && e % rb != 0))
                    fail_msg("n=%lld blk=%d rb=%d: %d rows, %lld blocks (was %lld)", (long long)n, blk, rb, e,
                             (long long)ne, (long long)nb);
                /* the last block: no smaller than the others by more than they are apart */
                const int64_t last = n - (ne - 1) * e;
                if (e != blk && last < e - (int64_t)rb * ne)
                    fail_msg("n=%lld blk=%d rb=%d: last block %lld of %d", (long long)n, blk, rb, (long long)last, e);
            }
}

/* Ensure a malformed FA_FLASH_SHARED_MAX is refused by name, and stays refused (read once). */
static void test_malformed_environment_is_refused_once_and_for_all(void **state)
{
    (void)state;
    tu_tensor q = tu_alloc4(FA_F32, 1, 8, 1, 16, 0), k = tu_alloc4(FA_F32, 1, 8, 1, 16, 0);
    tu_tensor v = tu_alloc4(FA_F32, 1, 8, 1, 16, 0), o = tu_alloc4(FA_F32, 1, 8, 1, 16, 0);
    uint64_t rng = tu_seed();
    tu_fill(&q, &rng, -1, 1);
    tu_fill(&k, &rng, -1, 1);
    tu_fill(&v, &rng, -1, 1);
    assert_int_equal(fa_forward(&q.t, &k.t, &v.t, &o.t, NULL, NULL), FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "FA_FLASH_SHARED_MAX=16MB"));
    fa_cpu_info info;
    assert_int_equal(fa_get_cpu_info(&info), FA_ERR_OPTION);
    setenv("FA_FLASH_SHARED_MAX", "16M", 1); /* too late: the environment was read once */
    assert_int_equal(fa_forward(&q.t, &k.t, &v.t, &o.t, NULL, NULL), FA_ERR_OPTION);
    tu_free(&q); tu_free(&k); tu_free(&v); tu_free(&o);
}

int main(void)
{
    setenv("FA_FLASH_SHARED_MAX", "16MB", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_counts_parse_strictly),
        cmocka_unit_test(test_even_blocks_leave_no_sliver),
        cmocka_unit_test(test_malformed_environment_is_refused_once_and_for_all),
    };
    tu_seed();
    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
