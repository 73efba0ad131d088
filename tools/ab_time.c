/*
 * ab_time.c — time fa_forward or fa_backward through the public API only, so
 * the same source builds against any revision's libflashattn.a: the timing
 * half of tools/ab_revisions.sh (before/after comparisons of one change).
 *
 *   usage: ab_time N D H THREADS REPS [--pass fwd|bwd] [--dtype f32|f16|bf16]
 *                  [--causal] [--window L,R] [--softcap C] [--hash] [--context]
 *   prints one line: "gflops G median_ms M" (FLOPs 4*N^2*d*H, half when causal,
 *   x2.5 for bwd; windows are counted as N^2, so compare like with like);
 *   with --hash also "hash H": an FNV-1a hash of the output bits (O, or dQ, dK,
 *   dV for bwd), to check that two revisions compute the same bits.
 * Inputs are uniform in [-1, 1) (never zeros), converted to the dtype asked
 * for; O and the gradients are float32. B = 1, BSHD, heads_k = H.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn.h"
#include "ab_common.h"

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: ab_time N D H THREADS REPS [--pass fwd|bwd] [--dtype f32|f16|bf16] "
                        "[--causal] [--window L,R] [--softcap C]\n");
        return 2;
    }
    const int64_t n = atoll(argv[1]), d = atoll(argv[2]), h = atoll(argv[3]);
    const int threads = atoi(argv[4]), reps = atoi(argv[5]);
    int bwd = 0, hash = 0;
    fa_dtype dt = FA_F32;
    fa_options opt = fa_options_default();
    opt.num_threads = threads;
    for (int i = 6; i < argc; i++) {
        if (!strcmp(argv[i], "--causal")) opt.causal = 1;
        else if (!strcmp(argv[i], "--hash")) hash = 1;
        else if (!strcmp(argv[i], "--context")) { /* keep scratch across calls (fa_context's arena) */
            if (fa_context_create(&opt.context, NULL, threads) != FA_OK) return 2;
        }
        else if (!strcmp(argv[i], "--pass") && i + 1 < argc) bwd = !strcmp(argv[++i], "bwd");
        else if (!strcmp(argv[i], "--softcap") && i + 1 < argc) opt.softcap = atof(argv[++i]);
        else if (!strcmp(argv[i], "--window") && i + 1 < argc) {
            long long l, r;
            if (sscanf(argv[++i], "%lld,%lld", &l, &r) != 2) return 2;
            opt.window_left = l;
            opt.window_right = r;
        } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *s = argv[++i];
            dt = !strcmp(s, "bf16") ? FA_BF16 : !strcmp(s, "f16") ? FA_F16 : FA_F32;
        } else {
            fprintf(stderr, "ab_time: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (n < 1 || d < 1 || h < 1 || threads < 1 || reps < 1 || reps > 1000) return 2;
    uint64_t rng = 0x5eed1234abcdull;
    fa_tensor q, k, v, o, lse, dout, dq, dk, dv;
    void *bufs[9];
    bufs[0] = ab_make_tensor(&q, dt, n, h, d, &rng);
    bufs[1] = ab_make_tensor(&k, dt, n, h, d, &rng);
    bufs[2] = ab_make_tensor(&v, dt, n, h, d, &rng);
    bufs[3] = ab_make_tensor(&o, FA_F32, n, h, d, &rng);
    bufs[4] = ab_make_tensor(&dout, FA_F32, n, h, d, &rng);
    bufs[5] = ab_make_tensor(&dq, FA_F32, n, h, d, &rng);
    bufs[6] = ab_make_tensor(&dk, FA_F32, n, h, d, &rng);
    bufs[7] = ab_make_tensor(&dv, FA_F32, n, h, d, &rng);
    float *l = malloc(sizeof(float) * (size_t)(h * n));
    const int64_t ls[3] = {1, h, n};
    if (!l || fa_tensor_make(&lse, l, FA_F32, 3, ls, NULL) != FA_OK) return 2;
    bufs[8] = l;
    if (fa_forward(&q, &k, &v, &o, &lse, &opt) != FA_OK) {
        fprintf(stderr, "ab_time: %s\n", fa_last_error());
        return 1;
    }
    double *t = malloc(sizeof(double) * (size_t)(reps + 1));
    for (int r = 0; r <= reps; r++) { /* run 0 warms up */
        const double t0 = ab_now_s();
        const fa_status st = bwd ? fa_backward(&q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv, &opt)
                                 : fa_forward(&q, &k, &v, &o, NULL, &opt);
        t[r] = ab_now_s() - t0;
        if (st != FA_OK) {
            fprintf(stderr, "ab_time: %s\n", fa_last_error());
            return 1;
        }
    }
    qsort(t + 1, (size_t)reps, sizeof(double), ab_cmp_double);
    const double med = reps % 2 ? t[1 + reps / 2] : 0.5 * (t[reps / 2] + t[reps / 2 + 1]);
    const double flops = 4.0 * (double)n * (double)n * (double)d * (double)h * (bwd ? 2.5 : 1.0) * (opt.causal ? 0.5 : 1.0);
    printf("gflops %.2f median_ms %.3f", flops / med / 1e9, med * 1e3);
    if (hash) {
        uint64_t hv = 1469598103934665603ull;
        const fa_tensor *grads[3] = {&dq, &dk, &dv};
        for (int t = 0; t < (bwd ? 3 : 1); t++) {
            const unsigned char *bytes = (bwd ? grads[t] : &o)->data;
            for (size_t i = 0; i < (size_t)(n * h * d) * sizeof(float); i++) hv = (hv ^ bytes[i]) * 1099511628211ull;
        }
        printf(" hash %016llx", (unsigned long long)hv);
    }
    printf("\n");
    for (int i = 0; i < 9; i++) free(bufs[i]);
    free(t);
    return 0;
}
