/*
 * pack_pattern.c — how fast one thread packs K and V the way flash.c's shared packing
 * does, without the library: K [N][8][D] float32 (BSHD, one batch) transposed per
 * 256-key block into a [D][256] panel, V copied into [256][D] rows, head after head,
 * every head into the same slot (N x D x 2 floats: 1 MiB at N = 2048, D = 64, 2 MiB at
 * D = 128 — like the library's shared slot, partly in L2 and partly in L3), the source
 * evicted from the caches (a 256 MiB read, not timed) before each of 7 passes.
 * It isolates what the hardware prefetchers do with rows 8 x D floats apart: one 4 KiB
 * page per row at D = 128 (src/kernels/avx512_transpose.c's comment quotes its figures).
 *
 *   usage: pack_pattern PF [N [D [AHEAD [OFFSET]]]]
 *     PF     0: no software prefetch of K rows; 1: prefetcht1 (into L2); 2: prefetcht0
 *            (each 16-row step asks for rows AHEAD .. AHEAD+15 further on, whole; V rows
 *            are asked for 8 ahead with prefetcht1 in every mode, as fa_pack_rows does)
 *     N      keys (default 2048, a multiple of 256); D 64 or 128 (default 128);
 *            AHEAD 16 (default) .. 128; OFFSET 0 (default) .. 60 bytes, a multiple of 4: the
 *            source placed that far past a 64-byte line (malloc's large blocks: 16)
 *   Prints the best pass's time and GB/s of K and V read.
 *   AVX-512 only:  cc -O2 -mavx512f tools/pack_pattern.c -o pack_pattern
 */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { H = 8, BC = 256 };

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* out[c] = column c of the 16 x 16 block r (the library's four shuffle stages) */
static inline void transpose16(const __m512 r[16], __m512 out[16])
{
    __m512 a[16], b[16];
    for (int i = 0; i < 16; i += 2) {
        a[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        a[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) {
        const __m512d a0 = _mm512_castps_pd(a[g]), a1 = _mm512_castps_pd(a[g + 1]);
        const __m512d a2 = _mm512_castps_pd(a[g + 2]), a3 = _mm512_castps_pd(a[g + 3]);
        b[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
        b[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
        b[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
        b[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
    }
    for (int m = 0; m < 4; m++) {
        const __m512 s1 = _mm512_shuffle_f32x4(b[m], b[4 + m], 0x88), s2 = _mm512_shuffle_f32x4(b[m], b[4 + m], 0xdd);
        const __m512 s3 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0x88);
        const __m512 s4 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0xdd);
        out[m] = _mm512_shuffle_f32x4(s1, s3, 0x88);
        out[4 + m] = _mm512_shuffle_f32x4(s2, s4, 0x88);
        out[8 + m] = _mm512_shuffle_f32x4(s1, s3, 0xdd);
        out[12 + m] = _mm512_shuffle_f32x4(s2, s4, 0xdd);
    }
}

static int pf, ahead = 16, dim = 128;

static void pack_k(const float *k, size_t ldk, float *kt)
{
    for (int jb = 0; jb < BC; jb += 16) {
        for (int jj = jb + ahead; pf && jj < jb + ahead + 16 && jj < BC; jj++) {
            /* the whole row, to the line of its last byte (as the library asks) */
            const char *row = (const char *)(k + (size_t)jj * ldk);
            const size_t span = (size_t)dim * sizeof(float) + ((uintptr_t)row & 63);
            for (size_t b = 0; b < span; b += 64) {
                if (pf == 1) _mm_prefetch(row + b, _MM_HINT_T1);
                else _mm_prefetch(row + b, _MM_HINT_T0);
            }
        }
        for (int cb = 0; cb < dim; cb += 16) {
            __m512 r[16], out[16];
            for (int jj = 0; jj < 16; jj++) r[jj] = _mm512_loadu_ps(k + (size_t)(jb + jj) * ldk + cb);
            transpose16(r, out);
            for (int cc = 0; cc < 16; cc++) _mm512_storeu_ps(kt + (size_t)(cb + cc) * BC + jb, out[cc]);
        }
    }
}

static void pack_v(const float *v, size_t ldv, float *dst)
{
    for (int r = 0; r < BC; r++) {
        if (r + 8 < BC) { /* fa_pack_rows: the row 8 ahead, whole */
            const char *row = (const char *)(v + (size_t)(r + 8) * ldv);
            const size_t span = (size_t)dim * sizeof(float) + ((uintptr_t)row & 63);
            for (size_t b = 0; b < span; b += 64) _mm_prefetch(row + b, _MM_HINT_T1);
        }
        memcpy(dst + (size_t)r * dim, v + (size_t)r * ldv, (size_t)dim * sizeof(float));
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: pack_pattern PF [N [D [AHEAD [OFFSET]]]]\n");
        return 2;
    }
    pf = atoi(argv[1]);
    const int n = argc > 2 ? atoi(argv[2]) : 2048;
    dim = argc > 3 ? atoi(argv[3]) : 128;
    ahead = argc > 4 ? atoi(argv[4]) : 16;
    const int offset = argc > 5 ? atoi(argv[5]) : 0;
    if (pf < 0 || pf > 2 || n < BC || n % BC || (dim != 64 && dim != 128) || ahead < 16 || ahead > 128 ||
        offset < 0 || offset > 60 || offset % 4) {
        fprintf(stderr, "pack_pattern: PF 0..2, N a multiple of 256, D 64|128, AHEAD 16..128, OFFSET 0..60 (x4)\n");
        return 2;
    }
    const size_t total = (size_t)n * H * (size_t)dim, evb = (size_t)256 << 20;
    char *kbuf = aligned_alloc(64, total * sizeof(float) + 64), *vbuf = aligned_alloc(64, total * sizeof(float) + 64);
    if (!kbuf || !vbuf) return 2;
    float *k = (float *)(void *)(kbuf + offset), *v = (float *)(void *)(vbuf + offset);
    float *slot = aligned_alloc(64, (size_t)n * (size_t)dim * 2 * sizeof(float));
    char *e = malloc(evb);
    if (!slot || !e) return 2;
    for (size_t i = 0; i < total; i++) k[i] = v[i] = (float)(i & 1023);
    memset(slot, 0, (size_t)n * (size_t)dim * 2 * sizeof(float));
    memset(e, 1, evb);
    volatile unsigned long sink = 0;
    double best = 1e30;
    const size_t ld = (size_t)H * (size_t)dim;
    for (int pass = 0; pass < 7; pass++) {
        for (size_t i = 0; i < evb; i += 64) sink += (unsigned long)e[i];
        const double t0 = now();
        for (int h = 0; h < H; h++)
            for (int kb = 0; kb < n / BC; kb++) {
                const size_t src = ((size_t)kb * BC * H + (size_t)h) * (size_t)dim;
                pack_k(k + src, ld, slot + (size_t)kb * (size_t)dim * BC);
                pack_v(v + src, ld, slot + (size_t)n * (size_t)dim + (size_t)kb * BC * (size_t)dim);
            }
        const double t = now() - t0;
        if (t < best) best = t;
    }
    printf("pf %d N %d D %d ahead %d offset %d: %.3f ms, %.2f GB/s of K and V read (check %lu)\n", pf, n, dim, ahead, offset,
           best * 1e3, 2.0 * (double)total * sizeof(float) / best / 1e9, (unsigned long)(sink & 1) + (unsigned long)slot[7]);
    free(kbuf);
    free(vbuf);
    free(slot);
    free(e);
    return 0;
}
