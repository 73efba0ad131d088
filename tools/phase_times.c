/*
 * phase_times.c — where one flash forward's time goes, per thread and call:
 * the shared packing, the tasks (of which the cut, masked tiles, and the
 * gather of each task's Q rows), the waits, and the score elements qk
 * computed against N^2. Under a causal mask (passes with a packing phase):
 * "pack" is the phase with its barrier, "tasks" the task loops, "wait" the
 * barrier after each. Overlapped (no causal mask, 2+ threads; flash.c,
 * pack_sync): "pack" is the time in the units a thread packs, inside
 * "tasks" (the whole loop), and "wait" the waits for a set or a slot.
 * Needs the library built with
 * tools/phase_times.patch applied (it adds the timers; never commit that):
 *
 *   git apply tools/phase_times.patch && make build/libflashattn.a
 *   cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Iinclude tools/phase_times.c \
 *       build/libflashattn.a -fopenmp -lm -o phase_times
 *   ./phase_times N D CAUSAL [THREADS]     (B = 1, H = 8, float32, one context, 30 calls)
 *   git apply -R tools/phase_times.patch
 *
 * docs/performance.md, "Causal at N = 1024 taken apart", is its output.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn.h"

extern double fa_phase[6][64]; /* tools/phase_times.patch */

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: phase_times N D CAUSAL [THREADS]\n");
        return 2;
    }
    const int n = atoi(argv[1]), d = atoi(argv[2]), causal = atoi(argv[3]), threads = argc > 4 ? atoi(argv[4]) : 2;
    const int reps = 30, heads = 8;
    if (n < 1 || d < 1 || threads < 1 || threads > 64) return 2;
    const int64_t sh[4] = {1, n, heads, d};
    const size_t count = (size_t)n * heads * d;
    float *buf[4];
    for (int x = 0; x < 4; x++) buf[x] = malloc(count * sizeof(float));
    srand(1);
    for (int x = 0; x < 3; x++)
        for (size_t i = 0; i < count; i++) buf[x][i] = rand() / (float)RAND_MAX - 0.5f;
    fa_tensor t[4];
    for (int x = 0; x < 4; x++) fa_tensor_make(&t[x], buf[x], FA_F32, 4, sh, NULL);
    fa_options opt = fa_options_default();
    opt.causal = causal;
    opt.num_threads = threads;
    opt.impl = FA_IMPL_FLASH;
    fa_context *ctx;
    if (fa_context_create(&ctx, NULL, threads) != FA_OK) return 1;
    opt.context = ctx;
    if (fa_forward(&t[0], &t[1], &t[2], &t[3], NULL, &opt) != FA_OK) { /* warm-up */
        fprintf(stderr, "phase_times: %s\n", fa_last_error());
        return 1;
    }
    memset(fa_phase, 0, sizeof fa_phase);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int r = 0; r < reps; r++) fa_forward(&t[0], &t[1], &t[2], &t[3], NULL, &opt);
    clock_gettime(CLOCK_MONOTONIC, &b);
    const double call = ((double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec)) / reps;
    printf("N %d d %d causal %d, %d threads: %.3f ms a call\n", n, d, causal, threads, 1e3 * call);
    static const char *what[5] = {"pack", "tasks", "wait", "cut tiles", "Q gather"};
    for (int ph = 0; ph < 5; ph++) {
        printf("  %-9s ms per call, per thread:", what[ph]);
        for (int th = 0; th < threads; th++) printf(" %.3f", 1e3 * fa_phase[ph][th] / reps);
        printf("\n");
    }
    printf("  scores computed / N^2 per head: %.4f (whole tiles %.4f, cut tiles %.4f)\n",
           (fa_phase[5][0] + fa_phase[5][1]) / reps / heads / ((double)n * n),
           fa_phase[5][0] / reps / heads / ((double)n * n), fa_phase[5][1] / reps / heads / ((double)n * n));
    fa_context_destroy(ctx);
    for (int x = 0; x < 4; x++) free(buf[x]);
    return 0;
}
