/*
 * 02_naive_attention.c — attention as the textbook writes it: S, then P, then O.
 *
 * Previous step: 01 computed one softmax over one vector, three ways.
 * What changes: attention is O = softmax(scale * Q K^T) V, row-wise softmax.
 *   We do it literally, materializing two N x N matrices:
 *       S = scale * Q K^T      [N][N]  (written once, read by the softmax)
 *       P = softmax_rows(S)    [N][N]  (written once, read by P V)
 *       O = P V                [N][d]
 *   Each phase is a simple loop nest with no blocking at all.
 * What to look for:
 *   - the workspace column: 2 N^2 floats, 32 MiB at N = 2048 and 8 GiB at
 *     N = 32768. That is the memory wall FlashAttention removes.
 *   - L1 misses [sim] divided by N^2 (the L1miss/N^2 column) settles to a
 *     constant: misses grow as N^2. Here the constant is about 2d/16 + 4/16 per
 *     pair: each row of S re-reads all of K, each row of O all of V (d/16 lines
 *     per key, since a 64-byte line holds 16 floats), plus S and P themselves.
 *   - GFLOP/s is far below the machine's peak: the loops are memory-bound.
 */
#include "common.h"

/*
 * The whole algorithm, one head.
 * Q, K, V: [n][d]; O: [n][d]; workspace: S [n][n], then P [n][n].
 */
TUT_BODY void attention_naive_body(cachesim *cs, const tut_problem *pb)
{
    const int n = pb->n, d = pb->d;
    const float *Q = pb->Q, *K = pb->K, *V = pb->V;
    float *O = pb->O;
    float *S = pb->ws;                       /* [n][n] scores */
    float *P = pb->ws + (size_t)n * n;       /* [n][n] probabilities */
    const float scale = 1.0f / sqrtf((float)d);

    /* 1. S = scale Q K^T: one dot product per (query, key) pair. */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int c = 0; c < d; c++) acc += LD(cs, &Q[(size_t)i * d + c]) * LD(cs, &K[(size_t)j * d + c]);
            if (pb->causal && j > i) acc = -INFINITY;   /* masked: e^{-inf} = 0 below */
            ST(cs, &S[(size_t)i * n + j], acc * scale);
        }

    /* 2. P = softmax of each row of S, the safe way (step 01): max, sum, divide. */
    for (int i = 0; i < n; i++) {
        const float *s = &S[(size_t)i * n];     /* [n] */
        float *p = &P[(size_t)i * n];           /* [n] */
        float m = -INFINITY, l = 0.0f;
        for (int j = 0; j < n; j++) m = fmaxf(m, LD(cs, &s[j]));
        for (int j = 0; j < n; j++) l += expf(LD(cs, &s[j]) - m);
        for (int j = 0; j < n; j++) ST(cs, &p[j], expf(LD(cs, &s[j]) - m) / l);
    }

    /* 3. O = P V: row i of O is the P-weighted sum of the rows of V. */
    for (int i = 0; i < n; i++) {
        float *o = &O[(size_t)i * d];           /* [d] */
        for (int c = 0; c < d; c++) ST(cs, &o[c], 0.0f);
        for (int j = 0; j < n; j++) {
            float p = LD(cs, &P[(size_t)i * n + j]);
            for (int c = 0; c < d; c++) ST(cs, &o[c], LD(cs, &o[c]) + p * LD(cs, &V[(size_t)j * d + c]));
        }
    }
}

TUT_NOINLINE void attention_naive(const tut_problem *pb) { attention_naive_body(NULL, pb); }
TUT_NOINLINE void attention_naive_probed(cachesim *cs, const tut_problem *pb) { attention_naive_body(cs, pb); }
static size_t naive_ws(const tut_problem *pb) { return 2 * (size_t)pb->n * (size_t)pb->n; }

int main(int argc, char **argv)
{
    const tut_kernel k = {"attention_naive", attention_naive, attention_naive_probed, naive_ws, 0};
    tut_args a = {.n = {128, 256, 512}, .n_count = 3, .d = 64, .reps = 3, .vg_kernel = k.name};
    tut_parse_args(argc, argv, &a, "02_naive_attention: materialize S and P");
    if (tut_kernel_mode(&a, &k, 0, 0)) return 0;

    tut_hw hw;
    tut_hw_init(&hw);
    tut_banner("Step 02: naive attention (S and P materialized)", &a, &hw);
    printf("   One head, d = %d%s. FLOPs = 4 N^2 d. Error: max |O - O_ref| against the library's\n"
           "   float64 reference (fa_forward, FA_IMPL_REFERENCE); tolerance 1e-4.\n\n",
           a.d, a.causal ? ", causal" : "");
    cachesim *cs = a.no_sim ? NULL : cachesim_create(&a.geo);
    FILE *dat = tut_dat_open(&a, "02", TUT_DAT_COLUMNS);
    tut_table_head();
    double first = 0, last = 0;
    for (int t = 0; t < a.n_count; t++) {
        tut_result r = tut_measure(&a, &k, a.n[t], 0, 0, cs, &hw, 1e-4);
        tut_table_row(dat, &r);
        double per = (double)r.l1_miss / ((double)r.n * r.n);
        if (t == 0) first = per;
        last = per;
    }
    fclose(dat);
    cachesim_free(cs);
    tut_io_summary(&a);
    printf("\n   Predicted L1 misses per (query, key) pair once K and V no longer fit in L1:\n"
           "   2d/16 + 4/16 = %.2f (K and V re-read for every row; S written, read; P written, read).\n",
           2.0 * a.d / 16 + 4.0 / 16);
    if (!a.no_sim)
        printf("   Measured L1miss/N^2 went from %.2f to %.2f: once the first rows evict K,\n"
               "   misses grow as N^2, and they would at any N.\n", first, last);
    printf("   Try: --n 2048 --no-sim (32 MiB of S and P), --d 128, --geometry teaching,\n"
           "   and `make cachegrind STEP=02` to see valgrind count the same misses.\n"
           "   Next: 03 blocks the two matmuls; does that fix the N^2 term?\n");
    return 0;
}
