/*
 * 07_flash2.c — FlashAttention-2's loop order: Q outer, normalize once, LSE.
 *
 * Previous step: 06 walked K/V blocks in the outer loop, so every query block's
 *   O, m and l went back to slow memory after each key block, and O was
 *   divided by l after every block too.
 * What changes (Dao 2023, FlashAttention-2, Algorithm 1):
 *     for each query block i (Q_i: Br x d)             outer: parallel-friendly
 *       acc = 0 [Br][d], m = -inf [Br], l = 0 [Br]     all in fast memory
 *       for each key block j (K_j, V_j: Bc x d)
 *         S     = scale Q_i K_j^T                      Br x Bc tile
 *         m_new = max(m, rowmax S);  P = e^{S - m_new}
 *         l     = e^{m - m_new} l + rowsum P
 *         acc   = e^{m - m_new} acc + P V_j            (no division here)
 *       O_i   = acc / l                                once, at the end
 *       LSE_i = m + ln l                               what the backward pass needs
 *   O, m and l never leave fast memory until the row block is done; each query
 *   block is independent of the others (step 11 gives them to threads).
 * What to look for:
 *   - L1miss/N^2 ~ 2d/(16 Br): now K and V are what streams, once per query
 *     block; Q_i and O_i are touched once. Still Theta(N^2 d^2 / M).
 *   - the LSE column: the log-sum-exp of every row, checked against the
 *     reference too. It is the (m, l) pair of step 01 folded into one number.
 *   - blocks come from tut_fit_blocks: Q_i, O_i, the tile and TWO K/V blocks
 *     fit in L1 (LRU keeps the old block while the next one arrives).
 */
#include "common.h"

/*
 * Q, K, V: [n][d]; O: [n][d]; lse: [n].
 * Workspace: S [br][bc], acc [br][d], m [br], l [br]: all "on chip".
 */
TUT_BODY void flash2_body(cachesim *cs, const tut_problem *pb)
{
    const int n = pb->n, d = pb->d, br = pb->br, bc = pb->bc;
    const float *Q = pb->Q, *K = pb->K, *V = pb->V;
    float *O = pb->O, *lse = pb->lse;
    float *S = pb->ws;                          /* [br][bc] scores, then P */
    float *acc = S + (size_t)br * bc;           /* [br][d] unnormalized O_i */
    float *m = acc + (size_t)br * d;            /* [br] running max */
    float *l = m + br;                          /* [br] running sum */
    const float scale = 1.0f / sqrtf((float)d);

    for (int i0 = 0; i0 < n; i0 += br) {                         /* outer: query blocks */
        int in = i0 + br < n ? br : n - i0;
        for (int ii = 0; ii < in; ii++) {
            ST(cs, &m[ii], -INFINITY);
            ST(cs, &l[ii], 0.0f);
            for (int c = 0; c < d; c++) ST(cs, &acc[(size_t)ii * d + c], 0.0f);
        }
        for (int j0 = 0; j0 < n; j0 += bc) {                     /* inner: key/value blocks */
            int jn = j0 + bc < n ? bc : n - j0;
            for (int ii = 0; ii < in; ii++) {
                int i = i0 + ii;
                float *s = &S[(size_t)ii * bc];                  /* [bc] this row of the tile */
                float mt = LD(cs, &m[ii]);
                for (int jj = 0; jj < jn; jj++) {
                    int j = j0 + jj;
                    float x = 0.0f;
                    for (int c = 0; c < d; c++) x += LD(cs, &Q[(size_t)i * d + c]) * LD(cs, &K[(size_t)j * d + c]);
                    x = (pb->causal && j > i) ? -INFINITY : x * scale;
                    ST(cs, &s[jj], x);
                    mt = fmaxf(mt, x);
                }
                if (mt == -INFINITY) continue;                   /* nothing visible yet */
                float alpha = expf(LD(cs, &m[ii]) - mt);         /* rescale of the old state */
                float rowsum = 0.0f;
                for (int jj = 0; jj < jn; jj++) {
                    float p = expf(LD(cs, &s[jj]) - mt);
                    ST(cs, &s[jj], p);
                    rowsum += p;
                }
                ST(cs, &l[ii], LD(cs, &l[ii]) * alpha + rowsum);
                ST(cs, &m[ii], mt);
                float *a_row = &acc[(size_t)ii * d];             /* [d] */
                for (int c = 0; c < d; c++) ST(cs, &a_row[c], LD(cs, &a_row[c]) * alpha);
                for (int jj = 0; jj < jn; jj++) {
                    float p = LD(cs, &s[jj]);
                    for (int c = 0; c < d; c++)
                        ST(cs, &a_row[c], LD(cs, &a_row[c]) + p * LD(cs, &V[(size_t)(j0 + jj) * d + c]));
                }
            }
        }
        for (int ii = 0; ii < in; ii++) {                        /* normalize once, write O and LSE */
            float li = LD(cs, &l[ii]);
            for (int c = 0; c < d; c++)
                ST(cs, &O[(size_t)(i0 + ii) * d + c], LD(cs, &acc[(size_t)ii * d + c]) / li);
            ST(cs, &lse[i0 + ii], LD(cs, &m[ii]) + logf(li));
        }
    }
}

TUT_NOINLINE void flash2(const tut_problem *pb) { flash2_body(NULL, pb); }
TUT_NOINLINE void flash2_probed(cachesim *cs, const tut_problem *pb) { flash2_body(cs, pb); }
static size_t flash2_ws(const tut_problem *pb)
{
    return (size_t)pb->br * pb->bc + (size_t)pb->br * pb->d + 2 * (size_t)pb->br;
}

int main(int argc, char **argv)
{
    const tut_kernel k = {"flash2", flash2, flash2_probed, flash2_ws, 1};
    tut_args a = {.n = {128, 256, 512}, .n_count = 3, .d = 64, .reps = 3, .vg_kernel = k.name};
    tut_parse_args(argc, argv, &a, "07_flash2: FlashAttention-2 order, Q outer, LSE");
    tut_fit_blocks(&a, &a.br, &a.bc);
    if (tut_kernel_mode(&a, &k, a.br, a.bc)) return 0;

    tut_hw hw;
    tut_hw_init(&hw);
    tut_banner("Step 07: FlashAttention-2 order (Q outer, normalize once, LSE)", &a, &hw);
    printf("   Br = %d, Bc = %d: working set (2 Br + 4 Bc) d + Br Bc = %s of a %s L1.\n"
           "   Error column: O against the reference; LSE is checked too (same tolerance 1e-4).\n\n",
           a.br, a.bc, tut_bytes(4.0 * ((2.0 * a.br + 4.0 * a.bc) * a.d + (double)a.br * a.bc)),
           tut_bytes((double)a.geo.l1.size_bytes));
    cachesim *cs = a.no_sim ? NULL : cachesim_create(&a.geo);
    FILE *dat = tut_dat_open(&a, "07", TUT_DAT_COLUMNS);
    tut_table_head();
    double lse_err = 0;
    tut_result last = {0}, big = {0};
    for (int t = 0; t < a.n_count; t++) {
        tut_result r = tut_measure(&a, &k, a.n[t], a.br, a.bc, cs, &hw, 1e-4);
        tut_table_row(dat, &r);
        last = r;
        lse_err = fmax(lse_err, r.lse_err);
    }
    if (tut_big_n(&a) > 0) big = tut_measure_big(&a, &k, "07", tut_big_n(&a), a.br, a.bc, 1e-4);
    fclose(dat);
    cachesim_free(cs);
    tut_io_summary(&a);
    tut_l2_story(&a, &last, &big, 2.0 / a.br, "Q outer, K and V re-read once per query block");
    printf("\n   max |LSE - LSE_ref| = %.1e. Predicted L1 misses per pair: K_j and V_j once per query\n"
           "   block, 2d/(16 Br) = %.2f. Compare steps 02 (~8), 05 (~8), 06 (~0.26 with the paper's\n"
           "   overflowing blocks). Try: --br 32 --bc 32 (two K/V blocks no longer fit: misses\n"
           "   double), --br 8, --geometry teaching, --causal.\n"
           "   Next: 08 skips the tiles a causal mask hides entirely.\n",
           lse_err, 2.0 * a.d / (16.0 * a.br));
    return 0;
}
