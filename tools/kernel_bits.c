/*
 * kernel_bits.c — a hash of one kernel table's output bits over EVERY float, for checking that
 * a kernel change keeps the bits: the `transform` line (softcap c = 1 and 30, with its
 * derivative line), `vexp`, `softmax` over rows of 256 (consecutive float patterns, and
 * rows of -|x| after a 0 so that every exponent argument in (-inf, 0] is met), and `bwd_line`
 * in its four modes (every float as a score, masked lanes at both ends). Build it against
 * two revisions' libraries and compare the printed hashes (about 3 minutes an ISA):
 *
 *   cc -std=c11 -O2 -Isrc -Iinclude tools/kernel_bits.c build/libflashattn.a -fopenmp -lm \
 *      -o /tmp/kernel_bits && /tmp/kernel_bits avx512
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"

enum { B = 4096 }; /* floats a call: 16 rows of 256 for softmax */

static uint64_t mix(uint64_t h, const float *v, int n)
{
    uint32_t u;
    for (int i = 0; i < n; i++) {
        memcpy(&u, v + i, 4);
        h = (h ^ u) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    return h;
}

/* s[i] = the float whose bits are u0 + i */
static void fill(float *s, uint64_t u0)
{
    for (int i = 0; i < B; i++) {
        const uint32_t u = (uint32_t)(u0 + (uint64_t)i);
        memcpy(&s[i], &u, 4);
    }
}

int main(int argc, char **argv)
{
    const fa_kernels *k = argc > 1 ? fa_kernels_by_name(argv[1]) : NULL;
    if (!k) {
        fprintf(stderr, "usage: kernel_bits ISA   (scalar, avx2, avx512, neon: one this CPU runs)\n");
        return 2;
    }
    static float s[B], y[B], g[B], m[16], l[16], al[16];
    static const float caps[2] = {1.0f, 30.0f};
    for (int ci = 0; ci < 2; ci++) {
        uint64_t h = 1469598103934665603ull;
        for (uint64_t u0 = 0; u0 < (1ull << 32); u0 += B) {
            fill(s, u0);
            k->transform(B, 0, B, s, caps[ci], 1.0f / caps[ci], 0.0, 0, 1, g);
            h = mix(mix(h, s, B), g, B);
        }
        printf("%s transform cap %g: %016llx\n", argv[1], caps[ci], (unsigned long long)h);
    }
    uint64_t h = 1469598103934665603ull;
    for (uint64_t u0 = 0; u0 < (1ull << 32); u0 += B) {
        fill(s, u0);
        k->vexp(B, s, y);
        h = mix(h, y, B);
    }
    printf("%s vexp: %016llx\n", argv[1], (unsigned long long)h);
    for (int pattern = 0; pattern < 2; pattern++) {
        h = 1469598103934665603ull;
        for (uint64_t u0 = 0; u0 < (1ull << 32); u0 += B) {
            fill(s, u0);
            if (pattern) /* each row: a small non-negative first score, then -|x| */
                for (int i = 0; i < B; i++) s[i] = i % 256 == 0 ? (float)(u0 >> 24) : -fabsf(s[i]);
            for (int r = 0; r < 16; r++) {
                m[r] = -INFINITY;
                l[r] = 0.0f;
            }
            k->softmax(16, 256, s, 256, m, l, al);
            h = mix(mix(mix(mix(h, s, B), m, 16), l, 16), al, 16);
        }
        printf("%s softmax rows %d: %016llx\n", argv[1], pattern, (unsigned long long)h);
    }
    /* bwd_line: every float as a score, P = exp(s - L) and dS = P (dP - D) [* g] on lines of
     * B with a masked prefix and suffix (visible [5, B - 3)), each (per_elem, g) mode; L, D,
     * dP and g vary along the line in short cycles */
    static float dp[B], dp0[B], lse[B], dd[B];
    for (int i = 0; i < B; i++) {
        dp0[i] = (float)(i % 7) - 3.0f;
        lse[i] = (float)(i % 5) - 1.0f;
        dd[i] = 0.25f * (float)(i % 3);
        g[i] = 1.0f - (float)(i % 11) / 16.0f;
    }
    for (int mode = 0; mode < 4; mode++) {
        const int per = mode & 1, wg = mode >> 1;
        h = 1469598103934665603ull;
        for (uint64_t u0 = 0; u0 < (1ull << 32); u0 += B) {
            fill(s, u0);
            memcpy(dp, dp0, sizeof dp);
            k->bwd_line(B, 5, B - 3, s, dp, lse, dd, per, wg ? g : NULL);
            h = mix(mix(h, s, B), dp, B);
        }
        printf("%s bwd_line per_elem %d g %d: %016llx\n", argv[1], per, wg, (unsigned long long)h);
    }
    return 0;
}
