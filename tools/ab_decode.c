/*
 * ab_decode.c — time one decode (seqlen_q = 1) through the public API only, so the same
 * source builds against any revision's libflashattn.a (the decode counterpart of ab_time.c;
 * docs/performance.md, "bf16 decoding: the compute side").
 *
 *   usage: ab_decode N f32|f16|bf16 REPS [COLD [SPLITS [THREADS [H [HK]]]]]
 *   Q [1][1][H][128] float32 against K, V [1][N][HK][128] of the dtype (defaults: H = 32,
 *   HK = 8, SPLITS 1, THREADS 1). COLD = 1 reads a 600 MiB buffer before every run (not
 *   timed), so K/V come from DRAM. Prints the min and median of REPS runs (after one warm-up),
 *   GB/s of K/V (each byte once) and an FNV-1a hash of O. Every value is a bf16 value
 *   widened, so the three dtypes hold the same numbers and must print the same hash (the
 *   decode path's promise that a half cache gives the float32 cache's bits).
 *   AB_HUGE=1 puts Q, K and V on 2 MiB-aligned buffers with madvise(MADV_HUGEPAGE) (a caller
 *   that asks for transparent huge pages for its cache; build with -D_DEFAULT_SOURCE).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include "flashattn.h"
#include "ab_common.h"

/* A [1][n][h][d] tensor of the dtype holding bf16 values in [-1, 1). */
static void *make(fa_tensor *t, fa_dtype dt, int64_t n, int64_t h, int64_t d, uint64_t *rng)
{
    const size_t count = (size_t)(n * h * d), es = dt == FA_F32 ? 4 : 2;
    const int huge = getenv("AB_HUGE") && atoi(getenv("AB_HUGE")) > 0;
    const size_t align = huge ? (size_t)2 << 20 : 64, bytes = (count * es + align - 1) / align * align;
    void *p = aligned_alloc(align, bytes);
    if (!p) exit(2);
#ifdef MADV_HUGEPAGE
    if (huge && madvise(p, bytes, MADV_HUGEPAGE) != 0) fprintf(stderr, "ab_decode: madvise(MADV_HUGEPAGE) failed\n");
#else
    if (huge) fprintf(stderr, "ab_decode: no MADV_HUGEPAGE here (build with -D_DEFAULT_SOURCE)\n");
#endif
    for (size_t i = 0; i < count; i++) {
        const float v = ab_bf16_value(ab_to_bf16(ab_uniform(rng)));
        if (dt == FA_F32) {
            ((float *)p)[i] = v;
        } else if (dt == FA_BF16) {
            ((uint16_t *)p)[i] = ab_to_bf16(v);
        } else {
            const _Float16 x = (_Float16)v;
            memcpy((uint16_t *)p + i, &x, 2);
        }
    }
    const int64_t shape[4] = {1, n, h, d};
    if (fa_tensor_make(t, p, dt, 4, shape, NULL) != FA_OK) exit(2);
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: ab_decode N f32|f16|bf16 REPS [COLD [SPLITS [THREADS [H [HK]]]]]\n");
        return 2;
    }
    const int64_t n = atoll(argv[1]), d = 128;
    const int reps = atoi(argv[3]), cold = argc > 4 ? atoi(argv[4]) : 0;
    const int splits = argc > 5 ? atoi(argv[5]) : 1, threads = argc > 6 ? atoi(argv[6]) : 1;
    const int64_t h = argc > 7 ? atoll(argv[7]) : 32, hk = argc > 8 ? atoll(argv[8]) : 8;
    if (strcmp(argv[2], "f32") && strcmp(argv[2], "f16") && strcmp(argv[2], "bf16")) {
        fprintf(stderr, "ab_decode: dtype '%s' is not f32, f16 or bf16\n", argv[2]);
        return 2;
    }
    const fa_dtype dt = !strcmp(argv[2], "bf16") ? FA_BF16 : !strcmp(argv[2], "f16") ? FA_F16 : FA_F32;
    if (n < 1 || reps < 1 || reps > 100000 || h < 1 || hk < 1 || h % hk) {
        fprintf(stderr, "ab_decode: N, REPS (1..100000), H and HK must be positive, H a multiple of HK\n");
        return 2;
    }
    fa_options opt = fa_options_default();
    opt.num_threads = threads;
    opt.num_splits = splits;
    uint64_t rng = 0x5eed1234abcdull;
    fa_tensor q, k, v, o;
    void *bufs[4] = {make(&q, FA_F32, 1, h, d, &rng), make(&k, dt, n, hk, d, &rng), make(&v, dt, n, hk, d, &rng),
                     make(&o, FA_F32, 1, h, d, &rng)};
    const size_t evict = cold ? (size_t)600 << 20 : 0;
    char *ev = cold ? malloc(evict) : NULL;
    if (cold && !ev) return 2;
    if (ev) memset(ev, 1, evict);
    double *t = malloc(sizeof(double) * (size_t)(reps + 1));
    if (!t) return 2;
    volatile long sink = 0;
    for (int r = 0; r <= reps; r++) { /* run 0 warms up */
        if (ev) {
            long s = 0;
            for (size_t i = 0; i < evict; i += 64) s += ev[i];
            sink += s;
        }
        const double t0 = ab_now_s();
        if (fa_forward(&q, &k, &v, &o, NULL, &opt) != FA_OK) {
            fprintf(stderr, "ab_decode: %s\n", fa_last_error());
            return 1;
        }
        t[r] = ab_now_s() - t0;
    }
    qsort(t + 1, (size_t)reps, sizeof(double), ab_cmp_double);
    const double med = t[1 + reps / 2], mn = t[1], bytes = 2.0 * (double)(n * hk * d) * (dt == FA_F32 ? 4 : 2);
    uint64_t hv = 1469598103934665603ull;
    const unsigned char *ob = bufs[3];
    for (size_t i = 0; i < (size_t)(h * d) * sizeof(float); i++) hv = (hv ^ ob[i]) * 1099511628211ull;
    printf("%s n=%lld min_ms %.4f med_ms %.4f gbps_min %.2f gbps_med %.2f hash %016llx\n", argv[2], (long long)n,
           mn * 1e3, med * 1e3, bytes / mn / 1e9, bytes / med / 1e9, (unsigned long long)hv);
    for (int i = 0; i < 4; i++) free(bufs[i]);
    free(ev);
    free(t);
    return 0;
}
