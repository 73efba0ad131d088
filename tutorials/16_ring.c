/*
 * 16_ring.c — the online-softmax merge as a distributed algorithm: ring attention.
 *
 * Previous steps merged K/V blocks inside one core: a running (m, l, O) rescaled
 *   by e^{m_old - m_new} whenever a block raised the row max (step 05). Nothing
 *   there needs the blocks to live in one memory.
 * What changes: P "ranks" (simulated here in one process, so the step builds
 *   without MPI; the real thing is src/mpi/ring.c and build/flashattn-mpi) each
 *   hold N/P rows of Q, K and V. Q stays put; the K/V shards travel around a
 *   ring, rank r -> r+1, one hop per step, and each rank computes its Q rows
 *   against whatever shard it holds (a library fa_forward call per block) and
 *   merges the partial (O_b, LSE_b) into its running (O, LSE) in the stable form
 *       LSE = max + log1p(exp(min - max)),
 *       O   = exp(LSE_a - LSE) O_a + exp(LSE_b - LSE) O_b.
 *   The program counts every byte it "sends" and every (query, key) pair it
 *   computes, per rank and per step.
 * What to look for:
 *   - bytes per step per rank = 2 (N/P) d s (K and V; s = 4 bytes): the count
 *     equals the formula, and P - 1 steps add up to ~2 N d s per rank, the same
 *     as gathering all of K and V: the ring saves memory (O(N/P) per rank),
 *     not traffic;
 *   - overlap: a step computes 4 (N/P)^2 d FLOPs while it moves 2 (N/P) d s bytes,
 *     so the transfer hides behind the compute when N/P >= (s/2) F / W (F: FLOP/s
 *     of one rank, W: link bytes/s); the table prints that c for the F measured
 *     here and three named links (causal zigzag does half the work per step: 2x);
 *   - causal, contiguous: rank r's keys after its rows are invisible, so at each
 *     step some ranks have a full block and others nothing; a step lasts as long
 *     as its busiest rank, and the balance (useful work / P x the critical path)
 *     falls toward 50%. Zigzag (rank r holds chunks r and 2P-1-r of 2P) gives
 *     every rank one early and one late chunk: the same work at every step, ~100%.
 */
#include "common.h"

enum { MAXP = 8 };

typedef struct rank_state {
    int nseg, seg_start[2], seg_len[2]; /* its rows: one or two runs of global rows */
    float *q, *kv_cur, *kv_next;        /* Q shard [c][d]; K then V shards [2][c][d] */
    float *o;                           /* running O [c][d] */
    double *lse;                        /* running LSE [c] */
    int kv_owner;                       /* whose K/V shard kv_cur holds */
    double bytes_sent;
} rank_state;

static void layout_rows(int n, int p, int r, int zigzag, rank_state *s)
{
    const int c = n / p;
    if (!zigzag || p == 1) {
        s->nseg = 1, s->seg_start[0] = r * c, s->seg_len[0] = c;
    } else {
        s->nseg = 2;
        s->seg_start[0] = r * (c / 2), s->seg_start[1] = (2 * p - 1 - r) * (c / 2);
        s->seg_len[0] = s->seg_len[1] = c / 2;
    }
}

/* Rows of a [n][d] array at rank s's positions -> [c][d]. */
static void gather_rows(const float *x, float *dst, const rank_state *s, int d)
{
    for (int g = 0, i = 0; g < s->nseg; g++)
        for (int t = 0; t < s->seg_len[g]; t++, i++)
            memcpy(dst + (size_t)i * d, x + (size_t)(s->seg_start[g] + t) * d, (size_t)d * sizeof(float));
}

/* The merge, row by row: (o, lse) <- (o, lse) + (ob, lb). */
static void merge_row(float *o, double *lse, const float *ob, double lb, int d)
{
    if (lb == -INFINITY) return; /* this block hid every key from the row */
    if (*lse == -INFINITY) { memcpy(o, ob, (size_t)d * sizeof(float)); *lse = lb; return; }
    const double hi = *lse > lb ? *lse : lb, lo = *lse > lb ? lb : *lse;
    const double l = hi + log1p(exp(lo - hi));
    const double wa = exp(*lse - l), wb = exp(lb - l);
    for (int x = 0; x < d; x++) o[x] = (float)(wa * o[x] + wb * ob[x]);
    *lse = l;
}

/* One block: rows [qs, qs+len) against keys [ks, ks+len) (equal lengths). Returns pairs computed. */
static double block(int d, int causal, const float *q, const float *k, const float *v, int len, int qs, int ks,
                    float *o, double *lse, float *ob, float *lb)
{
    if (causal && ks > qs) return 0; /* every key after every row: hidden, skipped */
    fa_tensor tq, tk, tv, to, tl;
    const int64_t sh[4] = {1, len, 1, d}, ls[3] = {1, 1, len};
    fa_tensor_make(&tq, (void *)q, FA_F32, 4, sh, NULL);
    fa_tensor_make(&tk, (void *)k, FA_F32, 4, sh, NULL);
    fa_tensor_make(&tv, (void *)v, FA_F32, 4, sh, NULL);
    fa_tensor_make(&to, ob, FA_F32, 4, sh, NULL);
    fa_tensor_make(&tl, lb, FA_F32, 3, ls, NULL);
    fa_options opt = fa_options_default();
    opt.causal = causal && ks == qs; /* the diagonal block: the plain causal mask of a square block */
    if (fa_forward(&tq, &tk, &tv, &to, &tl, &opt) != FA_OK) { fprintf(stderr, "%s\n", fa_last_error()); exit(1); }
    for (int i = 0; i < len; i++) merge_row(o + (size_t)i * d, lse + i, ob + (size_t)i * d, lb[i], d);
    return opt.causal ? 0.5 * len * (len + 1.0) : (double)len * len;
}

typedef struct ring_result { double err, bytes_step, bytes_total, balance; } ring_result;

static ring_result ring(int n, int d, int p, int zigzag, int causal, const float *Q, const float *K, const float *V,
                        const double *O_ref)
{
    rank_state R[MAXP];
    const int c = n / p;
    const size_t kvf = 2 * (size_t)c * d;
    float *ob = tut_alloc((size_t)c * d * 4), *lb = tut_alloc((size_t)c * 4);
    for (int r = 0; r < p; r++) {
        rank_state *s = &R[r];
        memset(s, 0, sizeof *s);
        layout_rows(n, p, r, zigzag, s);
        s->q = tut_alloc((size_t)c * d * 4), s->o = tut_alloc((size_t)c * d * 4);
        s->kv_cur = tut_alloc(kvf * 4), s->kv_next = tut_alloc(kvf * 4), s->lse = tut_alloc((size_t)c * 8);
        gather_rows(Q, s->q, s, d);
        gather_rows(K, s->kv_cur, s, d);
        gather_rows(V, s->kv_cur + (size_t)c * d, s, d);
        for (int i = 0; i < c; i++) s->lse[i] = -INFINITY;
        s->kv_owner = r;
    }
    ring_result res = {0, 0, 0, 0};
    double useful = 0, critical = 0;
    for (int step = 0; step < p; step++) {
        if (step < p - 1) /* send: every rank's shard to rank r+1 (counted) */
            for (int r = 0; r < p; r++) {
                memcpy(R[(r + 1) % p].kv_next, R[r].kv_cur, kvf * 4);
                R[r].bytes_sent += (double)kvf * 4;
            }
        double busiest = 0;
        for (int r = 0; r < p; r++) { /* compute: my Q runs x the K/V runs I hold */
            rank_state *s = &R[r], owner;
            layout_rows(n, p, s->kv_owner, zigzag, &owner);
            double pairs = 0;
            for (int a = 0, qi = 0; a < s->nseg; qi += s->seg_len[a++])
                for (int b = 0, ki = 0; b < owner.nseg; ki += owner.seg_len[b++])
                    pairs += block(d, causal, s->q + (size_t)qi * d, s->kv_cur + (size_t)ki * d,
                                   s->kv_cur + (size_t)(c + ki) * d, s->seg_len[a], s->seg_start[a],
                                   owner.seg_start[b], s->o + (size_t)qi * d, s->lse + qi, ob, lb);
            useful += pairs;
            if (pairs > busiest) busiest = pairs;
        }
        critical += busiest; /* a step ends when its busiest rank does */
        if (step < p - 1)
            for (int r = 0; r < p; r++) { /* receive: swap the buffers */
                float *t = R[r].kv_cur;
                R[r].kv_cur = R[r].kv_next, R[r].kv_next = t;
                R[r].kv_owner = (R[r].kv_owner + p - 1) % p;
            }
    }
    for (int r = 0; r < p; r++) { /* compare each rank's rows with the reference at their global rows */
        rank_state *s = &R[r];
        for (int g = 0, i = 0; g < s->nseg; g++)
            for (int t = 0; t < s->seg_len[g]; t++, i++) {
                const double e = tut_max_err(s->o + (size_t)i * d, O_ref + (size_t)(s->seg_start[g] + t) * d, d);
                if (!(e <= res.err)) res.err = e;
            }
        if (s->bytes_sent > res.bytes_total) res.bytes_total = s->bytes_sent;
        free(s->q), free(s->o), free(s->kv_cur), free(s->kv_next), free(s->lse);
    }
    res.bytes_step = p > 1 ? res.bytes_total / (p - 1) : 0;
    res.balance = critical > 0 ? useful / (p * critical) : 1;
    free(ob), free(lb);
    return res;
}

int main(int argc, char **argv)
{
    tut_args a = {0};
    a.d = 64;
    a.reps = 3;
    a.n[0] = 256, a.n[1] = 512, a.n_count = 2;
    tut_parse_args(argc, argv, &a, "ring attention: the online-softmax merge over P ranks (simulated)");
    const int d = a.d;
    char path[512];
    snprintf(path, sizeof path, "%s/16_ring.dat", a.out);
    FILE *dat = fopen(path, "w");
    if (!dat) { fprintf(stderr, "cannot write %s\n", path); return 1; }
    fprintf(dat, "# n P layout causal bytes_per_step bytes_total_per_rank balance max_err\n");
    printf("ring attention, one head, d = %d, float32 (s = 4 bytes); each rank holds c = N/P rows\n\n", d);
    printf("%6s %3s %-10s %-6s %14s %12s %14s %9s %10s\n", "N", "P", "layout", "mask", "B/step/rank",
           "2 c d s", "B total/rank", "balance", "max err");
    for (int ni = 0; ni < a.n_count; ni++) {
        const int n = a.n[ni];
        float *Q = tut_alloc((size_t)n * d * 4), *K = tut_alloc((size_t)n * d * 4), *V = tut_alloc((size_t)n * d * 4);
        double *O_full = tut_alloc((size_t)n * d * 8), *O_causal = tut_alloc((size_t)n * d * 8);
        tut_fill(Q, (size_t)n * d, 1, -1, 1), tut_fill(K, (size_t)n * d, 2, -1, 1), tut_fill(V, (size_t)n * d, 3, -1, 1);
        tut_reference(n, d, Q, K, V, 0, O_full, NULL);
        tut_reference(n, d, Q, K, V, 1, O_causal, NULL);
        for (int p = 1; p <= MAXP; p *= 2) {
            if (n % (2 * p)) continue;
            for (int causal = 0; causal < 2; causal++)
                for (int zz = 0; zz < 2; zz++) {
                    ring_result r = ring(n, d, p, zz, causal, Q, K, V, causal ? O_causal : O_full);
                    const double formula = p > 1 ? 2.0 * (n / p) * d * 4 : 0;
                    printf("%6d %3d %-10s %-6s %14.0f %12.0f %14.0f %8.1f%% %10.2e\n", n, p,
                           zz ? "zigzag" : "contiguous", causal ? "causal" : "full", r.bytes_step, formula,
                           r.bytes_total, 100 * r.balance, r.err);
                    fprintf(dat, "%d %d %s %d %.0f %.0f %.4f %.3e\n", n, p, zz ? "zigzag" : "contiguous", causal,
                            r.bytes_step, r.bytes_total, r.balance, r.err);
                    tut_require(r.err, 1e-4, "ring attention vs the float64 reference");
                    if (r.bytes_step != formula) { fprintf(stderr, "FAILED: bytes counted != 2 c d s\n"); return 1; }
                }
        }
        free(Q), free(K), free(V), free(O_full), free(O_causal);
    }
    fclose(dat);

    /* Overlap: time one c x c block here to get F, then the smallest c that hides a step's transfer. */
    const int c = a.n[a.n_count - 1] / 2;
    float *q = tut_alloc((size_t)c * d * 4), *o = tut_alloc((size_t)c * d * 4), *l = tut_alloc((size_t)c * 4);
    float *ob = tut_alloc((size_t)c * d * 4);
    double *lse = tut_alloc((size_t)c * 8);
    tut_fill(q, (size_t)c * d, 4, -1, 1);
    double best = 1e30;
    for (int rep = 0; rep < a.reps; rep++) {
        for (int i = 0; i < c; i++) lse[i] = -INFINITY;
        const double t0 = tut_now();
        block(d, 0, q, q, q, c, 0, 0, o, lse, ob, l);
        const double t = tut_now() - t0;
        if (t < best) best = t;
    }
    const double F = 4.0 * c * c * d / best;
    printf("\noverlap: one step moves 2 c d s bytes and computes 4 c^2 d FLOPs (full mask), so it hides\n"
           "the transfer when c >= (s/2) F / W. Measured here: F = %.1f GFLOP/s for one %d x %d block\n"
           "(one rank; a shared machine, so a rough figure). Smallest c per link (causal zigzag: 2x):\n", F / 1e9, c, c);
    const struct { const char *name; double w; } links[] = {
        {"shared memory copy, ~10 GB/s (assumed)", 10e9}, {"InfiniBand HDR 200 Gb/s = 25 GB/s", 25e9},
        {"100 Gb/s Ethernet = 12.5 GB/s", 12.5e9}, {"10 Gb/s Ethernet = 1.25 GB/s", 1.25e9}};
    for (int i = 0; i < 4; i++)
        printf("  %-42s c >= %8.0f rows (causal zigzag: %8.0f)\n", links[i].name, 2.0 * F / links[i].w,
               4.0 * F / links[i].w);
    printf("\nwrote %s\n", path);
    free(q), free(o), free(l), free(ob), free(lse);
    return 0;
}
