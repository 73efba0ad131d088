/*
 * 05_online_row.c — one pass over the keys per row: the online softmax at work.
 *
 * Previous step: 04 needed a row of N scores and two passes over the keys
 *   (scores, then p V), because the softmax needs the row's max and sum first.
 * What changes: step 01's online recurrence, applied to the output too. For
 *   query i, walk the keys once, keeping a running max m, a running sum l and
 *   an unnormalized output accumulator acc [d]:
 *       s    = scale q_i . k_j
 *       m'   = max(m, s)
 *       l    = l e^{m - m'} + e^{s - m'}
 *       acc  = acc e^{m - m'} + e^{s - m'} v_j
 *       m    = m'
 *   and at the end o_i = acc / l. The rescale e^{m - m'} fixes up everything
 *   accumulated under the old max, exactly as it did for l alone in step 01.
 * What to look for:
 *   - workspace: d floats (the accumulator), independent of N;
 *   - the same ~2d/16 misses per pair as step 04: one pass is not enough,
 *     each row still streams all of K and V. What the online softmax buys is
 *     the freedom to cut the keys into blocks and process them in any order:
 *     step 06 uses it to keep a block of K and V in cache for many rows.
 */
#include "common.h"

/* Q, K, V: [n][d]; O: [n][d]; workspace: acc [d]. */
TUT_BODY void attention_online_body(cachesim *cs, const tut_problem *pb)
{
    const int n = pb->n, d = pb->d;
    const float *Q = pb->Q, *K = pb->K, *V = pb->V;
    float *O = pb->O;
    float *acc = pb->ws;                      /* [d] unnormalized o_i */
    const float scale = 1.0f / sqrtf((float)d);

    for (int i = 0; i < n; i++) {
        const float *q = &Q[(size_t)i * d];   /* [d] */
        float m = -INFINITY, l = 0.0f;
        for (int c = 0; c < d; c++) ST(cs, &acc[c], 0.0f);
        int kend = pb->causal ? i + 1 : n;    /* causal: keys after i are invisible */
        for (int j = 0; j < kend; j++) {
            float s = 0.0f;
            for (int c = 0; c < d; c++) s += LD(cs, &q[c]) * LD(cs, &K[(size_t)j * d + c]);
            s *= scale;
            float m_new = fmaxf(m, s);
            float alpha = expf(m - m_new);    /* rescale of the old terms; e^{-inf} = 0 at j = 0 */
            float p = expf(s - m_new);
            l = l * alpha + p;
            for (int c = 0; c < d; c++)
                ST(cs, &acc[c], LD(cs, &acc[c]) * alpha + p * LD(cs, &V[(size_t)j * d + c]));
            m = m_new;
        }
        for (int c = 0; c < d; c++) ST(cs, &O[(size_t)i * d + c], LD(cs, &acc[c]) / l);
    }
}

TUT_NOINLINE void attention_online(const tut_problem *pb) { attention_online_body(NULL, pb); }
TUT_NOINLINE void attention_online_probed(cachesim *cs, const tut_problem *pb) { attention_online_body(cs, pb); }
static size_t online_ws(const tut_problem *pb) { return (size_t)pb->d; }

int main(int argc, char **argv)
{
    const tut_kernel k = {"attention_online", attention_online, attention_online_probed, online_ws, 0};
    tut_args a = {.n = {128, 256, 512}, .n_count = 3, .d = 64, .reps = 3, .vg_kernel = k.name};
    tut_parse_args(argc, argv, &a, "05_online_row: one pass per query row with the online softmax");
    if (tut_kernel_mode(&a, &k, 0, 0)) return 0;

    tut_hw hw;
    tut_hw_init(&hw);
    tut_banner("Step 05: one-pass online softmax per row (workspace: d floats)", &a, &hw);
    cachesim *cs = a.no_sim ? NULL : cachesim_create(&a.geo);
    FILE *dat = tut_dat_open(&a, "05", TUT_DAT_COLUMNS);
    tut_table_head();
    tut_result last = {0}, big = {0};
    for (int t = 0; t < a.n_count; t++) {
        tut_result r = tut_measure(&a, &k, a.n[t], 0, 0, cs, &hw, 1e-4);
        tut_table_row(dat, &r);
        last = r;
    }
    if (tut_big_n(&a) > 0) big = tut_measure_big(&a, &k, "05", tut_big_n(&a), 0, 0, 1e-4);
    fclose(dat);
    cachesim_free(cs);
    tut_io_summary(&a);
    tut_l2_story(&a, &last, &big, 2.0, "row by row, every row re-reads all of K and V");
    printf("\n   Same answer (the error column), one pass, O(d) memory. Misses per pair still\n"
           "   ~2d/16 = %.1f: the keys are visited in the same order for every row, and no\n"
           "   block of them survives in L1 from one row to the next.\n"
           "   Try: --causal (the loop simply stops at the diagonal).\n"
           "   Next: 06 swaps the loops: a block of keys stays in cache while MANY rows use it.\n",
           2.0 * a.d / 16);
    return 0;
}
