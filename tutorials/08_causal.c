/*
 * 08_causal.c — causal attention: skip the tiles the mask hides entirely.
 *
 * Previous step: 07, FlashAttention-2's loop order, handled --causal by
 *   computing every Br x Bc tile and then setting masked scores to -inf.
 * What changes: with a causal mask, query i sees keys j <= i. In tile terms:
 *   - a tile strictly above the diagonal (first key > last query) is ALL
 *     masked: skip it, no loads, no FLOPs;
 *   - a tile strictly below it is all visible: no mask test at all;
 *   - only the ~N/Bc tiles on the diagonal need the per-element test.
 *   So the inner loop simply stops at the diagonal block. Half the tiles, half
 *   the work, half the K/V traffic.
 * What to look for:
 *   - "tiles" column: ~half with skipping;
 *   - time roughly halves, and GFLOP/s, computed on the causal FLOP count
 *     (half of 4 N^2 d), stays about the same: the skipped work was wasted work;
 *   - L1 misses [sim] roughly halve too: K/V blocks above the diagonal are never read.
 */
#include "common.h"

static long tiles_done;   /* tiles computed by the last run (counted outside the probes) */

/*
 * Q, K, V: [n][d]; O: [n][d]; lse: [n]; causal.
 * Workspace: S [br][bc], acc [br][d], m [br], l [br]. skip = 1 stops at the diagonal.
 */
TUT_BODY void flash2_causal_body(cachesim *cs, const tut_problem *pb, int skip)
{
    const int n = pb->n, d = pb->d, br = pb->br, bc = pb->bc;
    const float *Q = pb->Q, *K = pb->K, *V = pb->V;
    float *O = pb->O, *lse = pb->lse;
    float *S = pb->ws;                          /* [br][bc] */
    float *acc = S + (size_t)br * bc;           /* [br][d] */
    float *m = acc + (size_t)br * d;            /* [br] */
    float *l = m + br;                          /* [br] */
    const float scale = 1.0f / sqrtf((float)d);
    long tiles = 0;

    for (int i0 = 0; i0 < n; i0 += br) {
        int in = i0 + br < n ? br : n - i0;
        for (int ii = 0; ii < in; ii++) {
            ST(cs, &m[ii], -INFINITY);
            ST(cs, &l[ii], 0.0f);
            for (int c = 0; c < d; c++) ST(cs, &acc[(size_t)ii * d + c], 0.0f);
        }
        /* With skipping, the last key block is the one holding key i0 + in - 1 (the diagonal). */
        int j_end = skip ? i0 + in : n;
        for (int j0 = 0; j0 < j_end; j0 += bc) {
            int jn = j0 + bc < n ? bc : n - j0;
            int diagonal = j0 + jn - 1 > i0;            /* some (i, j) here has j > i */
            tiles++;
            for (int ii = 0; ii < in; ii++) {
                int i = i0 + ii;
                float *s = &S[(size_t)ii * bc];         /* [bc] */
                float mt = LD(cs, &m[ii]);
                for (int jj = 0; jj < jn; jj++) {
                    int j = j0 + jj;
                    float x = 0.0f;
                    for (int c = 0; c < d; c++) x += LD(cs, &Q[(size_t)i * d + c]) * LD(cs, &K[(size_t)j * d + c]);
                    x = (diagonal && j > i) ? -INFINITY : x * scale;
                    ST(cs, &s[jj], x);
                    mt = fmaxf(mt, x);
                }
                if (mt == -INFINITY) continue;
                float alpha = expf(LD(cs, &m[ii]) - mt);
                float rowsum = 0.0f;
                for (int jj = 0; jj < jn; jj++) {
                    float p = expf(LD(cs, &s[jj]) - mt);
                    ST(cs, &s[jj], p);
                    rowsum += p;
                }
                ST(cs, &l[ii], LD(cs, &l[ii]) * alpha + rowsum);
                ST(cs, &m[ii], mt);
                float *a_row = &acc[(size_t)ii * d];    /* [d] */
                for (int c = 0; c < d; c++) ST(cs, &a_row[c], LD(cs, &a_row[c]) * alpha);
                for (int jj = 0; jj < jn; jj++) {
                    float p = LD(cs, &s[jj]);
                    for (int c = 0; c < d; c++)
                        ST(cs, &a_row[c], LD(cs, &a_row[c]) + p * LD(cs, &V[(size_t)(j0 + jj) * d + c]));
                }
            }
        }
        for (int ii = 0; ii < in; ii++) {
            float li = LD(cs, &l[ii]);
            for (int c = 0; c < d; c++)
                ST(cs, &O[(size_t)(i0 + ii) * d + c], LD(cs, &acc[(size_t)ii * d + c]) / li);
            ST(cs, &lse[i0 + ii], LD(cs, &m[ii]) + logf(li));
        }
    }
    tiles_done = tiles;
}

TUT_NOINLINE void flash2_causal_mask(const tut_problem *pb) { flash2_causal_body(NULL, pb, 0); }
TUT_NOINLINE void flash2_causal_mask_probed(cachesim *cs, const tut_problem *pb) { flash2_causal_body(cs, pb, 0); }
TUT_NOINLINE void flash2_causal_skip(const tut_problem *pb) { flash2_causal_body(NULL, pb, 1); }
TUT_NOINLINE void flash2_causal_skip_probed(cachesim *cs, const tut_problem *pb) { flash2_causal_body(cs, pb, 1); }
static size_t causal_ws(const tut_problem *pb)
{
    return (size_t)pb->br * pb->bc + (size_t)pb->br * pb->d + 2 * (size_t)pb->br;
}

int main(int argc, char **argv)
{
    const tut_kernel ks[2] = {
        {"flash2_causal_mask", flash2_causal_mask, flash2_causal_mask_probed, causal_ws, 1},
        {"flash2_causal_skip", flash2_causal_skip, flash2_causal_skip_probed, causal_ws, 1},
    };
    tut_args a = {.n = {128, 256, 512}, .n_count = 3, .d = 64, .reps = 3, .causal = 1,
                  .vg_kernel = ks[1].name};
    tut_parse_args(argc, argv, &a, "08_causal: causal FlashAttention-2 with masked tiles skipped");
    a.causal = 1;
    tut_fit_blocks(&a, &a.br, &a.bc);
    if (tut_kernel_mode(&a, &ks[1], a.br, a.bc)) return 0;

    tut_hw hw;
    tut_hw_init(&hw);
    tut_banner("Step 08: causal attention, fully masked tiles skipped", &a, &hw);
    printf("   Br = Bc = %d. GFLOP/s counts the causal work only: 2 N^2 d (half of 4 N^2 d).\n\n", a.br);
    cachesim *cs = a.no_sim ? NULL : cachesim_create(&a.geo);
    FILE *dat = tut_dat_open(&a, "08", "variant tiles " TUT_DAT_COLUMNS);
    double t_mask = 0, t_skip = 0;
    for (int v = 0; v < 2; v++) {
        printf("   %s: %s\n", ks[v].name, v ? "stop at the diagonal block" : "every tile, masked elementwise");
        tut_table_head();
        for (int t = 0; t < a.n_count; t++) {
            tut_result r = tut_measure(&a, &ks[v], a.n[t], a.br, a.bc, cs, &hw, 1e-4);
            long nb = (a.n[t] + a.bc - 1) / a.bc, mb = (a.n[t] + a.br - 1) / a.br;
            fprintf(dat, "%d %ld ", v, tiles_done);
            tut_table_row(dat, &r);
            printf("   %6s tiles computed: %ld of %ld\n", "", tiles_done, nb * mb);
            if (t == a.n_count - 1) *(v ? &t_skip : &t_mask) = r.sec;
        }
        printf("\n");
    }
    fclose(dat);
    cachesim_free(cs);
    tut_io_summary(&a);
    printf("   At N = %d skipping took %.2fx the time of masking everything (ideal: ~0.5x, plus the\n"
           "   diagonal tiles). Try: --n 1024 --no-sim, --br 8 (finer tiles waste less on the diagonal).\n"
           "   Next: 09 makes the inner loops SIMD-friendly.\n",
           a.n[a.n_count - 1], t_skip / t_mask);
    return 0;
}
