/*
 * softmax_tile.c — the kernel table's online-softmax update alone, on tiles of R rows x 256
 * scores for R = 8 .. 256: small tiles sit in L1, large ones in L2 (docs/performance.md,
 * "Sixteenth session": where the forward's softmax loses its cycles). Best of 7 timed runs of
 * ~2M scores each, ns a score.
 *
 *   cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc tools/softmax_tile.c \
 *       build/libflashattn.a -fopenmp -lm -o softmax_tile && ./softmax_tile [avx512|avx2|neon|scalar]
 *
 * Scores 0.001 * (x % 997) against a running max of 40 every call, so every exp argument is
 * near -40 (normal results; P overwrites S and the next call sees the same range).
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/kernels.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    const char *isa = argc > 1 ? argv[1] : "avx512";
    const fa_kernels *k = fa_kernels_by_name(isa);
    if (!k) {
        fprintf(stderr, "softmax_tile: ISA '%s' is not built or not supported here\n", isa);
        return 2;
    }
    static const int rows[] = {8, 16, 32, 64, 128, 256};
    const int bc = 256, lds = bc + 16; /* a leading dimension off a power of two, as the driver's */
    for (size_t bi = 0; bi < sizeof rows / sizeof rows[0]; bi++) {
        const int br = rows[bi];
        float *s = aligned_alloc(64, (size_t)br * lds * sizeof(float));
        float *m = malloc((size_t)br * sizeof(float)), *l = malloc((size_t)br * sizeof(float));
        float *a = malloc((size_t)br * sizeof(float));
        if (!s || !m || !l || !a) return 2;
        for (int x = 0; x < br * lds; x++) s[x] = 0.001f * (float)(x % 997);
        const long inner = 2000000 / (br * bc) + 1;
        double best = 1e30;
        for (int rep = 0; rep < 7; rep++) {
            const double t0 = now();
            for (long it = 0; it < inner; it++) {
                for (int i = 0; i < br; i++) m[i] = 40.0f, l[i] = 1.0f;
                k->softmax(br, bc, s, (size_t)lds, m, l, a);
            }
            const double per = (now() - t0) / (double)inner / (double)(br * bc);
            if (per < best) best = per;
        }
        printf("%s softmax  rows %3d x %d  %.3f ns/score  (tile %.1f KiB)\n", isa, br, bc, best * 1e9,
               (double)br * lds * sizeof(float) / 1024.0);
        free(s); free(m); free(l); free(a);
    }
    return 0;
}
