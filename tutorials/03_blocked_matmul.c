/*
 * 03_blocked_matmul.c — tile the two matrix products, keep the softmax apart.
 *
 * Previous step: 02 re-read all of K for every query row and all of V for
 *   every output row: about 2d/16 L1 misses per (query, key) pair.
 * What changes: the two products are computed in tiles, the classic matmul
 *   fix. A Br x Bc tile of S needs Br rows of Q and Bc rows of K; while it is
 *   computed, both sit in L1, so each K row is loaded once per Br queries
 *   instead of once per query. O = P V is tiled the same way: Br rows of O
 *   stay in L1 while every block of Bc rows of V streams past. The softmax
 *   between them is step 02's, unchanged: S and P still go to memory.
 * What to look for:
 *   - L1miss/N^2 drops from ~8 (step 02) to well under 1: blocking works.
 *   - but it does not go to zero, and the workspace is still 2 N^2 floats:
 *     what is left is writing S, reading it back, writing P, reading it back,
 *     4/16 misses per pair at 16 floats per line. No blocking of the
 *     matmuls can remove that: the softmax needs a whole row of S before
 *     it can produce any of P. Steps 04-06 remove it.
 */
#include "common.h"

/*
 * Q, K, V: [n][d]; O: [n][d]; workspace S [n][n], P [n][n].
 * Tiles: Br query rows x Bc key rows.
 */
TUT_BODY void attention_blocked_body(cachesim *cs, const tut_problem *pb)
{
    const int n = pb->n, d = pb->d, br = pb->br, bc = pb->bc;
    const float *Q = pb->Q, *K = pb->K, *V = pb->V;
    float *O = pb->O;
    float *S = pb->ws;                       /* [n][n] */
    float *P = pb->ws + (size_t)n * n;       /* [n][n] */
    const float scale = 1.0f / sqrtf((float)d);

    /* 1. S = scale Q K^T, one Br x Bc tile at a time. */
    for (int i0 = 0; i0 < n; i0 += br)
        for (int j0 = 0; j0 < n; j0 += bc)
            for (int i = i0; i < i0 + br && i < n; i++)
                for (int j = j0; j < j0 + bc && j < n; j++) {
                    float acc = 0.0f;
                    for (int c = 0; c < d; c++)
                        acc += LD(cs, &Q[(size_t)i * d + c]) * LD(cs, &K[(size_t)j * d + c]);
                    if (pb->causal && j > i) acc = -INFINITY;
                    ST(cs, &S[(size_t)i * n + j], acc * scale);
                }

    /* 2. Row softmax, unfused: exactly step 02's three passes per row. */
    for (int i = 0; i < n; i++) {
        const float *s = &S[(size_t)i * n];     /* [n] */
        float *p = &P[(size_t)i * n];           /* [n] */
        float m = -INFINITY, l = 0.0f;
        for (int j = 0; j < n; j++) m = fmaxf(m, LD(cs, &s[j]));
        for (int j = 0; j < n; j++) l += expf(LD(cs, &s[j]) - m);
        for (int j = 0; j < n; j++) ST(cs, &p[j], expf(LD(cs, &s[j]) - m) / l);
    }

    /* 3. O = P V: for a block of Br output rows, stream all of V past in Bc-row blocks. */
    for (int i0 = 0; i0 < n; i0 += br) {
        for (int i = i0; i < i0 + br && i < n; i++)
            for (int c = 0; c < d; c++) ST(cs, &O[(size_t)i * d + c], 0.0f);
        for (int j0 = 0; j0 < n; j0 += bc)
            for (int i = i0; i < i0 + br && i < n; i++) {
                float *o = &O[(size_t)i * d];   /* [d] */
                for (int j = j0; j < j0 + bc && j < n; j++) {
                    float p = LD(cs, &P[(size_t)i * n + j]);
                    for (int c = 0; c < d; c++)
                        ST(cs, &o[c], LD(cs, &o[c]) + p * LD(cs, &V[(size_t)j * d + c]));
                }
            }
    }
}

TUT_NOINLINE void attention_blocked(const tut_problem *pb) { attention_blocked_body(NULL, pb); }
TUT_NOINLINE void attention_blocked_probed(cachesim *cs, const tut_problem *pb) { attention_blocked_body(cs, pb); }
static size_t blocked_ws(const tut_problem *pb) { return 2 * (size_t)pb->n * (size_t)pb->n; }

int main(int argc, char **argv)
{
    const tut_kernel k = {"attention_blocked", attention_blocked, attention_blocked_probed, blocked_ws, 0};
    tut_args a = {.n = {128, 256, 512}, .n_count = 3, .d = 64, .br = 32, .bc = 32, .reps = 3,
                  .vg_kernel = k.name};
    tut_parse_args(argc, argv, &a, "03_blocked_matmul: tiled QK^T and PV, softmax in between");
    if (a.br == 0) a.br = 32;
    if (a.bc == 0) a.bc = 32;
    if (tut_kernel_mode(&a, &k, a.br, a.bc)) return 0;

    tut_hw hw;
    tut_hw_init(&hw);
    tut_banner("Step 03: blocked matmuls, unfused softmax (S and P still materialized)", &a, &hw);
    printf("   One head, d = %d. Tiles of S: Br = %d query rows x Bc = %d key rows; while a tile is\n"
           "   computed, Q and K blocks take (Br + Bc) d floats = %s of L1.\n\n",
           a.d, a.br, a.bc, tut_bytes((a.br + a.bc) * (double)a.d * 4));
    cachesim *cs = a.no_sim ? NULL : cachesim_create(&a.geo);
    FILE *dat = tut_dat_open(&a, "03", TUT_DAT_COLUMNS);
    tut_table_head();
    double last = 0;
    for (int t = 0; t < a.n_count; t++) {
        tut_result r = tut_measure(&a, &k, a.n[t], a.br, a.bc, cs, &hw, 1e-4);
        tut_table_row(dat, &r);
        last = (double)r.l1_miss / ((double)r.n * r.n);
    }
    fclose(dat);
    cachesim_free(cs);
    tut_io_summary(&a);
    printf("\n   Predicted L1 misses per pair: K and V once per Br rows, 2d/(16 Br) = %.2f, plus S and P\n"
           "   written and read, 4/16 = 0.25: total %.2f.",
           2.0 * a.d / (16.0 * a.br), 2.0 * a.d / (16.0 * a.br) + 0.25);
    if (!a.no_sim) printf(" Measured at the largest N: %.2f.", last);
    printf("\n   The S/P term is N^2 whatever the tiles: it is the price of materializing them.\n"
           "   Try: --br 8 (less reuse of K), --br 128 --bc 128 (tiles no longer fit L1),\n"
           "   --geometry teaching. Next: 04 never stores S: it computes one row at a time.\n");
    return 0;
}
