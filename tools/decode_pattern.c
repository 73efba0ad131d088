/*
 * decode_pattern.c — the memory pattern of a decode step, without the library: how fast
 * one thread reads a [N][H][D] K and V cache in four orders, with a fixed amount of
 * arithmetic per 64-byte line standing in for the kernels' (docs/performance.md, "Prefetch
 * the next head", "Why bf16 still trails").
 *
 *   usage: decode_pattern ELEM_BYTES ORDER [BLOCK [FMAS [LOCALITY]]]
 *     ELEM_BYTES  4 (float32 rows) or 2 (bf16 rows); H = 8 heads, D = 128, N = 32768 keys
 *     ORDER       0: head by head within blocks of BLOCK keys, K rows then V rows (the
 *                    decoder's order), no software prefetch
 *                 1: the same, asking (prefetcht0) for the next head's rows of the block
 *                    (after the last head, the first head's rows of the next block)
 *                 2: address order: each key's rows of every head, K then V
 *                 3: head by head, asking at head h for slice h of H of the next block's
 *                    keys, every head, in address order (prefetch LOCALITY 3: t0, 2: t1,
 *                    1: t2; default 3)
 *                 4: each block read once in address order (one load a line), then head by
 *                    head from the caches (the library's touch_block on AMD)
 *                 5: as 4, but the read of the next block is spread over this block's heads:
 *                    after head h, slice h of H of the next block's keys, address order
 *                 6: head by head, asking (prefetch LOCALITY) for the next block in address
 *                    order spread evenly: a few lines before every row read
 *                 7: as 6, but a head's share asked at once, before its K rows and its V rows
 *                 8: address order in STREAMS (environment, default 4) interleaved parts of
 *                    the keys: BLOCK keys of part 0, of part 1, ... then the next BLOCK of
 *                    each (2 x STREAMS sequential streams, K and V, for the L2 streamer)
 *                 (environment GRAN=G, order 6: ask every G rows, G times as many lines)
 *     BLOCK       keys per block (default 32); FMAS: 16-lane FMAs per line read, in groups
 *                 of 8 (default 0; 16 is about the bf16 kernels' arithmetic per line)
 *   Prints GB/s (K and V bytes once over the best of 5 cold passes; a 1 GiB read before
 *   each pass, not timed, evicts the caches).
 *   AVX-512 (the first figures came from an AVX-512 core) or AVX2 (two 8-lane halves a line):
 *   build: cc -O2 -mavx512f -mfma tools/decode_pattern.c -o decode_pattern
 *          cc -O2 -mavx2 -mfma tools/decode_pattern.c -o decode_pattern
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <immintrin.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { H = 8, D = 128 };
static const long N = 32768;

#ifdef __AVX512F__
static __m512i acc;
static __m512 f[8];
#else
static __m256i acc;
static __m256 f[8];
#endif
static int fmas;

/* Read one row (bytes long, 64-byte aligned): XOR every line into acc, and do `fmas` FMAs
 * per line on it into 8 independent accumulators (held in registers for the row). AVX2:
 * a line is two 8-lane halves, and each 16-lane FMA of FMAS is two 8-lane ones, so the
 * arithmetic per line is the same count of float32 multiply-adds. */
static void use_row(const char *row, size_t bytes)
{
#ifdef __AVX512F__
    const __m512 m = _mm512_set1_ps(0.9999f);
    __m512i x_acc = acc;
    __m512 f0 = f[0], f1 = f[1], f2 = f[2], f3 = f[3], f4 = f[4], f5 = f[5], f6 = f[6], f7 = f[7];
    for (size_t b = 0; b < bytes; b += 64) {
        const __m512i v = _mm512_load_si512((const void *)(row + b));
        x_acc = _mm512_xor_si512(x_acc, v);
        const __m512 w = _mm512_castsi512_ps(v);
        for (int k = 0; k < fmas; k += 8) {
            f0 = _mm512_fmadd_ps(w, m, f0); f1 = _mm512_fmadd_ps(w, m, f1);
            f2 = _mm512_fmadd_ps(w, m, f2); f3 = _mm512_fmadd_ps(w, m, f3);
            f4 = _mm512_fmadd_ps(w, m, f4); f5 = _mm512_fmadd_ps(w, m, f5);
            f6 = _mm512_fmadd_ps(w, m, f6); f7 = _mm512_fmadd_ps(w, m, f7);
        }
    }
#else
    const __m256 m = _mm256_set1_ps(0.9999f);
    __m256i x_acc = acc;
    __m256 f0 = f[0], f1 = f[1], f2 = f[2], f3 = f[3], f4 = f[4], f5 = f[5], f6 = f[6], f7 = f[7];
    for (size_t b = 0; b < bytes; b += 64) {
        const __m256i v0 = _mm256_load_si256((const __m256i *)(const void *)(row + b));
        const __m256i v1 = _mm256_load_si256((const __m256i *)(const void *)(row + b + 32));
        x_acc = _mm256_xor_si256(x_acc, _mm256_xor_si256(v0, v1));
        const __m256 w0 = _mm256_castsi256_ps(v0), w1 = _mm256_castsi256_ps(v1);
        for (int k = 0; k < fmas; k += 8) {
            f0 = _mm256_fmadd_ps(w0, m, f0); f1 = _mm256_fmadd_ps(w0, m, f1);
            f2 = _mm256_fmadd_ps(w0, m, f2); f3 = _mm256_fmadd_ps(w0, m, f3);
            f4 = _mm256_fmadd_ps(w0, m, f4); f5 = _mm256_fmadd_ps(w0, m, f5);
            f6 = _mm256_fmadd_ps(w0, m, f6); f7 = _mm256_fmadd_ps(w0, m, f7);
            f0 = _mm256_fmadd_ps(w1, m, f0); f1 = _mm256_fmadd_ps(w1, m, f1);
            f2 = _mm256_fmadd_ps(w1, m, f2); f3 = _mm256_fmadd_ps(w1, m, f3);
            f4 = _mm256_fmadd_ps(w1, m, f4); f5 = _mm256_fmadd_ps(w1, m, f5);
            f6 = _mm256_fmadd_ps(w1, m, f6); f7 = _mm256_fmadd_ps(w1, m, f7);
        }
    }
#endif
    acc = x_acc;
    f[0] = f0; f[1] = f1; f[2] = f2; f[3] = f3; f[4] = f4; f[5] = f5; f[6] = f6; f[7] = f7;
}

/* Keys j0 .. j0+n-1, every head, in address order (one contiguous stretch per key row). */
static void ask_keys(const char *base, long j0, int n, size_t keyb, int loc)
{
    const char *r = base + (size_t)j0 * keyb;
    for (size_t b = 0; b < (size_t)n * keyb; b += 64) {
        if (loc == 3) __builtin_prefetch(r + b, 0, 3);
        else if (loc == 2) __builtin_prefetch(r + b, 0, 2);
        else __builtin_prefetch(r + b, 0, 1);
    }
}

/* Keys j0 .. j0+n-1, every head, in address order: one demand load a line (a touch). */
static void touch_keys(const char *base, long j0, int n, size_t keyb)
{
    const char *r = base + (size_t)j0 * keyb;
    for (size_t b = 0; b < (size_t)n * keyb; b += 64) (void)*(const volatile char *)(r + b);
}

/* Order 6's cursor: the next block's K then V lines, handed out a few at a time. */
static const char *cur_k, *cur_v, *cur_kend, *cur_vend;
static size_t cur_step;
static int cur_loc, gran = 1;

static void ask_some(void)
{
    for (size_t i = 0; i < cur_step; i++) {
        const char *q;
        if (cur_k < cur_kend) q = cur_k, cur_k += 64;
        else if (cur_v < cur_vend) q = cur_v, cur_v += 64;
        else return;
        if (cur_loc == 3) __builtin_prefetch(q, 0, 3);
        else if (cur_loc == 2) __builtin_prefetch(q, 0, 2);
        else __builtin_prefetch(q, 0, 1);
    }
}

static void ask_rows(const char *base, long j0, int n, int h, size_t keyb, size_t rowb)
{
    for (int x = 0; x < n; x++) {
        const char *r = base + (size_t)(j0 + x) * keyb + (size_t)h * rowb;
        for (size_t b = 0; b < rowb; b += 64) __builtin_prefetch(r + b, 0, 3);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: decode_pattern ELEM_BYTES ORDER [BLOCK [FMAS [LOCALITY]]]\n");
        return 2;
    }
    const int esz = atoi(argv[1]), order = atoi(argv[2]), bc = argc > 3 ? atoi(argv[3]) : 32;
    fmas = argc > 4 ? atoi(argv[4]) : 0;
    const int loc = argc > 5 ? atoi(argv[5]) : 3;
    if (getenv("GRAN")) gran = atoi(getenv("GRAN")); /* order 6: ask every GRAN rows */
    if ((esz != 2 && esz != 4) || order < 0 || order > 8 || loc < 1 || loc > 3 || bc < 1 || bc > 4096 || fmas < 0 ||
        fmas > 256) {
        fprintf(stderr, "decode_pattern: ELEM_BYTES 2|4, ORDER 0..8, BLOCK 1..4096, FMAS 0..256, LOCALITY 1..3\n");
        return 2;
    }
    const size_t rowb = (size_t)D * (size_t)esz, keyb = rowb * H, total = keyb * (size_t)N;
    char *K = aligned_alloc(4096, total), *V = aligned_alloc(4096, total);
    const size_t evb = (size_t)1 << 30;
    char *E = malloc(evb);
    if (!K || !V || !E) return 2;
    memset(K, 1, total);
    memset(V, 2, total);
    memset(E, 3, evb);
#ifdef __AVX512F__
    for (int k = 0; k < 8; k++) f[k] = _mm512_set1_ps((float)(k + 1)); /* far from subnormal sums */
#else
    for (int k = 0; k < 8; k++) f[k] = _mm256_set1_ps((float)(k + 1));
#endif
    double best = 1e30;
    volatile uint64_t sink = 0;
    for (int pass = 0; pass < 5; pass++) {
        for (size_t i = 0; i < evb; i += 64) sink += (uint64_t)E[i];
        const double t0 = now();
        if (order == 8) {
            const long ns = getenv("STREAMS") ? atol(getenv("STREAMS")) : 4, part = (N + ns - 1) / ns;
            for (long t0 = 0; t0 < part; t0 += bc)
                for (long sidx = 0; sidx < ns; sidx++)
                    for (long j = sidx * part + t0; j < sidx * part + t0 + bc && j < (sidx + 1) * part && j < N; j++) {
                        use_row(K + (size_t)j * keyb, keyb);
                        use_row(V + (size_t)j * keyb, keyb);
                    }
        } else if (order == 2) {
            for (long j = 0; j < N; j++) {
                use_row(K + (size_t)j * keyb, keyb);
                use_row(V + (size_t)j * keyb, keyb);
            }
        } else {
            for (long j0 = 0; j0 < N; j0 += bc) {
                const int n = N - j0 < bc ? (int)(N - j0) : bc;
                if (order == 4 || (order == 5 && j0 == 0)) {
                    touch_keys(K, j0, n, keyb);
                    touch_keys(V, j0, n, keyb);
                }
                if (order == 6 || order == 7) {
                    const long a0 = j0 + bc < N ? j0 + bc : N, a1 = j0 + 2 * bc < N ? j0 + 2 * bc : N;
                    cur_k = K + (size_t)a0 * keyb, cur_kend = K + (size_t)a1 * keyb;
                    cur_v = V + (size_t)a0 * keyb, cur_vend = V + (size_t)a1 * keyb;
                    cur_step = ((size_t)(a1 - a0) * keyb * 2 / 64 + (size_t)(2 * n * H) - 1) / (size_t)(2 * n * H);
                    cur_loc = loc;
                }
                for (int h = 0; h < H; h++) {
                    const int th = h + 1 < H ? h + 1 : 0;
                    const long tj = h + 1 < H ? j0 : j0 + bc;
                    const int tn = tj >= N ? 0 : (N - tj < bc ? (int)(N - tj) : bc);
                    if (order == 3 || order == 5) { /* slice h of the next block, address order */
                        const long a0 = j0 + bc + (long)h * bc / H, a1 = j0 + bc + (long)(h + 1) * bc / H;
                        const long e = a1 < N ? a1 : N;
                        if (e > a0 && order == 3) {
                            ask_keys(K, a0, (int)(e - a0), keyb, loc);
                            ask_keys(V, a0, (int)(e - a0), keyb, loc);
                        } else if (e > a0) {
                            touch_keys(K, a0, (int)(e - a0), keyb);
                            touch_keys(V, a0, (int)(e - a0), keyb);
                        }
                    }
                    if (order == 1) ask_rows(K, tj, tn, th, keyb, rowb);
                    if (order == 7) for (int x = 0; x < n; x++) ask_some();
                    for (int x = 0; x < n; x++) {
                        if (order == 6 && x % gran == 0) for (int y = 0; y < gran; y++) ask_some();
                        use_row(K + (size_t)(j0 + x) * keyb + (size_t)h * rowb, rowb);
                    }
                    if (order == 1) ask_rows(V, tj, tn, th, keyb, rowb);
                    if (order == 7) for (int x = 0; x < n; x++) ask_some();
                    for (int x = 0; x < n; x++) {
                        if (order == 6 && x % gran == 0) for (int y = 0; y < gran; y++) ask_some();
                        use_row(V + (size_t)(j0 + x) * keyb + (size_t)h * rowb, rowb);
                    }
                }
            }
        }
        const double t = now() - t0;
        if (t < best) best = t;
    }
#ifdef __AVX512F__
    __m512 t = f[0];
    for (int k = 1; k < 8; k++) t = _mm512_add_ps(t, f[k]);
    const double s = (double)_mm512_reduce_add_ps(t) + (double)_mm512_reduce_add_epi64(acc);
#else
    __m256 t = f[0];
    for (int k = 1; k < 8; k++) t = _mm256_add_ps(t, f[k]);
    float tl[8];
    long long al[4];
    _mm256_storeu_ps(tl, t);
    _mm256_storeu_si256((__m256i *)(void *)al, acc);
    double s = 0.0;
    for (int k = 0; k < 8; k++) s += (double)tl[k];
    for (int k = 0; k < 4; k++) s += (double)al[k];
#endif
    printf("elem %d B, order %d, block %d, %d FMAs/line: %.2f GB/s (checksum %g)\n", esz, order, bc, fmas,
           2.0 * (double)total / best / 1e9, s + (double)(sink & 1));
    free(K);
    free(V);
    free(E);
    return 0;
}
