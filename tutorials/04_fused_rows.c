/*
 * 04_fused_rows.c — fuse the three phases, one query row at a time.
 *
 * Previous step: 03 tiled the matmuls, but S and P (2 N^2 floats) still went
 *   to memory and back: an N^2 term no tiling could remove.
 * What changes: for each query row i we compute its whole score row s (N
 *   floats), take its softmax in place, and immediately form o_i = p V. The
 *   N x N matrices are gone: the workspace is one row, N floats.
 * What to look for:
 *   - workspace: N floats instead of 2 N^2 (4 KiB instead of 32 MiB at N = 1024);
 *   - but L1miss/N^2 is back to ~2d/16, step 02's level: each query row again
 *     streams all of K and all of V through L1, with nothing reused between
 *     rows. We traded the S/P traffic for the K/V traffic 03 had blocked.
 *   - the row still needs two passes over keys (scores, then p V) and a
 *     buffer of N floats. Step 05 removes both with the online softmax.
 */
#include "common.h"

/* Q, K, V: [n][d]; O: [n][d]; workspace: s [n], one row of scores. */
TUT_BODY void attention_rows_body(cachesim *cs, const tut_problem *pb)
{
    const int n = pb->n, d = pb->d;
    const float *Q = pb->Q, *K = pb->K, *V = pb->V;
    float *O = pb->O;
    float *s = pb->ws;                        /* [n] scores, then probabilities, of row i */
    const float scale = 1.0f / sqrtf((float)d);

    for (int i = 0; i < n; i++) {
        const float *q = &Q[(size_t)i * d];   /* [d] */
        float *o = &O[(size_t)i * d];         /* [d] */
        /* Scores of row i, and their max on the fly. */
        float m = -INFINITY;
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int c = 0; c < d; c++) acc += LD(cs, &q[c]) * LD(cs, &K[(size_t)j * d + c]);
            acc = (pb->causal && j > i) ? -INFINITY : acc * scale;
            ST(cs, &s[j], acc);
            m = fmaxf(m, acc);
        }
        /* Unnormalized probabilities and their sum. */
        float l = 0.0f;
        for (int j = 0; j < n; j++) {
            float p = expf(LD(cs, &s[j]) - m);
            ST(cs, &s[j], p);
            l += p;
        }
        /* o_i = (sum_j p_j v_j) / l: normalize once, at the end. */
        for (int c = 0; c < d; c++) ST(cs, &o[c], 0.0f);
        for (int j = 0; j < n; j++) {
            float p = LD(cs, &s[j]);
            for (int c = 0; c < d; c++) ST(cs, &o[c], LD(cs, &o[c]) + p * LD(cs, &V[(size_t)j * d + c]));
        }
        for (int c = 0; c < d; c++) ST(cs, &o[c], LD(cs, &o[c]) / l);
    }
}

TUT_NOINLINE void attention_rows(const tut_problem *pb) { attention_rows_body(NULL, pb); }
TUT_NOINLINE void attention_rows_probed(cachesim *cs, const tut_problem *pb) { attention_rows_body(cs, pb); }
static size_t rows_ws(const tut_problem *pb) { return (size_t)pb->n; }

int main(int argc, char **argv)
{
    const tut_kernel k = {"attention_rows", attention_rows, attention_rows_probed, rows_ws, 0};
    tut_args a = {.n = {128, 256, 512}, .n_count = 3, .d = 64, .reps = 3, .vg_kernel = k.name};
    tut_parse_args(argc, argv, &a, "04_fused_rows: one query row at a time, S never stored");
    if (tut_kernel_mode(&a, &k, 0, 0)) return 0;

    tut_hw hw;
    tut_hw_init(&hw);
    tut_banner("Step 04: fused row by row (a score row of N floats, no S or P)", &a, &hw);
    cachesim *cs = a.no_sim ? NULL : cachesim_create(&a.geo);
    FILE *dat = tut_dat_open(&a, "04", TUT_DAT_COLUMNS);
    tut_table_head();
    for (int t = 0; t < a.n_count; t++) {
        tut_result r = tut_measure(&a, &k, a.n[t], 0, 0, cs, &hw, 1e-4);
        tut_table_row(dat, &r);
    }
    fclose(dat);
    cachesim_free(cs);
    tut_io_summary(&a);
    printf("\n   Workspace is now linear in N. Misses per pair are ~2d/16 = %.1f again: K and V\n"
           "   stream through L1 once per query row, as in step 02, because consecutive rows\n"
           "   share nothing that stays in cache once K (N d floats) outgrows L1.\n"
           "   Try: --n 64 (K and V fit in L1: misses collapse), --d 16.\n"
           "   Next: 05 does each row in ONE pass over the keys, with no score buffer at all.\n",
           2.0 * a.d / 16);
    return 0;
}
