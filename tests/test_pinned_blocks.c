/*
 * test_pinned_blocks.c — bits are identical per (ISA, block sizes); pinning
 * the blocks reproduces them on a machine with another L2.
 *
 * The environment is read once per process, so this program runs itself as
 * children under different FA_L2_BYTES (standing in for machines with a
 * 256 KiB and a 2 MiB L2): each child prints the flash blocks it derived or
 * was given and a hash of the O and LSE bits of a fixed problem. Unpinned,
 * the two "machines" choose different blocks (which is why bits may differ
 * across machines); pinned with FA_BLOCK_Q / FA_BLOCK_K, the blocks and the
 * bits are the same. The ISA is the same in all children (the dispatcher's).
 */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Child: blocks, a 64-bit FNV-1a hash of O and LSE of a fixed problem, and the
 * rows per strip fa_strip_rows reports. */
static int child(void)
{
    uint64_t rng = 0x5eed;
    tu_tensor q = tu_alloc4(FA_F32, 1, 300, 2, 64, 0), k = tu_alloc4(FA_F32, 1, 700, 2, 64, 0);
    tu_tensor v = tu_alloc4(FA_F32, 1, 700, 2, 64, 0), o = tu_alloc4(FA_F32, 1, 300, 2, 64, 0);
    const int64_t ls[3] = {1, 2, 300};
    tu_tensor lse = tu_alloc(FA_F32, 3, ls);
    tu_fill(&q, &rng, -1, 1);
    tu_fill(&k, &rng, -1, 1);
    tu_fill(&v, &rng, -1, 1);
    int br, bc, strip;
    fa_options opt = fa_options_default();
    opt.causal = getenv("FA_PINNED_PLAIN") ? 0 : 1; /* FA_PINNED_PLAIN: no mask (the tail split's test) */
    if (fa_block_sizes(64, 64, &opt, &br, &bc) != FA_OK || fa_strip_rows(64, 64, &opt, &strip) != FA_OK ||
        fa_forward(&q.t, &k.t, &v.t, &o.t, &lse.t, &opt) != FA_OK) {
        fprintf(stderr, "child: %s\n", fa_last_error());
        return 1;
    }
    uint64_t h = 1469598103934665603ull;
    const unsigned char *bytes[2] = {o.mem, lse.mem};
    const size_t n[2] = {o.bytes, lse.bytes};
    for (int x = 0; x < 2; x++)
        for (size_t i = 0; i < n[x]; i++) h = (h ^ bytes[x][i]) * 1099511628211ull;
    printf("%d %d %016llx %d\n", br, bc, (unsigned long long)h, strip);
    tu_free(&q); tu_free(&k); tu_free(&v); tu_free(&o); tu_free(&lse);
    return 0;
}

static const char *self;

/* Run a child under `env` ("VAR=value ..."); parse its line (strip: may be NULL). */
static void run_child_strip(const char *env, int *br, int *bc, char hash[17], int *strip)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "env FA_PINNED_CHILD=1 %s '%s'", env, self);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    int st;
    if (fscanf(f, "%d %d %16s %d", br, bc, hash, &st) != 4) fail_msg("child '%s' printed no result", env);
    assert_int_equal(pclose(f), 0);
    if (strip) *strip = st;
}

static void run_child(const char *env, int *br, int *bc, char hash[17])
{
    run_child_strip(env, br, bc, hash, NULL);
}

/* Ensure unpinned blocks follow the L2, and pinned blocks give the same bits under any L2. */
static void test_pinned_blocks_reproduce_bits_across_l2_sizes(void **state)
{
    (void)state;
    int br1, bc1, br2, bc2;
    char h1[17], h2[17];
    run_child("FA_L2_BYTES=256K", &br1, &bc1, h1);
    run_child("FA_L2_BYTES=2M", &br2, &bc2, h2);
    if (br1 == br2 && bc1 == bc2) fail_msg("L2 256K and 2M derived the same blocks (%d, %d)", br1, bc1);
    run_child("FA_L2_BYTES=256K FA_BLOCK_Q=96 FA_BLOCK_K=80", &br1, &bc1, h1);
    run_child("FA_L2_BYTES=2M FA_BLOCK_Q=96 FA_BLOCK_K=80", &br2, &bc2, h2);
    assert_int_equal(br1, 96);
    assert_int_equal(bc1, 80);
    assert_int_equal(br2, 96);
    assert_int_equal(bc2, 80);
    assert_string_equal(h1, h2);
}

/*
 * Ensure the strips of whole tiles (src/flash.c, strip_rows) never move a bit:
 * strips sized from L1d (16 KiB: 32 rows on AVX-512, 36 on AVX2 at this Bc;
 * 4 KiB: whole tiles on the SIMD tables, 9 rows on scalar; 1 GiB: whole
 * tiles), pinned to one row block or to 40 rows, or off, all give the bits
 * of the default, blocks pinned; and a malformed FA_STRIP_ROWS is refused.
 */
static void test_strip_rows_do_not_move_the_bits(void **state)
{
    (void)state;
    /* each setting, and the rows per strip fa_strip_rows must report for it (Br = 96):
     * [lo, hi]; the register blocks are 1 (scalar) to 8 rows, so 1 pins 1..8, 40 pins 36..40;
     * 4K: 9 rows on scalar, 8 on NEON (row block 4), whole tiles (96) on AVX2 / AVX-512 */
    static const struct { const char *env; int lo, hi; } cases[] = {
        {"FA_STRIP_ROWS=0", 96, 96}, {"FA_STRIP_ROWS=1", 1, 8}, {"FA_STRIP_ROWS=40", 36, 40},
        {"FA_L1D_BYTES=16K", 9, 48}, {"FA_L1D_BYTES=4K", 8, 96}, {"FA_L1D_BYTES=1G", 96, 96}};
    int br0, bc0;
    char h0[17];
    run_child("FA_BLOCK_Q=96 FA_BLOCK_K=80", &br0, &bc0, h0);
    for (size_t x = 0; x < sizeof cases / sizeof cases[0]; x++) {
        char env[128], h[17];
        int br, bc, strip;
        snprintf(env, sizeof env, "FA_BLOCK_Q=96 FA_BLOCK_K=80 %s", cases[x].env);
        run_child_strip(env, &br, &bc, h, &strip);
        if (strcmp(h, h0) != 0) fail_msg("%s: hash %s, default %s", cases[x].env, h, h0);
        if (strip < cases[x].lo || strip > cases[x].hi)
            fail_msg("%s: fa_strip_rows says %d rows, expected %d..%d", cases[x].env, strip, cases[x].lo, cases[x].hi);
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "env FA_PINNED_CHILD=1 FA_STRIP_ROWS=x12 '%s' 2>/dev/null", self);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char line[256];
    if (fgets(line, sizeof line, f)) fail_msg("FA_STRIP_ROWS=x12 was accepted: %s", line);
    assert_int_not_equal(pclose(f), 0);
}

/*
 * A scheduling knob read from the environment: under `base` (blocks, and the mask choice)
 * with each thread setting, every value in good[] gives the default's hash, and every value
 * in bad[] is refused (no result, non-zero exit).
 */
static void expect_env_keeps_bits(const char *base, const char *const threads[2], const char *const *good, size_t ngood,
                                  const char *const *bad, size_t nbad)
{
    for (size_t t = 0; t < 2; t++) {
        int br0, bc0;
        char h0[17], env[160];
        snprintf(env, sizeof env, "%s %s", base, threads[t]);
        run_child(env, &br0, &bc0, h0);
        for (size_t x = 0; x < ngood; x++) {
            char h[17];
            int br, bc;
            snprintf(env, sizeof env, "%s %s %s", base, threads[t], good[x]);
            run_child(env, &br, &bc, h);
            if (strcmp(h, h0) != 0) fail_msg("%s: hash %s, default %s", env, h, h0);
        }
    }
    for (size_t x = 0; x < nbad; x++) {
        char cmd[1024], line[256];
        snprintf(cmd, sizeof cmd, "env FA_PINNED_CHILD=1 %s '%s' 2>/dev/null", bad[x], self);
        FILE *f = popen(cmd, "r");
        assert_non_null(f);
        if (fgets(line, sizeof line, f)) fail_msg("%s was accepted: %s", bad[x], line);
        assert_int_not_equal(pclose(f), 0);
    }
}

/*
 * Ensure FA_TASK_CHUNK (flash.c's task order: N pieces of one head a grab) is read from
 * the environment and never moves a bit — 3 and 1024 pieces a grab, on the default and
 * on 7 threads (Q blocks cut into pieces) — and that values outside 0..1024 or not a
 * number are refused.
 */
static void test_task_chunk_env_does_not_move_the_bits(void **state)
{
    (void)state;
    static const char *const threads[] = {"", "OMP_NUM_THREADS=7"};
    static const char *const good[] = {"FA_TASK_CHUNK=0", "FA_TASK_CHUNK=3", "FA_TASK_CHUNK=1024"};
    static const char *const bad[] = {"FA_TASK_CHUNK=1025", "FA_TASK_CHUNK=-1", "FA_TASK_CHUNK=4x"};
    expect_env_keeps_bits("FA_BLOCK_Q=96 FA_BLOCK_K=80", threads, good, 3, bad, 3);
}

/*
 * Ensure FA_TAIL_SPLIT (flash.c's tail_split: a pass's last tasks cut into N pieces) is read from
 * the environment and never moves a bit — whole (0, 1), 2 and 1024 pieces, on 2 and on 7
 * threads (Q blocks cut into pieces) — and that values outside 0..1024 or not a number are
 * refused. The child runs unmasked here (FA_PINNED_PLAIN): under its causal mask the split is
 * skipped.
 */
static void test_tail_split_env_does_not_move_the_bits(void **state)
{
    (void)state;
    static const char *const threads[] = {"OMP_NUM_THREADS=2", "OMP_NUM_THREADS=7"};
    static const char *const good[] = {"FA_TAIL_SPLIT=0", "FA_TAIL_SPLIT=1", "FA_TAIL_SPLIT=2", "FA_TAIL_SPLIT=1024"};
    static const char *const bad[] = {"FA_TAIL_SPLIT=1025", "FA_TAIL_SPLIT=-1", "FA_TAIL_SPLIT=4x"};
    expect_env_keeps_bits("FA_PINNED_PLAIN=1 FA_BLOCK_Q=96 FA_BLOCK_K=80", threads, good, 4, bad, 3);
}

int main(int argc, char **argv)
{
    (void)argc;
    if (getenv("FA_PINNED_CHILD")) return child();
    self = argv[0];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pinned_blocks_reproduce_bits_across_l2_sizes),
        cmocka_unit_test(test_strip_rows_do_not_move_the_bits),
        cmocka_unit_test(test_task_chunk_env_does_not_move_the_bits),
        cmocka_unit_test(test_tail_split_env_does_not_move_the_bits),
    };
    return cmocka_run_group_tests_name("pinned_blocks", tests, NULL, NULL);
}
