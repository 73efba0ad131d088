/*
 * test_kvcache.c — the KV cache (fa_options.kvcache: FlashAttention's
 * flash_attn_with_kvcache) and paged KV, through the public API.
 *
 * What must hold:
 *   - sequence b attends to the cache rows cache_leftpad[b] ..
 *     cache_seqlens[b] - 1 of cache cache_batch_idx[b], then its new keys:
 *     its O and LSE are bit for bit what the same implementation gives the
 *     uniform problem whose keys are those rows copied out contiguously
 *     (masks bottom-right aligned to that key count), for every
 *     implementation and mask;
 *   - fa_forward appends k_new/v_new in place at cache_seqlens[b] and touches
 *     no other cache row; fa_check reads them from k_new/v_new, writes
 *     nothing, and passes the flash output;
 *   - paged KV (any page size: 1, 3, 16, 256; pages in a random order) gives
 *     the bits of the same cache stored contiguously, and appends into the
 *     right page and row;
 *   - bad caches and index arrays are refused, naming the array and index.
 */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define B 3
#define H 4
#define HK 2
#define D 16
#define DV 8
#define SC 40  /* seqlen_cache */
#define BC 4   /* batch_cache */

typedef struct opt_case {
    int causal;
    int64_t wl, wr;
    double softcap;
    int alibi;
} opt_case;

static const opt_case OPTS[] = {
    {0, -1, -1, 0.0, 0}, {1, -1, -1, 0.0, 0}, {0, 6, 0, 20.0, 1}, {1, 5, -1, 0.0, 1},
};

typedef struct kv_data {
    tu_tensor q, kc, vc, kn, vn, slopes;
    int32_t seqlens[B], idx[B], pad[B];
    int64_t sq, sn;
} kv_data;

static void make_data(kv_data *g, uint64_t *rng, int64_t sq, int64_t sn)
{
    g->sq = sq;
    g->sn = sn;
    g->q = tu_alloc4(FA_F32, B, sq, H, D, 0);
    g->kc = tu_alloc4(FA_F32, BC, SC, HK, D, 0);
    g->vc = tu_alloc4(FA_F32, BC, SC, HK, DV, 0);
    g->kn = tu_alloc4(FA_F32, B, sn > 0 ? sn : 1, HK, D, 0);
    g->vn = tu_alloc4(FA_F32, B, sn > 0 ? sn : 1, HK, DV, 0);
    const int64_t s1[1] = {H};
    g->slopes = tu_alloc(FA_F32, 1, s1);
    tu_fill(&g->q, rng, -2, 2);
    tu_fill(&g->kc, rng, -2, 2);
    tu_fill(&g->vc, rng, -1, 1);
    tu_fill(&g->kn, rng, -2, 2);
    tu_fill(&g->vn, rng, -1, 1);
    tu_fill(&g->slopes, rng, 0.05, 0.5);
    const int32_t n[B] = {10, 0, 25}, idx[B] = {2, 0, 3}, pad[B] = {2, 0, 5};
    memcpy(g->seqlens, n, sizeof n);
    memcpy(g->idx, idx, sizeof idx);
    memcpy(g->pad, pad, sizeof pad);
}

static void free_data(kv_data *g)
{
    tu_free(&g->q); tu_free(&g->kc); tu_free(&g->vc); tu_free(&g->kn); tu_free(&g->vn); tu_free(&g->slopes);
}

/* k_new/v_new as the first sn rows of the (>= 1 row) buffers */
static fa_tensor rows_of(const tu_tensor *t, int64_t n)
{
    fa_tensor v = t->t;
    v.shape[1] = n;
    return v;
}

static fa_options make_opt(const opt_case *oc, const kv_data *g, fa_impl impl)
{
    fa_options opt = fa_options_default();
    opt.causal = oc->causal;
    opt.window_left = oc->wl;
    opt.window_right = oc->wr;
    opt.softcap = oc->softcap;
    opt.alibi_slopes = oc->alibi ? &g->slopes.t : NULL;
    opt.impl = impl;
    opt.block_q = 4;
    opt.block_k = 8;
    opt.num_threads = 2;
    return opt;
}

/* Key row j of sequence b as the cache problem sees it (before the append). */
static const float *key_row(const kv_data *g, int vside, int use_idx, int use_pad, int64_t b, int64_t j, int64_t hk)
{
    const int64_t pad = use_pad ? g->pad[b] : 0, cached = g->seqlens[b] - pad;
    const tu_tensor *c = vside ? &g->vc : &g->kc, *n = vside ? &g->vn : &g->kn;
    const int64_t w = vside ? DV : D;
    if (j >= cached) return (const float *)n->mem + (((b * n->t.shape[1]) + (j - cached)) * HK + hk) * w;
    const int64_t row = use_idx ? g->idx[b] : b;
    return (const float *)c->mem + ((row * SC + pad + j) * HK + hk) * w;
}

static void expect_same(const void *a, const void *b, size_t bytes, const char *what)
{
    if (memcmp(a, b, bytes) != 0) fail_msg("%s differs", what);
}

/* Run the cache problem and each sequence's uniform equivalent; compare bits. */
static void cache_case(int64_t sq, int64_t sn, int use_idx, int use_pad)
{
    uint64_t rng = tu_seed() ^ (uint64_t)(sq * 131 + sn * 7 + use_idx * 3 + use_pad);
    kv_data g;
    make_data(&g, &rng, sq, sn);
    for (size_t oi = 0; oi < sizeof OPTS / sizeof OPTS[0]; oi++)
        for (int impl = 0; impl < FA_IMPL_COUNT; impl++) {
            /* fresh caches per run: the append writes them */
            tu_tensor kc = tu_alloc4(FA_F32, BC, SC, HK, D, 0), vc = tu_alloc4(FA_F32, BC, SC, HK, DV, 0);
            memcpy(kc.mem, g.kc.mem, kc.bytes);
            memcpy(vc.mem, g.vc.mem, vc.bytes);
            fa_tensor kn = rows_of(&g.kn, sn), vn = rows_of(&g.vn, sn);
            fa_kvcache kv = fa_kvcache_default();
            kv.cache_seqlens = g.seqlens;
            kv.cache_batch_idx = use_idx ? g.idx : NULL;
            kv.cache_leftpad = use_pad ? g.pad : NULL;
            if (sn > 0) { kv.k_new = &kn; kv.v_new = &vn; }
            fa_options opt = make_opt(&OPTS[oi], &g, (fa_impl)impl);
            opt.kvcache = &kv;
            tu_tensor o = tu_alloc4(FA_F32, B, sq, H, DV, 0);
            const int64_t ls[3] = {B, H, sq};
            tu_tensor lse = tu_alloc(FA_F32, 3, ls);
            tu_poison(&o); tu_poison(&lse);
            if (fa_forward(&g.q.t, &kc.t, &vc.t, &o.t, &lse.t, &opt) != FA_OK)
                fail_msg("cache forward (%s): %s", fa_impl_name((fa_impl)impl), fa_last_error());

            /* the append, and nothing else, changed the caches */
            for (int vside = 0; vside < 2; vside++) {
                const tu_tensor *now = vside ? &vc : &kc, *before = vside ? &g.vc : &g.kc;
                const int64_t w = vside ? DV : D;
                for (int64_t cb = 0; cb < BC; cb++)
                    for (int64_t r = 0; r < SC; r++) {
                        int64_t seq = -1;
                        for (int64_t b = 0; b < B; b++)
                            if ((use_idx ? g.idx[b] : b) == cb && r >= g.seqlens[b] && r < g.seqlens[b] + sn) seq = b;
                        for (int64_t hk = 0; hk < HK; hk++) {
                            const float *got = (const float *)now->mem + ((cb * SC + r) * HK + hk) * w;
                            const float *want = seq >= 0 ? key_row(&g, vside, use_idx, use_pad, seq,
                                                                   g.seqlens[seq] - (use_pad ? g.pad[seq] : 0) + r - g.seqlens[seq], hk)
                                                         : (const float *)before->mem + ((cb * SC + r) * HK + hk) * w;
                            if (memcmp(got, want, (size_t)w * sizeof(float)) != 0)
                                fail_msg("%s cache row (%lld, %lld) head %lld is wrong after the append", vside ? "v" : "k",
                                         (long long)cb, (long long)r, (long long)hk);
                        }
                    }
            }

            /* each sequence as a uniform problem on its keys, copied out */
            for (int64_t b = 0; b < B; b++) {
                const int64_t nk = g.seqlens[b] - (use_pad ? g.pad[b] : 0) + sn;
                tu_tensor kb = tu_alloc4(FA_F32, 1, nk, HK, D, 0), vb = tu_alloc4(FA_F32, 1, nk, HK, DV, 0);
                for (int64_t j = 0; j < nk; j++)
                    for (int64_t hk = 0; hk < HK; hk++) {
                        memcpy((float *)kb.mem + (j * HK + hk) * D, key_row(&g, 0, use_idx, use_pad, b, j, hk), D * sizeof(float));
                        memcpy((float *)vb.mem + (j * HK + hk) * DV, key_row(&g, 1, use_idx, use_pad, b, j, hk), DV * sizeof(float));
                    }
                fa_tensor qb = g.q.t;
                qb.data = (float *)g.q.mem + b * sq * H * D;
                qb.shape[0] = 1;
                tu_tensor ob = tu_alloc4(FA_F32, 1, sq, H, DV, 0);
                const int64_t lbs[3] = {1, H, sq};
                tu_tensor lb = tu_alloc(FA_F32, 3, lbs);
                fa_options uo = make_opt(&OPTS[oi], &g, (fa_impl)impl);
                if (fa_forward(&qb, &kb.t, &vb.t, &ob.t, &lb.t, &uo) != FA_OK)
                    fail_msg("sequence %lld alone: %s", (long long)b, fa_last_error());
                if (memcmp((float *)o.mem + b * sq * H * DV, ob.mem, ob.bytes) != 0 ||
                    memcmp((float *)lse.mem + b * H * sq, lb.mem, lb.bytes) != 0)
                    fail_msg("sq %lld sn %lld idx %d pad %d, %s, options %zu: sequence %lld differs from its keys alone",
                             (long long)sq, (long long)sn, use_idx, use_pad, fa_impl_name((fa_impl)impl), oi, (long long)b);
                tu_free(&kb); tu_free(&vb); tu_free(&ob); tu_free(&lb);
            }

            if (impl == FA_IMPL_FLASH) { /* fa_check on the caches as they were: passes, writes nothing */
                memcpy(kc.mem, g.kc.mem, kc.bytes);
                memcpy(vc.mem, g.vc.mem, vc.bytes);
                fa_check_options co = fa_check_options_default();
                fa_check_report r = fa_check_report_init();
                if (fa_check(&g.q.t, &kc.t, &vc.t, &o.t, &lse.t, &opt, &co, &r) != FA_OK)
                    fail_msg("cache check: %s", fa_last_error());
                if (!r.pass) fail_msg("flash fails the cache check (max err %g, bound %g)", r.max_abs_err, r.bound);
                fa_check_report_free(&r);
                expect_same(kc.mem, g.kc.mem, kc.bytes, "k cache after fa_check");
                expect_same(vc.mem, g.vc.mem, vc.bytes, "v cache after fa_check");
            }
            tu_free(&kc); tu_free(&vc); tu_free(&o); tu_free(&lse);
        }
    free_data(&g);
}

/* Ensure each sequence of a cache gets the bits of its keys alone: decode (1 query) and a chunk of 4, with appends. */
static void test_cache_matches_each_sequence_alone(void **state)
{
    (void)state;
    cache_case(1, 0, 0, 0);
    cache_case(1, 1, 0, 0);
    cache_case(4, 3, 0, 0);
    cache_case(4, 3, 1, 0);
    cache_case(4, 2, 1, 1);
    cache_case(1, 0, 0, 1);
}

/* Ensure a paged cache (page sizes 1, 3, 16, 256, pages shuffled) gives the contiguous cache's bits and appends into the right page. */
static void test_paged_cache_is_bit_identical_to_contiguous(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x9a6e;
    kv_data g;
    make_data(&g, &rng, 4, 3);
    static const int64_t page_sizes[] = {1, 3, 16, 256};
    for (size_t pi = 0; pi < sizeof page_sizes / sizeof page_sizes[0]; pi++) {
        const int64_t ps = page_sizes[pi], maxp = (SC + ps - 1) / ps, npages = B * maxp + 5;
        for (size_t oi = 0; oi < sizeof OPTS / sizeof OPTS[0]; oi++)
            for (int impl = 0; impl < FA_IMPL_COUNT; impl++) {
                /* contiguous: caches [B][SC] (sequence b in cache row b) */
                tu_tensor kc = tu_alloc4(FA_F32, B, SC, HK, D, 0), vc = tu_alloc4(FA_F32, B, SC, HK, DV, 0);
                memcpy(kc.mem, g.kc.mem, kc.bytes);
                memcpy(vc.mem, g.vc.mem, vc.bytes);
                /* paged: the same rows scattered over shuffled pages */
                tu_tensor kp = tu_alloc4(FA_F32, npages, ps, HK, D, 0), vp = tu_alloc4(FA_F32, npages, ps, HK, DV, 0);
                tu_fill(&kp, &rng, -9, 9); /* unused pages and rows hold other values */
                tu_fill(&vp, &rng, -9, 9);
                int32_t *perm = malloc((size_t)npages * sizeof(int32_t)), *table = malloc((size_t)(B * maxp) * sizeof(int32_t));
                for (int64_t x = 0; x < npages; x++) perm[x] = (int32_t)x;
                for (int64_t x = npages - 1; x > 0; x--) {
                    const int64_t y = (int64_t)(tu_next(&rng) % (uint64_t)(x + 1));
                    const int32_t t = perm[x]; perm[x] = perm[y]; perm[y] = t;
                }
                for (int64_t b = 0; b < B; b++)
                    for (int64_t x = 0; x < maxp; x++) table[b * maxp + x] = perm[b * maxp + x];
                for (int64_t b = 0; b < B; b++)
                    for (int64_t r = 0; r < g.seqlens[b]; r++) {
                        const int64_t pg = table[b * maxp + r / ps], off = r % ps;
                        memcpy((float *)kp.mem + ((pg * ps + off) * HK) * D, (float *)kc.mem + ((b * SC + r) * HK) * D, HK * D * sizeof(float));
                        memcpy((float *)vp.mem + ((pg * ps + off) * HK) * DV, (float *)vc.mem + ((b * SC + r) * HK) * DV, HK * DV * sizeof(float));
                    }
                fa_tensor kn = rows_of(&g.kn, 3), vn = rows_of(&g.vn, 3);
                fa_kvcache kv = fa_kvcache_default();
                kv.cache_seqlens = g.seqlens;
                kv.k_new = &kn;
                kv.v_new = &vn;
                fa_options opt = make_opt(&OPTS[oi], &g, (fa_impl)impl);
                opt.kvcache = &kv;
                tu_tensor o1 = tu_alloc4(FA_F32, B, 4, H, DV, 0), o2 = tu_alloc4(FA_F32, B, 4, H, DV, 0);
                const int64_t ls[3] = {B, H, 4};
                tu_tensor l1 = tu_alloc(FA_F32, 3, ls), l2 = tu_alloc(FA_F32, 3, ls);
                if (fa_forward(&g.q.t, &kc.t, &vc.t, &o1.t, &l1.t, &opt) != FA_OK)
                    fail_msg("contiguous: %s", fa_last_error());
                kv.block_table = table;
                kv.max_pages = maxp;
                if (fa_forward(&g.q.t, &kp.t, &vp.t, &o2.t, &l2.t, &opt) != FA_OK)
                    fail_msg("paged (page %lld): %s", (long long)ps, fa_last_error());
                if (memcmp(o1.mem, o2.mem, o1.bytes) != 0 || memcmp(l1.mem, l2.mem, l1.bytes) != 0)
                    fail_msg("page size %lld, %s, options %zu: paged O/LSE differ from contiguous", (long long)ps,
                             fa_impl_name((fa_impl)impl), oi);
                /* the appended rows landed in the right page and row */
                for (int64_t b = 0; b < B; b++)
                    for (int64_t r = g.seqlens[b]; r < g.seqlens[b] + 3; r++) {
                        const int64_t pg = table[b * maxp + r / ps], off = r % ps;
                        if (memcmp((float *)kp.mem + ((pg * ps + off) * HK) * D, (float *)kc.mem + ((b * SC + r) * HK) * D,
                                   HK * D * sizeof(float)) != 0 ||
                            memcmp((float *)vp.mem + ((pg * ps + off) * HK) * DV, (float *)vc.mem + ((b * SC + r) * HK) * DV,
                                   HK * DV * sizeof(float)) != 0)
                            fail_msg("page size %lld: sequence %lld key %lld was not appended into its page", (long long)ps,
                                     (long long)b, (long long)r);
                    }
                free(perm); free(table);
                tu_free(&kc); tu_free(&vc); tu_free(&kp); tu_free(&vp);
                tu_free(&o1); tu_free(&o2); tu_free(&l1); tu_free(&l2);
            }
    }
    free_data(&g);
}

static void expect_refusal(kv_data *g, const fa_kvcache *kv, const fa_tensor *kc, const fa_tensor *vc, fa_status want,
                           const char *needle)
{
    tu_tensor o = tu_alloc4(FA_F32, B, g->sq, H, DV, 0);
    fa_options opt = fa_options_default();
    opt.kvcache = kv;
    const fa_status st = fa_forward(&g->q.t, kc, vc, &o.t, NULL, &opt);
    if (st != want || !strstr(fa_last_error(), needle))
        fail_msg("expected status %d with '%s', got %d: %s", (int)want, needle, (int)st, fa_last_error());
    tu_free(&o);
}

/* Ensure a call that fails after the append (here the standard path's memory cap) leaves the
 * caches as they were — with cache_batch_idx and cache_leftpad too — and that the same call
 * under the default cap appends. */
static void test_failed_call_leaves_the_caches(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xca11;
    kv_data g;
    make_data(&g, &rng, 2, 3);
    for (int variant = 0; variant < 2; variant++) {
        tu_tensor kc = tu_alloc4(FA_F32, BC, SC, HK, D, 0), vc = tu_alloc4(FA_F32, BC, SC, HK, DV, 0);
        memcpy(kc.mem, g.kc.mem, kc.bytes);
        memcpy(vc.mem, g.vc.mem, vc.bytes);
        fa_tensor kn = rows_of(&g.kn, 3), vn = rows_of(&g.vn, 3);
        fa_kvcache kv = fa_kvcache_default();
        kv.cache_seqlens = g.seqlens;
        kv.cache_batch_idx = variant ? g.idx : NULL;
        kv.cache_leftpad = variant ? g.pad : NULL;
        kv.k_new = &kn;
        kv.v_new = &vn;
        fa_options opt = make_opt(&OPTS[1], &g, FA_IMPL_STANDARD);
        opt.kvcache = &kv;
        opt.standard_max_bytes = 64; /* S and P of one head need more: refused after the append */
        tu_tensor o = tu_alloc4(FA_F32, B, g.sq, H, DV, 0);
        const fa_status st = fa_forward(&g.q.t, &kc.t, &vc.t, &o.t, NULL, &opt);
        if (st != FA_ERR_TOO_LARGE) fail_msg("variant %d: expected FA_ERR_TOO_LARGE, got %d: %s", variant, (int)st, fa_last_error());
        expect_same(kc.mem, g.kc.mem, kc.bytes, "k cache after a failed call");
        expect_same(vc.mem, g.vc.mem, vc.bytes, "v cache after a failed call");
        opt.standard_max_bytes = 0;
        if (fa_forward(&g.q.t, &kc.t, &vc.t, &o.t, NULL, &opt) != FA_OK) fail_msg("variant %d: %s", variant, fa_last_error());
        if (memcmp(kc.mem, g.kc.mem, kc.bytes) == 0 || memcmp(vc.mem, g.vc.mem, vc.bytes) == 0)
            fail_msg("variant %d: the call that succeeded appended nothing", variant);
        tu_free(&kc); tu_free(&vc); tu_free(&o);
    }
    free_data(&g);
}

/* Ensure bad caches and index arrays are refused with a message naming the array and the index. */
static void test_cache_refuses_bad_arguments(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xbadc;
    kv_data g;
    make_data(&g, &rng, 2, 3);
    fa_tensor kn = rows_of(&g.kn, 3), vn = rows_of(&g.vn, 3);
    fa_kvcache kv = fa_kvcache_default();
    kv.cache_seqlens = g.seqlens;
    kv.k_new = &kn;
    kv.v_new = &vn;
    int32_t big[B] = {10, 0, 38};
    kv.cache_seqlens = big;
    expect_refusal(&g, &kv, &g.kc.t, &g.vc.t, FA_ERR_INDEX, "cache_seqlens[2] + seqlen_new = 38 + 3 is past the cache");
    kv.cache_seqlens_name = "seqlens.npy";
    expect_refusal(&g, &kv, &g.kc.t, &g.vc.t, FA_ERR_INDEX, "seqlens.npy: cache_seqlens[2]");
    kv.cache_seqlens_name = NULL;
    kv.cache_seqlens = g.seqlens;
    int32_t idx_bad[B] = {2, 4, 3}, idx_dup[B] = {2, 0, 2}, pad_bad[B] = {0, 1, 0};
    kv.cache_batch_idx = idx_bad;
    expect_refusal(&g, &kv, &g.kc.t, &g.vc.t, FA_ERR_INDEX, "cache_batch_idx[1] = 4 is outside 0..3");
    kv.cache_batch_idx = idx_dup;
    int32_t close_lens[B] = {10, 0, 11}; /* sequences 0 and 2 append rows 10..12 and 11..13 of cache 2 */
    kv.cache_seqlens = close_lens;
    expect_refusal(&g, &kv, &g.kc.t, &g.vc.t, FA_ERR_INDEX, "sequences 0 and 2 would both append");
    /* sequence 0 appends rows 5..7 of cache 2, which sequence 2 reads (0..11): the append comes
     * first, so forward and check would disagree on what sequence 2 sees */
    int32_t read_lens[B] = {5, 0, 12};
    kv.cache_seqlens = read_lens;
    kv.cache_batch_idx_name = "idx.npy";
    expect_refusal(&g, &kv, &g.kc.t, &g.vc.t, FA_ERR_INDEX,
                   "idx.npy: sequence 0 would append into the cache row that sequence 2 reads as its key 5 (cache 2, row 5)");
    kv.cache_batch_idx_name = NULL;
    kv.cache_seqlens = g.seqlens;
    kv.cache_batch_idx = NULL;
    kv.cache_leftpad = pad_bad;
    expect_refusal(&g, &kv, &g.kc.t, &g.vc.t, FA_ERR_INDEX, "cache_leftpad[1] = 1 is outside 0..cache_seqlens[1] = 0");
    kv.cache_leftpad = NULL;
    kv.v_new = NULL;
    expect_refusal(&g, &kv, &g.kc.t, &g.vc.t, FA_ERR_NULL_ARG, "k_new and v_new go together");
    kv.v_new = &vn;
    /* paged: a page index outside the pages, and paging with cache_batch_idx */
    tu_tensor kp = tu_alloc4(FA_F32, 6, 16, HK, D, 0), vp = tu_alloc4(FA_F32, 6, 16, HK, DV, 0);
    int32_t table[B * 3] = {0, 1, 2, 3, 4, 5, 5, 99, 1};
    kv.block_table = table;
    kv.max_pages = 3;
    expect_refusal(&g, &kv, &kp.t, &vp.t, FA_ERR_INDEX, "block_table[2][1] = 99 is outside the pages 0..5");
    table[7] = 0; /* sequence 2 appends rows 25..27 = page 0 rows 9..11, where sequence 0 appends rows 10..12 */
    expect_refusal(&g, &kv, &kp.t, &vp.t, FA_ERR_INDEX, "sequences 0 and 2 would both append");
    /* one page twice in sequence 0's row: its keys 16.. land on page 4 again, and the append
     * (keys 17..19 = page 4 rows 1..3) overwrites its own keys 1..3 */
    int32_t table_self[B * 3] = {4, 4, 2, 3, 0, 5, 1, 0, 5}, lens_self[B] = {17, 0, 5};
    kv.block_table = table_self;
    kv.cache_seqlens = lens_self;
    expect_refusal(&g, &kv, &kp.t, &vp.t, FA_ERR_INDEX,
                   "sequence 0 would append into the cache row that sequence 0 reads as its key 1 (page 4, row 1)");
    /* pages of one row: sequence 0's new keys 2 and 3 both on page 2 (it would append twice into one row) */
    {
        tu_tensor kp1 = tu_alloc4(FA_F32, 16, 1, HK, D, 0), vp1 = tu_alloc4(FA_F32, 16, 1, HK, DV, 0);
        int32_t table1[B * 5] = {0, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, lens1[B] = {2, 0, 2};
        kv.block_table = table1;
        kv.max_pages = 5;
        kv.cache_seqlens = lens1;
        expect_refusal(&g, &kv, &kp1.t, &vp1.t, FA_ERR_INDEX, "sequences 0 and 0 would both append into one cache row (page 2, row 0)");
        /* a pool of 2^18 pages of one row: the check's memory follows the appended rows, not the pool */
        table1[3] = 3;
        table1[4] = 1 << 17;
        tu_tensor kbig = tu_alloc4(FA_F32, 1 << 18, 1, HK, D, 0), vbig = tu_alloc4(FA_F32, 1 << 18, 1, HK, DV, 0);
        tu_tensor o = tu_alloc4(FA_F32, B, g.sq, H, DV, 0);
        fa_options opt = fa_options_default();
        opt.kvcache = &kv;
        fa_alloc_stats st;
        fa_alloc_stats_reset();
        if (fa_forward(&g.q.t, &kbig.t, &vbig.t, &o.t, NULL, &opt) != FA_OK) fail_msg("a big pool: %s", fa_last_error());
        fa_alloc_stats_get(&st);
        if (st.peak_bytes > ((size_t)1 << 20)) /* one int64 per pool row would be 2 MiB */
            fail_msg("a call on a pool of 2^18 one-row pages allocated %zu bytes at its peak", st.peak_bytes);
        kv.max_pages = 3;
        tu_free(&kp1); tu_free(&vp1); tu_free(&kbig); tu_free(&vbig); tu_free(&o);
    }
    kv.block_table = table;
    kv.cache_seqlens = g.seqlens;
    kv.cache_batch_idx = g.idx;
    expect_refusal(&g, &kv, &kp.t, &vp.t, FA_ERR_OPTION, "cannot be combined");
    kv.cache_batch_idx = NULL;
    kv.block_table = NULL;
    /* k_new of another dtype than the cache */
    tu_tensor kn16 = tu_alloc4(FA_F16, B, 3, HK, D, 0);
    tu_fill(&kn16, &rng, -1, 1);
    kv.k_new = &kn16.t;
    expect_refusal(&g, &kv, &g.kc.t, &g.vc.t, FA_ERR_DTYPE, "the caches' dtypes");
    {   /* a caller built against 0.5: its fa_kvcache ends before k_new_name, and the bytes
         * after it (garbage here) must not be read — the message falls back to "k_new" */
        fa_kvcache raw;
        memset(&raw, 0xab, sizeof raw);
        fa_kvcache old = kv;
        old.struct_size = offsetof(fa_kvcache, k_new_name);
        memcpy(&raw, &old, old.struct_size);
        expect_refusal(&g, &raw, &g.kc.t, &g.vc.t, FA_ERR_DTYPE, "k_new: k_new/v_new must have the caches' dtypes");
        kv.k_new_name = "kn16.npy";
        expect_refusal(&g, &kv, &g.kc.t, &g.vc.t, FA_ERR_DTYPE, "kn16.npy: k_new/v_new must have the caches' dtypes");
        kv.k_new_name = NULL;
    }
    kv.k_new = &kn;
    /* a cache smaller than q's batch needs cache_batch_idx */
    fa_tensor small_k = g.kc.t, small_v = g.vc.t;
    small_k.shape[0] = small_v.shape[0] = 2;
    expect_refusal(&g, &kv, &small_k, &small_v, FA_ERR_SHAPE, "give cache_batch_idx");
    /* forward only */
    tu_tensor dq = tu_alloc4(FA_F32, B, 2, H, D, 0), dk = tu_alloc4(FA_F32, BC, SC, HK, D, 0),
              dv = tu_alloc4(FA_F32, BC, SC, HK, DV, 0), dout = tu_alloc4(FA_F32, B, 2, H, DV, 0);
    fa_options opt = fa_options_default();
    opt.kvcache = &kv;
    assert_int_equal(fa_backward(&g.q.t, &g.kc.t, &g.vc.t, NULL, NULL, &dout.t, &dq.t, &dk.t, &dv.t, &opt), FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "forward only"));
    tu_free(&dq); tu_free(&dk); tu_free(&dv); tu_free(&dout);
    tu_free(&kp); tu_free(&vp); tu_free(&kn16);
    free_data(&g);
}

/*
 * fa_check_inputs (what `run` calls before a forward over a cache): a NaN in cache rows no
 * sequence reads is fine, one in a row a sequence reads is refused naming the cache, the
 * sequence and the key (counted from the leftpad), one in a new key names k_new.
 */
static void test_check_inputs_refuses_only_what_is_read(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x1a7e;
    kv_data g;
    make_data(&g, &rng, 2, 3);
    fa_tensor kn = rows_of(&g.kn, 3), vn = rows_of(&g.vn, 3);
    fa_kvcache kv = fa_kvcache_default();
    kv.cache_seqlens = g.seqlens; /* 10, 0, 25 */
    kv.cache_batch_idx = g.idx;   /* 2, 0, 3 */
    kv.cache_leftpad = g.pad;     /* 2, 0, 5 */
    kv.k_new = &kn;
    kv.v_new = &vn;
    kv.k_new_name = "kn.npy";
    fa_options opt = fa_options_default();
    opt.kvcache = &kv;
    assert_int_equal(fa_check_inputs(&g.q.t, &g.kc.t, &g.vc.t, &opt, NULL, "kc.npy", "vc.npy"), FA_OK);
    float *kc = g.kc.t.data, *knd = g.kn.t.data;
    const size_t row = (size_t)HK * D; /* floats per cache row */
    kc[((size_t)2 * SC + 30) * row + 5] = NAN; /* cache 2 row 30: sequence 0 reads rows 2..9 only */
    kc[((size_t)2 * SC + 1) * row + 5] = NAN;  /* row 1: below sequence 0's leftpad */
    kc[((size_t)1 * SC + 0) * row + 5] = NAN;  /* cache 1: no sequence's */
    assert_int_equal(fa_check_inputs(&g.q.t, &g.kc.t, &g.vc.t, &opt, NULL, "kc.npy", "vc.npy"), FA_OK);
    kc[((size_t)3 * SC + 7) * row + D + 2] = INFINITY; /* cache 3 row 7, kv head 1: sequence 2's key 2 */
    assert_int_equal(fa_check_inputs(&g.q.t, &g.kc.t, &g.vc.t, &opt, NULL, "kc.npy", "vc.npy"), FA_ERR_NONFINITE);
    assert_non_null(strstr(fa_last_error(), "kc.npy: sequence 2, key 2, head 1, element 2 (element [3,7,1,2] of the cache) is Inf"));
    kc[((size_t)3 * SC + 7) * row + D + 2] = 0.5f;
    knd[((size_t)0 * g.kn.t.shape[1] + 1) * row + 3] = NAN; /* sequence 0's new key 1 */
    assert_int_equal(fa_check_inputs(&g.q.t, &g.kc.t, &g.vc.t, &opt, NULL, "kc.npy", "vc.npy"), FA_ERR_NONFINITE);
    assert_non_null(strstr(fa_last_error(), "kn.npy: batch 0, new key 1, head 0, element 3 is NaN"));
    free_data(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_matches_each_sequence_alone),
        cmocka_unit_test(test_paged_cache_is_bit_identical_to_contiguous),
        cmocka_unit_test(test_cache_refuses_bad_arguments),
        cmocka_unit_test(test_failed_call_leaves_the_caches),
        cmocka_unit_test(test_check_inputs_refuses_only_what_is_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
