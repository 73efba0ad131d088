/*
 * ab_chunk.c — the flash forward under several task orders (src/flash.c, task_chunk),
 * alternating call by call in ONE process: on a host whose speed moves between processes and
 * minutes (the 16-core device host: +-15% between two runs of the same binary), settings
 * timed side by side, call after call, share the same drift. Each round runs every setting
 * in a fresh random order, each as an untimed call and then a timed one (so a timed call
 * always follows its own setting's); prints each setting's median GFLOP/s and the median
 * over rounds of its speed over the first setting's in the same round.
 *
 *   usage: ab_chunk N D H THREADS ROUNDS [--causal] [--tail] -- SETTING...
 *          SETTING: 0 heads interleaved (the default), N pieces of one head a grab
 *          (FA_TASK_CHUNK=N); give one twice for a control (its pair reads ~1.000)
 *          --tail: the settings are FA_TAIL_SPLIT's instead (0/1 the last tasks whole, N cut
 *          into N pieces; flash.c, tail_split), the task order left at its default
 *   cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc -Itools tools/ab_chunk.c \
 *      build/libflashattn.a -fopenmp -lm -o /tmp/ab_chunk
 * B = 1, BSHD float32, heads_k = H, inputs uniform in [-1, 1); FLOPs 4 N^2 d H (half causal).
 * Every call reads the same inputs, so a call finds what the one before left in L2/L3 (the
 * untimed call of each pair warms them for the timed one, as in a model's repeated layer).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ab_common.h"
#include "flashattn.h"
#include "problem.h" /* fa_task_chunk_test, fa_tail_split_test */

#define MAX_SET 8

/* The setting under test: the task order's or the tail split's (the other at its default). */
static void pin(int tail, int value)
{
    fa_task_chunk_test = tail ? -1 : value;
    fa_tail_split_test = tail ? value : -1;
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, ab_cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: ab_chunk N D H THREADS ROUNDS [--causal] [--tail] -- SETTING...\n");
        return 2;
    }
    const int64_t n = atoll(argv[1]), d = atoll(argv[2]), h = atoll(argv[3]);
    const int threads = atoi(argv[4]), rounds = atoi(argv[5]);
    fa_options opt = fa_options_default();
    opt.num_threads = threads;
    int a = 6, nset = 0, set[MAX_SET], tail = 0;
    for (; a < argc && strcmp(argv[a], "--"); a++) {
        if (!strcmp(argv[a], "--causal")) opt.causal = 1;
        else if (!strcmp(argv[a], "--tail")) tail = 1;
        else return 2;
    }
    for (a++; a < argc; a++) {
        if (nset == MAX_SET || atoi(argv[a]) < 0 || atoi(argv[a]) > 1024) {
            fprintf(stderr, "ab_chunk: at most %d settings, each in 0..1024 (FA_TASK_CHUNK's and FA_TAIL_SPLIT's range)\n", MAX_SET);
            return 2;
        }
        set[nset++] = atoi(argv[a]);
    }
    if (n < 1 || d < 1 || h < 1 || threads < 1 || rounds < 1 || nset < 1) return 2;
    if (fa_context_create(&opt.context, NULL, threads) != FA_OK) return 2;
    uint64_t rng = 0x5eed1234abcdull;
    fa_tensor q, k, v, o;
    void *bufs[4] = {ab_make_tensor(&q, FA_F32, n, h, d, &rng), ab_make_tensor(&k, FA_F32, n, h, d, &rng),
                     ab_make_tensor(&v, FA_F32, n, h, d, &rng), ab_make_tensor(&o, FA_F32, n, h, d, &rng)};
    double *t = malloc(sizeof(double) * (size_t)rounds * nset), *x = malloc(sizeof(double) * (size_t)rounds);
    if (!t || !x) return 2;
    for (int s = 0; s < nset; s++) { /* one warm-up call each */
        pin(tail, set[s]);
        if (fa_forward(&q, &k, &v, &o, NULL, &opt) != FA_OK) {
            fprintf(stderr, "ab_chunk: %s\n", fa_last_error());
            return 1;
        }
    }
    uint64_t shuffle = 0x9e3779b97f4a7c15ull;
    for (int r = 0; r < rounds; r++) {
        int order[MAX_SET];
        for (int j = 0; j < nset; j++) order[j] = j;
        for (int j = nset - 1; j > 0; j--) { /* a fresh random order every round */
            shuffle = shuffle * 6364136223846793005ull + 1442695040888963407ull;
            const int pick = (int)((shuffle >> 33) % (uint64_t)(j + 1)), tmp = order[j];
            order[j] = order[pick];
            order[pick] = tmp;
        }
        for (int j = 0; j < nset; j++) {
            const int s = order[j];
            pin(tail, set[s]);
            /* an untimed call of the same setting first: the timed call never follows
             * another setting's (whose threads, caches and imbalance it would inherit) */
            if (fa_forward(&q, &k, &v, &o, NULL, &opt) != FA_OK) return 1;
            const double t0 = ab_now_s();
            if (fa_forward(&q, &k, &v, &o, NULL, &opt) != FA_OK) return 1;
            t[(size_t)r * nset + s] = ab_now_s() - t0;
        }
    }
    const double flops = 4.0 * (double)n * (double)n * (double)d * (double)h * (opt.causal ? 0.5 : 1.0);
    fa_cpu_info info;
    if (fa_get_cpu_info(&info) != FA_OK) return 1;
    printf("N %lld d %lld H %lld threads %d %s rounds %d, ISA %s, L2 %zu KiB; settings: %s\n", (long long)n,
           (long long)d, (long long)h, threads, opt.causal ? "causal" : "non-causal", rounds, info.isa,
           info.l2_bytes / 1024, tail ? "FA_TAIL_SPLIT" : "FA_TASK_CHUNK");
    for (int s = 0; s < nset; s++) {
        for (int r = 0; r < rounds; r++) x[r] = t[(size_t)r * nset + s];
        const double med = median(x, rounds);
        for (int r = 0; r < rounds; r++) x[r] = t[(size_t)r * nset] / t[(size_t)r * nset + s];
        printf("  setting %3d  median %8.1f GFLOP/s  speed over setting %d, paired median %.3f\n", set[s],
               flops / med / 1e9, set[0], median(x, rounds));
    }
    for (int i = 0; i < 4; i++) free(bufs[i]);
    free(t);
    free(x);
    fa_context_destroy(opt.context);
    return 0;
}
