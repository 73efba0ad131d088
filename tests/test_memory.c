/*
 * test_memory.c — memory ceilings as assertions, not timings.
 *
 * Every buffer the library allocates goes through its counting allocator
 * (fa_alloc_stats_get), so the scratch an implementation uses is measured
 * exactly, independent of the C library's allocator and of page-level RSS.
 *
 *   - flash at N = 65536, d = 64, one head, causal: below 16 MiB of scratch
 *     (the project's memory target, docs/performance.md), i.e. O(threads x block), with 1 and 2 threads;
 *   - standard at the same size refuses with FA_ERR_TOO_LARGE (S would be
 *     16 GiB) before allocating anything, and says so in fa_workspace_bytes.
 *
 * The flash run is the full causal problem (2^37 multiply-adds); O is then
 * checked against the float64 reference on a few rows, so the ceiling is not
 * met by skipping work.
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 65536
#define D 64
#define CEILING ((size_t)16 << 20)

typedef struct big {
    tu_tensor q, k, v, o, lse;
} big;

static int setup(void **state)
{
    big *b = calloc(1, sizeof *b);
    uint64_t rng = tu_seed() ^ 0x65536;
    b->q = tu_alloc4(FA_F32, 1, N, 1, D, 0);
    b->k = tu_alloc4(FA_F32, 1, N, 1, D, 0);
    b->v = tu_alloc4(FA_F32, 1, N, 1, D, 0);
    b->o = tu_alloc4(FA_F32, 1, N, 1, D, 0);
    int64_t ls[3] = {1, 1, N};
    b->lse = tu_alloc(FA_F32, 3, ls);
    tu_fill(&b->q, &rng, -1, 1);
    tu_fill(&b->k, &rng, -1, 1);
    tu_fill(&b->v, &rng, -1, 1);
    *state = b;
    return 0;
}

static int teardown(void **state)
{
    big *b = *state;
    tu_free(&b->q); tu_free(&b->k); tu_free(&b->v); tu_free(&b->o); tu_free(&b->lse);
    free(b);
    return 0;
}

/* Ensure flash at N = 65536 causal allocates < 16 MiB of scratch and still gets the answer. */
static void test_flash_scratch_stays_below_16_mib_at_n_65536(void **state)
{
    big *b = *state;
    static const int threads[] = {1, 2};
    fa_cpu_info info;
    assert_int_equal(fa_get_cpu_info(&info), FA_OK);
    /* Under the sanitizers (make sanitize sets FA_SANITIZED) the full causal run costs ~1 minute
     * a thread count on a 2-core machine, most of CI's sanitizer step: there it runs once, on the
     * most threads available (the shared packing and per-thread scratch both exercised); the
     * plain `make test` keeps both counts. */
    const int sanitized = getenv("FA_SANITIZED") != NULL;
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        if (threads[t] > info.max_threads) continue; /* a build without OpenMP: the same run again */
        if (sanitized && t + 1 < sizeof threads / sizeof threads[0] && threads[t + 1] <= info.max_threads)
            continue;
        fa_options opt = fa_options_default();
        opt.causal = 1;
        opt.num_threads = threads[t];
        size_t planned = 0;
        assert_int_equal(fa_workspace_bytes(&b->q.t, &b->k.t, &b->v.t, &opt, &planned), FA_OK);
        tu_poison(&b->o);
        fa_alloc_stats before, after;
        fa_alloc_stats_reset();
        fa_alloc_stats_get(&before);
        fa_status st = fa_forward(&b->q.t, &b->k.t, &b->v.t, &b->o.t, &b->lse.t, &opt);
        fa_alloc_stats_get(&after);
        if (st != FA_OK) fail_msg("flash: %s", fa_last_error());
        const size_t peak = after.peak_bytes - before.current_bytes;
        print_message("[ memory   ] flash N=%d d=%d causal, %d thread(s): peak scratch %.2f MiB "
                      "(planned %.2f MiB, %zu allocations)\n",
                      N, D, threads[t], peak / 1048576.0, planned / 1048576.0, after.total_allocs);
        if (peak >= CEILING) fail_msg("flash allocated %zu bytes at N=%d (ceiling %zu)", peak, N, CEILING);
        assert_int_equal(after.current_bytes, before.current_bytes); /* everything freed */
        assert_true(planned < CEILING);
        assert_int_equal(tu_count_nan(&b->o), 0);
    }

    /* a few rows against the float64 reference, straight from the definition */
    static const int64_t rows[] = {0, 1, 4095, 40000, N - 1};
    const float *q = b->q.mem, *k = b->k.mem, *v = b->v.mem, *o = b->o.mem, *lse = b->lse.mem;
    double *s = malloc(sizeof(double) * N);
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        const int64_t i = rows[r];
        double m = -INFINITY, l = 0, acc[D] = {0};
        for (int64_t j = 0; j <= i; j++) {
            double dot = 0;
            for (int c = 0; c < D; c++) dot += (double)q[i * D + c] * k[j * D + c];
            s[j] = dot / 8.0; /* 1/sqrt(64) */
            if (s[j] > m) m = s[j];
        }
        for (int64_t j = 0; j <= i; j++) {
            double e = exp(s[j] - m);
            l += e;
            for (int c = 0; c < D; c++) acc[c] += e * v[j * D + c];
        }
        for (int c = 0; c < D; c++)
            if (!(fabs(o[i * D + c] - acc[c] / l) <= 5e-5))
                fail_msg("row %lld col %d: %.9g vs %.9g", (long long)i, c, o[i * D + c], acc[c] / l);
        assert_true(fabs(lse[i] - (m + log(l))) <= 5e-5);
    }
    free(s);
}

/*
 * Ensure the flash backward pass at N = 65536 allocates < 16 MiB: its scratch
 * is O(threads x block) plus D [B][H][Sq] (256 KiB here) and a capped packing
 * of K/V. A causal sliding window of 256 keys keeps the run short (the full
 * causal backward is ~2.5x the forward's 2^37 multiply-adds); the buffers the
 * pass allocates are sized by the shapes and blocks, not by the mask. Run on
 * one thread (one (batch, kv head) task: the single pass) and on two (the two
 * passes), with float32 gradients (dQ accumulates in the output) and float16
 * ones (the single pass would keep N x d float accumulators: 16 MiB here, so
 * the rule must fall back to the two passes).
 */
static void backward_peak_below_ceiling(big *b, fa_dtype gdt, int threads)
{
    tu_tensor dout = tu_alloc4(FA_F32, 1, N, 1, D, 0), dq = tu_alloc4(gdt, 1, N, 1, D, 0);
    tu_tensor dk = tu_alloc4(gdt, 1, N, 1, D, 0), dv = tu_alloc4(gdt, 1, N, 1, D, 0);
    uint64_t rng = tu_seed() ^ 0xd0;
    tu_fill(&dout, &rng, -1, 1);
    fa_options opt = fa_options_default();
    opt.causal = 1;
    opt.window_left = 256;
    opt.num_threads = threads;
    assert_int_equal(fa_forward(&b->q.t, &b->k.t, &b->v.t, &b->o.t, &b->lse.t, &opt), FA_OK);
    tu_poison(&dq); tu_poison(&dk); tu_poison(&dv);
    fa_alloc_stats before, after;
    fa_alloc_stats_reset();
    fa_alloc_stats_get(&before);
    fa_status st = fa_backward(&b->q.t, &b->k.t, &b->v.t, &b->o.t, &b->lse.t, &dout.t, &dq.t, &dk.t,
                               &dv.t, &opt);
    fa_alloc_stats_get(&after);
    if (st != FA_OK) fail_msg("flash backward: %s", fa_last_error());
    const size_t peak = after.peak_bytes - before.current_bytes;
    print_message("[ memory   ] flash backward N=%d d=%d causal window 256, %s gradients, %d thread(s): peak scratch "
                  "%.2f MiB\n", N, D, gdt == FA_F32 ? "f32" : "f16", opt.num_threads, peak / 1048576.0);
    if (peak >= CEILING)
        fail_msg("flash backward (%s gradients, %d threads) allocated %zu bytes at N=%d (ceiling %zu)",
                 gdt == FA_F32 ? "f32" : "f16", threads, peak, N, CEILING);
    assert_int_equal(after.current_bytes, before.current_bytes);
    assert_int_equal(tu_count_nan(&dq) + tu_count_nan(&dk) + tu_count_nan(&dv), 0);
    tu_free(&dout); tu_free(&dq); tu_free(&dk); tu_free(&dv);
}

static void test_flash_backward_scratch_stays_below_16_mib_at_n_65536(void **state)
{
    fa_cpu_info info;
    assert_int_equal(fa_get_cpu_info(&info), FA_OK);
    backward_peak_below_ceiling(*state, FA_F32, 1);
    backward_peak_below_ceiling(*state, FA_F16, 1);
    if (info.max_threads >= 2) {
        backward_peak_below_ceiling(*state, FA_F32, 2);
        backward_peak_below_ceiling(*state, FA_F16, 2);
    }
}

/* Ensure standard refuses N = 65536 with FA_ERR_TOO_LARGE instead of allocating 16 GiB. */
static void test_standard_refuses_n_65536_without_allocating(void **state)
{
    big *b = *state;
    fa_options opt = fa_options_default();
    opt.impl = FA_IMPL_STANDARD;
    opt.causal = 1;
    size_t planned = 0;
    assert_int_equal(fa_workspace_bytes(&b->q.t, &b->k.t, &b->v.t, &opt, &planned), FA_OK);
    assert_true(planned >= (size_t)N * N * sizeof(float)); /* S alone is 16 GiB */
    fa_alloc_stats before, after;
    fa_alloc_stats_reset();
    fa_alloc_stats_get(&before);
    fa_status st = fa_forward(&b->q.t, &b->k.t, &b->v.t, &b->o.t, &b->lse.t, &opt);
    fa_alloc_stats_get(&after);
    assert_int_equal(st, FA_ERR_TOO_LARGE);
    assert_non_null(strstr(fa_last_error(), "cap"));
    assert_int_equal(after.peak_bytes, before.current_bytes); /* nothing was allocated */
}

/*
 * Ensure scratch is sized per thread that gets a task, not per requested
 * thread: a 4-token problem at num_threads = 1024 plans (fa_workspace_bytes)
 * exactly what it plans at 4 threads (it has at most 4 tasks: 4 rows for the
 * reference, one block for flash and standard), and every implementation
 * allocates under 1 MiB (it was ~4 KiB x 1024 per implementation before;
 * flash, whose per-thread scratch is about 4 MiB, far more). Then the result
 * is checked against the reference, so the bound is not met by doing nothing.
 */
static void test_scratch_is_per_thread_with_a_task(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x1024;
    tu_tensor q = tu_alloc4(FA_F32, 1, 4, 1, D, 0), k = tu_alloc4(FA_F32, 1, 4, 1, D, 0);
    tu_tensor v = tu_alloc4(FA_F32, 1, 4, 1, D, 0), o = tu_alloc4(FA_F32, 1, 4, 1, D, 0);
    tu_tensor ref = tu_alloc4(FA_F32, 1, 4, 1, D, 0);
    tu_fill(&q, &rng, -1, 1);
    tu_fill(&k, &rng, -1, 1);
    tu_fill(&v, &rng, -1, 1);
    fa_options opt = fa_options_default();
    opt.impl = FA_IMPL_REFERENCE;
    assert_int_equal(fa_forward(&q.t, &k.t, &v.t, &ref.t, NULL, &opt), FA_OK);
    const fa_impl impls[3] = {FA_IMPL_FLASH, FA_IMPL_STANDARD, FA_IMPL_REFERENCE};
    for (int x = 0; x < 3; x++) {
        opt.impl = impls[x];
        size_t one = 0, many = 0;
        opt.num_threads = 4;
        assert_int_equal(fa_workspace_bytes(&q.t, &k.t, &v.t, &opt, &one), FA_OK);
        opt.num_threads = 1024;
        assert_int_equal(fa_workspace_bytes(&q.t, &k.t, &v.t, &opt, &many), FA_OK);
        if (many != one) fail_msg("impl %d: workspace %zu bytes at 1024 threads, %zu at 4", (int)impls[x], many, one);
        tu_poison(&o);
        fa_alloc_stats before, after;
        fa_alloc_stats_reset();
        fa_alloc_stats_get(&before);
        fa_status st = fa_forward(&q.t, &k.t, &v.t, &o.t, NULL, &opt);
        fa_alloc_stats_get(&after);
        if (st != FA_OK) fail_msg("impl %d: %s", (int)impls[x], fa_last_error());
        const size_t peak = after.peak_bytes - before.current_bytes;
        print_message("[ memory   ] impl %d, 4 tokens, 1024 threads: peak %zu bytes (planned %zu)\n",
                      (int)impls[x], peak, many);
        if (peak > ((size_t)1 << 20) && peak > 2 * one)
            fail_msg("impl %d: a 4-token problem at 1024 threads allocated %zu bytes", (int)impls[x], peak);
        if (!(tu_max_abs_diff(&o, &ref, NULL) <= 1e-5)) fail_msg("impl %d: wrong result", (int)impls[x]);
    }
    tu_free(&q); tu_free(&k); tu_free(&v); tu_free(&o); tu_free(&ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_standard_refuses_n_65536_without_allocating),
        cmocka_unit_test(test_flash_scratch_stays_below_16_mib_at_n_65536),
        cmocka_unit_test(test_flash_backward_scratch_stays_below_16_mib_at_n_65536),
        cmocka_unit_test(test_scratch_is_per_thread_with_a_task),
    };
    tu_seed();
    return cmocka_run_group_tests_name("memory", tests, setup, teardown);
}
