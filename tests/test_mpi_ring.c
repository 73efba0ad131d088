/*
 * test_mpi_ring.c — the ring (src/mpi) against single-process flash and the
 * float64 reference; run by tests/test_mpi.sh under
 *   mpirun -np P build/tests/mpi_ring_check            (P = 1 .. 4)
 *
 * Every rank builds the same fresh random inputs (seed from rank 0:
 * $FA_TEST_SEED or the clock, printed), computes the whole problem with
 * fa_forward/fa_backward (flash and reference), runs the ring on its shard,
 * and compares its rows at their global positions (fa_ring_global_row):
 *   P = 1: bit-identical to single-process flash (forward and backward);
 *   P > 1: max|ring - ref| <= 2 max|flash - ref| + floor (FlashAttention's rule;
 *          floor = 2^-20 max|ref|, a few float32 ulps), for O, LSE, dQ, dK, dV;
 *   the same run twice gives the same bits; zigzag and contiguous agree within
 *   the same bound; a caller's progress hook is run on the main thread and moves
 *   no bit, nor do options of an older layout; a bad shard on one rank fails on
 *   every rank, same message.
 * Exit status 0 only when every check passed on every rank.
 */
#include "flashattn_mpi.h"

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#define RING_MAX_THREADS() omp_get_max_threads()
#else
#define RING_MAX_THREADS() 1 /* a build without OpenMP (NO_OMP=1) */
#endif
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int rank_, size_, failures;

#define CHECK(cond, ...)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            failures++;                                                                  \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", rank_, __FILE__, __LINE__);         \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n");                                                       \
        }                                                                                \
    } while (0)

static uint64_t rng;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

typedef struct cfg {
    const char *name;
    int64_t B, Sq, Sk, H, Hk, d, dv;
    int causal;
    int64_t wl, wr;
    double softcap;
    int align;
} cfg;

typedef struct full {
    float *q, *k, *v, *dout;
    double *o_ref, *lse_ref, *dq_ref, *dk_ref, *dv_ref;
    float *o_fl, *lse_fl, *dq_fl, *dk_fl, *dv_fl;
} full;

static fa_tensor T(void *p, fa_dtype dt, int r, int64_t a, int64_t b, int64_t c, int64_t d)
{
    fa_tensor t;
    const int64_t s[4] = {a, b, c, d};
    fa_tensor_make(&t, p, dt, r, s, NULL);
    return t;
}

static fa_options opts(const cfg *c, fa_impl impl)
{
    fa_options o = fa_options_default();
    o.causal = c->causal;
    o.window_left = c->wl;
    o.window_right = c->wr;
    o.softcap = c->softcap;
    o.align = c->align;
    o.impl = impl;
    o.block_q = 16; /* small tiles: several per block even at these sizes */
    o.block_k = 16;
    return o;
}

/* Copy rows of a full [B][S][Hx][w] array (float) into a shard [B][c][Hx][w] in `layout`. */
static void shard_rows(const float *src, float *dst, int64_t B, int64_t S, int64_t hw, fa_ring_layout L)
{
    const int64_t c = S / size_;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < c; i++) {
            const int64_t g = fa_ring_global_row(S, size_, rank_, L, i);
            memcpy(dst + (b * c + i) * hw, src + (b * S + g) * hw, (size_t)hw * sizeof(float));
        }
}

/* max |shard - full_ref| over this rank's rows of a [B][S][Hx][w] array (all ranks: MPI_MAX). */
static double err_rows(const float *shard, const double *ref, int64_t B, int64_t S, int64_t hw, fa_ring_layout L)
{
    const int64_t c = S / size_;
    double e = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < c; i++) {
            const int64_t g = fa_ring_global_row(S, size_, rank_, L, i);
            for (int64_t x = 0; x < hw; x++) {
                const double a = shard[(b * c + i) * hw + x], r = ref[(b * S + g) * hw + x];
                const double de = (a == r) ? 0.0 : fabs(a - r); /* -inf == -inf: 0 */
                if (!(de <= e)) e = de;                          /* NaN propagates */
            }
        }
    double all;
    MPI_Allreduce(&e, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

/* LSE [B][H][S]: the same with rows on the last axis. */
static double err_lse(const float *shard, const double *ref, int64_t B, int64_t H, int64_t S, fa_ring_layout L)
{
    const int64_t c = S / size_;
    double e = 0;
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < c; i++) {
            const int64_t g = fa_ring_global_row(S, size_, rank_, L, i);
            const double a = shard[bh * c + i], r = ref[bh * S + g];
            const double de = (a == r) ? 0.0 : fabs(a - r);
            if (!(de <= e)) e = de;
        }
    double all;
    MPI_Allreduce(&e, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

static double maxdiff_f(const float *a, const double *r, size_t n)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        const double de = (a[i] == r[i]) ? 0.0 : fabs(a[i] - r[i]);
        if (!(de <= e)) e = de;
    }
    return e;
}

static double maxabs(const double *r, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(r[i]) && fabs(r[i]) > m) m = fabs(r[i]);
    return m;
}

/* 1 when this rank's shard equals the full float array's rows bit for bit (all ranks agree). */
static int same_bits_rows(const float *shard, const float *fullv, int64_t B, int64_t S, int64_t hw, fa_ring_layout L)
{
    const int64_t c = S / size_;
    int ok = 1;
    for (int64_t b = 0; b < B && ok; b++)
        for (int64_t i = 0; i < c && ok; i++) {
            const int64_t g = fa_ring_global_row(S, size_, rank_, L, i);
            ok = memcmp(shard + (b * c + i) * hw, fullv + (b * S + g) * hw, (size_t)hw * sizeof(float)) == 0;
        }
    int all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

static float *fa32(size_t n) { return calloc(n ? n : 1, sizeof(float)); }
static double *fa64(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

static void run_case(const cfg *c, uint64_t seed)
{
    const int64_t B = c->B, Sq = c->Sq, Sk = c->Sk, H = c->H, Hk = c->Hk, d = c->d, dv = c->dv;
    const size_t nq = (size_t)(B * Sq * H * d), nk = (size_t)(B * Sk * Hk * d), nv = (size_t)(B * Sk * Hk * dv);
    const size_t no = (size_t)(B * Sq * H * dv), nl = (size_t)(B * H * Sq);
    full F;
    F.q = fa32(nq), F.k = fa32(nk), F.v = fa32(nv), F.dout = fa32(no);
    rng = seed | 1;
    for (size_t i = 0; i < nq; i++) F.q[i] = (float)(2.0 * urand());
    for (size_t i = 0; i < nk; i++) F.k[i] = (float)(2.0 * urand());
    for (size_t i = 0; i < nv; i++) F.v[i] = (float)urand();
    for (size_t i = 0; i < no; i++) F.dout[i] = (float)urand();
    F.o_ref = fa64(no), F.lse_ref = fa64(nl), F.dq_ref = fa64(nq), F.dk_ref = fa64(nk), F.dv_ref = fa64(nv);
    F.o_fl = fa32(no), F.lse_fl = fa32(nl), F.dq_fl = fa32(nq), F.dk_fl = fa32(nk), F.dv_fl = fa32(nv);

    /* the whole problem, single-process: flash and the float64 reference */
    const fa_tensor q = T(F.q, FA_F32, 4, B, Sq, H, d), k = T(F.k, FA_F32, 4, B, Sk, Hk, d);
    const fa_tensor v = T(F.v, FA_F32, 4, B, Sk, Hk, dv), g = T(F.dout, FA_F32, 4, B, Sq, H, dv);
    fa_options fo = opts(c, FA_IMPL_FLASH), ro = opts(c, FA_IMPL_REFERENCE);
    fa_tensor t1 = T(F.o_ref, FA_F64, 4, B, Sq, H, dv), t2 = T(F.lse_ref, FA_F64, 3, B, H, Sq, 0);
    CHECK(fa_forward(&q, &k, &v, &t1, &t2, &ro) == FA_OK, "%s: reference forward: %s", c->name, fa_last_error());
    fa_tensor t3 = T(F.o_fl, FA_F32, 4, B, Sq, H, dv), t4 = T(F.lse_fl, FA_F32, 3, B, H, Sq, 0);
    CHECK(fa_forward(&q, &k, &v, &t3, &t4, &fo) == FA_OK, "%s: flash forward: %s", c->name, fa_last_error());
    fa_tensor a1 = T(F.dq_ref, FA_F64, 4, B, Sq, H, d), a2 = T(F.dk_ref, FA_F64, 4, B, Sk, Hk, d),
              a3 = T(F.dv_ref, FA_F64, 4, B, Sk, Hk, dv);
    CHECK(fa_backward(&q, &k, &v, NULL, NULL, &g, &a1, &a2, &a3, &ro) == FA_OK, "%s: reference backward: %s",
          c->name, fa_last_error());
    fa_tensor b1 = T(F.dq_fl, FA_F32, 4, B, Sq, H, d), b2 = T(F.dk_fl, FA_F32, 4, B, Sk, Hk, d),
              b3 = T(F.dv_fl, FA_F32, 4, B, Sk, Hk, dv);
    CHECK(fa_backward(&q, &k, &v, NULL, NULL, &g, &b1, &b2, &b3, &fo) == FA_OK, "%s: flash backward: %s", c->name,
          fa_last_error());

    /* single-process flash's own error: the yardstick */
    const double e_o = maxdiff_f(F.o_fl, F.o_ref, no), e_l = maxdiff_f(F.lse_fl, F.lse_ref, nl);
    const double e_dq = maxdiff_f(F.dq_fl, F.dq_ref, nq), e_dk = maxdiff_f(F.dk_fl, F.dk_ref, nk),
                 e_dv = maxdiff_f(F.dv_fl, F.dv_ref, nv);
    const double fl = 0x1p-20; /* floor, relative to max|ref| */
    const double b_o = 2 * e_o + fl * maxabs(F.o_ref, no), b_l = 2 * e_l + fl * maxabs(F.lse_ref, nl);
    const double b_dq = 2 * e_dq + fl * maxabs(F.dq_ref, nq), b_dk = 2 * e_dk + fl * maxabs(F.dk_ref, nk),
                 b_dv = 2 * e_dv + fl * maxabs(F.dv_ref, nv);

    const int64_t cq = Sq / size_, ck = Sk / size_;
    const fa_ring_layout layouts[2] = {FA_RING_CONTIGUOUS, FA_RING_ZIGZAG};
    float *zz_o = NULL; /* zigzag's O, gathered to global rows, vs contiguous's */
    float *ct_o = NULL;
    for (int li = 0; li < 2; li++) {
        const fa_ring_layout L = layouts[li];
        const size_t sq_ = (size_t)(B * cq * H * d), sk_ = (size_t)(B * ck * Hk * d), sv_ = (size_t)(B * ck * Hk * dv);
        const size_t so_ = (size_t)(B * cq * H * dv), sl_ = (size_t)(B * H * cq);
        float *lq = fa32(sq_), *lk = fa32(sk_), *lv = fa32(sv_), *lg = fa32(so_);
        float *lo = fa32(so_), *ll = fa32(sl_), *lo2 = fa32(so_), *ll2 = fa32(sl_);
        float *gq = fa32(sq_), *gk = fa32(sk_), *gv = fa32(sv_), *gq2 = fa32(sq_), *gk2 = fa32(sk_), *gv2 = fa32(sv_);
        shard_rows(F.q, lq, B, Sq, H * d, L);
        shard_rows(F.k, lk, B, Sk, Hk * d, L);
        shard_rows(F.v, lv, B, Sk, Hk * dv, L);
        shard_rows(F.dout, lg, B, Sq, H * dv, L);
        /* the shard's LSE rows, for err_lse: [B][H][cq] from the full [B][H][Sq] */
        const fa_tensor xq = T(lq, FA_F32, 4, B, cq, H, d), xk = T(lk, FA_F32, 4, B, ck, Hk, d);
        const fa_tensor xv = T(lv, FA_F32, 4, B, ck, Hk, dv), xg = T(lg, FA_F32, 4, B, cq, H, dv);
        fa_tensor xo = T(lo, FA_F32, 4, B, cq, H, dv), xl = T(ll, FA_F32, 3, B, H, cq, 0);
        fa_tensor xo2 = T(lo2, FA_F32, 4, B, cq, H, dv), xl2 = T(ll2, FA_F32, 3, B, H, cq, 0);
        fa_ring_stats st;
        fa_status s1 = fa_ring_forward(MPI_COMM_WORLD, L, &xq, &xk, &xv, &xo, &xl, &fo, &st);
        fa_status s2 = fa_ring_forward(MPI_COMM_WORLD, L, &xq, &xk, &xv, &xo2, &xl2, &fo, NULL);
        CHECK(s1 == FA_OK && s2 == FA_OK, "%s %s: ring forward: %s", c->name, fa_ring_layout_name(L),
              fa_ring_last_error());
        fa_tensor yq = T(gq, FA_F32, 4, B, cq, H, d), yk = T(gk, FA_F32, 4, B, ck, Hk, d),
                  yv = T(gv, FA_F32, 4, B, ck, Hk, dv);
        fa_tensor yq2 = T(gq2, FA_F32, 4, B, cq, H, d), yk2 = T(gk2, FA_F32, 4, B, ck, Hk, d),
                  yv2 = T(gv2, FA_F32, 4, B, ck, Hk, dv);
        fa_ring_stats bs;
        fa_status s3 = fa_ring_backward(MPI_COMM_WORLD, L, &xq, &xk, &xv, NULL, NULL, &xg, &yq, &yk, &yv, &fo, &bs);
        fa_status s4 = fa_ring_backward(MPI_COMM_WORLD, L, &xq, &xk, &xv, &xo, &xl, &xg, &yq2, &yk2, &yv2, &fo, NULL);
        CHECK(s3 == FA_OK && s4 == FA_OK, "%s %s: ring backward: %s", c->name, fa_ring_layout_name(L),
              fa_ring_last_error());

        const double r_o = err_rows(lo, F.o_ref, B, Sq, H * dv, L), r_l = err_lse(ll, F.lse_ref, B, H, Sq, L);
        const double r_dq = err_rows(gq, F.dq_ref, B, Sq, H * d, L), r_dk = err_rows(gk, F.dk_ref, B, Sk, Hk * d, L),
                     r_dv = err_rows(gv, F.dv_ref, B, Sk, Hk * dv, L);
        if (rank_ == 0)
            printf("  %-28s P=%d %-10s |O-ref| %.2e (flash %.2e, bound %.2e)  LSE %.2e/%.2e  dQ %.2e/%.2e  "
                   "dK %.2e/%.2e  dV %.2e/%.2e  blocks %lld+%lld skipped, %llu B/step\n",
                   c->name, size_, fa_ring_layout_name(L), r_o, e_o, b_o, r_l, b_l, r_dq, b_dq, r_dk, b_dk, r_dv,
                   b_dv, (long long)st.blocks_computed, (long long)st.blocks_skipped,
                   (unsigned long long)st.step_bytes);
        if (size_ == 1) { /* one rank: the single-process bits */
            CHECK(same_bits_rows(lo, F.o_fl, B, Sq, H * dv, L), "%s %s: P=1 O differs from flash", c->name,
                  fa_ring_layout_name(L));
            CHECK(memcmp(ll, F.lse_fl, sl_ * sizeof(float)) == 0, "%s: P=1 LSE differs from flash", c->name);
            CHECK(same_bits_rows(gq, F.dq_fl, B, Sq, H * d, L) && same_bits_rows(gk, F.dk_fl, B, Sk, Hk * d, L) &&
                      same_bits_rows(gv, F.dv_fl, B, Sk, Hk * dv, L),
                  "%s %s: P=1 gradients differ from flash", c->name, fa_ring_layout_name(L));
        }
        CHECK(r_o <= b_o, "%s %s: |O - ref| %.3e > bound %.3e", c->name, fa_ring_layout_name(L), r_o, b_o);
        CHECK(r_l <= b_l, "%s %s: |LSE - ref| %.3e > bound %.3e", c->name, fa_ring_layout_name(L), r_l, b_l);
        CHECK(r_dq <= b_dq, "%s %s: |dQ - ref| %.3e > bound %.3e", c->name, fa_ring_layout_name(L), r_dq, b_dq);
        CHECK(r_dk <= b_dk, "%s %s: |dK - ref| %.3e > bound %.3e", c->name, fa_ring_layout_name(L), r_dk, b_dk);
        CHECK(r_dv <= b_dv, "%s %s: |dV - ref| %.3e > bound %.3e", c->name, fa_ring_layout_name(L), r_dv, b_dv);
        /* run to run: the same bits (and backward with the given O/LSE == recomputed) */
        int same = memcmp(lo, lo2, so_ * sizeof(float)) == 0 && memcmp(ll, ll2, sl_ * sizeof(float)) == 0 &&
                   memcmp(gq, gq2, sq_ * sizeof(float)) == 0 && memcmp(gk, gk2, sk_ * sizeof(float)) == 0 &&
                   memcmp(gv, gv2, sv_ * sizeof(float)) == 0;
        CHECK(same, "%s %s: two identical runs differ in their bits", c->name, fa_ring_layout_name(L));

        /* gather O at global rows (one rank writes each row; the sum is exact) */
        float *part = fa32(no), *gath = fa32(no);
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < cq; i++)
                memcpy(part + (b * Sq + fa_ring_global_row(Sq, size_, rank_, L, i)) * H * dv,
                       lo + (b * cq + i) * H * dv, (size_t)(H * dv) * sizeof(float));
        MPI_Allreduce(part, gath, (int)no, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        free(part);
        if (L == FA_RING_ZIGZAG) zz_o = gath;
        else ct_o = gath;
        free(lq), free(lk), free(lv), free(lg), free(lo), free(ll), free(lo2), free(ll2);
        free(gq), free(gk), free(gv), free(gq2), free(gk2), free(gv2);
    }
    double zc = 0;
    for (size_t i = 0; i < no; i++) {
        const double de = fabs((double)zz_o[i] - (double)ct_o[i]);
        if (!(de <= zc)) zc = de;
    }
    CHECK(zc <= b_o, "%s: zigzag and contiguous differ by %.3e > %.3e", c->name, zc, b_o);
    free(zz_o), free(ct_o);
    free(F.q), free(F.k), free(F.v), free(F.dout), free(F.o_ref), free(F.lse_ref), free(F.dq_ref), free(F.dk_ref);
    free(F.dv_ref), free(F.o_fl), free(F.lse_fl), free(F.dq_fl), free(F.dk_fl), free(F.dv_fl);
}

/* The caller's own progress hook through the ring: still run (the ring's hook runs it after
 * its tests), only on the main thread, never twice at once, and no bit moves; with one thread
 * per rank every task is thread 0's, so it must run. Options of the 0.5 layout (ending at
 * num_splits, struct_size = offsetof(progress)) followed by garbage where progress would
 * be: the ring reads them only as far as they go, and gives the bits of the current layout. */
static _Thread_local int on_main;
static atomic_int hook_calls, hook_elsewhere, hook_inside, hook_overlap;

static void user_hook(void *arg)
{
    (void)arg;
    if (atomic_fetch_add(&hook_inside, 1) != 0) atomic_fetch_add(&hook_overlap, 1);
    atomic_fetch_add(&hook_calls, 1);
    if (!on_main) atomic_fetch_add(&hook_elsewhere, 1);
    atomic_fetch_sub(&hook_inside, 1);
}

static void caller_hook(void)
{
    const int64_t B = 1, S = 48 * (int64_t)size_, H = 2, Hk = 1, d = 16, c = S / size_;
    const size_t nq = (size_t)(B * c * H * d), nk = (size_t)(B * c * Hk * d), nl = (size_t)(B * H * c);
    float *q = fa32(nq), *k = fa32(nk), *v = fa32(nk), *g = fa32(nq);
    rng = 0x5eed5 + (uint64_t)rank_;
    for (size_t i = 0; i < nq; i++) q[i] = (float)urand(), g[i] = (float)urand();
    for (size_t i = 0; i < nk; i++) k[i] = (float)urand(), v[i] = (float)urand();
    const fa_tensor xq = T(q, FA_F32, 4, B, c, H, d), xk = T(k, FA_F32, 4, B, c, Hk, d);
    const fa_tensor xv = T(v, FA_F32, 4, B, c, Hk, d), xg = T(g, FA_F32, 4, B, c, H, d);
    float *o[3], *l[3], *dq[3], *dk[3], *dv[3];
    fa_options plain = fa_options_default();
    plain.causal = 1;
    plain.block_q = 16;
    plain.block_k = 16;
    fa_options hooked = plain;
    hooked.progress = user_hook;
    unsigned char *old = malloc(sizeof(fa_options) + 64);
    memset(old, 0x5a, sizeof(fa_options) + 64); /* progress would be a wild pointer */
    memcpy(old, &plain, offsetof(fa_options, progress));
    ((fa_options *)(void *)old)->struct_size = offsetof(fa_options, progress);
    const fa_options *use[3] = {&plain, &hooked, (const fa_options *)(void *)old};
    for (int x = 0; x < 3; x++) {
        o[x] = fa32(nq), l[x] = fa32(nl), dq[x] = fa32(nq), dk[x] = fa32(nk), dv[x] = fa32(nk);
        fa_tensor yo = T(o[x], FA_F32, 4, B, c, H, d), yl = T(l[x], FA_F32, 3, B, H, c, 0);
        fa_tensor yq = T(dq[x], FA_F32, 4, B, c, H, d), yk = T(dk[x], FA_F32, 4, B, c, Hk, d);
        fa_tensor yv = T(dv[x], FA_F32, 4, B, c, Hk, d);
        on_main = 1;
        const fa_status s1 = fa_ring_forward(MPI_COMM_WORLD, FA_RING_ZIGZAG, &xq, &xk, &xv, &yo, &yl, use[x], NULL);
        const fa_status s2 = fa_ring_backward(MPI_COMM_WORLD, FA_RING_ZIGZAG, &xq, &xk, &xv, &yo, &yl, &xg, &yq, &yk,
                                              &yv, use[x], NULL);
        on_main = 0;
        CHECK(s1 == FA_OK && s2 == FA_OK, "caller hook, options %d: %s", x, fa_ring_last_error());
    }
    for (int x = 1; x < 3; x++)
        CHECK(memcmp(o[0], o[x], nq * sizeof(float)) == 0 && memcmp(l[0], l[x], nl * sizeof(float)) == 0 &&
                  memcmp(dq[0], dq[x], nq * sizeof(float)) == 0 && memcmp(dk[0], dk[x], nk * sizeof(float)) == 0 &&
                  memcmp(dv[0], dv[x], nk * sizeof(float)) == 0,
              "options %d (%s) change the ring's bits", x, x == 1 ? "a caller's hook" : "the 0.5 layout");
    if (RING_MAX_THREADS() == 1) CHECK(atomic_load(&hook_calls) >= 1, "the caller's hook never ran");
    CHECK(atomic_load(&hook_elsewhere) == 0, "the caller's hook ran off the main thread %d times",
          atomic_load(&hook_elsewhere));
    CHECK(atomic_load(&hook_overlap) == 0, "the caller's hook ran twice at once");
    for (int x = 0; x < 3; x++) free(o[x]), free(l[x]), free(dq[x]), free(dk[x]), free(dv[x]);
    free(old), free(q), free(k), free(v), free(g);
}

/* Bad input on ONE rank: every rank gets the same error, nobody hangs. */
static void bad_inputs(void)
{
    const int64_t B = 1, c = 8, H = 2, d = 8;
    float *q = fa32((size_t)(B * c * H * d)), *o = fa32((size_t)(B * c * H * d));
    for (int64_t i = 0; i < B * c * H * d; i++) q[i] = (float)urand();
    fa_tensor t = T(q, FA_F32, 4, B, c, H, d);
    fa_tensor ot = T(o, FA_F32, 4, B, c, H, d);
    fa_options op = fa_options_default();
    /* the last rank's o has the wrong shape */
    fa_tensor bad = rank_ == size_ - 1 ? T(o, FA_F32, 4, B, c, H, d / 2) : ot;
    fa_status s = fa_ring_forward(MPI_COMM_WORLD, FA_RING_CONTIGUOUS, &t, &t, &t, &bad, NULL, &op, NULL);
    char msg[512], msg0[512];
    snprintf(msg, sizeof msg, "%s", fa_ring_last_error());
    memcpy(msg0, msg, sizeof msg);
    MPI_Bcast(msg0, (int)sizeof msg0, MPI_CHAR, 0, MPI_COMM_WORLD);
    CHECK(s == FA_ERR_SHAPE, "bad o on rank %d: status %s", size_ - 1, fa_status_string(s));
    CHECK(strcmp(msg, msg0) == 0 && strstr(msg, "o:") != NULL, "bad o: message '%s' (rank 0: '%s')", msg, msg0);
    if (rank_ == 0) printf("  bad o on rank %d only: every rank says \"%s\"\n", size_ - 1, msg);
    /* a shard count that zigzag cannot split: 3 rows per rank */
    fa_tensor odd = T(q, FA_F32, 4, B, 3, H, d), oo = T(o, FA_F32, 4, B, 3, H, d);
    s = fa_ring_forward(MPI_COMM_WORLD, FA_RING_ZIGZAG, &odd, &odd, &odd, &oo, NULL, &op, NULL);
    CHECK(size_ == 1 ? s == FA_OK : s == FA_ERR_SHAPE, "zigzag with 3 rows per rank: status %s",
          fa_status_string(s)); /* one rank: contiguous, any length */
    /* ranks that disagree on the options */
    fa_options o2 = fa_options_default();
    o2.causal = rank_ == 0;
    s = fa_ring_forward(MPI_COMM_WORLD, FA_RING_CONTIGUOUS, &t, &t, &t, &ot, NULL, &o2, NULL);
    CHECK(size_ == 1 ? s == FA_OK : s == FA_ERR_SHAPE, "options differing across ranks: status %s (%s)",
          fa_status_string(s), fa_ring_last_error());
    /* ALiBi refused by name */
    float slopes[2] = {0.5f, 0.25f};
    fa_tensor sl = T(slopes, FA_F32, 1, 2, 0, 0, 0);
    fa_options o3 = fa_options_default();
    o3.alibi_slopes = &sl;
    s = fa_ring_forward(MPI_COMM_WORLD, FA_RING_CONTIGUOUS, &t, &t, &t, &ot, NULL, &o3, NULL);
    CHECK(s == FA_ERR_OPTION && strstr(fa_ring_last_error(), "ALiBi"), "ALiBi: status %s", fa_status_string(s));
    /* backward: O/LSE given on rank 0 only (the others would recompute over the ring: must not hang) */
    float *lse = fa32((size_t)(B * H * c)), *g = fa32((size_t)(B * c * H * d)), *dq = fa32((size_t)(B * c * H * d));
    float *dk = fa32((size_t)(B * c * H * d)), *dv = fa32((size_t)(B * c * H * d));
    fa_tensor lt = T(lse, FA_F32, 3, B, H, c, 0), gt = T(g, FA_F32, 4, B, c, H, d);
    fa_tensor dqt = T(dq, FA_F32, 4, B, c, H, d), dkt = T(dk, FA_F32, 4, B, c, H, d), dvt = T(dv, FA_F32, 4, B, c, H, d);
    s = fa_ring_backward(MPI_COMM_WORLD, FA_RING_CONTIGUOUS, &t, &t, &t, rank_ == 0 ? &ot : NULL, rank_ == 0 ? &lt : NULL,
                         &gt, &dqt, &dkt, &dvt, &op, NULL);
    CHECK(size_ == 1 ? s == FA_OK : s == FA_ERR_NULL_ARG, "O/LSE on rank 0 only: status %s (%s)", fa_status_string(s),
          fa_ring_last_error());
    free(lse), free(g), free(dq), free(dk), free(dv);
    free(q), free(o);
}

static void layout_map(void)
{
    /* zigzag, P = 4, S = 16: chunks of 2; rank 1 holds chunks 1 and 6 -> rows 2,3,12,13 */
    const int64_t want[4] = {2, 3, 12, 13};
    for (int i = 0; i < 4; i++)
        CHECK(fa_ring_global_row(16, 4, 1, FA_RING_ZIGZAG, i) == want[i], "zigzag row %d", i);
    CHECK(fa_ring_global_row(16, 4, 1, FA_RING_CONTIGUOUS, 3) == 7, "contiguous row");
    CHECK(fa_ring_global_row(15, 4, 1, FA_RING_CONTIGUOUS, 0) == -1, "15 over 4 ranks");
    CHECK(fa_ring_global_row(12, 4, 1, FA_RING_ZIGZAG, 0) == -1, "zigzag 12 over 8 chunks");
    /* every global row exactly once */
    int seen[48] = {0};
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 16; i++) seen[fa_ring_global_row(48, 3, r, FA_RING_ZIGZAG, i)]++;
    int ok = 1;
    for (int i = 0; i < 48; i++) ok &= seen[i] == 1;
    CHECK(ok, "zigzag over 3 ranks covers each row once");
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    unsigned long long seed = 0;
    if (rank_ == 0) {
        const char *e = getenv("FA_TEST_SEED");
        seed = e && *e ? strtoull(e, NULL, 0) : (unsigned long long)time(NULL) * 2654435761ull;
        printf("mpi_ring_check: %d ranks, seed %llu (FA_TEST_SEED=%llu replays)\n", size_, seed, seed);
    }
    MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    layout_map();
    /* lengths are multiples of 24 so that 2P divides them for P = 1..4 */
    const cfg cases[] = {
        {"full MHA", 2, 48, 48, 2, 2, 16, 16, 0, -1, -1, 0, FA_ALIGN_BOTTOM_RIGHT},
        {"causal", 1, 96, 96, 2, 2, 32, 32, 1, -1, -1, 0, FA_ALIGN_BOTTOM_RIGHT},
        {"causal GQA softcap Sq<Sk", 2, 48, 96, 4, 2, 16, 24, 1, -1, -1, 5.0, FA_ALIGN_BOTTOM_RIGHT},
        {"causal Sq>Sk (empty rows)", 1, 96, 48, 2, 1, 16, 16, 1, -1, -1, 0, FA_ALIGN_BOTTOM_RIGHT},
        {"window 20,7 top-left", 1, 72, 96, 3, 1, 16, 16, 0, 20, 7, 0, FA_ALIGN_TOP_LEFT},
        {"window left 30", 1, 96, 96, 2, 2, 16, 16, 0, 30, -1, 0, FA_ALIGN_BOTTOM_RIGHT},
        {"causal window 10", 1, 96, 72, 2, 2, 16, 16, 1, 10, -1, 30.0, FA_ALIGN_BOTTOM_RIGHT},
        /* long enough that a Q chunk is cut into pieces while a transfer is in flight (>= 128 rows) */
        {"long causal", 1, 384, 384, 1, 1, 16, 16, 1, -1, -1, 0, FA_ALIGN_BOTTOM_RIGHT},
        {"long window 50,3 Sq<Sk", 1, 384, 480, 2, 1, 16, 16, 0, 50, 3, 0, FA_ALIGN_BOTTOM_RIGHT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], seed + 7919 * i);
    caller_hook();
    bad_inputs();
    int all;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank_ == 0) printf("mpi_ring_check: %d ranks: %s (%d failed checks)\n", size_, all ? "FAIL" : "ok", all);
    MPI_Finalize();
    return all ? 1 : 0;
}
