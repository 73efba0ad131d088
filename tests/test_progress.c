/*
 * test_progress.c — fa_options::progress, the caller's hook run between tasks.
 *
 * The hook exists so that an MPI rank (fa_ring_forward / fa_ring_backward) can
 * drive its transfers while the other threads of a call compute. What it must
 * never do is change a result, run on a thread other than the caller's (an
 * MPI_THREAD_FUNNELED rank may call MPI only there), or run twice at once.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "flashattn.h"
#include "test_util.h"

/* How often a hook runs depends on which tasks thread 0 takes: on a busy machine the other
 * threads can take every task of a small call (the header says "possibly never"). So each
 * multi-thread check repeats its hooked call, checking the bits every time, until the hook
 * has run at least once (at most TRIES calls). */
#define TRIES 50

/* Set on the thread that makes the library call, zero on every other thread. */
static _Thread_local int on_caller;

typedef struct hook_log {
    atomic_int calls;     /* times the hook ran */
    atomic_int elsewhere; /* ... on a thread that did not make the call */
    atomic_int inside;    /* hooks running now */
    atomic_int overlap;   /* times a hook found another one running */
} hook_log;

static void hook(void *arg)
{
    hook_log *h = arg;
    if (atomic_fetch_add(&h->inside, 1) != 0) atomic_fetch_add(&h->overlap, 1);
    atomic_fetch_add(&h->calls, 1);
    if (!on_caller) atomic_fetch_add(&h->elsewhere, 1);
    atomic_fetch_sub(&h->inside, 1);
}

typedef struct problem {
    tu_tensor q, k, v, o, lse, dout;
} problem;

/* B = 2, Sq = 480, Sk = 544, H = 4, Hk = 2, d = 48: many Q and K blocks with the blocks pinned small,
 * and calls long enough (milliseconds) that thread 0 takes tasks even on a loaded machine. */
static problem make(uint64_t salt)
{
    problem p;
    uint64_t rng = tu_seed() ^ salt;
    p.q = tu_alloc4(FA_F32, 2, 480, 4, 48, 0);
    p.k = tu_alloc4(FA_F32, 2, 544, 2, 48, 0);
    p.v = tu_alloc4(FA_F32, 2, 544, 2, 48, 0);
    p.o = tu_alloc4(FA_F32, 2, 480, 4, 48, 0);
    p.dout = tu_alloc4(FA_F32, 2, 480, 4, 48, 0);
    const int64_t ls[3] = {2, 4, 480};
    p.lse = tu_alloc(FA_F32, 3, ls);
    tu_fill(&p.q, &rng, -2, 2);
    tu_fill(&p.k, &rng, -2, 2);
    tu_fill(&p.v, &rng, -1, 1);
    tu_fill(&p.dout, &rng, -1, 1);
    tu_poison(&p.o);
    tu_poison(&p.lse);
    return p;
}

static void release(problem *p)
{
    tu_free(&p->q); tu_free(&p->k); tu_free(&p->v); tu_free(&p->o); tu_free(&p->lse); tu_free(&p->dout);
}

static fa_options base_options(int threads, int64_t pack_max_bytes, int causal)
{
    fa_options opt = fa_options_default();
    opt.num_threads = threads;
    opt.block_q = 32;
    opt.block_k = 48;
    opt.pack_max_bytes = pack_max_bytes;
    opt.causal = causal;
    return opt;
}

/* Ensure the forward with a hook gives the bits of the forward without one, every element
 * written, and the hook ran on the caller's thread only, never twice at once. */
static void check_forward(int threads, int64_t pack_max_bytes, int causal)
{
    problem a = make(0x9e1), b = make(0x9e1);
    fa_options opt = base_options(threads, pack_max_bytes, causal);
    assert_int_equal(fa_forward(&a.q.t, &a.k.t, &a.v.t, &a.o.t, &a.lse.t, &opt), FA_OK);
    hook_log log;
    memset(&log, 0, sizeof log);
    opt.progress = hook;
    opt.progress_arg = &log;
    for (int x = 0; x < TRIES && atomic_load(&log.calls) == 0; x++) {
        tu_poison(&b.o);
        tu_poison(&b.lse);
        on_caller = 1;
        assert_int_equal(fa_forward(&b.q.t, &b.k.t, &b.v.t, &b.o.t, &b.lse.t, &opt), FA_OK);
        on_caller = 0;
        assert_int_equal(tu_count_nan(&b.o), 0);
        assert_int_equal(tu_count_nan(&b.lse), 0);
        assert_memory_equal(a.o.mem, b.o.mem, a.o.bytes);
        assert_memory_equal(a.lse.mem, b.lse.mem, a.lse.bytes);
        if (threads == 1) assert_true(atomic_load(&log.calls) >= 1); /* thread 0 runs every task */
    }
    assert_true(atomic_load(&log.calls) >= 1);
    assert_int_equal(atomic_load(&log.elsewhere), 0);
    assert_int_equal(atomic_load(&log.overlap), 0);
    /* and the result is attention: against the float64 reference */
    fa_options ref = base_options(threads, pack_max_bytes, causal);
    ref.impl = FA_IMPL_REFERENCE;
    tu_tensor r = tu_alloc4(FA_F64, 2, 480, 4, 48, 0);
    assert_int_equal(fa_forward(&a.q.t, &a.k.t, &a.v.t, &r.t, NULL, &ref), FA_OK);
    int64_t where;
    assert_true(tu_max_abs_diff(&b.o, &r, &where) < 1e-5);
    tu_free(&r);
    release(&a);
    release(&b);
}

static void test_forward_shared_packing(void **state)
{
    (void)state;
    check_forward(1, -1, 0);
    check_forward(3, -1, 0);
    check_forward(3, -1, 1);
}

static void test_forward_per_tile_packing(void **state)
{
    (void)state;
    check_forward(1, 0, 0);
    check_forward(3, 0, 1);
}

/* Ensure the backward with a hook gives the bits of the backward without one, with the same
 * thread rules: 4 (batch, kv head) tasks run FlashAttention-2's single pass on 1 thread and
 * the two passes on 3 (shared packing, or per tile with pack_max_bytes 0). */
static void check_backward(int threads, int64_t pack_max_bytes, int causal)
{
    problem a = make(0x9e2);
    fa_options opt = base_options(threads, pack_max_bytes, causal);
    assert_int_equal(fa_forward(&a.q.t, &a.k.t, &a.v.t, &a.o.t, &a.lse.t, &opt), FA_OK);
    tu_grads g0, g1;
    tu_backward(&a.q, &a.k, &a.v, &a.dout, &opt, &g0);
    hook_log log;
    memset(&log, 0, sizeof log);
    opt.progress = hook;
    opt.progress_arg = &log;
    for (int x = 0; x < TRIES && atomic_load(&log.calls) == 0; x++) {
        on_caller = 1;
        tu_backward(&a.q, &a.k, &a.v, &a.dout, &opt, &g1);
        on_caller = 0;
        assert_int_equal(tu_count_nan(&g1.dq), 0);
        assert_int_equal(tu_count_nan(&g1.dk), 0);
        assert_int_equal(tu_count_nan(&g1.dv), 0);
        assert_memory_equal(g0.dq.mem, g1.dq.mem, g0.dq.bytes);
        assert_memory_equal(g0.dk.mem, g1.dk.mem, g0.dk.bytes);
        assert_memory_equal(g0.dv.mem, g1.dv.mem, g0.dv.bytes);
        if (threads == 1) assert_true(atomic_load(&log.calls) >= 1);
        if (atomic_load(&log.calls) == 0) tu_free_grads(&g1);
    }
    assert_true(atomic_load(&log.calls) >= 1);
    assert_int_equal(atomic_load(&log.elsewhere), 0);
    assert_int_equal(atomic_load(&log.overlap), 0);
    tu_free_grads(&g0);
    tu_free_grads(&g1);
    release(&a);
}

static void test_backward(void **state)
{
    (void)state;
    check_backward(1, -1, 0);
    check_backward(3, -1, 1);
    check_backward(3, 0, 0);
}

/* Ensure a call made from inside the caller's own parallel region (nested parallelism off:
 * the library's team is the caller alone; on: a team of its own) runs each hook on the thread
 * that made that call only, and gives the bits of a call made outside. */
static void test_calls_from_a_parallel_region(void **state)
{
    (void)state;
#ifndef _OPENMP
    skip(); /* a build without OpenMP (NO_OMP=1) has no parallel region to call from */
#else
    problem ref = make(0x9e4);
    fa_options opt = base_options(2, -1, 1);
    assert_int_equal(fa_forward(&ref.q.t, &ref.k.t, &ref.v.t, &ref.o.t, &ref.lse.t, &opt), FA_OK);
    for (int levels = 1; levels <= 2; levels++) {
        omp_set_max_active_levels(levels);
        problem x[2] = {make(0x9e4), make(0x9e4)};
        hook_log log[2];
        memset(log, 0, sizeof log);
        for (int y = 0; y < TRIES && (atomic_load(&log[0].calls) == 0 || atomic_load(&log[1].calls) == 0); y++) {
            fa_status st[2] = {FA_ERR_OPTION, FA_ERR_OPTION};
#pragma omp parallel num_threads(2)
            {
                const int t = omp_get_thread_num();
                fa_options o = base_options(2, -1, 1);
                o.progress = hook;
                o.progress_arg = &log[t];
                tu_poison(&x[t].o);
                on_caller = 1;
                st[t] = fa_forward(&x[t].q.t, &x[t].k.t, &x[t].v.t, &x[t].o.t, &x[t].lse.t, &o);
                on_caller = 0;
            }
            for (int t = 0; t < 2; t++) {
                assert_int_equal(st[t], FA_OK);
                assert_memory_equal(ref.o.mem, x[t].o.mem, ref.o.bytes);
                assert_memory_equal(ref.lse.mem, x[t].lse.mem, ref.lse.bytes);
            }
        }
        for (int t = 0; t < 2; t++) {
            assert_true(atomic_load(&log[t].calls) >= 1);
            assert_int_equal(atomic_load(&log[t].elsewhere), 0);
            assert_int_equal(atomic_load(&log[t].overlap), 0);
            release(&x[t]);
        }
    }
    omp_set_max_active_levels(1);
    release(&ref);
#endif
}

/* Ensure the paths that do not run the hook (decode, reference, standard) still compute
 * with one set, and do not call it. */
static void test_other_paths_ignore_it_safely(void **state)
{
    (void)state;
    hook_log log;
    memset(&log, 0, sizeof log);
    uint64_t rng = tu_seed() ^ 0x9e3;
    tu_tensor q = tu_alloc4(FA_F32, 1, 1, 8, 64, 0), k = tu_alloc4(FA_F32, 1, 300, 2, 64, 0);
    tu_tensor v = tu_alloc4(FA_F32, 1, 300, 2, 64, 0), o = tu_alloc4(FA_F32, 1, 1, 8, 64, 0);
    tu_fill(&q, &rng, -1, 1);
    tu_fill(&k, &rng, -1, 1);
    tu_fill(&v, &rng, -1, 1);
    const fa_impl impls[3] = {FA_IMPL_FLASH, FA_IMPL_REFERENCE, FA_IMPL_STANDARD};
    for (int x = 0; x < 3; x++) {
        fa_options opt = fa_options_default();
        opt.num_threads = 3;
        opt.impl = impls[x];
        opt.progress = hook;
        opt.progress_arg = &log;
        tu_poison(&o);
        on_caller = 1;
        assert_int_equal(fa_forward(&q.t, &k.t, &v.t, &o.t, NULL, &opt), FA_OK);
        on_caller = 0;
        assert_int_equal(tu_count_nan(&o), 0);
    }
    assert_int_equal(atomic_load(&log.calls), 0);
    tu_free(&q); tu_free(&k); tu_free(&v); tu_free(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_shared_packing),
        cmocka_unit_test(test_forward_per_tile_packing),
        cmocka_unit_test(test_backward),
        cmocka_unit_test(test_calls_from_a_parallel_region),
        cmocka_unit_test(test_other_paths_ignore_it_safely),
    };
    tu_seed();
    return cmocka_run_group_tests_name("progress", tests, NULL, NULL);
}
