/*
 * dec_kernels.c — one-thread micro-benchmark of the AVX2 decode kernels (dec_qk, dec_pv)
 * on rows that stay in L1/L2: nr query rows (default 4, a GQA group) against n keys a call
 * (default 32, decode.c's block), d = dv = 128, 256 K and V rows in rotation (128 KiB of
 * float32 each). Prints ns per 256-bit FMA of each kernel (best of 5 runs of 200,000 calls)
 * and the GFLOP/s that makes; docs/performance.md, "Eighteenth session", compares it with
 * bench's FMA peak (0.338 ns per FMA on the Zen 1 measured there).
 *
 *   cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Isrc -Iinclude tools/dec_kernels.c \
 *      build/libflashattn.a -fopenmp -lm -o /tmp/dec_kernels
 *   /tmp/dec_kernels [FMT [KEYS [ROWS]]]     FMT 0 = float32 rows, 1 = f16, 2 = bf16
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/kernels.h" /* a tool of the kernel layer: it times the table directly */

extern const fa_kernels fa_kernels_avx2;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    const fa_kernels *k = &fa_kernels_avx2;
    const int fmt = argc > 1 ? atoi(argv[1]) : FA_ROW_F32, nkeys = argc > 2 ? atoi(argv[2]) : 32;
    const int nr = argc > 3 ? atoi(argv[3]) : 4, d = 128, nrow = 256;
    if (fmt < 0 || fmt > 2 || nkeys < 1 || nkeys > nrow || nr < 1 || nr > 64) {
        fprintf(stderr, "usage: dec_kernels [FMT 0|1|2 [KEYS 1..256 [ROWS 1..64]]]\n");
        return 2;
    }
    const size_t es = fmt == FA_ROW_F32 ? 4 : 2, bytes = (size_t)nrow * d * es;
    unsigned char *kb = aligned_alloc(64, bytes), *vb = aligned_alloc(64, bytes);
    /* 64-byte aligned, as the decoder's scratch rows are (a 256-bit load across two lines
     * costs Zen 1 more) */
    float *q = aligned_alloc(64, 64 * 128 * sizeof(float)), *s = aligned_alloc(64, 64 * 256 * sizeof(float));
    float *o = aligned_alloc(64, 64 * 128 * sizeof(float)), alpha[64];
    if (!kb || !vb || !q || !s || !o) return 2;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < bytes; i++) { /* small finite values in every format */
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        kb[i] = (unsigned char)((x >> 33) & 0x3f);
        vb[i] = (unsigned char)((x >> 41) & 0x3f);
    }
    for (int i = 0; i < 64 * 128; i++) {
        q[i] = (float)(i % 97) / 97.0f;
        o[i] = 0.0f;
    }
    for (int i = 0; i < 64 * 256; i++) s[i] = 0.001f * (float)(i % 7);
    for (int i = 0; i < 64; i++) alpha[i] = 1.0f;
    const void *kp[256], *vp[256];
    for (int j = 0; j < nrow; j++) {
        kp[j] = kb + (size_t)j * d * es;
        vp[j] = vb + (size_t)j * d * es;
    }
    const long iters = 200000;
    double best_qk = 1e30, best_pv = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        const double t0 = now_s();
        for (long it = 0; it < iters; it++)
            k->dec_qk(nr, nkeys, d, q, 128, kp + (it * nkeys) % (nrow - nkeys + 1), fmt, 0.1f, s, 256, NULL);
        const double t1 = now_s();
        for (long it = 0; it < iters; it++)
            k->dec_pv(nr, nkeys, d, s, 256, vp + (it * nkeys) % (nrow - nkeys + 1), fmt, alpha, o, 128);
        const double t2 = now_s();
        if (t1 - t0 < best_qk) best_qk = t1 - t0;
        if (t2 - t1 < best_pv) best_pv = t2 - t1;
    }
    const double fmas = (double)iters * nkeys * nr * d / 8; /* 256-bit FMAs of each kernel */
    printf("fmt %d keys %d rows %d: dec_qk %.3f ns/FMA (%.1f GFLOP/s), dec_pv %.3f ns/FMA (%.1f GFLOP/s)\n", fmt,
           nkeys, nr, best_qk / fmas * 1e9, fmas * 16 / best_qk / 1e9, best_pv / fmas * 1e9,
           fmas * 16 / best_pv / 1e9);
    free(kb); free(vb); free(q); free(s); free(o);
    return 0;
}
