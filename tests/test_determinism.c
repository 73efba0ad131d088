/*
 * test_determinism.c — the flash forward pass gives identical bits for 1, 2
 * and 3 threads, and across repeated runs.
 *
 * Why it holds (src/flash.c): each (batch, head, query block) task is
 * computed start to finish by one thread in a fixed key order, and nothing
 * is reduced across threads, so the schedule cannot change a single rounding.
 * With more threads than blocks, blocks are cut into pieces of rows (keys in
 * the backward's dK/dV pass; internal.h's fa_piece_rows): the same bits,
 * because every kernel computes each row on its own. 7 and 16 threads cut
 * these problems' blocks into several pieces each; and the task orders of
 * FA_TASK_CHUNK (flash.c's task_chunk: N pieces of one head a grab) and the
 * cut of a pass's last tasks into pieces (FA_TAIL_SPLIT, tail_split) change
 * which thread computes what, never one rounding.
 * The problems below have more tasks than threads, GQA groups, uneven tails,
 * causal and windowed masks, and both the shared-packing and per-tile paths.
 * The backward pass makes the same promise (no atomics; each gradient element
 * is accumulated by one thread in a fixed order), including the GQA sums of
 * dK and dV over the query heads of a group, and its single pass (one task
 * per (batch, kv head), FA_BWD_ONE_PASS=1) gives the bits of its two passes.
 */
#include "test_util.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "problem.h" /* fa_bwd_one_pass_test, fa_count_overlap_units */

typedef struct dcase {
    int64_t B, Sq, Sk, H, Hk, d, dv;
    int causal;
    int64_t wl;
    double softcap;
    int bq, bk;
    const char *shared_max; /* FA_FLASH_SHARED_MAX, NULL: default */
} dcase;

/* Run flash with `threads`; O and LSE (f32) bytes are appended to out[]. */
static void run_flash(const dcase *c, const tu_tensor *q, const tu_tensor *k, const tu_tensor *v,
                      int threads, tu_tensor *o, tu_tensor *lse)
{
    *o = tu_alloc4(FA_F32, c->B, c->Sq, c->H, c->dv, 0);
    int64_t ls[3] = {c->B, c->H, c->Sq};
    *lse = tu_alloc(FA_F32, 3, ls);
    tu_poison(o);
    tu_poison(lse);
    fa_options opt = fa_options_default();
    opt.causal = c->causal;
    opt.window_left = c->wl;
    opt.softcap = c->softcap;
    opt.block_q = c->bq;
    opt.block_k = c->bk;
    opt.num_threads = threads;
    if (c->shared_max) opt.pack_max_bytes = strtoll(c->shared_max, NULL, 10);
    fa_status st = fa_forward(&q->t, &k->t, &v->t, &o->t, &lse->t, &opt);
    if (st != FA_OK) fail_msg("flash with %d threads: %s", threads, fa_last_error());
}

/* Ensure flash's O and LSE are bit-identical for 1, 2, 3, 7, 16 threads and across runs. */
static void test_flash_is_bitwise_deterministic_across_thread_counts(void **state)
{
    (void)state;
    static const dcase cases[] = {
        {2, 300, 257, 4, 2, 64, 64, 0, -1, 0.0, 0, 0, NULL},
        {1, 513, 513, 3, 1, 40, 24, 1, -1, 0.0, 0, 0, NULL},
        {2, 200, 333, 2, 2, 32, 32, 1, 50, 20.0, 16, 48, NULL},
        {1, 257, 700, 2, 1, 16, 16, 0, -1, 0.0, 0, 0, "0"}, /* per-tile packing */
        /* 12 (batch, kv head) pairs, about two a packing pass: every slot reused by later passes */
        {3, 300, 600, 8, 4, 32, 32, 1, -1, 0.0, 0, 0, "450000"},
        /* the same unmasked: two sets of slots, one pair a pass (flash.c, pack_sync) */
        {3, 300, 600, 8, 4, 32, 32, 0, -1, 0.0, 0, 0, "450000"},
        /* one set (a cap under two slots of ~160 KB): a pass waits for the one before */
        {3, 300, 600, 8, 4, 32, 32, 0, -1, 0.0, 0, 0, "250000"},
        /* two sets of two or three pairs a pass: the next pass's first units packed while
         * other slots of this one are still read */
        {3, 300, 600, 8, 4, 32, 32, 0, -1, 0.0, 0, 0, "1000000"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const dcase *c = &cases[ci];
        uint64_t rng = tu_seed() + 31 * ci;
        tu_tensor q = tu_alloc4(FA_F32, c->B, c->Sq, c->H, c->d, 0);
        tu_tensor k = tu_alloc4(FA_F32, c->B, c->Sk, c->Hk, c->d, 0);
        tu_tensor v = tu_alloc4(FA_F32, c->B, c->Sk, c->Hk, c->dv, 0);
        tu_fill(&q, &rng, -2, 2);
        tu_fill(&k, &rng, -2, 2);
        tu_fill(&v, &rng, -1, 1);
        tu_tensor o1, l1;
        run_flash(c, &q, &k, &v, 1, &o1, &l1);
        assert_int_equal(tu_count_nan(&o1), 0);
        static const int threads[] = {2, 3, 7, 16, 1, 2}; /* 7, 16: Q blocks cut into pieces */
        /* task orders (flash.c's task_chunk, FA_TASK_CHUNK): interleaved, then 3 and 8 pieces
         * of one head a grab — 3 divides no head's pieces here, 8 some; and with the
         * interleaved order, a pass's last tasks whole (tail split 1), in 3 pieces, in 64
         * (more than most tasks have row blocks, so some pieces are empty) and the default */
        static const int chunks[] = {0, 3, 8, 0, 0, 0}, tails[] = {-1, -1, -1, 1, 3, 64};
        for (size_t x = 0; x < sizeof chunks / sizeof chunks[0]; x++) {
            fa_task_chunk_test = chunks[x];
            fa_tail_split_test = tails[x];
            for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
                tu_tensor o, l;
                fa_count_test = 1;
                atomic_store(&fa_count_overlap_units, 0);
                run_flash(c, &q, &k, &v, threads[t], &o, &l);
                fa_count_test = 0;
                if (memcmp(o.mem, o1.mem, o1.bytes) != 0 || memcmp(l.mem, l1.mem, l1.bytes) != 0)
                    fail_msg("case %zu: %d threads (run %zu, task chunk %d, tail split %d) differs from 1 thread "
                             "in the last bits", ci, threads[t], t, chunks[x], tails[x]);
                /* the packing ran beside the tasks (flash.c, pack_overlap) exactly where it should:
                 * 2+ threads, the default order, no causal mask without a left window, packed K/V */
                const long units = atomic_load(&fa_count_overlap_units);
                const int overlap = threads[t] >= 2 && chunks[x] == 0 && (!c->causal || c->wl >= 0) &&
                                    !(c->shared_max && !strcmp(c->shared_max, "0"));
                if (overlap ? units == 0 : units != 0)
                    fail_msg("case %zu, %d threads, task chunk %d: %ld pack units beside the tasks, expected %s",
                             ci, threads[t], chunks[x], units, overlap ? "some" : "none");
                tu_free(&o);
                tu_free(&l);
            }
        }
        fa_task_chunk_test = -1;
        fa_tail_split_test = -1;
        tu_free(&o1); tu_free(&l1); tu_free(&q); tu_free(&k); tu_free(&v);
    }
}

/* Run the flash backward pass with `threads` into fresh dq, dk, dv. */
static void run_flash_backward(const dcase *c, const tu_tensor *q, const tu_tensor *k, const tu_tensor *v,
                               const tu_tensor *dout, int threads, tu_tensor grads[3])
{
    grads[0] = tu_alloc4(FA_F32, c->B, c->Sq, c->H, c->d, 0);
    grads[1] = tu_alloc4(FA_F32, c->B, c->Sk, c->Hk, c->d, 0);
    grads[2] = tu_alloc4(FA_F32, c->B, c->Sk, c->Hk, c->dv, 0);
    for (int g = 0; g < 3; g++) tu_poison(&grads[g]);
    fa_options opt = fa_options_default();
    opt.causal = c->causal;
    opt.window_left = c->wl;
    opt.softcap = c->softcap;
    opt.block_q = c->bq;
    opt.block_k = c->bk;
    opt.num_threads = threads;
    /* o and lse NULL: recomputed by a forward pass of the same implementation */
    fa_status st = fa_backward(&q->t, &k->t, &v->t, NULL, NULL, &dout->t, &grads[0].t, &grads[1].t,
                               &grads[2].t, &opt);
    if (st != FA_OK) fail_msg("flash backward with %d threads: %s", threads, fa_last_error());
}

/* Ensure the flash backward pass's dQ, dK, dV are bit-identical for 1, 2, 3, 7, 16 threads and across runs,
 * on its single pass and its two passes alike. */
static void test_flash_backward_is_bitwise_deterministic_across_thread_counts(void **state)
{
    (void)state;
    static const dcase cases[] = {
        {2, 200, 157, 4, 2, 32, 32, 0, -1, 0.0, 0, 0, NULL},  /* GQA: dK/dV summed over 2 heads */
        {1, 300, 300, 3, 1, 40, 24, 1, -1, 0.0, 0, 0, NULL},  /* MQA, causal */
        {1, 150, 260, 2, 2, 16, 16, 1, 40, 10.0, 16, 32, NULL}, /* window, softcap, small blocks */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const dcase *c = &cases[ci];
        uint64_t rng = tu_seed() + 97 * ci;
        tu_tensor q = tu_alloc4(FA_F32, c->B, c->Sq, c->H, c->d, 0);
        tu_tensor k = tu_alloc4(FA_F32, c->B, c->Sk, c->Hk, c->d, 0);
        tu_tensor v = tu_alloc4(FA_F32, c->B, c->Sk, c->Hk, c->dv, 0);
        tu_tensor dout = tu_alloc4(FA_F32, c->B, c->Sq, c->H, c->dv, 0);
        tu_fill(&q, &rng, -2, 2);
        tu_fill(&k, &rng, -2, 2);
        tu_fill(&v, &rng, -1, 1);
        tu_fill(&dout, &rng, -1, 1);
        tu_tensor ref[3];
        run_flash_backward(c, &q, &k, &v, &dout, 1, ref);
        for (int g = 0; g < 3; g++) assert_int_equal(tu_count_nan(&ref[g]), 0);
        /* the default (the task rule picks one pass or two), then the two passes and the single
         * pass forced (FA_BWD_ONE_PASS=0, 1): all against the default's 1-thread bits */
        static const int threads[] = {2, 3, 7, 16, 1};
        static const char *const paths[3] = {"default", "two passes", "one pass"};
        for (int path = 0; path < 3; path++)
            for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
                tu_tensor got[3];
                fa_bwd_one_pass_test = path - 1;
                run_flash_backward(c, &q, &k, &v, &dout, threads[t], got);
                fa_bwd_one_pass_test = -1;
                static const char *const names[3] = {"dQ", "dK", "dV"};
                for (int g = 0; g < 3; g++) {
                    if (memcmp(got[g].mem, ref[g].mem, ref[g].bytes) != 0)
                        fail_msg("case %zu: %s with %d threads (%s) differs from 1 thread", ci, names[g], threads[t],
                                 paths[path]);
                    tu_free(&got[g]);
                }
            }
        for (int g = 0; g < 3; g++) tu_free(&ref[g]);
        tu_free(&q); tu_free(&k); tu_free(&v); tu_free(&dout);
    }
}

/*
 * Ensure evening out the Q blocks (a derived Br lowered by fa_even_block so the
 * last block is not a sliver) keeps the bits: Sq = 2 Br + 5 with the derived
 * blocks (evened) against the same Br and Bc pinned (not evened), causal,
 * with 1 and 3 threads.
 */
static void test_flash_even_blocks_keep_the_bits(void **state)
{
    (void)state;
    int br, bc;
    assert_int_equal(fa_block_sizes(32, 32, NULL, &br, &bc), FA_OK);
    const dcase derived = {1, 2 * (int64_t)br + 5, 2 * (int64_t)br + 5, 2, 1, 32, 32, 1, -1, 0.0, 0, 0, NULL};
    dcase pinned = derived;
    pinned.bq = br;
    pinned.bk = bc;
    uint64_t rng = tu_seed() ^ 0xeb;
    tu_tensor q = tu_alloc4(FA_F32, 1, derived.Sq, 2, 32, 0), k = tu_alloc4(FA_F32, 1, derived.Sk, 1, 32, 0);
    tu_tensor v = tu_alloc4(FA_F32, 1, derived.Sk, 1, 32, 0);
    tu_fill(&q, &rng, -2, 2);
    tu_fill(&k, &rng, -2, 2);
    tu_fill(&v, &rng, -1, 1);
    for (int threads = 1; threads <= 3; threads += 2) {
        tu_tensor o[2], lse[2];
        run_flash(&derived, &q, &k, &v, threads, &o[0], &lse[0]);
        run_flash(&pinned, &q, &k, &v, threads, &o[1], &lse[1]);
        if (memcmp(o[0].mem, o[1].mem, o[0].bytes) != 0 || memcmp(lse[0].mem, lse[1].mem, lse[0].bytes) != 0)
            fail_msg("Sq=%lld, Br=%d Bc=%d: evened blocks changed the bits (%d threads)", (long long)derived.Sq, br,
                     bc, threads);
        for (int x = 0; x < 2; x++) { tu_free(&o[x]); tu_free(&lse[x]); }
    }
    tu_free(&q); tu_free(&k); tu_free(&v);
}

/* Every test starts with the task-order hooks unset (a failed test leaves them set). */
static int reset_hooks(void **state)
{
    (void)state;
    fa_task_chunk_test = -1;
    fa_tail_split_test = -1;
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_flash_is_bitwise_deterministic_across_thread_counts, reset_hooks),
        cmocka_unit_test_setup(test_flash_backward_is_bitwise_deterministic_across_thread_counts, reset_hooks),
        cmocka_unit_test_setup(test_flash_even_blocks_keep_the_bits, reset_hooks),
    };
    tu_seed();
    return cmocka_run_group_tests_name("determinism", tests, NULL, NULL);
}
