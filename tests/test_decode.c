/*
 * test_decode.c — the decode path of flash (src/decode.c): few query rows,
 * GQA packing, split-KV (fa_options.num_splits), f16/bf16 and paged caches.
 *
 * What must hold:
 *   - for every split count 1..7, with GQA, causal, windows, softcap, ALiBi
 *     and seqlen_q 1..4, O and LSE match the float64 reference under the
 *     project's one tolerance model (test_forward.c's: fa_check's float32
 *     emulation, 8x its max error, 4x its mean error, 4x its LSE error);
 *   - for a fixed split count the bits do not depend on the thread count (1, 2, 3);
 *   - GQA packing (the g query heads of a kv head in one tile) gives the bits
 *     of the same problem with every kv head replicated g times (one query
 *     head per kv head: no packing);
 *   - an f16/bf16 cache gives the bits of a float32 cache holding the same
 *     values (the widening is exact) and matches the reference;
 *   - a paged cache (pages 1, 3, 16, shuffled) gives the contiguous cache's
 *     bits with splits; varlen batches (empty sequences included) match the
 *     reference for every split count;
 *   - task shapes (a kv head of more than 64 rows cut into chunks; groups of kv heads
 *     that do not divide heads_k) match the reference;
 *   - Inf in V at a key a row cannot see does not reach that row, with splits;
 *   - the direct kernels' edges: 64 and 65 rows per kv head, d not a multiple of
 *     16, d = 256, d_v != d, seqlen_q up to 16, f16/bf16 and pages of 1 and 3
 *     rows, each bit-identical to the contiguous float32 cache;
 *   - address order (decode.c's addr_plan: a task's first block read, each later one asked
 *     for during the one before) runs for tasks of several kv heads in dense, paged and
 *     appending caches, is skipped for BHSD and MQA, and never changes a bit;
 *   - the num_splits heuristic and clamp; the workspace holds no Sq x Sk term.
 */
#include "test_util.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "internal.h"

/* ------------------------------------------------------------------------ */
/* One flash run against the float64 reference                              */
/* ------------------------------------------------------------------------ */

/* Tensors shaped like `like` (q: rank 4 [B][S][H][d] or varlen rank 3 [T][H][d]) with last dim w. */
static tu_tensor like_rows(const fa_tensor *like, fa_dtype dt, int64_t w)
{
    if (like->rank == 4) return tu_alloc4(dt, like->shape[0], like->shape[1], like->shape[2], w, 0);
    const int64_t s[3] = {like->shape[0], like->shape[1], w};
    return tu_alloc(dt, 3, s);
}

static tu_tensor lse_like(const fa_tensor *q, fa_dtype dt)
{
    if (q->rank == 4) {
        const int64_t s[3] = {q->shape[0], q->shape[2], q->shape[1]};
        return tu_alloc(dt, 3, s);
    }
    const int64_t s[2] = {q->shape[1], q->shape[0]};
    return tu_alloc(dt, 2, s);
}

typedef struct run_out {
    tu_tensor o, lse;
} run_out;

/* flash with `opt` (threads, splits as set) into fresh poisoned O and LSE. */
static run_out run_flash(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, int64_t dv, fa_options opt,
                         const char *what)
{
    run_out r;
    r.o = like_rows(q, FA_F32, dv);
    r.lse = lse_like(q, FA_F32);
    tu_poison(&r.o);
    tu_poison(&r.lse);
    opt.impl = FA_IMPL_FLASH;
    if (fa_forward(q, k, v, &r.o.t, &r.lse.t, &opt) != FA_OK) fail_msg("flash failed: %s (%s)", fa_last_error(), what);
    return r;
}

static void free_out(run_out *r)
{
    tu_free(&r->o);
    tu_free(&r->lse);
}

static void same_bits(const run_out *a, const run_out *b, const char *what)
{
    if (a->o.bytes != b->o.bytes || memcmp(a->o.mem, b->o.mem, a->o.bytes) != 0)
        fail_msg("O bits differ: %s", what);
    if (a->lse.bytes != b->lse.bytes || memcmp(a->lse.mem, b->lse.mem, a->lse.bytes) != 0)
        fail_msg("LSE bits differ: %s", what);
}

/* Largest finite |x| of a tensor (at least 1). */
static double max_abs_finite(const tu_tensor *t)
{
    double mx = 1.0;
    const int64_t n = fa_tensor_numel(&t->t); /* contiguous tensors only */
    for (int64_t i = 0; i < n; i++) {
        const double x = fabs(fa_load_f64(&t->t, i));
        if (isfinite(x) && x > mx) mx = x;
    }
    return mx;
}

/* Compare a flash output against the float64 reference of the same problem
 * (the rule of test_forward.c, the f32 emulation even for f16/bf16 inputs:
 * the flash path computes in float32 on the exact input values). */
static void expect_reference(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, int64_t dv, fa_options opt,
                             const run_out *got, const char *what)
{
    tu_tensor o_ref = like_rows(q, FA_F64, dv), lse_ref = lse_like(q, FA_F64);
    tu_poison(&o_ref);
    tu_poison(&lse_ref);
    opt.impl = FA_IMPL_REFERENCE;
    if (fa_forward(q, k, v, &o_ref.t, &lse_ref.t, &opt) != FA_OK)
        fail_msg("reference failed: %s (%s)", fa_last_error(), what);
    if (tu_count_nan(&got->o) != 0 || tu_count_nan(&got->lse) != 0)
        fail_msg("unwritten (NaN) outputs: O %lld, LSE %lld (%s)", (long long)tu_count_nan(&got->o),
                 (long long)tu_count_nan(&got->lse), what);
    fa_check_options co = fa_check_options_default();
    co.dtype = FA_F32;
    fa_check_report rep = fa_check_report_init();
    if (fa_check(q, k, v, &got->o.t, &got->lse.t, &opt, &co, &rep) != FA_OK)
        fail_msg("fa_check failed: %s (%s)", fa_last_error(), what);
    int64_t where;
    const double eo = tu_max_abs_diff(&got->o, &o_ref, &where);
    const double max_bound = 8.0 * rep.emu_max_abs_err + 0x1p-20 * rep.max_abs_ref;
    const double mean_bound = 4.0 * rep.emu_mean_abs_err + 0x1p-24 * rep.max_abs_ref;
    if (!(eo <= max_bound) || !(rep.mean_abs_err <= mean_bound))
        fail_msg("O error max %.3g at %lld (bound %.3g), mean %.3g (bound %.3g) (%s)", eo, (long long)where,
                 max_bound, rep.mean_abs_err, mean_bound, what);
    const double el = tu_max_abs_diff(&got->lse, &lse_ref, &where);
    const double lse_tol = 4.0 * rep.lse_emu_max_abs_err + 0x1p-20 * max_abs_finite(&lse_ref);
    if (!(el <= lse_tol)) fail_msg("LSE error %.3g at %lld exceeds %.3g (%s)", el, (long long)where, lse_tol, what);
    if (getenv("FA_TEST_VERBOSE"))
        printf("  O err %.2e (bound %.2e) LSE err %.2e (bound %.2e): %s\n", eo, max_bound, el, lse_tol, what);
    fa_check_report_free(&rep);
    tu_free(&o_ref);
    tu_free(&lse_ref);
}

/* ------------------------------------------------------------------------ */
/* Dense problems                                                            */
/* ------------------------------------------------------------------------ */

typedef struct mask_case {
    int causal;
    int64_t wl, wr;
    double softcap;
    int alibi;
} mask_case;

static const mask_case MASKS[] = {
    {0, -1, -1, 0.0, 0}, {1, -1, -1, 0.0, 0}, {1, 40, -1, 0.0, 0}, {0, -1, -1, 15.0, 1}, {1, 70, 0, 10.0, 1},
};

static fa_options mask_opt(const mask_case *mc, const tu_tensor *slopes)
{
    fa_options opt = fa_options_default();
    opt.causal = mc->causal;
    opt.window_left = mc->wl;
    opt.window_right = mc->wr;
    opt.softcap = mc->softcap;
    opt.alibi_slopes = mc->alibi ? &slopes->t : NULL;
    opt.block_k = 16; /* many key blocks to split */
    opt.num_threads = 2;
    return opt;
}

/* Ensure split counts 1..7 match the float64 reference for seqlen_q 1..4, GQA and every mask. */
static void test_splits_match_reference(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xdec0de01u;
    enum { Bn = 2, H = 8, HK = 2, D = 32, DV = 24, SK = 203 };
    const int64_t hs[1] = {H};
    tu_tensor slopes = tu_alloc(FA_F32, 1, hs);
    tu_fill(&slopes, &rng, 0.02, 0.3);
    for (int64_t sq = 1; sq <= 4; sq++) {
        tu_tensor q = tu_alloc4(FA_F32, Bn, sq, H, D, 0), k = tu_alloc4(FA_F32, Bn, SK, HK, D, 0);
        tu_tensor v = tu_alloc4(FA_F32, Bn, SK, HK, DV, 0);
        tu_fill(&q, &rng, -2, 2);
        tu_fill(&k, &rng, -2, 2);
        tu_fill(&v, &rng, -1, 1);
        for (size_t mi = 0; mi < sizeof MASKS / sizeof MASKS[0]; mi++)
            for (int ns = 1; ns <= 7; ns++) {
                fa_options opt = mask_opt(&MASKS[mi], &slopes);
                opt.num_splits = ns;
                char what[160];
                snprintf(what, sizeof what, "sq=%lld mask=%zu splits=%d", (long long)sq, mi, ns);
                run_out r = run_flash(&q.t, &k.t, &v.t, DV, opt, what);
                expect_reference(&q.t, &k.t, &v.t, DV, opt, &r, what);
                free_out(&r);
            }
        tu_free(&q); tu_free(&k); tu_free(&v);
    }
    tu_free(&slopes);
}

/* Ensure a fixed split count, and the heuristic (0), give the same bits for 1, 2 and 3 threads. */
static void test_split_bits_do_not_depend_on_threads(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xdec0de02u;
    enum { Bn = 1, H = 4, HK = 1, D = 40, SK = 517 };
    tu_tensor q = tu_alloc4(FA_F32, Bn, 2, H, D, 0), k = tu_alloc4(FA_F32, Bn, SK, HK, D, 0);
    tu_tensor v = tu_alloc4(FA_F32, Bn, SK, HK, D, 0);
    tu_fill(&q, &rng, -2, 2);
    tu_fill(&k, &rng, -2, 2);
    tu_fill(&v, &rng, -1, 1);
    static const int splits[] = {3, 5, 0};
    for (size_t si = 0; si < sizeof splits / sizeof splits[0]; si++)
        for (int causal = 0; causal <= 1; causal++) {
            fa_options opt = fa_options_default();
            opt.causal = causal;
            opt.block_k = 32;
            opt.num_splits = splits[si];
            opt.num_threads = 1;
            run_out first = run_flash(&q.t, &k.t, &v.t, D, opt, "first");
            static const int threads[] = {2, 3, 1, 3};
            for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
                opt.num_threads = threads[t];
                run_out r = run_flash(&q.t, &k.t, &v.t, D, opt, "threads");
                char what[96];
                snprintf(what, sizeof what, "splits %d, causal %d, %d threads vs %d", splits[si], causal,
                         opt.num_threads, 1);
                same_bits(&r, &first, what);
                free_out(&r);
            }
            free_out(&first);
        }
    tu_free(&q); tu_free(&k); tu_free(&v);
}

/* Ensure GQA packing gives the bits of the unpacked problem (every kv head replicated per query head). */
static void test_gqa_packing_matches_unpacked(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xdec0de03u;
    enum { Bn = 2, H = 8, D = 32, SK = 150 };
    static const int64_t hks[] = {1, 2, 4};
    for (size_t hi = 0; hi < sizeof hks / sizeof hks[0]; hi++)
        for (int64_t sq = 1; sq <= 3; sq++) {
            const int64_t HK = hks[hi], g = H / HK;
            tu_tensor q = tu_alloc4(FA_F32, Bn, sq, H, D, 0), k = tu_alloc4(FA_F32, Bn, SK, HK, D, 0);
            tu_tensor v = tu_alloc4(FA_F32, Bn, SK, HK, D, 0);
            tu_tensor kr = tu_alloc4(FA_F32, Bn, SK, H, D, 0), vr = tu_alloc4(FA_F32, Bn, SK, H, D, 0);
            tu_fill(&q, &rng, -2, 2);
            tu_fill(&k, &rng, -2, 2);
            tu_fill(&v, &rng, -1, 1);
            for (int64_t b = 0; b < Bn; b++)
                for (int64_t j = 0; j < SK; j++)
                    for (int64_t h = 0; h < H; h++) {
                        memcpy((float *)kr.mem + ((b * SK + j) * H + h) * D, (float *)k.mem + ((b * SK + j) * HK + h / g) * D,
                               D * sizeof(float));
                        memcpy((float *)vr.mem + ((b * SK + j) * H + h) * D, (float *)v.mem + ((b * SK + j) * HK + h / g) * D,
                               D * sizeof(float));
                    }
            for (int causal = 0; causal <= 1; causal++)
                for (int ns = 1; ns <= 3; ns += 2) {
                    fa_options opt = fa_options_default();
                    opt.causal = causal;
                    opt.block_k = 16;
                    opt.num_splits = ns;
                    opt.num_threads = 2;
                    char what[128];
                    snprintf(what, sizeof what, "heads_k %lld, sq %lld, causal %d, splits %d", (long long)HK,
                             (long long)sq, causal, ns);
                    run_out packed = run_flash(&q.t, &k.t, &v.t, D, opt, what);
                    run_out plain = run_flash(&q.t, &kr.t, &vr.t, D, opt, what);
                    same_bits(&packed, &plain, what);
                    expect_reference(&q.t, &k.t, &v.t, D, opt, &packed, what);
                    free_out(&packed);
                    free_out(&plain);
                }
            tu_free(&q); tu_free(&k); tu_free(&v); tu_free(&kr); tu_free(&vr);
        }
}

/* Ensure the task shapes match the reference: a kv head with more than 64 rows (cut into row
 * chunks) and groups of kv heads that do not divide heads_k (the last task holds fewer heads). */
static void test_task_shapes_match_reference(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xdec0de09u;
    static const int64_t shapes[][3] = {{48, 1, 3}, {40, 5, 4}, {12, 3, 1}}; /* H, HK, seqlen_q */
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t H = shapes[si][0], HK = shapes[si][1], SQ = shapes[si][2], D = 16, SK = 77;
        tu_tensor q = tu_alloc4(FA_F32, 2, SQ, H, D, 0), k = tu_alloc4(FA_F32, 2, SK, HK, D, 0);
        tu_tensor v = tu_alloc4(FA_F32, 2, SK, HK, D, 0);
        tu_fill(&q, &rng, -2, 2);
        tu_fill(&k, &rng, -2, 2);
        tu_fill(&v, &rng, -1, 1);
        for (int causal = 0; causal <= 1; causal++)
            for (int ns = 1; ns <= 3; ns++) {
                fa_options opt = fa_options_default();
                opt.causal = causal;
                opt.block_k = 16;
                opt.num_splits = ns;
                opt.num_threads = 3;
                char what[96];
                snprintf(what, sizeof what, "H %lld, heads_k %lld, sq %lld, causal %d, splits %d", (long long)H,
                         (long long)HK, (long long)SQ, causal, ns);
                run_out r = run_flash(&q.t, &k.t, &v.t, D, opt, what);
                expect_reference(&q.t, &k.t, &v.t, D, opt, &r, what);
                free_out(&r);
            }
        tu_free(&q); tu_free(&k); tu_free(&v);
    }
}

/* Ensure Inf in V at a key a row cannot see stays out of that row, with and without splits. */
static void test_inf_in_hidden_value_stays_hidden(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xdec0de04u;
    enum { H = 4, HK = 2, D = 16, SK = 90, SQ = 3 };
    tu_tensor q = tu_alloc4(FA_F32, 1, SQ, H, D, 0), k = tu_alloc4(FA_F32, 1, SK, HK, D, 0);
    tu_tensor v = tu_alloc4(FA_F32, 1, SK, HK, D, 0);
    tu_fill(&q, &rng, -1, 1);
    tu_fill(&k, &rng, -1, 1);
    tu_fill(&v, &rng, -1, 1);
    /* the last key: visible only to the last query row under the causal mask */
    for (int64_t hk = 0; hk < HK; hk++) ((float *)v.mem)[((SK - 1) * HK + hk) * D + 3] = INFINITY;
    for (int ns = 1; ns <= 4; ns++) {
        fa_options opt = fa_options_default();
        opt.causal = 1;
        opt.block_k = 16;
        opt.num_splits = ns;
        run_out r = run_flash(&q.t, &k.t, &v.t, D, opt, "inf in V");
        tu_tensor o_ref = tu_alloc4(FA_F64, 1, SQ, H, D, 0);
        opt.impl = FA_IMPL_REFERENCE;
        assert_int_equal(fa_forward(&q.t, &k.t, &v.t, &o_ref.t, NULL, &opt), FA_OK);
        for (int64_t i = 0; i < SQ - 1; i++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t c = 0; c < D; c++) {
                    const int64_t idx[4] = {0, i, h, c};
                    const double x = tu_get(&r.o, idx), y = tu_get(&o_ref, idx);
                    if (!isfinite(x) || fabs(x - y) > 1e-5)
                        fail_msg("splits %d: row %lld head %lld col %lld = %g, reference %g", ns, (long long)i,
                                 (long long)h, (long long)c, x, y);
                }
        /* the row that sees it: Inf (or NaN) in that column, as the reference */
        const int64_t idx[4] = {0, SQ - 1, 0, 3};
        if (isfinite(tu_get(&r.o, idx))) fail_msg("splits %d: the row that sees Inf is finite", ns);
        tu_free(&o_ref);
        free_out(&r);
    }
    tu_free(&q); tu_free(&k); tu_free(&v);
}

/* ------------------------------------------------------------------------ */
/* KV caches: f16/bf16, paged                                                */
/* ------------------------------------------------------------------------ */

enum { CB = 3, CH = 8, CHK = 2, CD = 32, CSC = 180 };

/* Round-trip a float32 cache through dt (the values a dt cache holds, as float32). */
static void round_to(tu_tensor *f32, tu_tensor *low)
{
    const int64_t n = fa_tensor_numel(&f32->t);
    for (int64_t i = 0; i < n; i++) {
        fa_store_f64(&low->t, i, (double)((float *)f32->mem)[i]);
        ((float *)f32->mem)[i] = (float)fa_load_f64(&low->t, i);
    }
}

/* Ensure f16/bf16 caches give the bits of a float32 cache of the same values, and match the reference. */
static void test_low_precision_cache(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xdec0de05u;
    static const fa_dtype dts[] = {FA_BF16, FA_F16};
    const int32_t seqlens[CB] = {180, 77, 1};
    for (size_t di = 0; di < 2; di++)
        for (int64_t sq = 1; sq <= 2; sq++) {
            tu_tensor q = tu_alloc4(FA_F32, CB, sq, CH, CD, 0);
            tu_tensor k = tu_alloc4(FA_F32, CB, CSC, CHK, CD, 0), v = tu_alloc4(FA_F32, CB, CSC, CHK, CD, 0);
            tu_tensor kl = tu_alloc4(dts[di], CB, CSC, CHK, CD, 0), vl = tu_alloc4(dts[di], CB, CSC, CHK, CD, 0);
            tu_fill(&q, &rng, -2, 2);
            tu_fill(&k, &rng, -2, 2);
            tu_fill(&v, &rng, -1, 1);
            round_to(&k, &kl);
            round_to(&v, &vl);
            fa_kvcache kv = fa_kvcache_default();
            kv.cache_seqlens = seqlens;
            for (int causal = 0; causal <= 1; causal++)
                for (int ns = 1; ns <= 4; ns += 3) {
                    fa_options opt = fa_options_default();
                    opt.kvcache = &kv;
                    opt.causal = causal;
                    opt.block_k = 32;
                    opt.num_splits = ns;
                    char what[128];
                    snprintf(what, sizeof what, "%s cache, sq %lld, causal %d, splits %d", fa_dtype_name(dts[di]),
                             (long long)sq, causal, ns);
                    run_out low = run_flash(&q.t, &kl.t, &vl.t, CD, opt, what);
                    run_out f32 = run_flash(&q.t, &k.t, &v.t, CD, opt, what);
                    same_bits(&low, &f32, what);
                    expect_reference(&q.t, &kl.t, &vl.t, CD, opt, &low, what);
                    free_out(&low);
                    free_out(&f32);
                }
            tu_free(&q); tu_free(&k); tu_free(&v); tu_free(&kl); tu_free(&vl);
        }
}

/* Ensure a paged cache (pages 1, 3, 16; shuffled) gives the contiguous cache's bits with splits, f32 and bf16. */
static void test_paged_cache_with_splits(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xdec0de06u;
    const int32_t seqlens[CB] = {171, 0, 64};
    static const int64_t page_sizes[] = {1, 3, 16};
    static const fa_dtype dts[] = {FA_F32, FA_BF16};
    for (size_t di = 0; di < 2; di++)
        for (size_t pi = 0; pi < 3; pi++) {
            const int64_t ps = page_sizes[pi], maxp = (CSC + ps - 1) / ps, npages = CB * maxp + 3;
            const int64_t sq = 1 + (int64_t)pi;
            tu_tensor q = tu_alloc4(FA_F32, CB, sq, CH, CD, 0);
            tu_tensor k = tu_alloc4(dts[di], CB, CSC, CHK, CD, 0), v = tu_alloc4(dts[di], CB, CSC, CHK, CD, 0);
            tu_tensor kp = tu_alloc4(dts[di], npages, ps, CHK, CD, 0), vp = tu_alloc4(dts[di], npages, ps, CHK, CD, 0);
            tu_fill(&q, &rng, -2, 2);
            tu_fill(&k, &rng, -2, 2);
            tu_fill(&v, &rng, -1, 1);
            tu_fill(&kp, &rng, -9, 9); /* rows no sequence owns hold other values */
            tu_fill(&vp, &rng, -9, 9);
            int32_t *perm = malloc((size_t)npages * sizeof(int32_t)), *table = malloc((size_t)(CB * maxp) * sizeof(int32_t));
            assert_non_null(perm);
            assert_non_null(table);
            for (int64_t x = 0; x < npages; x++) perm[x] = (int32_t)x;
            for (int64_t x = npages - 1; x > 0; x--) {
                const int64_t y = (int64_t)(tu_next(&rng) % (uint64_t)(x + 1));
                const int32_t t = perm[x];
                perm[x] = perm[y];
                perm[y] = t;
            }
            const size_t esz = fa_dtype_size(dts[di]), row = (size_t)CHK * CD * esz;
            for (int64_t b = 0; b < CB; b++)
                for (int64_t pg = 0; pg < maxp; pg++) {
                    const int32_t page = perm[b * maxp + pg];
                    table[b * maxp + pg] = page;
                    for (int64_t r = 0; r < ps && pg * ps + r < CSC; r++) {
                        memcpy((char *)kp.mem + (size_t)(page * ps + r) * row, (char *)k.mem + (size_t)(b * CSC + pg * ps + r) * row, row);
                        memcpy((char *)vp.mem + (size_t)(page * ps + r) * row, (char *)v.mem + (size_t)(b * CSC + pg * ps + r) * row, row);
                    }
                }
            fa_kvcache kv = fa_kvcache_default(), kvp = fa_kvcache_default();
            kv.cache_seqlens = seqlens;
            kvp.cache_seqlens = seqlens;
            kvp.block_table = table;
            kvp.max_pages = maxp;
            for (int ns = 1; ns <= 5; ns += 2) {
                fa_options opt = fa_options_default();
                opt.causal = 1;
                opt.block_k = 16;
                opt.num_splits = ns;
                char what[128];
                snprintf(what, sizeof what, "%s, page %lld, sq %lld, splits %d", fa_dtype_name(dts[di]), (long long)ps,
                         (long long)sq, ns);
                opt.kvcache = &kv;
                run_out flat = run_flash(&q.t, &k.t, &v.t, CD, opt, what);
                opt.kvcache = &kvp;
                run_out paged = run_flash(&q.t, &kp.t, &vp.t, CD, opt, what);
                same_bits(&paged, &flat, what);
                expect_reference(&q.t, &kp.t, &vp.t, CD, opt, &paged, what);
                free_out(&flat);
                free_out(&paged);
            }
            free(perm);
            free(table);
            tu_free(&q); tu_free(&k); tu_free(&v); tu_free(&kp); tu_free(&vp);
        }
}

/* Ensure a cache with new keys appended in the call matches the reference with splits. */
static void test_cache_append_with_splits(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xdec0de07u;
    enum { SN = 2 };
    const int32_t seqlens[CB] = {100, 0, 170};
    for (int ns = 1; ns <= 4; ns++) {
        tu_tensor q = tu_alloc4(FA_F32, CB, SN, CH, CD, 0);
        tu_tensor k = tu_alloc4(FA_BF16, CB, CSC, CHK, CD, 0), v = tu_alloc4(FA_BF16, CB, CSC, CHK, CD, 0);
        tu_tensor kn = tu_alloc4(FA_BF16, CB, SN, CHK, CD, 0), vn = tu_alloc4(FA_BF16, CB, SN, CHK, CD, 0);
        tu_fill(&q, &rng, -2, 2);
        tu_fill(&k, &rng, -2, 2);
        tu_fill(&v, &rng, -1, 1);
        tu_fill(&kn, &rng, -2, 2);
        tu_fill(&vn, &rng, -1, 1);
        fa_kvcache kv = fa_kvcache_default();
        kv.cache_seqlens = seqlens;
        kv.k_new = &kn.t;
        kv.v_new = &vn.t;
        fa_options opt = fa_options_default();
        opt.kvcache = &kv;
        opt.causal = 1;
        opt.block_k = 16;
        opt.num_splits = ns;
        /* fa_check reads k_new/v_new where they are not yet appended: check first, on a copy of the result */
        tu_tensor k0 = tu_alloc4(FA_BF16, CB, CSC, CHK, CD, 0), v0 = tu_alloc4(FA_BF16, CB, CSC, CHK, CD, 0);
        memcpy(k0.mem, k.mem, k.bytes);
        memcpy(v0.mem, v.mem, v.bytes);
        char what[64];
        snprintf(what, sizeof what, "append, splits %d", ns);
        run_out r = run_flash(&q.t, &k.t, &v.t, CD, opt, what); /* appends into k, v */
        expect_reference(&q.t, &k0.t, &v0.t, CD, opt, &r, what);
        free_out(&r);
        tu_free(&q); tu_free(&k); tu_free(&v); tu_free(&kn); tu_free(&vn); tu_free(&k0); tu_free(&v0);
    }
}

/* Copy a [B][S][HK][w] cache into pages of ps rows in the shuffled order perm; table [B][maxp]. */
static tu_tensor to_pages(const tu_tensor *c, int64_t ps, const int32_t *perm, int64_t maxp, int64_t npages, int32_t *table)
{
    const int64_t B = c->t.shape[0], S = c->t.shape[1], HK = c->t.shape[2], W = c->t.shape[3];
    tu_tensor pg = tu_alloc4(c->t.dtype, npages, ps, HK, W, 0);
    uint64_t junk = 0x5eed;
    tu_fill(&pg, &junk, -9, 9); /* rows no sequence owns hold other values */
    const size_t row = (size_t)(HK * W) * fa_dtype_size(c->t.dtype);
    for (int64_t b = 0; b < B; b++)
        for (int64_t x = 0; x < maxp; x++) {
            const int32_t page = perm[b * maxp + x];
            table[b * maxp + x] = page;
            for (int64_t r = 0; r < ps && x * ps + r < S; r++)
                memcpy((char *)pg.mem + (size_t)(page * ps + r) * row, (char *)c->mem + (size_t)(b * S + x * ps + r) * row,
                       row);
        }
    return pg;
}

/* Ensure the direct decode kernels' edges: tiles at and past the 64-row bound (GQA x seqlen_q up to 16), d not a
 * multiple of 16, d = 256, d_v != d, f16/bf16 caches (= their float32 widening, bit for bit) and pages of 1 and 3
 * rows (= contiguous, bit for bit), causal or not, 1 or 3 splits, all against the float64 reference. */
static void test_direct_kernel_edges(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xdec0de0au;
    static const int64_t shapes[][5] = {/* H, HK, SQ, D, DV */
                                        {8, 2, 16, 100, 100}, /* 4 x 16 = 64 rows: the bound */
                                        {10, 2, 13, 17, 17},  /* 5 x 13 = 65 rows: two chunks */
                                        {4, 1, 5, 256, 256},
                                        {6, 3, 2, 72, 40},
                                        {3, 3, 7, 33, 48}};
    static const fa_dtype dts[] = {FA_F32, FA_BF16, FA_F16};
    static const int64_t page_sizes[] = {0, 1, 3};
    enum { B = 2, SC = 140 };
    const int32_t seqlens[B] = {140, 61};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t H = shapes[si][0], HK = shapes[si][1], SQ = shapes[si][2], D = shapes[si][3], DV = shapes[si][4];
        tu_tensor q = tu_alloc4(FA_F32, B, SQ, H, D, 0);
        tu_fill(&q, &rng, -2, 2);
        for (size_t di = 0; di < 3; di++) {
            tu_tensor k = tu_alloc4(FA_F32, B, SC, HK, D, 0), v = tu_alloc4(FA_F32, B, SC, HK, DV, 0);
            tu_tensor kl = tu_alloc4(dts[di], B, SC, HK, D, 0), vl = tu_alloc4(dts[di], B, SC, HK, DV, 0);
            tu_fill(&k, &rng, -2, 2);
            tu_fill(&v, &rng, -1, 1);
            round_to(&k, &kl); /* k, v: the float32 values the dt cache holds */
            round_to(&v, &vl);
            for (size_t pi = 0; pi < 3; pi++) {
                const int64_t ps = page_sizes[pi];
                const int64_t maxp = ps ? (SC + ps - 1) / ps : 0, npages = B * maxp + 2;
                int32_t *perm = NULL, *table = NULL;
                tu_tensor kp = {0}, vp = {0};
                fa_kvcache kv = fa_kvcache_default();
                kv.cache_seqlens = seqlens;
                if (ps) {
                    perm = malloc((size_t)npages * sizeof(int32_t));
                    table = malloc((size_t)(B * maxp) * sizeof(int32_t));
                    assert_non_null(perm);
                    assert_non_null(table);
                    for (int64_t x = 0; x < npages; x++) perm[x] = (int32_t)x;
                    for (int64_t x = npages - 1; x > 0; x--) {
                        const int64_t y = (int64_t)(tu_next(&rng) % (uint64_t)(x + 1));
                        const int32_t t = perm[x];
                        perm[x] = perm[y];
                        perm[y] = t;
                    }
                    kp = to_pages(&kl, ps, perm, maxp, npages, table);
                    vp = to_pages(&vl, ps, perm, maxp, npages, table);
                    kv.block_table = table;
                    kv.max_pages = maxp;
                }
                fa_kvcache flat = fa_kvcache_default();
                flat.cache_seqlens = seqlens;
                for (int ns = 1; ns <= 3; ns += 2) {
                    fa_options opt = fa_options_default();
                    opt.causal = (int)((si + pi + (size_t)ns) % 2);
                    opt.block_k = 16;
                    opt.num_splits = ns;
                    opt.num_threads = 2;
                    char what[160];
                    snprintf(what, sizeof what, "H %lld HK %lld sq %lld d %lld dv %lld, %s, page %lld, causal %d, splits %d",
                             (long long)H, (long long)HK, (long long)SQ, (long long)D, (long long)DV,
                             fa_dtype_name(dts[di]), (long long)ps, opt.causal, ns);
                    opt.kvcache = &kv;
                    run_out got = ps ? run_flash(&q.t, &kp.t, &vp.t, DV, opt, what) : run_flash(&q.t, &kl.t, &vl.t, DV, opt, what);
                    expect_reference(&q.t, ps ? &kp.t : &kl.t, ps ? &vp.t : &vl.t, DV, opt, &got, what);
                    opt.kvcache = &flat;
                    run_out f32 = run_flash(&q.t, &k.t, &v.t, DV, opt, what); /* contiguous float32 */
                    same_bits(&got, &f32, what);
                    free_out(&got);
                    free_out(&f32);
                }
                if (ps) {
                    tu_free(&kp);
                    tu_free(&vp);
                }
                free(perm);
                free(table);
            }
            tu_free(&k); tu_free(&v); tu_free(&kl); tu_free(&vl);
        }
        tu_free(&q);
    }
}

/* A [B][S][HK][D] cache in layout 0 (BSHD), 1 (BHSD) or 2 (BSHD, but heads 2D apart: every other head of a
 * [B][S][2 HK][D] buffer, the other heads filled too). */
static tu_tensor cache_layout(fa_dtype dt, int64_t B, int64_t S, int64_t HK, int64_t D, int layout, uint64_t *rng,
                              double lo, double hi)
{
    tu_tensor c = tu_alloc4(dt, B, S, layout == 2 ? 2 * HK : HK, D, layout == 1);
    tu_fill(&c, rng, lo, hi);
    if (layout == 2) {
        c.t.shape[2] = HK;
        c.t.stride[2] = 2 * D;
    }
    return c;
}

/* Ensure address order (decode.c's addr_plan: the first block of a task read, every later one asked for while the
 * one before is computed) runs where a task holds several kv
 * heads whose rows sit next to each other in a key's row (dense BSHD, paged, f32 and bf16, a cache with new keys
 * appended in the call), is skipped where they do not (BHSD, heads S x d apart) or where a task holds one kv head
 * (MQA), and never changes a bit: each run with it equals the run without it, and the reference holds. */
static void test_touch_runs_and_keeps_bits(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xdec0de0cu;
    enum { B = 2, SC = 150, D = 40 };
    const int32_t seqlens[B] = {150, 97};
    static const struct {
        int64_t h, hk;
        fa_dtype dt;
        int bhsd, ps, append, threads, splits, touched; /* bhsd: cache_layout's layout; touched: 1 address
                                                           order must run, 0 it must not */
        int bk; /* block_k pinned (0: the decoder's own) */
    } cases[] = {
        {8, 4, FA_F32, 0, 0, 0, 1, 1, 1, 0},  /* one task, all 4 kv heads: whole key rows */
        {8, 4, FA_BF16, 0, 0, 0, 2, 0, 1, 0}, /* the heuristic's splits, 2 threads */
        {12, 3, FA_F32, 0, 3, 0, 1, 3, 1, 0}, /* pages of 3 rows */
        {8, 4, FA_BF16, 0, 16, 0, 3, 2, 1, 0},
        {8, 4, FA_F32, 0, 0, 1, 1, 1, 1, 0},  /* new keys appended in the call (into the cache, before it is read) */
        {4, 4, FA_F32, 0, 0, 0, 1, 1, 1, 0},  /* one query row a kv head (the kernels' 1-row blocking) */
        {32, 4, FA_BF16, 0, 0, 0, 1, 1, 1, 0}, /* 8 rows a kv head (two row blocks a dec_qk call) */
        {8, 4, FA_F32, 0, 0, 0, 2, 1, 1, 100}, /* blocks of 100 keys: several dec_qk calls a head */
        {8, 4, FA_F16, 0, 3, 0, 1, 2, 1, 5},  /* blocks of 5 keys on pages of 3 */
        {8, 4, FA_F32, 1, 0, 0, 1, 1, 0, 0},  /* BHSD: a key's heads S x d apart, skipped */
        {8, 4, FA_F32, 2, 0, 0, 1, 1, 0, 0},  /* heads 2d apart (every other head of a wider buffer), skipped */
        {4, 1, FA_F32, 0, 0, 0, 1, 1, 0, 0},  /* MQA: one kv head a task */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t H = cases[ci].h, HK = cases[ci].hk, ps = cases[ci].ps;
        const int64_t maxp = ps ? (SC + ps - 1) / ps : 0, npages = B * maxp + 2;
        const int64_t nnew = cases[ci].append ? 3 : 0;
        tu_tensor q = tu_alloc4(FA_F32, B, 1, H, D, 0);
        tu_tensor k = cache_layout(cases[ci].dt, B, SC, HK, D, cases[ci].bhsd, &rng, -2, 2);
        tu_tensor v = cache_layout(cases[ci].dt, B, SC, HK, D, cases[ci].bhsd, &rng, -1, 1);
        tu_tensor kn = tu_alloc4(cases[ci].dt, B, nnew ? nnew : 1, HK, D, 0);
        tu_tensor vn = tu_alloc4(cases[ci].dt, B, nnew ? nnew : 1, HK, D, 0);
        tu_fill(&q, &rng, -2, 2);
        tu_fill(&kn, &rng, -2, 2);
        tu_fill(&vn, &rng, -1, 1);
        int32_t *perm = NULL, *table = NULL;
        tu_tensor kp = {0}, vp = {0};
        if (ps) {
            perm = malloc((size_t)npages * sizeof(int32_t));
            table = malloc((size_t)(B * maxp) * sizeof(int32_t));
            assert_non_null(perm);
            assert_non_null(table);
            for (int64_t x = 0; x < npages; x++) perm[x] = (int32_t)(npages - 1 - x); /* reversed: pages out of order */
            kp = to_pages(&k, ps, perm, maxp, npages, table);
            vp = to_pages(&v, ps, perm, maxp, npages, table);
        }
        const int32_t used[B] = {seqlens[0] - (int32_t)nnew, seqlens[1] - (int32_t)nnew};
        char what[160];
        snprintf(what, sizeof what, "H %lld HK %lld %s%s, page %lld%s, %d threads, splits %d, block_k %d",
                 (long long)H, (long long)HK, fa_dtype_name(cases[ci].dt),
                 cases[ci].bhsd == 1 ? " BHSD" : cases[ci].bhsd ? " heads 2d apart" : "", (long long)ps,
                 nnew ? ", 3 new keys" : "", cases[ci].threads, cases[ci].splits, cases[ci].bk);
        run_out out[2];
        long blocks[2], touched[2], asked[2], bad[2];
        for (int touch = 0; touch < 2; touch++) {
            fa_kvcache kv = fa_kvcache_default();
            kv.cache_seqlens = nnew ? used : seqlens;
            if (ps) {
                kv.block_table = table;
                kv.max_pages = maxp;
            }
            if (nnew) {
                kv.k_new = &kn.t;
                kv.v_new = &vn.t;
            }
            /* an appending call writes the new keys into the cache: each run starts from the same cache */
            tu_tensor kc = {0}, vc = {0};
            const tu_tensor *ks = ps ? &kp : &k, *vs = ps ? &vp : &v;
            if (nnew) {
                kc = tu_alloc4(cases[ci].dt, B, SC, HK, D, cases[ci].bhsd);
                vc = tu_alloc4(cases[ci].dt, B, SC, HK, D, cases[ci].bhsd);
                memcpy(kc.mem, ks->mem, ks->bytes);
                memcpy(vc.mem, vs->mem, vs->bytes);
                ks = &kc;
                vs = &vc;
            }
            fa_options opt = fa_options_default();
            opt.causal = 1;
            opt.num_threads = cases[ci].threads;
            opt.num_splits = cases[ci].splits;
            if (cases[ci].bk) opt.block_k = cases[ci].bk;
            opt.kvcache = &kv;
            fa_decode_touch_test = touch;
            fa_count_test = 1;
            atomic_store(&fa_count_addr_blocks, 0);
            atomic_store(&fa_count_touched, 0);
            atomic_store(&fa_count_asked, 0);
            atomic_store(&fa_count_ask_bad, 0);
            out[touch] = run_flash(&q.t, &ks->t, &vs->t, D, opt, what);
            blocks[touch] = atomic_load(&fa_count_addr_blocks);
            touched[touch] = atomic_load(&fa_count_touched);
            asked[touch] = atomic_load(&fa_count_asked);
            bad[touch] = atomic_load(&fa_count_ask_bad);
            fa_count_test = 0;
            fa_decode_touch_test = -1;
            if (touch) {
                opt.kvcache = &kv;
                if (nnew) { /* the reference reads the cache the call appended into */
                    kv.k_new = NULL;
                    kv.v_new = NULL;
                    kv.cache_seqlens = seqlens;
                }
                expect_reference(&q.t, &ks->t, &vs->t, D, opt, &out[touch], what);
            }
            if (nnew) {
                tu_free(&kc);
                tu_free(&vc);
            }
        }
        if (blocks[0] != 0 || touched[0] != 0 || asked[0] != 0 || bad[0] != 0)
            fail_msg("%s: address order with it off (%ld blocks)", what, blocks[0]);
        if (bad[1] != 0) fail_msg("%s: %ld blocks asked for in part, or another block's lines", what, bad[1]);
        if (cases[ci].touched) {
            /* each task reads its first block, and asks for every later one during the one before */
            if (touched[1] <= 0 || asked[1] <= 0 || touched[1] + asked[1] != blocks[1])
                fail_msg("%s: of %ld blocks in address order %ld read first, %ld asked for", what, blocks[1],
                         touched[1], asked[1]);
        } else if (touched[1] != 0 || asked[1] != 0) {
            fail_msg("%s: %ld blocks read, %ld asked for where it must skip", what, touched[1], asked[1]);
        }
        same_bits(&out[1], &out[0], what);
        free_out(&out[0]);
        free_out(&out[1]);
        if (ps) {
            tu_free(&kp);
            tu_free(&vp);
        }
        free(perm);
        free(table);
        tu_free(&q); tu_free(&k); tu_free(&v); tu_free(&kn); tu_free(&vn);
    }
}

/* ------------------------------------------------------------------------ */
/* Varlen                                                                    */
/* ------------------------------------------------------------------------ */

/* Ensure varlen decode batches (query lengths 0..4, empty key sets) match the reference for split counts 1..5. */
static void test_varlen_decode_with_splits(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xdec0de08u;
    enum { NB = 5, H = 6, HK = 3, D = 24 };
    const int32_t cu_q[NB + 1] = {0, 1, 4, 4, 6, 10}, cu_k[NB + 1] = {0, 130, 130, 170, 241, 300};
    const int64_t tq = cu_q[NB], tk = cu_k[NB];
    const int64_t qs[3] = {tq, H, D}, ks[3] = {tk, HK, D};
    tu_tensor q = tu_alloc(FA_F32, 3, qs), k = tu_alloc(FA_F32, 3, ks), v = tu_alloc(FA_F32, 3, ks);
    tu_fill(&q, &rng, -2, 2);
    tu_fill(&k, &rng, -2, 2);
    tu_fill(&v, &rng, -1, 1);
    fa_varlen vl = fa_varlen_default();
    vl.batch = NB;
    vl.cu_seqlens_q = cu_q;
    vl.cu_seqlens_k = cu_k;
    for (int causal = 0; causal <= 1; causal++)
        for (int ns = 1; ns <= 5; ns++) {
            fa_options opt = fa_options_default();
            opt.varlen = &vl;
            opt.causal = causal;
            opt.block_k = 16;
            opt.num_splits = ns;
            char what[64];
            snprintf(what, sizeof what, "varlen, causal %d, splits %d", causal, ns);
            run_out r = run_flash(&q.t, &k.t, &v.t, D, opt, what);
            expect_reference(&q.t, &k.t, &v.t, D, opt, &r, what);
            free_out(&r);
        }
    tu_free(&q); tu_free(&k); tu_free(&v);
}

/* ------------------------------------------------------------------------ */
/* The split count, the workspace                                            */
/* ------------------------------------------------------------------------ */

static fa_problem resolve(int64_t B, int64_t sq, int64_t sk, int64_t H, int64_t HK, int threads, int splits, int bk)
{
    static float dummy[1];
    fa_tensor q, k, v;
    const int64_t qs[4] = {B, sq, H, 8}, ks[4] = {B, sk, HK, 8}, z[4] = {0, 0, 0, 0};
    assert_int_equal(fa_tensor_make(&q, dummy, FA_F32, 4, qs, z), FA_OK);
    assert_int_equal(fa_tensor_make(&k, dummy, FA_F32, 4, ks, z), FA_OK);
    assert_int_equal(fa_tensor_make(&v, dummy, FA_F32, 4, ks, z), FA_OK);
    fa_options opt = fa_options_default();
    opt.num_threads = threads;
    opt.num_splits = splits;
    opt.block_k = bk;
    fa_problem p;
    if (fa_resolve(FA_PURPOSE_WORKSPACE, &q, &k, &v, NULL, NULL, &opt, NULL, &p) != FA_OK)
        fail_msg("resolve: %s", fa_last_error());
    return p;
}

/* Ensure num_splits 0 splits only when heads_k x row chunks are fewer than FA_DECODE_SPLIT_TASKS
 * tasks, whatever the thread count or batch, and every count is clamped to the key blocks. */
static void test_split_heuristic_and_clamp(void **state)
{
    (void)state;
    for (int threads = 1; threads <= 64; threads *= 4) {
        fa_problem p = resolve(1, 1, 4096, 8, 1, threads, 0, 64); /* MQA, one task: 16 splits */
        assert_true(fa_decode_applies(&p));
        assert_int_equal(fa_decode_splits(&p), FA_DECODE_SPLIT_TASKS);
        p = resolve(1, 1, 4096, 32, 8, threads, 0, 64); /* 8 kv heads: 2 splits each */
        assert_int_equal(fa_decode_splits(&p), 2);
        p = resolve(4, 1, 4096, 32, 8, threads, 0, 64); /* the batch does not count */
        assert_int_equal(fa_decode_splits(&p), 2);
        p = resolve(1, 16, 4096, 64, 8, threads, 0, 64); /* 8 x 16 = 128 rows per kv head: 2 chunks each, 16 tasks */
        assert_int_equal(fa_decode_splits(&p), 1);
        p = resolve(3, 1, 4096, 12, 3, threads, 0, 64); /* 3 kv heads: ceil(16 / 3) = 6 splits */
        assert_int_equal(fa_decode_splits(&p), 6);
        p = resolve(1, 1, 100, 8, 1, threads, 0, 64); /* 2 key blocks: at most 2 splits */
        assert_int_equal(fa_decode_splits(&p), 2);
    }
    fa_problem p = resolve(1, 1, 100, 8, 1, 1, 7, 64); /* 2 key blocks: at most 2 splits */
    assert_int_equal(fa_decode_splits(&p), 2);
    p = resolve(1, 1, 1 << 20, 8, 1, 1, 1000000, 64);
    assert_int_equal(fa_decode_splits(&p), FA_DECODE_MAX_SPLITS);
    p = resolve(1, FA_DECODE_MAX_Q + 1, 4096, 8, 1, 1, 0, 64); /* longer queries: the flash driver */
    assert_false(fa_decode_applies(&p));
}

/* Ensure the decode workspace grows with the splits but never with seqlen_q x seqlen_k. */
static void test_workspace_has_no_sq_sk_term(void **state)
{
    (void)state;
    fa_problem a = resolve(1, 4, 1 << 14, 8, 2, 2, 4, 64), b = resolve(1, 4, 1 << 18, 8, 2, 2, 4, 64);
    assert_int_equal(fa_decode_workspace(&a), fa_decode_workspace(&b)); /* 16x the keys: same bytes */
    fa_problem c = resolve(1, 4, 1 << 14, 8, 2, 2, 8, 64);
    assert_true(fa_decode_workspace(&c) > fa_decode_workspace(&a)); /* more partials */
    fa_problem one = resolve(1, 4, 1 << 14, 8, 2, 2, 1, 64);
    assert_true(fa_decode_workspace(&one) < fa_decode_workspace(&a)); /* one split: no partials */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_splits_match_reference),
        cmocka_unit_test(test_split_bits_do_not_depend_on_threads),
        cmocka_unit_test(test_gqa_packing_matches_unpacked),
        cmocka_unit_test(test_task_shapes_match_reference),
        cmocka_unit_test(test_inf_in_hidden_value_stays_hidden),
        cmocka_unit_test(test_low_precision_cache),
        cmocka_unit_test(test_paged_cache_with_splits),
        cmocka_unit_test(test_cache_append_with_splits),
        cmocka_unit_test(test_direct_kernel_edges),
        cmocka_unit_test(test_touch_runs_and_keeps_bits),
        cmocka_unit_test(test_varlen_decode_with_splits),
        cmocka_unit_test(test_split_heuristic_and_clamp),
        cmocka_unit_test(test_workspace_has_no_sq_sk_term),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
