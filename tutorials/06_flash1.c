/*
 * 06_flash1.c — tiled FlashAttention, the paper's loop order (Algorithm 1).
 *
 * Previous step: 05 made each row one pass over the keys with O(d) memory,
 *   but every row still streamed all of K and V through the cache.
 * What changes: the keys are cut into blocks of Bc rows, the queries into
 *   blocks of Br rows, and the loops are swapped so that the OUTER loop walks
 *   the key/value blocks (Dao et al. 2022, Algorithm 1):
 *
 *     for each key block j (K_j, V_j: Bc x d, loaded once, kept in fast memory)
 *       for each query block i (Q_i, O_i: Br x d; m_i, l_i: Br)
 *         S_ij  = scale Q_i K_j^T                      Br x Bc tile, fast memory
 *         m~    = rowmax(S_ij); P~ = e^{S_ij - m~}; l~ = rowsum(P~)
 *         m_new = max(m_i, m~);  l_new = e^{m_i - m_new} l_i + e^{m~ - m_new} l~
 *         O_i   = (l_i e^{m_i - m_new} O_i + e^{m~ - m_new} P~ V_j) / l_new
 *         m_i, l_i = m_new, l_new                     (written back to slow memory)
 *
 *   The online softmax (steps 01, 05) is what makes this legal: partial
 *   results over key blocks merge exactly. Blocks: Bc = ceil(M / 4d) and
 *   Br = min(Bc, d), M = the fast memory in floats (here: the simulated L1).
 * What to look for:
 *   - L1miss/N^2 falls far below step 05's ~2d/16: a K/V block is loaded once
 *     and used by all N queries. What still streams is Q and O (read, and O
 *     written back) once per key block: N/Bc times, ~3 N^2 d / Bc floats,
 *     i.e. Theta(N^2 d^2 / M) — the paper's bound (step 12 measures it).
 *   - the paper's blocks overflow a real L1 (the banner prints by how much);
 *     compare --br 24 --bc 24.
 *   - workspace: one Br x Bc tile plus m and l, O(N) not O(N^2).
 */
#include "common.h"

/*
 * Q, K, V: [n][d]; O: [n][d] (read and rewritten for every key block).
 * Workspace: S tile [br][bc], then m [n], l [n] (the paper keeps them in HBM).
 */
TUT_BODY void flash1_body(cachesim *cs, const tut_problem *pb)
{
    const int n = pb->n, d = pb->d, br = pb->br, bc = pb->bc;
    const float *Q = pb->Q, *K = pb->K, *V = pb->V;
    float *O = pb->O;
    float *S = pb->ws;                          /* [br][bc] score tile, then P~ */
    float *m = S + (size_t)br * bc;             /* [n] running row max */
    float *l = m + n;                           /* [n] running row sum */
    const float scale = 1.0f / sqrtf((float)d);

    for (int i = 0; i < n; i++) {
        ST(cs, &m[i], -INFINITY);
        ST(cs, &l[i], 0.0f);
        for (int c = 0; c < d; c++) ST(cs, &O[(size_t)i * d + c], 0.0f);
    }
    for (int j0 = 0; j0 < n; j0 += bc) {                     /* outer: key/value blocks */
        int jn = j0 + bc < n ? bc : n - j0;
        for (int i0 = 0; i0 < n; i0 += br) {                 /* inner: query blocks */
            int in = i0 + br < n ? br : n - i0;
            for (int ii = 0; ii < in; ii++) {
                int i = i0 + ii;
                /* S_ij row ii, and its max m~. */
                float mt = -INFINITY;
                for (int jj = 0; jj < jn; jj++) {
                    int j = j0 + jj;
                    float s = 0.0f;
                    for (int c = 0; c < d; c++) s += LD(cs, &Q[(size_t)i * d + c]) * LD(cs, &K[(size_t)j * d + c]);
                    s = (pb->causal && j > i) ? -INFINITY : s * scale;
                    ST(cs, &S[(size_t)ii * bc + jj], s);
                    mt = fmaxf(mt, s);
                }
                if (mt == -INFINITY) continue;               /* whole tile row masked: nothing to add */
                /* P~ = e^{S - m~} in place, l~ = its row sum. */
                float lt = 0.0f;
                for (int jj = 0; jj < jn; jj++) {
                    float p = expf(LD(cs, &S[(size_t)ii * bc + jj]) - mt);
                    ST(cs, &S[(size_t)ii * bc + jj], p);
                    lt += p;
                }
                /* Merge (m_i, l_i, O_i) with (m~, l~, P~ V_j), renormalizing O_i. */
                float mi = LD(cs, &m[i]), li = LD(cs, &l[i]);
                float m_new = fmaxf(mi, mt);
                float a_old = li * expf(mi - m_new), a_new = expf(mt - m_new);
                float l_new = a_old + a_new * lt;
                for (int c = 0; c < d; c++) {
                    float pv = 0.0f;
                    for (int jj = 0; jj < jn; jj++)
                        pv += LD(cs, &S[(size_t)ii * bc + jj]) * LD(cs, &V[(size_t)(j0 + jj) * d + c]);
                    float *o = &O[(size_t)i * d + c];
                    ST(cs, o, (a_old * LD(cs, o) + a_new * pv) / l_new);
                }
                ST(cs, &m[i], m_new);
                ST(cs, &l[i], l_new);
            }
        }
    }
}

TUT_NOINLINE void flash1(const tut_problem *pb) { flash1_body(NULL, pb); }
TUT_NOINLINE void flash1_probed(cachesim *cs, const tut_problem *pb) { flash1_body(cs, pb); }
static size_t flash1_ws(const tut_problem *pb) { return (size_t)pb->br * pb->bc + 2 * (size_t)pb->n; }

int main(int argc, char **argv)
{
    const tut_kernel k = {"flash1", flash1, flash1_probed, flash1_ws, 0};
    tut_args a = {.n = {128, 256, 512}, .n_count = 3, .d = 64, .reps = 3, .vg_kernel = k.name};
    tut_parse_args(argc, argv, &a, "06_flash1: tiled FlashAttention, K/V blocks in the outer loop");
    tut_paper_blocks(&a, &a.br, &a.bc);
    if (tut_kernel_mode(&a, &k, a.br, a.bc)) return 0;

    tut_hw hw;
    tut_hw_init(&hw);
    tut_banner("Step 06: FlashAttention, the paper's loop order (K/V outer)", &a, &hw);
    printf("   Fast memory M = simulated L1 = %zu floats; Bc = ceil(M/4d) = %d, Br = min(Bc, d) = %d.\n"
           "   In L1 at once: K_j, V_j, Q_i, O_i and the tile: (2 Bc + 2 Br) d + Br Bc = %s.\n\n",
           a.geo.l1.size_bytes / 4, a.bc, a.br,
           tut_bytes(4.0 * ((2.0 * a.bc + 2.0 * a.br) * a.d + (double)a.br * a.bc)));
    cachesim *cs = a.no_sim ? NULL : cachesim_create(&a.geo);
    FILE *dat = tut_dat_open(&a, "06", TUT_DAT_COLUMNS);
    tut_table_head();
    tut_result last = {0}, big = {0};
    for (int t = 0; t < a.n_count; t++) {
        tut_result r = tut_measure(&a, &k, a.n[t], a.br, a.bc, cs, &hw, 1e-4);
        tut_table_row(dat, &r);
        last = r;
    }
    if (tut_big_n(&a) > 0) big = tut_measure_big(&a, &k, "06", tut_big_n(&a), a.br, a.bc, 1e-4);
    fclose(dat);
    cachesim_free(cs);
    tut_io_summary(&a);
    tut_l2_story(&a, &last, &big, 3.0 / a.bc, "K/V outer, Q and O re-read and O rewritten per key block");
    printf("\n   If Q_i, O_i, K_j, V_j and the tile all stayed in L1, Q_i and O_i would be loaded once per\n"
           "   key block: 2d/(16 Bc) = %.2f L1 misses per pair (step 05: %.1f). The paper's blocks need\n"
           "   more than L1 holds here, and the excess shows up as extra misses: its rule is a Theta.\n"
           "   Note also that O_i is divided by l_new after EVERY key block: step 07 divides once.\n"
           "   Try: --br 24 --bc 24 (fits), --bc 16, `make cachegrind STEP=06`.\n"
           "   Next: 07 swaps the loops back: Q outer, K/V inner.\n",
           2.0 * a.d / (16.0 * a.bc), 2.0 * a.d / 16);
    return 0;
}
