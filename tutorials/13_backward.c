/*
 * 13_backward.c — the backward pass: recompute P from the LSE instead of storing it.
 *
 * Previous step: 12 measured the forward pass's traffic. Training also needs
 *   gradients, and the textbook backward pass wants P (N x N) from the forward.
 * What changes: given dO (and O, LSE from the forward), the gradients are
 *     D_i = dO_i . O_i                    (one number per query row)
 *     dV  = P^T dO          dP = dO V^T
 *     dS  = P o (dP - D)                  (o: elementwise; D broadcast along rows)
 *     dQ  = scale dS K      dK = scale dS^T Q
 *   standard: stores P and dS (2 N^2 floats), one phase after another.
 *   flash (FlashAttention-2's backward): stores nothing N x N. For each key
 *   block j (K_j, V_j and the accumulators dK_j, dV_j stay in fast memory), walk
 *   the query blocks i and RECOMPUTE the tile P_ij = e^{scale Q_i K_j^T - LSE_i}:
 *   the LSE saved by the forward is exactly what makes P one exp per element,
 *   already normalized. dQ_i is accumulated in slow memory across key blocks.
 * What to look for:
 *   - workspace: 2 N^2 floats against a few tiles;
 *   - L1 misses [sim]: the recomputation costs FLOPs (S again) but saves the
 *     N^2 traffic, as in the forward pass;
 *   - max error of dQ, dK, dV against a float64 backward written from the
 *     formulas above, itself checked against the library's own backward pass
 *     (fa_backward with FA_IMPL_REFERENCE; the same is `flashattn grad` and
 *     python's flashattn.grad, and FA_IMPL_FLASH is the tiled one).
 */
#include "common.h"

/* One head. Q, K, V, O, dO, dQ, dK, dV: [n][d]; lse, D: [n]. */
typedef struct grads {
    int n, d, br, bc;
    const float *Q, *K, *V, *O, *dO, *lse;
    float *dQ, *dK, *dV;
    float *ws;
} grads;

/* Standard: workspace P [n][n], dS [n][n]. */
TUT_BODY void backward_standard_body(cachesim *cs, const grads *g)
{
    const int n = g->n, d = g->d;
    float *P = g->ws, *dS = g->ws + (size_t)n * n;
    const float scale = 1.0f / sqrtf((float)d);
    for (int i = 0; i < n; i++)                                  /* P from S and the LSE */
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            for (int c = 0; c < d; c++) s += LD(cs, &g->Q[(size_t)i * d + c]) * LD(cs, &g->K[(size_t)j * d + c]);
            ST(cs, &P[(size_t)i * n + j], expf(s * scale - LD(cs, &g->lse[i])));
        }
    for (int i = 0; i < n; i++) {                                /* dS = P o (dO V^T - D) */
        float Di = 0.0f;
        for (int c = 0; c < d; c++) Di += LD(cs, &g->dO[(size_t)i * d + c]) * LD(cs, &g->O[(size_t)i * d + c]);
        for (int j = 0; j < n; j++) {
            float dp = 0.0f;
            for (int c = 0; c < d; c++) dp += LD(cs, &g->dO[(size_t)i * d + c]) * LD(cs, &g->V[(size_t)j * d + c]);
            ST(cs, &dS[(size_t)i * n + j], LD(cs, &P[(size_t)i * n + j]) * (dp - Di));
        }
    }
    /* dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO: row by row, so dS and P are read in order. */
    for (int i = 0; i < n; i++)
        for (int c = 0; c < d; c++) ST(cs, &g->dQ[(size_t)i * d + c], 0.0f);
    for (int j = 0; j < n; j++)
        for (int c = 0; c < d; c++) {
            ST(cs, &g->dK[(size_t)j * d + c], 0.0f);
            ST(cs, &g->dV[(size_t)j * d + c], 0.0f);
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float ds = LD(cs, &dS[(size_t)i * n + j]) * scale, p = LD(cs, &P[(size_t)i * n + j]);
            for (int c = 0; c < d; c++) {
                float *q = &g->dQ[(size_t)i * d + c], *k = &g->dK[(size_t)j * d + c], *v = &g->dV[(size_t)j * d + c];
                ST(cs, q, LD(cs, q) + ds * LD(cs, &g->K[(size_t)j * d + c]));
                ST(cs, k, LD(cs, k) + ds * LD(cs, &g->Q[(size_t)i * d + c]));
                ST(cs, v, LD(cs, v) + p * LD(cs, &g->dO[(size_t)i * d + c]));
            }
        }
}

/* Flash: workspace D [n], then per tile P [br][bc], dS [br][bc]; dK, dV rows of block j accumulate in place. */
TUT_BODY void backward_flash_body(cachesim *cs, const grads *g)
{
    const int n = g->n, d = g->d, br = g->br, bc = g->bc;
    float *D = g->ws, *P = D + n, *dS = P + (size_t)br * bc;
    const float scale = 1.0f / sqrtf((float)d);
    for (int i = 0; i < n; i++) {
        float Di = 0.0f;
        for (int c = 0; c < d; c++) {
            Di += LD(cs, &g->dO[(size_t)i * d + c]) * LD(cs, &g->O[(size_t)i * d + c]);
            ST(cs, &g->dQ[(size_t)i * d + c], 0.0f);
        }
        ST(cs, &D[i], Di);
    }
    for (int j0 = 0; j0 < n; j0 += bc) {                          /* outer: key/value blocks */
        int jn = j0 + bc < n ? bc : n - j0;
        for (int jj = 0; jj < jn; jj++)
            for (int c = 0; c < d; c++) {
                ST(cs, &g->dK[(size_t)(j0 + jj) * d + c], 0.0f);
                ST(cs, &g->dV[(size_t)(j0 + jj) * d + c], 0.0f);
            }
        for (int i0 = 0; i0 < n; i0 += br) {                      /* inner: query blocks */
            int in = i0 + br < n ? br : n - i0;
            for (int ii = 0; ii < in; ii++) {                     /* recompute P, then dS, for the tile */
                int i = i0 + ii;
                float li = LD(cs, &g->lse[i]), Di = LD(cs, &D[i]);
                for (int jj = 0; jj < jn; jj++) {
                    int j = j0 + jj;
                    float s = 0.0f, dp = 0.0f;
                    for (int c = 0; c < d; c++) {
                        s += LD(cs, &g->Q[(size_t)i * d + c]) * LD(cs, &g->K[(size_t)j * d + c]);
                        dp += LD(cs, &g->dO[(size_t)i * d + c]) * LD(cs, &g->V[(size_t)j * d + c]);
                    }
                    float p = expf(s * scale - li);
                    ST(cs, &P[(size_t)ii * bc + jj], p);
                    ST(cs, &dS[(size_t)ii * bc + jj], p * (dp - Di));
                }
            }
            for (int ii = 0; ii < in; ii++)                       /* dQ_i += scale dS K_j */
                for (int c = 0; c < d; c++) {
                    float acc = 0.0f;
                    for (int jj = 0; jj < jn; jj++)
                        acc += LD(cs, &dS[(size_t)ii * bc + jj]) * LD(cs, &g->K[(size_t)(j0 + jj) * d + c]);
                    float *q = &g->dQ[(size_t)(i0 + ii) * d + c];
                    ST(cs, q, LD(cs, q) + acc * scale);
                }
            for (int jj = 0; jj < jn; jj++)                       /* dK_j += scale dS^T Q_i, dV_j += P^T dO_i */
                for (int c = 0; c < d; c++) {
                    float ak = 0.0f, av = 0.0f;
                    for (int ii = 0; ii < in; ii++) {
                        ak += LD(cs, &dS[(size_t)ii * bc + jj]) * LD(cs, &g->Q[(size_t)(i0 + ii) * d + c]);
                        av += LD(cs, &P[(size_t)ii * bc + jj]) * LD(cs, &g->dO[(size_t)(i0 + ii) * d + c]);
                    }
                    float *k = &g->dK[(size_t)(j0 + jj) * d + c], *v = &g->dV[(size_t)(j0 + jj) * d + c];
                    ST(cs, k, LD(cs, k) + ak * scale);
                    ST(cs, v, LD(cs, v) + av);
                }
        }
    }
}

TUT_NOINLINE void backward_standard(cachesim *cs, const grads *g) { backward_standard_body(NULL, g); }
TUT_NOINLINE void backward_standard_probed(cachesim *cs, const grads *g) { backward_standard_body(cs, g); }
TUT_NOINLINE void backward_flash(cachesim *cs, const grads *g) { backward_flash_body(NULL, g); }
TUT_NOINLINE void backward_flash_probed(cachesim *cs, const grads *g) { backward_flash_body(cs, g); }

/* float64 backward from the formulas; ref: dQ, dK, dV [3][n][d]. */
static void backward_ref(const grads *g, double *ref)
{
    const int n = g->n, d = g->d;
    const double scale = 1.0 / sqrt((double)d);
    double *P = malloc((size_t)n * sizeof *P), *dS = malloc((size_t)n * sizeof *dS);   /* [n] one row */
    double *dQ = ref, *dK = ref + (size_t)n * d, *dV = ref + 2 * (size_t)n * d;
    memset(ref, 0, 3 * (size_t)n * d * sizeof *ref);
    for (int i = 0; i < n; i++) {
        double m = -INFINITY, l = 0, Di = 0;
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int c = 0; c < d; c++) s += (double)g->Q[(size_t)i * d + c] * g->K[(size_t)j * d + c];
            P[j] = s * scale;
            m = fmax(m, P[j]);
        }
        for (int j = 0; j < n; j++) l += exp(P[j] - m);
        for (int j = 0; j < n; j++) P[j] = exp(P[j] - m) / l;
        for (int c = 0; c < d; c++) Di += (double)g->dO[(size_t)i * d + c] * g->O[(size_t)i * d + c];
        for (int j = 0; j < n; j++) {
            double dp = 0;
            for (int c = 0; c < d; c++) dp += (double)g->dO[(size_t)i * d + c] * g->V[(size_t)j * d + c];
            dS[j] = P[j] * (dp - Di);
            for (int c = 0; c < d; c++) {
                dQ[(size_t)i * d + c] += scale * dS[j] * g->K[(size_t)j * d + c];
                dK[(size_t)j * d + c] += scale * dS[j] * g->Q[(size_t)i * d + c];
                dV[(size_t)j * d + c] += P[j] * g->dO[(size_t)i * d + c];
            }
        }
    }
    free(P); free(dS);
}

/* max |ref - the library's float64 backward| over dQ, dK, dV (O and LSE recomputed by the library). */
static double library_diff(const grads *g, const double *ref)
{
    const int n = g->n, d = g->d;
    const size_t nd = (size_t)n * d;
    double *lib = tut_alloc(3 * nd * 8);   /* dQ, dK, dV [3][n][d] */
    fa_tensor tq, tk, tv, tdo, tdq, tdk, tdv;
    int64_t shape[4] = {1, n, 1, d};
    fa_tensor_make(&tq, (void *)g->Q, FA_F32, 4, shape, NULL);
    fa_tensor_make(&tk, (void *)g->K, FA_F32, 4, shape, NULL);
    fa_tensor_make(&tv, (void *)g->V, FA_F32, 4, shape, NULL);
    fa_tensor_make(&tdo, (void *)g->dO, FA_F32, 4, shape, NULL);
    fa_tensor_make(&tdq, lib, FA_F64, 4, shape, NULL);
    fa_tensor_make(&tdk, lib + nd, FA_F64, 4, shape, NULL);
    fa_tensor_make(&tdv, lib + 2 * nd, FA_F64, 4, shape, NULL);
    fa_options fo = fa_options_default();
    fo.impl = FA_IMPL_REFERENCE;
    if (fa_backward(&tq, &tk, &tv, NULL, NULL, &tdo, &tdq, &tdk, &tdv, &fo) != FA_OK) {
        fprintf(stderr, "fa_backward: %s\n", fa_last_error());
        exit(1);
    }
    double e = 0;
    for (size_t x = 0; x < 3 * nd; x++) e = fmax(e, fabs(lib[x] - ref[x]));
    free(lib);
    return e;
}

int main(int argc, char **argv)
{
    double lib_diff = 0;
    tut_args a = {.n = {128, 256}, .n_count = 2, .d = 64, .reps = 3, .vg_kernel = "backward_flash"};
    tut_parse_args(argc, argv, &a, "13_backward: gradients with P recomputed from the LSE");
    tut_fit_blocks(&a, &a.br, &a.bc);
    tut_hw hw;
    tut_hw_init(&hw);
    if (!a.kernel_only && !a.sim_kernel) tut_banner("Step 13: the backward pass (P recomputed from the LSE)", &a, &hw);
    if (!a.kernel_only && !a.sim_kernel)
        printf("   Br = Bc = %d. FLOPs counted as 2.5 x the forward's 4 N^2 d. Errors: max |grad - ref| over\n"
               "   dQ, dK, dV against a float64 backward; tolerance 1e-4.\n\n", a.br);
    cachesim *cs = a.no_sim ? NULL : cachesim_create(&a.geo);
    FILE *dat = (a.kernel_only || a.sim_kernel) ? NULL : tut_dat_open(&a, "13", "variant " TUT_DAT_COLUMNS);
    for (int v = 0; v < 2; v++) {
        void (*run)(cachesim *, const grads *) = v ? backward_flash : backward_standard;
        void (*probed)(cachesim *, const grads *) = v ? backward_flash_probed : backward_standard_probed;
        if ((a.kernel_only || a.sim_kernel) && !v) continue;
        if (dat) { printf("   %s\n", v ? "flash: P_ij recomputed per tile" : "standard: P and dS stored"); tut_table_head(); }
        for (int t = 0; t < a.n_count; t++) {
            int n = a.n[t], d = a.d;
            size_t nd = (size_t)n * d;
            size_t wsf = v ? (size_t)n + 2 * (size_t)a.br * a.bc : 2 * (size_t)n * n;
            float *buf = tut_alloc(nd * 4 * 8 + (size_t)n * 4);  /* Q K V O dO dQ dK dV [n][d] each, lse [n] */
            grads g = {n, d, a.br, a.bc, buf, buf + nd, buf + 2 * nd, buf + 3 * nd, buf + 4 * nd, buf + 8 * nd,
                       buf + 5 * nd, buf + 6 * nd, buf + 7 * nd, tut_alloc(wsf * 4)};
            tut_fill((float *)g.Q, nd, 11, -2, 2);
            tut_fill((float *)g.K, nd, 22, -2, 2);
            tut_fill((float *)g.V, nd, 33, -1, 1);
            tut_fill((float *)g.dO, nd, 44, -1, 1);
            /* The forward pass, from the library: O and the LSE the backward pass needs. */
            fa_tensor tq, tk, tv, to, tl;
            int64_t shape[4] = {1, n, 1, d}, lshape[3] = {1, 1, n};
            fa_tensor_make(&tq, (void *)g.Q, FA_F32, 4, shape, NULL);
            fa_tensor_make(&tk, (void *)g.K, FA_F32, 4, shape, NULL);
            fa_tensor_make(&tv, (void *)g.V, FA_F32, 4, shape, NULL);
            fa_tensor_make(&to, (void *)g.O, FA_F32, 4, shape, NULL);
            fa_tensor_make(&tl, (void *)g.lse, FA_F32, 3, lshape, NULL);
            fa_options fo = fa_options_default();
            fo.impl = FA_IMPL_REFERENCE;
            if (fa_forward(&tq, &tk, &tv, &to, &tl, &fo) != FA_OK) { fprintf(stderr, "%s\n", fa_last_error()); return 1; }
            if (a.kernel_only) { tut_flush_caches(&a); run(NULL, &g); return 0; }
            if (a.sim_kernel) { probed(cs, &g); tut_print_sim_counts(cs, "backward_flash"); return 0; }
            double *ref = tut_alloc(3 * nd * 8);   /* dQ, dK, dV [3][n][d] */
            backward_ref(&g, ref);
            if (!v) lib_diff = fmax(lib_diff, library_diff(&g, ref));
            tut_result r = {.n = n, .d = d, .br = v ? a.br : 0, .bc = v ? a.bc : 0, .ws_bytes = wsf * 4,
                            .hw_l1 = -1, .hw_ll = -1};
            run(NULL, &g);
            r.err = fmax(tut_max_err(g.dQ, ref, nd), fmax(tut_max_err(g.dK, ref + nd, nd), tut_max_err(g.dV, ref + 2 * nd, nd)));
            tut_require(r.err, 1e-4, v ? "flash backward" : "standard backward");
            tut_hw_start(&hw);
            TUT_TIME(a.reps, r.sec, run(NULL, &g));
            tut_hw_stop(&hw);
            r.hw_l1 = hw.l1 < 0 ? -1 : hw.l1 / (a.reps + 1);
            r.gflops = 2.5 * 4.0 * n * (double)n * d / r.sec / 1e9;
            if (cs) {
                cachesim_reset(cs);
                probed(cs, &g);
                r.l1_miss = cachesim_misses(cs, 1);
                r.l2_miss = cachesim_misses(cs, 2);
                r.l1_bytes = cachesim_traffic_bytes(cs, 1);
                r.l2_bytes = cachesim_traffic_bytes(cs, 2);
            }
            fprintf(dat, "%d ", v);
            tut_table_row(dat, &r);
            free(ref); free(buf); free(g.ws);
        }
        printf("\n");
    }
    if (dat) fclose(dat);
    cachesim_free(cs);
    tut_io_summary(&a);
    if (!a.kernel_only && !a.sim_kernel) {
        tut_require(lib_diff, 1e-5, "this step's float64 backward against fa_backward");
        printf("   This step's float64 backward and the library's (fa_backward, impl reference; also\n"
               "   `flashattn grad` and python's flashattn.grad) agree to %.1e (O rounded to float32 here).\n",
               lib_diff);
    }
    printf("   Both compute S once here: this standard path also rebuilds P from the LSE, since the forward\n"
           "   did not keep it. One that kept P from the forward saves those 2 N^2 d FLOPs and pays N^2\n"
           "   memory and traffic for them; FlashAttention recomputes, because FLOPs are cheaper than bytes.\n"
           "   Try: --n 1024 --no-sim, --br 16 --bc 48. Next: 14 validates someone else's output.\n");
    return 0;
}
