/*
 * fuzz_attention.c — libFuzzer harness: small random attention problems,
 * flash and standard checked against the float64 reference, forward and
 * backward.
 *
 * The first 16 bytes of the input choose the problem; the rest seeds the
 * values (so a short input is a complete problem and mutations of the header
 * explore shapes and options directly):
 *
 *   byte  0   batch 1..2                  byte  8   window_left 0..39
 *   byte  1   seqlen_q 0..47              byte  9   window_right 0..39
 *   byte  2   seqlen_k 0..47              byte 10   softcap (bits 0-1), scale (bits 2-4)
 *   byte  3   heads_k 1..3, group 1..3    byte 11   block_q (0 = derived, else 1..40)
 *   byte  4   d 1..48                     byte 12   block_k (0 = derived, else 1..40)
 *   byte  5   d_v 1..48                   byte 13   value amplitude, ALiBi slope scale
 *   byte  6   dtypes of q, k, v, o        byte 14   lse dtype, which tensors are BHSD
 *   byte  7   flags: causal, window_left on, window_right on, softcap on,
 *             alibi per head, alibi per batch x head, lse wanted, zero-stride K
 *
 * What must hold, for every decoded problem:
 *   - fa_forward returns FA_OK for all three implementations;
 *   - every element of O and LSE is written (they are poisoned with NaN first);
 *   - a row with no visible key (computed here from the mask rule directly) is
 *     exactly O = 0, LSE = -inf in every implementation;
 *   - flash and standard are within a tolerance of reference derived from the
 *     logit bound (float32 dot products of length d) and the output dtype;
 *   - the backward pass (flash and reference, O and LSE recomputed) writes
 *     every element of dQ, dK, dV with a finite value, and flash agrees with
 *     reference within a loose bound when the logits are tame.
 * Anything else aborts, which libFuzzer records as a crash.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

#define HEADER 16

static void fail(const char *what, long long a, long long b, double x, double y)
{
    fprintf(stderr, "fuzz_attention: %s (%lld, %lld): %.9g vs %.9g\n", what, a, b, x, y);
    abort();
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Round-to-nearest-even float -> half / bfloat16 bits (written here, not taken from the library). */
static uint16_t to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static uint16_t to_f16(float f)
{
    /* values here are |f| <= 8, normal or zero in half precision after rounding */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax < 0x38800000u) return (uint16_t)sign; /* tiny: flush to zero (still a valid input) */
    uint32_t r = ax - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

static size_t dsize(fa_dtype t) { return t == FA_F64 ? 8 : t == FA_F32 ? 4 : 2; }

/* A rank-4 tensor [d0][d1][d2][d3], stored BSHD or (bhsd) as [d0][d2][d1][d3]. */
typedef struct buf4 {
    fa_tensor t;
    void *mem;
} buf4;

static buf4 make4(fa_dtype dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3, int bhsd)
{
    buf4 b;
    size_t n = (size_t)(d0 * d1 * d2 * d3);
    b.mem = malloc((n ? n : 1) * dsize(dt));
    int64_t shape[4] = {d0, d1, d2, d3};
    int64_t stride[4];
    if (bhsd) {
        stride[3] = 1; stride[1] = d3; stride[2] = d1 * d3; stride[0] = d2 * d1 * d3;
    } else {
        stride[3] = 1; stride[2] = d3; stride[1] = d2 * d3; stride[0] = d1 * d2 * d3;
    }
    if (fa_tensor_make(&b.t, b.mem, dt, 4, shape, stride) != FA_OK) fail("tensor_make", 0, 0, 0, 0);
    return b;
}

static void fill(buf4 *b, uint64_t *rng, double amp)
{
    size_t n = (size_t)fa_tensor_numel(&b->t);
    for (size_t i = 0; i < n; i++) {
        float x = (float)(amp * ((double)(splitmix(rng) >> 11) * 0x1.0p-53 * 2.0 - 1.0));
        switch (b->t.dtype) {
        case FA_F32: ((float *)b->mem)[i] = x; break;
        case FA_F64: ((double *)b->mem)[i] = x; break;
        case FA_F16: ((uint16_t *)b->mem)[i] = to_f16(x); break;
        default: ((uint16_t *)b->mem)[i] = to_bf16(x); break;
        }
    }
}

static void poison(void *mem, size_t bytes) { memset(mem, 0xFF, bytes); } /* NaN in every dtype */

static double get(const fa_tensor *t, const int64_t *idx)
{
    int64_t off = 0;
    for (int r = 0; r < t->rank; r++) off += idx[r] * t->stride[r];
    switch (t->dtype) {
    case FA_F32: return ((const float *)t->data)[off];
    case FA_F64: return ((const double *)t->data)[off];
    case FA_F16: {
        uint16_t h = ((const uint16_t *)t->data)[off];
        int e = (h >> 10) & 31, m = h & 1023;
        double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
        return (h & 0x8000) ? -v : v;
    }
    default: {
        uint32_t bits = (uint32_t)((const uint16_t *)t->data)[off] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    }
}

static double max_abs(const fa_tensor *t)
{
    double m = 0;
    int64_t idx[4];
    for (idx[0] = 0; idx[0] < t->shape[0]; idx[0]++)
        for (idx[1] = 0; idx[1] < t->shape[1]; idx[1]++)
            for (idx[2] = 0; idx[2] < t->shape[2]; idx[2]++)
                for (idx[3] = 0; idx[3] < t->shape[3]; idx[3]++) m = fmax(m, fabs(get(t, idx)));
    return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t h[HEADER] = {0};
    memcpy(h, data, size < HEADER ? size : HEADER);
    uint64_t rng = 0x5eed;
    for (size_t i = HEADER; i < size; i++) rng = (rng ^ data[i]) * 0x100000001b3ull;

    const int64_t B = 1 + h[0] % 2, Sq = h[1] % 48, Sk = h[2] % 48;
    const int64_t Hk = 1 + h[3] % 3, H = Hk * (1 + (h[3] / 3) % 3);
    const int64_t d = 1 + h[4] % 48, dv = 1 + h[5] % 48;
    const fa_dtype dt_q = (fa_dtype)(h[6] & 3), dt_k = (fa_dtype)((h[6] >> 2) & 3);
    const fa_dtype dt_v = (fa_dtype)((h[6] >> 4) & 3), dt_o = (fa_dtype)((h[6] >> 6) & 3);
    const int causal = h[7] & 1, want_lse = (h[7] >> 6) & 1, zero_stride_k = (h[7] >> 7) & 1;
    static const double softcaps[4] = {0.5, 1.0, 5.0, 30.0};
    static const double scales[8] = {0.0, 0.05, 0.3, 1.0, 2.0, 0.001, 0.7, 0.0};
    static const double amps[4] = {0.5, 1.0, 2.0, 4.0};
    const double amp = amps[h[13] & 3], slope_scale = 0.05 * (1 + ((h[13] >> 2) & 15));
    const fa_dtype dt_lse = (h[14] & 1) ? FA_F64 : FA_F32;

    fa_options opt = fa_options_default();
    opt.causal = causal;
    opt.window_left = (h[7] & 2) ? h[8] % 40 : -1;
    opt.window_right = (h[7] & 4) ? h[9] % 40 : -1;
    opt.softcap = (h[7] & 8) ? softcaps[h[10] & 3] : 0.0;
    opt.scale = scales[(h[10] >> 2) & 7];
    opt.block_q = h[11] ? 1 + h[11] % 40 : 0;
    opt.block_k = h[12] ? 1 + h[12] % 40 : 0;
    opt.num_threads = 1;

    buf4 q = make4(dt_q, B, Sq, H, d, (h[14] >> 1) & 1);
    buf4 k = make4(dt_k, B, Sk, Hk, d, (h[14] >> 2) & 1);
    buf4 v = make4(dt_v, B, Sk, Hk, dv, (h[14] >> 3) & 1);
    fill(&q, &rng, amp);
    fill(&k, &rng, amp);
    fill(&v, &rng, amp);
    if (zero_stride_k && Sk > 0) k.t.stride[1] = 0; /* every key row is the first one: a legal view */

    double slopes[2 * 9];
    fa_tensor alibi;
    double slope_max = 0;
    if (h[7] & 0x30) {
        int per_batch = (h[7] & 0x20) != 0;
        int64_t n = per_batch ? B * H : H;
        for (int64_t i = 0; i < n; i++) {
            slopes[i] = slope_scale * (double)(splitmix(&rng) >> 11) * 0x1.0p-53;
            slope_max = fmax(slope_max, slopes[i]);
        }
        int64_t shape[2] = {per_batch ? B : H, H};
        if (fa_tensor_make(&alibi, slopes, FA_F64, per_batch ? 2 : 1, per_batch ? shape : shape + 1,
                           NULL) != FA_OK)
            fail("alibi tensor", 0, 0, 0, 0);
        opt.alibi_slopes = &alibi;
    }

    buf4 o[3];
    fa_tensor lse[3];
    void *lse_mem[3];
    const fa_impl impls[3] = {FA_IMPL_REFERENCE, FA_IMPL_FLASH, FA_IMPL_STANDARD};
    for (int r = 0; r < 3; r++) {
        o[r] = make4(dt_o, B, Sq, H, dv, (h[14] >> 4) & 1);
        poison(o[r].mem, (size_t)(B * Sq * H * dv) * dsize(dt_o) + (B * Sq * H * dv == 0));
        int64_t lshape[3] = {B, H, Sq};
        lse_mem[r] = malloc((size_t)(B * H * Sq + 1) * dsize(dt_lse));
        poison(lse_mem[r], (size_t)(B * H * Sq + 1) * dsize(dt_lse));
        fa_tensor_make(&lse[r], lse_mem[r], dt_lse, 3, lshape, NULL);
        opt.impl = impls[r];
        fa_status st = fa_forward(&q.t, &k.t, &v.t, &o[r].t, want_lse ? &lse[r] : NULL, &opt);
        if (st != FA_OK) {
            fprintf(stderr, "fuzz_attention: %s failed: %s: %s\n", fa_impl_name(impls[r]),
                    fa_status_string(st), fa_last_error());
            abort();
        }
    }

    /* Tolerance: float32 logits carry ~d ulps of the logit bound; outputs are rounded to dt_o. */
    const double scale = opt.scale != 0 ? opt.scale : 1.0 / sqrt((double)d);
    double bound = scale * (double)d * max_abs(&q.t) * max_abs(&k.t);
    if (opt.softcap > 0 && bound > opt.softcap) bound = opt.softcap;
    bound += slope_max * 96.0;
    const double ds = 8.0 * ((double)d + 8.0) * FLT_EPSILON * (1.0 + bound);
    const double vmax = max_abs(&v.t);
    const double out_ulp = dt_o == FA_BF16 ? 0x1.0p-8 : dt_o == FA_F16 ? 0x1.0p-10 : 0x1.0p-22;
    const double tol_o = vmax * (expm1(2.0 * ds) + 2.0 * out_ulp) + 1e-6;
    const double tol_lse = ds + 1e-6 * (1.0 + bound);

    const int64_t wl = opt.window_left, wr = causal ? 0 : opt.window_right;
    for (int64_t b = 0; b < B; b++)
        for (int64_t hh = 0; hh < H; hh++)
            for (int64_t i = 0; i < Sq; i++) {
                /* mask rule, restated: key j visible iff diag-wl <= j <= diag+wr, 0 <= j < Sk */
                int64_t diag = i + Sk - Sq, lo = 0, hi = Sk - 1;
                if (wl >= 0 && diag - wl > lo) lo = diag - wl;
                if (wr >= 0 && diag + wr < hi) hi = diag + wr;
                const int empty = lo > hi;
                for (int r = 0; r < 3; r++) {
                    for (int64_t c = 0; c < dv; c++) {
                        int64_t idx[4] = {b, i, hh, c};
                        double x = get(&o[r].t, idx), ref = get(&o[0].t, idx);
                        if (isnan(x)) fail("O not written or NaN", i, c, x, ref);
                        if (empty && x != 0.0) fail("empty row O != 0", i, c, x, 0);
                        if (fabs(x - ref) > tol_o) fail(r == 1 ? "flash O off" : "standard O off", i, c, x, ref);
                    }
                    if (!want_lse) continue;
                    int64_t li[3] = {b, hh, i};
                    double x = get(&lse[r], li), ref = get(&lse[0], li);
                    if (isnan(x)) fail("LSE not written or NaN", b, i, x, ref);
                    if (empty != (x == -INFINITY)) fail("LSE -inf iff the row is empty", b, i, x, ref);
                    if (!empty && fabs(x - ref) > tol_lse)
                        fail(r == 1 ? "flash LSE off" : "standard LSE off", b, i, x, ref);
                }
            }

    /*
     * Backward: flash against reference (O and LSE recomputed inside). Every
     * gradient element must be written and finite; where the logits are tame
     * (bound <= 8) flash must agree with reference to a loose tolerance.
     */
    {
        buf4 dout = make4(FA_F32, B, Sq, H, dv, 0);
        fill(&dout, &rng, 1.0);
        buf4 g[2][3];
        for (int r = 0; r < 2; r++) {
            g[r][0] = make4(FA_F32, B, Sq, H, d, 0);
            g[r][1] = make4(FA_F32, B, Sk, Hk, d, 0);
            g[r][2] = make4(FA_F32, B, Sk, Hk, dv, 0);
            for (int t = 0; t < 3; t++)
                poison(g[r][t].mem, (size_t)fa_tensor_numel(&g[r][t].t) * 4);
            opt.impl = r == 0 ? FA_IMPL_REFERENCE : FA_IMPL_FLASH;
            fa_status st = fa_backward(&q.t, &k.t, &v.t, NULL, NULL, &dout.t, &g[r][0].t, &g[r][1].t,
                                       &g[r][2].t, &opt);
            if (st != FA_OK) {
                fprintf(stderr, "fuzz_attention: backward %s failed: %s: %s\n", fa_impl_name(opt.impl),
                        fa_status_string(st), fa_last_error());
                abort();
            }
        }
        for (int t = 0; t < 3; t++) {
            const double gmax = max_abs(&g[0][t].t);
            const double tol = 1e-3 * (1.0 + gmax) * (1.0 + bound);
            int64_t idx[4];
            const fa_tensor *ref = &g[0][t].t;
            for (idx[0] = 0; idx[0] < ref->shape[0]; idx[0]++)
                for (idx[1] = 0; idx[1] < ref->shape[1]; idx[1]++)
                    for (idx[2] = 0; idx[2] < ref->shape[2]; idx[2]++)
                        for (idx[3] = 0; idx[3] < ref->shape[3]; idx[3]++) {
                            double x = get(&g[1][t].t, idx), y = get(ref, idx);
                            if (!isfinite(x) || !isfinite(y)) fail("gradient not written or not finite", t, idx[1], x, y);
                            if (bound <= 8.0 && fabs(x - y) > tol) fail("flash gradient off", t, idx[1], x, y);
                        }
        }
        for (int r = 0; r < 2; r++)
            for (int t = 0; t < 3; t++) free(g[r][t].mem);
        free(dout.mem);
    }

    for (int r = 0; r < 3; r++) {
        free(o[r].mem);
        free(lse_mem[r]);
    }
    free(q.mem);
    free(k.mem);
    free(v.mem);
    return 0;
}
