/*
 * peak_probe.c — is bench's FMA peak a property of its measuring budget or of the machine?
 * Calls fa_measure_fma_peak (the loop `flashattn bench` runs for 0.3 s) with budgets of 0.3,
 * 1 and 3 seconds, alternating, twice, on THREADS threads, and prints each reading.
 *
 *   make build/libflashattn.a
 *   cc -std=c11 -O2 -Iinclude tools/peak_probe.c build/libflashattn.a -fopenmp -lm -o peak_probe
 *   OMP_PROC_BIND=close OMP_PLACES=cores ./peak_probe THREADS [ISA]     (ISA default avx512)
 */
#include <stdio.h>
#include <stdlib.h>

#include "flashattn.h"

int main(int argc, char **argv)
{
    if (argc < 2 || atoi(argv[1]) < 1) {
        fprintf(stderr, "usage: peak_probe THREADS [ISA]\n");
        return 2;
    }
    const int threads = atoi(argv[1]);
    const char *isa = argc > 2 ? argv[2] : "avx512";
    static const double budgets[] = {0.3, 1.0, 0.3, 3.0, 0.3, 1.0};
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 6; i++) {
            double g = 0.0;
            if (fa_measure_fma_peak(isa, threads, budgets[i], &g) != FA_OK) {
                fprintf(stderr, "peak_probe: %s\n", fa_last_error());
                return 1;
            }
            printf("threads %d budget %.1f s: %.1f GFLOP/s\n", threads, budgets[i], g);
            fflush(stdout);
        }
    return 0;
}
