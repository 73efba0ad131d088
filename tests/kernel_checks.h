/*
 * kernel_checks.h — the checks every ISA micro-kernel table must pass,
 * written once in plain C and shared by two runners:
 *   tests/test_kernels.c             CMocka, every x86 ISA this CPU has
 *   tests/neon/test_kernels_neon.c   no CMocka (there is none for arm64 here),
 *                                    cross-compiled, run under qemu-aarch64
 *
 * Each check takes the table under test and the scalar table (the spec),
 * runs both on the same seeded random tiles and returns the number of
 * failures, writing a description of the first one into `msg`.
 *
 * Buffers end exactly at a PROT_NONE guard page (mmap + mprotect), so a
 * kernel that reads or writes one float past the end of Q, V or O (which the
 * driver does not pad) crashes the test instead of passing by luck; padding
 * columns of S and O are filled with a sentinel and must come back unchanged.
 *
 * Tolerances — each derived from a float rounding model (u = 2^-24), not
 * tuned until green:
 *   qk:      both dot products are within gamma_d = d*u*sum_c |q_c k_c| of the
 *            exact one whatever the summation and FMA pattern, and the scale
 *            (1/sqrt(d) here, not a power of 2) adds one rounding, so they are
 *            within 2*(d+1)*u*scale*sum|q k| of each other (+1e-30).
 *   softmax: m_new must be identical (a max is exact; a NaN score is skipped
 *            by the max, as in scalar.c, and shows up as NaN in P and l). P is
 *            checked against exp(s - m) computed in double, for the table under
 *            test and for the scalar spec alike: P = exp(x), x = s - m, may err
 *            by (4 + 3|x|) u relative (+ FLT_MIN, where the kernels flush to 0
 *            what expf returns as a subnormal). The spec rounds s - m (|x| u
 *            relative in P) and calls expf (1 ulp <= 2u); the SIMD tables with
 *            a natural exp add FA_EXP_MAX_ULP ulps (<= 4u) to the same rounding;
 *            AVX-512 computes 2^(log2e s - log2e m) (simd_exp.h: two roundings
 *            of a number of size 1.45|x| and log2e's own 0.22u, times ln 2 in
 *            P: <= 2.3|x| u, plus its polynomial's 0.95 ulp). The |x| term is
 *            the conditioning of exp, the same kind of error as the score's own
 *            rounding, and large only where P = e^x is small.
 *            l = alpha*l + sum P: summation order differs ((bc + 2) u each side)
 *            and each P carries its table's error — from the per-table analyses
 *            above, not the looser P check: (2 + |x|) u for the spec, at most
 *            (4 + 3|x|) u for a SIMD table, so together (6 + 4|x|) u — hence
 *            |dl| <= (2bc + 10) u l + 4 u sum_j P_j |x_j|, computed per row.
 *            Scores include rows offset by 1e4 .. FLT_MAX (KC_OFFSET), where
 *            log2e m's low part is large next to x, and past 2^100, where
 *            AVX-512 falls back to the natural exp.
 *   pv:      O = alpha*O + sum_j P_j V_j, accumulated in a different order:
 *            |dO| <= 2 * (bc + 2) * u * (|alpha O| + sum_j |P_j V_j|).
 *   vexp:    <= FA_EXP_MAX_ULP ulps from expf where expf(x) >= FLT_MIN;
 *            exactly +0 below; exp(-inf) = +0, exp(+inf) = +inf, NaN -> NaN.
 *   tanh:    <= FA_TANH_MAX_ULP ulps from tanhf (through `transform`, c = 1).
 *   transform: see kc_check_transform.
 */
#ifndef FA_KERNEL_CHECKS_H
#define FA_KERNEL_CHECKS_H

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "kernels/simd_exp.h"

/* Sizes that exercise every tail: below, at and above 8/16-lane multiples. */
static const int kc_sizes[] = {1, 7, 15, 16, 17, 33, 64, 100, 128, 256};
#define KC_NSIZES ((int)(sizeof kc_sizes / sizeof kc_sizes[0]))
static const int kc_rows[] = {1, 2, 5, 7, 8, 9, 15, 17, 33, 64, 100, 128};
#define KC_NROWS ((int)(sizeof kc_rows / sizeof kc_rows[0]))

/* ---- random numbers (splitmix64) ---------------------------------------- */

static uint64_t kc_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float kc_uniform(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(kc_next(s) >> 11) * 0x1.0p-53);
}

/* ---- guarded buffers ------------------------------------------------------ */

typedef struct kc_buf {
    float *p;        /* n floats ending exactly at a PROT_NONE page */
    void *map;
    size_t map_bytes;
} kc_buf;

static kc_buf kc_alloc(size_t n)
{
    kc_buf b = {0};
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t bytes = (n ? n : 1) * sizeof(float);
    const size_t data_pages = (bytes + page - 1) / page;
    b.map_bytes = (data_pages + 1) * page;
    b.map = mmap(NULL, b.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b.map == MAP_FAILED) {
        fprintf(stderr, "kernel_checks: mmap failed\n");
        abort();
    }
    char *guard = (char *)b.map + data_pages * page;
    mprotect(guard, page, PROT_NONE);
    b.p = (float *)(guard - (n ? n : 1) * sizeof(float));
    return b;
}

static void kc_free(kc_buf *b)
{
    if (b->map) munmap(b->map, b->map_bytes);
    memset(b, 0, sizeof *b);
}

/* A float that no kernel produces by accident: its bits are checked. */
static const uint32_t kc_sentinel_bits = 0x7fc0beefu; /* a quiet NaN with a payload */

static float kc_sentinel(void)
{
    float f;
    memcpy(&f, &kc_sentinel_bits, 4);
    return f;
}

static int kc_is_sentinel(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u == kc_sentinel_bits;
}

static int kc_fail(char *msg, size_t cap, int *nfail, const char *fmt, ...)
{
    if (*nfail == 0 && msg && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, cap, fmt, ap);
        va_end(ap);
    }
    (*nfail)++;
    return 0;
}

static size_t kc_round16(int n) { return (size_t)((n + 15) / 16 * 16); }

/* ---- qk ------------------------------------------------------------------- */

/* One qk tile of shape (br, bc, d); Q rows and S rows have the given pads. */
static int kc_qk_case(const fa_kernels *k, const fa_kernels *ref, int br, int bc, int d,
                      int qpad, uint64_t *rng, char *msg, size_t cap)
{
    int nf = 0;
    const size_t ldq = (size_t)d + (size_t)qpad, ldk = kc_round16(bc), lds = kc_round16(bc) + 16;
    kc_buf q = kc_alloc((size_t)br * ldq), kt = kc_alloc((size_t)d * ldk);
    kc_buf s = kc_alloc((size_t)br * lds), sref = kc_alloc((size_t)br * lds);
    for (size_t x = 0; x < (size_t)br * ldq; x++) q.p[x] = kc_uniform(rng, -2.0f, 2.0f);
    for (int c = 0; c < d; c++)
        for (size_t j = 0; j < ldk; j++)
            kt.p[(size_t)c * ldk + j] = (int)j < bc ? kc_uniform(rng, -2.0f, 2.0f) : 0.0f;
    for (size_t x = 0; x < (size_t)br * lds; x++) s.p[x] = sref.p[x] = kc_sentinel();

    const float scale = 1.0f / sqrtf((float)d); /* the default scale: not a power of 2 */
    k->qk(br, bc, d, q.p, ldq, kt.p, ldk, scale, s.p, lds);
    ref->qk(br, bc, d, q.p, ldq, kt.p, ldk, scale, sref.p, lds);

    for (int i = 0; i < br && nf < 1; i++)
        for (size_t j = 0; j < lds; j++) {
            const float a = s.p[(size_t)i * lds + j], b = sref.p[(size_t)i * lds + j];
            if ((int)j >= bc) {
                if (!kc_is_sentinel(a))
                    kc_fail(msg, cap, &nf, "%s qk br=%d bc=%d d=%d: wrote S[%d][%zu] beyond bc",
                            k->name, br, bc, d, i, j);
                continue;
            }
            double mag = 0.0;
            for (int c = 0; c < d; c++)
                mag += fabs((double)q.p[(size_t)i * ldq + c] * kt.p[(size_t)c * ldk + j]);
            /* gamma_d of each dot product, plus the rounding of the scaling */
            const double tol = 2.0 * (d + 1) * 0x1.0p-24 * scale * mag + 1e-30;
            if (!(fabs((double)a - b) <= tol)) {
                kc_fail(msg, cap, &nf, "%s qk br=%d bc=%d d=%d: S[%d][%zu] = %.9g, scalar %.9g, tol %.3g",
                        k->name, br, bc, d, i, j, a, b, tol);
                break;
            }
        }
    kc_free(&q); kc_free(&kt); kc_free(&s); kc_free(&sref);
    return nf;
}

/* Every (br, bc, d) of the size lists; returns the number of failing tiles. */
static int kc_check_qk(const fa_kernels *k, const fa_kernels *ref, uint64_t seed, char *msg, size_t cap)
{
    int nf = 0;
    uint64_t rng = seed;
    for (int a = 0; a < KC_NROWS; a++)
        for (int b = 0; b < KC_NSIZES; b++)
            for (int c = 0; c < KC_NSIZES; c++) {
                const int f = kc_qk_case(k, ref, kc_rows[a], kc_sizes[b], kc_sizes[c], (a + c) % 3 == 0 ? 5 : 0,
                                         &rng, nf ? NULL : msg, cap);
                nf += f != 0;
            }
    return nf;
}

/* ---- softmax -------------------------------------------------------------- */

enum kc_mask {
    KC_FINITE,        /* random scores, nothing masked */
    KC_PARTIAL,       /* ~30% -inf at random, plus a causal-like band */
    KC_ROWS_MASKED,   /* some whole rows -inf */
    KC_ALL_MASKED,    /* the whole tile -inf */
    KC_EXTREME,       /* very negative (-1e30, -200) and large (+80..+88) scores */
    KC_NAN,           /* a few NaN scores among finite ones (Inf or NaN in Q or K) */
    KC_OFFSET,        /* each row offset by a large logit (1e4 .. FLT_MAX, both signs), then [-20, 0] */
    KC_NAN_MASKED,    /* -inf everywhere, and one NaN in every other row (its max stays -inf) */
    KC_MASK_COUNT
};

static void kc_fill_scores(float *s, size_t lds, int br, int bc, int kind, uint64_t *rng)
{
    for (int i = 0; i < br; i++)
        for (int j = 0; j < bc; j++) {
            float x = kc_uniform(rng, -8.0f, 8.0f);
            switch (kind) {
            case KC_PARTIAL:
                if (kc_next(rng) % 10 < 3 || j > i + bc / 2) x = -INFINITY;
                break;
            case KC_ROWS_MASKED:
                if (i % 3 == 1) x = -INFINITY;
                break;
            case KC_ALL_MASKED: x = -INFINITY; break;
            case KC_NAN_MASKED: x = i % 2 == 0 && j == (i * 7) % bc ? NAN : -INFINITY; break;
            case KC_NAN:
                if (kc_next(rng) % 16 == 0) x = NAN;
                break;
            case KC_OFFSET: { /* the same offset for row i in every tile of a sequence */
                static const float off[] = {1e4f, -1e4f, 2500.0f, 3e7f, -3e7f, 1e30f, -1e30f, 0x1p100f,
                                            0x1.fffffep99f, -0x1p100f, 0x1p127f, FLT_MAX, -FLT_MAX};
                x = off[i % (int)(sizeof off / sizeof off[0])] + kc_uniform(rng, -20.0f, 0.0f);
                break;
            }
            case KC_EXTREME: {
                const uint64_t r = kc_next(rng) % 6;
                x = r == 0 ? -1e30f : r == 1 ? -200.0f : r == 2 ? kc_uniform(rng, 80.0f, 88.0f)
                  : r == 3 ? -INFINITY : kc_uniform(rng, -100.0f, 0.0f);
                break;
            }
            default: break;
            }
            s[(size_t)i * lds + j] = x;
        }
}

/* |a - b| <= rel*|b| + abs_tol; equal infinities and NaN vs NaN count as equal */
static int kc_close_rel(double a, double b, double rel, double abs_tol)
{
    if (a == b || (isnan(a) && isnan(b))) return 1;
    return fabs(a - b) <= rel * fabs(b) + abs_tol;
}

/*
 * A sequence of tiles through softmax only, comparing (P, m, l, alpha) after
 * each: kinds[t] is the mask kind of tile t. Starts from m = -inf, l = 0.
 */
static int kc_softmax_seq(const fa_kernels *k, const fa_kernels *ref, int br, int bc,
                          const int *kinds, int ntiles, uint64_t *rng, char *msg, size_t cap)
{
    int nf = 0;
    const size_t lds = kc_round16(bc) + 16;
    kc_buf s = kc_alloc((size_t)br * lds), sref = kc_alloc((size_t)br * lds), s0 = kc_alloc((size_t)br * lds);
    kc_buf m = kc_alloc((size_t)br), l = kc_alloc((size_t)br), al = kc_alloc((size_t)br);
    kc_buf mr = kc_alloc((size_t)br), lr = kc_alloc((size_t)br), alr = kc_alloc((size_t)br);
    for (int i = 0; i < br; i++) m.p[i] = mr.p[i] = -INFINITY, l.p[i] = lr.p[i] = 0.0f;
    for (int t = 0; t < ntiles && !nf; t++) {
        for (size_t x = 0; x < (size_t)br * lds; x++) s.p[x] = kc_sentinel();
        kc_fill_scores(s.p, lds, br, bc, kinds[t], rng);
        memcpy(sref.p, s.p, (size_t)br * lds * sizeof(float));
        memcpy(s0.p, s.p, (size_t)br * lds * sizeof(float));
        for (int i = 0; i < br; i++) al.p[i] = alr.p[i] = kc_sentinel();
        k->softmax(br, bc, s.p, lds, m.p, l.p, al.p);
        ref->softmax(br, bc, sref.p, lds, mr.p, lr.p, alr.p);
        for (int i = 0; i < br && !nf; i++) {
            const char *what = NULL;
            int col = -1;
            if (memcmp(&m.p[i], &mr.p[i], sizeof(float)) != 0) what = "m";
            else if (!kc_close_rel(al.p[i], alr.p[i], 3.5 * 0x1.0p-23, FLT_MIN)) what = "alpha";
            double pxsum = 0.0; /* sum_j P_j |x_j| of the row, for l's bound */
            for (size_t j = 0; j < lds && !what; j++) {
                const float a = s.p[(size_t)i * lds + j], b = sref.p[(size_t)i * lds + j];
                if ((int)j >= bc) {
                    if (!kc_is_sentinel(a)) what = "P beyond bc", col = (int)j;
                    continue;
                }
                if (isnan(b) || isnan(a)) { /* a NaN score: NaN in both */
                    if (!(isnan(a) && isnan(b))) what = "P", col = (int)j;
                    continue;
                }
                if (s0.p[(size_t)i * lds + j] == -INFINITY || m.p[i] == -INFINITY) { /* masked: exactly +0 */
                    if (a != 0.0f || b != 0.0f || signbit(a) || signbit(b)) what = "P", col = (int)j;
                    continue;
                }
                const double x = (double)s0.p[(size_t)i * lds + j] - (double)m.p[i];
                const double e = exp(x), tol = (4.0 + 3.0 * fabs(x)) * 0x1.0p-24 * e + FLT_MIN;
                if (!(fabs((double)a - e) <= tol) || !(fabs((double)b - e) <= tol)) what = "P", col = (int)j;
                else if (e > 0.0) pxsum += e * fabs(x);
            }
            if (!what && !kc_close_rel(l.p[i], lr.p[i], 0.0,
                                       ((2.0 * bc + 10.0) * fabs(lr.p[i]) + 4.0 * pxsum) * 0x1.0p-24 + FLT_MIN))
                what = "l";
            if (what) {
                const size_t at = (size_t)i * lds + (size_t)(col < 0 ? 0 : col);
                kc_fail(msg, cap, &nf,
                        "%s softmax br=%d bc=%d tile %d (kind %d): %s differs at row %d col %d: "
                        "P %.9g vs %.9g, m %.9g vs %.9g, l %.9g vs %.9g, alpha %.9g vs %.9g",
                        k->name, br, bc, t, kinds[t], what, i, col, s.p[at], sref.p[at], m.p[i],
                        mr.p[i], l.p[i], lr.p[i], al.p[i], alr.p[i]);
            }
        }
    }
    kc_free(&s); kc_free(&sref); kc_free(&s0); kc_free(&m); kc_free(&l); kc_free(&al);
    kc_free(&mr); kc_free(&lr); kc_free(&alr);
    return nf;
}

/* The whole-row rules, stated exactly (not only "same as scalar"). */
static int kc_softmax_rules(const fa_kernels *k, int bc, char *msg, size_t cap)
{
    int nf = 0;
    const size_t lds = kc_round16(bc);
    kc_buf s = kc_alloc(2 * lds);
    float m[2] = {-INFINITY, 3.0f}, l[2] = {0.0f, 2.0f}, al[2];
    for (size_t j = 0; j < 2 * lds; j++) s.p[j] = -INFINITY;
    k->softmax(2, bc, s.p, lds, m, l, al);
    /* row 0: nothing visible yet -> P = 0, alpha = 1, l and m unchanged */
    /* row 1: all masked but m finite -> P = 0, alpha = exp(0) = 1, l unchanged */
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < bc; j++)
            if (s.p[(size_t)i * lds + j] != 0.0f || signbit(s.p[(size_t)i * lds + j]))
                kc_fail(msg, cap, &nf, "%s softmax bc=%d: masked P[%d][%d] = %g, want +0", k->name, bc,
                        i, j, s.p[(size_t)i * lds + j]);
    if (al[0] != 1.0f || l[0] != 0.0f || m[0] != -INFINITY)
        kc_fail(msg, cap, &nf, "%s softmax bc=%d: all-masked first tile gave alpha %g l %g m %g",
                k->name, bc, al[0], l[0], m[0]);
    if (al[1] != 1.0f || l[1] != 2.0f || m[1] != 3.0f)
        kc_fail(msg, cap, &nf, "%s softmax bc=%d: all-masked later tile gave alpha %g l %g m %g",
                k->name, bc, al[1], l[1], m[1]);
    /* a NaN score in a row with nothing else visible: the max skips it, so l = NaN carries it
     * (P = 0, alpha = 1, m = -inf); then a finite tile: m finite, alpha = 0, l stays NaN */
    for (size_t j = 0; j < 2 * lds; j++) s.p[j] = -INFINITY;
    s.p[bc - 1] = NAN;
    m[0] = -INFINITY, l[0] = 0.0f;
    k->softmax(1, bc, s.p, lds, m, l, al);
    if (al[0] != 1.0f || !isnan(l[0]) || m[0] != -INFINITY || s.p[bc - 1] != 0.0f)
        kc_fail(msg, cap, &nf, "%s softmax bc=%d: a NaN among -inf gave alpha %g l %g m %g P %g (want 1, NaN, -inf, 0)",
                k->name, bc, al[0], l[0], m[0], s.p[bc - 1]);
    for (int j = 0; j < bc; j++) s.p[j] = (float)(j % 5);
    k->softmax(1, bc, s.p, lds, m, l, al);
    if (!isnan(l[0]) || !(m[0] >= 0.0f))
        kc_fail(msg, cap, &nf, "%s softmax bc=%d: the NaN of an earlier tile was lost: l %g m %g", k->name, bc, l[0], m[0]);
    kc_free(&s);
    return nf;
}

static int kc_check_softmax(const fa_kernels *k, const fa_kernels *ref, uint64_t seed, char *msg, size_t cap)
{
    static const int seqs[][3] = {
        {KC_FINITE, KC_FINITE, KC_FINITE},
        {KC_PARTIAL, KC_PARTIAL, KC_FINITE},
        {KC_ROWS_MASKED, KC_PARTIAL, KC_ROWS_MASKED},
        {KC_ALL_MASKED, KC_FINITE, KC_PARTIAL},  /* first tile all masked, then finite */
        {KC_ALL_MASKED, KC_ALL_MASKED, KC_EXTREME},
        {KC_EXTREME, KC_FINITE, KC_EXTREME},
        {KC_FINITE, KC_NAN, KC_PARTIAL},        /* a NaN score: NaN where the spec has it, m unaffected */
        {KC_OFFSET, KC_OFFSET, KC_PARTIAL},     /* large logits: log2e m's split, the 2^100 fallback */
        {KC_FINITE, KC_OFFSET, KC_FINITE},      /* the max jumps to a large logit and stays */
        {KC_NAN_MASKED, KC_ALL_MASKED, KC_FINITE}, /* a NaN the max skips: l = NaN, and it sticks */
    };
    int nf = 0;
    uint64_t rng = seed;
    for (int a = 0; a < KC_NROWS; a++)
        for (int b = 0; b < KC_NSIZES; b++)
            for (size_t q = 0; q < sizeof seqs / sizeof seqs[0]; q++)
                nf += kc_softmax_seq(k, ref, kc_rows[a], kc_sizes[b], seqs[q], 3, &rng, nf ? NULL : msg, cap) != 0;
    for (int b = 0; b < KC_NSIZES; b++) nf += kc_softmax_rules(k, kc_sizes[b], nf ? NULL : msg, cap) != 0;
    return nf;
}

/* ---- pv ------------------------------------------------------------------- */

static int kc_pv_case(const fa_kernels *k, const fa_kernels *ref, int br, int bc, int dv,
                      int opad, uint64_t *rng, char *msg, size_t cap)
{
    int nf = 0;
    const size_t ldp = kc_round16(bc), ldv = (size_t)dv + (size_t)(opad ? 3 : 0), ldo = (size_t)dv + (size_t)opad;
    kc_buf p = kc_alloc((size_t)br * ldp), v = kc_alloc((size_t)bc * ldv), al = kc_alloc((size_t)br);
    kc_buf o = kc_alloc((size_t)br * ldo), oref = kc_alloc((size_t)br * ldo), o0 = kc_alloc((size_t)br * ldo);
    for (size_t x = 0; x < (size_t)br * ldp; x++) p.p[x] = kc_uniform(rng, 0.0f, 1.0f);
    for (int i = 0; i < br; i++) /* zero P here and there, as masked keys give */
        for (int j = 0; j < bc; j++)
            if (kc_next(rng) % 5 == 0) p.p[(size_t)i * ldp + j] = 0.0f;
    for (size_t x = 0; x < (size_t)bc * ldv; x++) v.p[x] = kc_uniform(rng, -3.0f, 3.0f);
    for (int i = 0; i < br; i++) /* alpha: 1, 0 (first visible tile) or in (0, 1) */
        al.p[i] = i % 4 == 0 ? 1.0f : i % 4 == 1 ? 0.0f : kc_uniform(rng, 0.0f, 1.0f);
    for (int i = 0; i < br; i++)
        for (size_t c = 0; c < ldo; c++)
            o0.p[(size_t)i * ldo + c] = (int)c < dv ? kc_uniform(rng, -5.0f, 5.0f) : kc_sentinel();
    memcpy(o.p, o0.p, (size_t)br * ldo * sizeof(float));
    memcpy(oref.p, o0.p, (size_t)br * ldo * sizeof(float));

    k->pv(br, bc, dv, p.p, ldp, v.p, ldv, al.p, o.p, ldo);
    ref->pv(br, bc, dv, p.p, ldp, v.p, ldv, al.p, oref.p, ldo);

    for (int i = 0; i < br && !nf; i++)
        for (size_t c = 0; c < ldo; c++) {
            const float a = o.p[(size_t)i * ldo + c], b = oref.p[(size_t)i * ldo + c];
            if ((int)c >= dv) {
                if (!kc_is_sentinel(a))
                    kc_fail(msg, cap, &nf, "%s pv br=%d bc=%d dv=%d: wrote O[%d][%zu] beyond dv",
                            k->name, br, bc, dv, i, c);
                continue;
            }
            double mag = fabs((double)al.p[i] * o0.p[(size_t)i * ldo + c]);
            for (int j = 0; j < bc; j++)
                mag += fabs((double)p.p[(size_t)i * ldp + j] * v.p[(size_t)j * ldv + c]);
            const double tol = 2.0 * (bc + 2) * 0x1.0p-24 * mag + 1e-30;
            if (!(fabs((double)a - b) <= tol)) {
                kc_fail(msg, cap, &nf, "%s pv br=%d bc=%d dv=%d: O[%d][%zu] = %.9g, scalar %.9g, tol %.3g",
                        k->name, br, bc, dv, i, c, a, b, tol);
                break;
            }
        }
    kc_free(&p); kc_free(&v); kc_free(&al); kc_free(&o); kc_free(&oref); kc_free(&o0);
    return nf;
}

static int kc_check_pv(const fa_kernels *k, const fa_kernels *ref, uint64_t seed, char *msg, size_t cap)
{
    int nf = 0;
    uint64_t rng = seed;
    for (int a = 0; a < KC_NROWS; a++)
        for (int b = 0; b < KC_NSIZES; b++)
            for (int c = 0; c < KC_NSIZES; c++)
                nf += kc_pv_case(k, ref, kc_rows[a], kc_sizes[b], kc_sizes[c], (a + b) % 2 ? 7 : 0, &rng,
                                 nf ? NULL : msg, cap) != 0;
    /* no key at all: O = alpha O */
    for (int a = 0; a < 3; a++) nf += kc_pv_case(k, ref, kc_rows[a * 4], 0, kc_sizes[a * 3 + 1], 0, &rng, nf ? NULL : msg, cap) != 0;
    return nf;
}

/*
 * pv_t (kernels.h): pv with P stored transposed must give pv's bits, element
 * for element, on the same tile. The transposed tile has a leading dimension
 * past br whose padding holds NaN (a read of it would poison O), ends at a
 * guard page, and O's padding columns hold the sentinel. Tables without pv_t
 * are not checked here (the driver transposes for them).
 */
static int kc_pv_t_case(const fa_kernels *k, int br, int bc, int dv, uint64_t *rng, char *msg, size_t cap)
{
    int nf = 0;
    const size_t ldp = kc_round16(bc), ldpt = (size_t)br + 5, ldv = (size_t)dv + 3, ldo = (size_t)dv + 2;
    kc_buf p = kc_alloc((size_t)br * ldp), pt = kc_alloc((size_t)bc * ldpt), v = kc_alloc((size_t)bc * ldv);
    kc_buf al = kc_alloc((size_t)br), o = kc_alloc((size_t)br * ldo), ot = kc_alloc((size_t)br * ldo);
    for (size_t x = 0; x < (size_t)bc * ldpt; x++) pt.p[x] = NAN;
    for (int i = 0; i < br; i++) /* signed values (dS is), exact zeros here and there */
        for (int j = 0; j < bc; j++) {
            const float x = kc_next(rng) % 5 == 0 ? 0.0f : kc_uniform(rng, -1.0f, 1.0f);
            p.p[(size_t)i * ldp + j] = x;
            pt.p[(size_t)j * ldpt + i] = x;
        }
    for (size_t x = 0; x < (size_t)bc * ldv; x++) v.p[x] = kc_uniform(rng, -3.0f, 3.0f);
    for (int i = 0; i < br; i++) al.p[i] = i % 3 == 0 ? 1.0f : kc_uniform(rng, 0.0f, 1.0f);
    for (int i = 0; i < br; i++)
        for (size_t c = 0; c < ldo; c++)
            o.p[(size_t)i * ldo + c] = (int)c < dv ? kc_uniform(rng, -5.0f, 5.0f) : kc_sentinel();
    memcpy(ot.p, o.p, (size_t)br * ldo * sizeof(float));

    k->pv(br, bc, dv, p.p, ldp, v.p, ldv, al.p, o.p, ldo);
    k->pv_t(br, bc, dv, pt.p, ldpt, v.p, ldv, al.p, ot.p, ldo);

    for (int i = 0; i < br && !nf; i++)
        for (size_t c = 0; c < ldo; c++) {
            const float a = ot.p[(size_t)i * ldo + c], b = o.p[(size_t)i * ldo + c];
            if ((int)c >= dv ? !kc_is_sentinel(a) : memcmp(&a, &b, sizeof a) != 0) {
                kc_fail(msg, cap, &nf, "%s pv_t br=%d bc=%d dv=%d: O[%d][%zu] = %.9g, pv on the tile %.9g",
                        k->name, br, bc, dv, i, c, a, b);
                break;
            }
        }
    kc_free(&p); kc_free(&pt); kc_free(&v); kc_free(&al); kc_free(&o); kc_free(&ot);
    return nf;
}

/* Number of failures; *checked = whether the table has pv_t at all. */
static int kc_check_pv_t(const fa_kernels *k, uint64_t seed, int *checked, char *msg, size_t cap)
{
    int nf = 0;
    uint64_t rng = seed;
    *checked = k->pv_t != NULL;
    if (!k->pv_t) return 0;
    for (int a = 0; a < KC_NROWS; a++)
        for (int b = 0; b < KC_NSIZES; b++)
            for (int c = 0; c < KC_NSIZES; c++)
                nf += kc_pv_t_case(k, kc_rows[a], kc_sizes[b], kc_sizes[c], &rng, nf ? NULL : msg, cap) != 0;
    /* more keys than one pv chunk (AVX-512 128, AVX2 256) */
    nf += kc_pv_t_case(k, 9, 300, 40, &rng, nf ? NULL : msg, cap) != 0;
    nf += kc_pv_t_case(k, 7, 0, 33, &rng, nf ? NULL : msg, cap) != 0; /* no key: O = alpha O */
    nf += kc_pv_t_case(k, 17, 513, 128, &rng, nf ? NULL : msg, cap) != 0;
    return nf;
}

/* ---- vexp ----------------------------------------------------------------- */

static uint32_t kc_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float kc_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/*
 * Sweep [-88, 88]: every `stride`-th float by bit pattern (both signs),
 * every float near the underflow edge (-87.33654) and the overflow edge
 * (88.72284), plus special values and every tail length. Reports the worst ulp error against
 * expf in *max_ulp (and where). Fails above FA_EXP_MAX_ULP.
 */
static int kc_check_vexp(const fa_kernels *k, uint32_t stride, double *max_ulp, float *worst_x,
                         char *msg, size_t cap)
{
    int nf = 0;
    enum { CHUNK = 4096 };
    float *x = malloc(CHUNK * sizeof(float)), *y = malloc(CHUNK * sizeof(float));
    if (!x || !y) abort();
    const uint32_t top = kc_bits(88.0f);
    double worst = 0.0;
    float wx = 0.0f;
    /* ranges of bit patterns: the whole [-88, 88] every `stride`-th float,
     * then every float near the underflow edge and the overflow edge */
    const uint32_t ranges[][4] = {/* first, last, step, sign */
                                  {0, top, stride, 0},
                                  {0, top, stride, 1},
                                  {kc_bits(87.30f), kc_bits(87.37f), 1, 1},
                                  {kc_bits(88.30f), kc_bits(88.80f), 1, 0}};
    for (int rg = 0; rg < 4; rg++) {
        uint32_t u = ranges[rg][0];
        const uint32_t last = ranges[rg][1], step = ranges[rg][2], sign = ranges[rg][3];
        while (u <= last) {
            int n = 0;
            for (; n < CHUNK && u <= last; n++, u += step) x[n] = kc_from_bits(u | (sign ? 0x80000000u : 0u));
            k->vexp(n, x, y);
            for (int i = 0; i < n; i++) {
                const float e = expf(x[i]);
                if (isinf(e)) {
                    if (y[i] != e) kc_fail(msg, cap, &nf, "%s vexp(%.9g) = %g, want inf", k->name, x[i], y[i]);
                    continue;
                }
                if (e < FLT_MIN) { /* flushed region: exactly +0, below FLT_MIN */
                    if (!(y[i] == 0.0f && !signbit(y[i])))
                        kc_fail(msg, cap, &nf, "%s vexp(%.9g) = %g, want 0 (expf %g)", k->name, x[i], y[i], e);
                    continue;
                }
                const double ulp = fabs((double)kc_bits(y[i]) - (double)kc_bits(e));
                if (ulp > worst) worst = ulp, wx = x[i];
            }
        }
    }
    if (worst > FA_EXP_MAX_ULP)
        kc_fail(msg, cap, &nf, "%s vexp: %.0f ulp from expf at x = %.9g (bound %.1f)", k->name, worst,
                wx, FA_EXP_MAX_ULP);

    /* special values, at every lane position and tail length */
    const float special[] = {-INFINITY, -1e30f, -1000.0f, -103.0f, -87.5f, 0.0f, -0.0f,
                             1.0f, 88.7f, 88.8f, 89.0f, 1e30f, INFINITY, NAN};
    const int nsp = (int)(sizeof special / sizeof special[0]);
    for (int len = 1; len <= 40; len++) {
        kc_buf xb = kc_alloc((size_t)len), yb = kc_alloc((size_t)len);
        for (int i = 0; i < len; i++) xb.p[i] = special[i % nsp];
        k->vexp(len, xb.p, yb.p);
        for (int i = 0; i < len; i++) {
            const float xi = xb.p[i], yi = yb.p[i], e = expf(xi);
            int ok;
            if (isnan(xi)) ok = isnan(yi);
            else if (isinf(e) || e == 0.0f || e < FLT_MIN) ok = (e < FLT_MIN) ? (yi == 0.0f && !signbit(yi)) : yi == e;
            else ok = fabs((double)kc_bits(yi) - (double)kc_bits(e)) <= FA_EXP_MAX_ULP;
            if (!ok) kc_fail(msg, cap, &nf, "%s vexp(%g) = %g, expf %g (n = %d)", k->name, xi, yi, e, len);
        }
        kc_free(&xb); kc_free(&yb);
    }
    free(x); free(y);
    *max_ulp = worst;
    *worst_x = wx;
    return nf;
}

/* ---- tanh and the line transform (softcap, ALiBi, mask) ------------------- */

/*
 * The table's tanh through its transform with c = 1 (u = 1 * tanh(u * 1)):
 * every `stride`-th float of |x| < 10 (both signs), every float around the
 * switch from the polynomial to the exp form (0.625) and where tanhf reaches
 * 1 (9..9.02), against libm's tanhf: at most FA_TANH_MAX_ULP ulps, the same
 * sign; then special values at every lane position: +-0 keep their sign,
 * +-inf give +-1, NaN gives NaN, huge give +-1, subnormals give themselves.
 */
static int kc_check_tanh(const fa_kernels *k, uint32_t stride, double *max_ulp, float *worst_x, char *msg,
                         size_t cap)
{
    int nf = 0;
    enum { CHUNK = 4096 };
    float *x = malloc(CHUNK * sizeof(float)), *y = malloc(CHUNK * sizeof(float));
    if (!x || !y) abort();
    double worst = 0.0;
    float wx = 0.0f;
    const uint32_t ranges[][4] = {/* first, last, step, sign */
                                  {0, kc_bits(10.0f), stride, 0},
                                  {0, kc_bits(10.0f), stride, 1},
                                  {kc_bits(0.62f), kc_bits(0.63f), 1, 0},
                                  {kc_bits(0.62f), kc_bits(0.63f), 1, 1},
                                  {kc_bits(9.0f), kc_bits(9.02f), 1, 0}};
    for (int rg = 0; rg < 5; rg++) {
        uint32_t u = ranges[rg][0];
        const uint32_t last = ranges[rg][1], step = ranges[rg][2], sign = ranges[rg][3];
        while (u <= last) {
            int n = 0;
            for (; n < CHUNK && u <= last; n++, u += step) x[n] = kc_from_bits(u | (sign ? 0x80000000u : 0u));
            memcpy(y, x, (size_t)n * sizeof(float));
            k->transform(n, 0, n, y, 1.0f, 1.0f, 0.0, 0, 1, NULL);
            for (int i = 0; i < n; i++) {
                const float t = tanhf(x[i]);
                const double ulp = signbit(y[i]) == signbit(t) ? fabs((double)kc_bits(y[i]) - (double)kc_bits(t))
                                                              : INFINITY;
                if (ulp > worst) worst = ulp, wx = x[i];
            }
        }
    }
    if (!(worst <= FA_TANH_MAX_ULP))
        kc_fail(msg, cap, &nf, "%s tanh: %.0f ulp from tanhf at x = %.9g (bound %.1f)", k->name, worst, wx,
                FA_TANH_MAX_ULP);

    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, -1e30f, 1e-40f, -1e-40f,
                             0.625f, -0.625f, 10.0f, -10.0f, 44.0f, 1e-5f};
    const int nsp = (int)(sizeof special / sizeof special[0]);
    for (int len = 1; len <= 40; len++) {
        kc_buf b = kc_alloc((size_t)len);
        for (int i = 0; i < len; i++) b.p[i] = special[(i + len) % nsp];
        k->transform(len, 0, len, b.p, 1.0f, 1.0f, 0.0, 0, 1, NULL);
        for (int i = 0; i < len; i++) {
            const float xi = special[(i + len) % nsp], yi = b.p[i], t = tanhf(xi);
            const int ok = isnan(xi) ? isnan(yi)
                         : (xi == 0.0f || isinf(xi) || fabsf(xi) < FLT_MIN) ? memcmp(&yi, &t, 4) == 0
                         : signbit(yi) == signbit(t) &&
                               fabs((double)kc_bits(yi) - (double)kc_bits(t)) <= FA_TANH_MAX_ULP;
            if (!ok) kc_fail(msg, cap, &nf, "%s tanh(%g) = %.9g, tanhf %.9g (n = %d)", k->name, xi, yi, t, len);
        }
        kc_free(&b);
    }
    free(x); free(y);
    *max_ulp = worst;
    *worst_x = wx;
    return nf;
}

/*
 * The line transform against the scalar spec on random lines of every tail
 * length, visible intervals [va, vb) empty, whole and partial, softcap
 * c in {0, 0.5, 5, 30}, ALiBi slopes 0 and not, both directions, a far
 * offset, NaN and +-inf scores, with and without the derivative g:
 *   outside [va, vb): s = -inf exactly, g untouched (sentinel);
 *   no softcap: bit-identical (the ALiBi product is the same double);
 *   softcap: cap*tanh differs from the spec's cap*tanhf by at most
 *     (FA_TANH_MAX_ULP + 1) ulp of it (tanh's ulps, then the product's own
 *     rounding), and subtracting the same bias adds one rounding of the
 *     result: |d| <= 2^-23 * ((MAX + 1) |cap t| + |cap t| + |bias|);
 *   g = 1 - th^2, th = u / c off by (MAX + 2) ulp: |dg| <= 2 (MAX + 2) 2^-23 + 2^-23.
 */
static int kc_check_transform(const fa_kernels *k, const fa_kernels *ref, uint64_t seed, char *msg, size_t cap)
{
    int nf = 0;
    uint64_t rng = seed;
    const float caps[] = {0.0f, 0.5f, 5.0f, 30.0f};
    const double slopes[] = {0.0, 0.0625, 0.3};
    const double u23 = 0x1.0p-23, mx = FA_TANH_MAX_ULP;
    for (int a = 0; a < KC_NSIZES && !nf; a++) {
        const int n = kc_sizes[a];
        const int iv[][2] = {{0, n}, {0, 0}, {n / 3, n - n / 4}, {1 < n ? 1 : n, n}, {0, n - 1}, {n, n}};
        for (int w = 0; w < 6 && !nf; w++)
            for (int c = 0; c < 4 && !nf; c++)
                for (int sl = 0; sl < 3 && !nf; sl++) {
                    const int va = iv[w][0], vb = iv[w][1] > va ? iv[w][1] : va;
                    const float cp = caps[c], inv = cp > 0.0f ? (float)(1.0 / (double)cp) : 0.0f;
                    const double slope = slopes[sl];
                    const int step = (w + c) % 2 ? 1 : -1;
                    const int64_t rel0 = (w == 5 ? 3000000000LL : 0) + (int64_t)(kc_next(&rng) % 97) - 48;
                    const int want_g = (sl + w) % 2;
                    kc_buf in = kc_alloc((size_t)n), s0 = kc_alloc((size_t)n), s1 = kc_alloc((size_t)n),
                           capped = kc_alloc((size_t)n), g0 = kc_alloc((size_t)n), g1 = kc_alloc((size_t)n);
                    for (int x = 0; x < n; x++) {
                        const uint64_t r = kc_next(&rng) % 64;
                        in.p[x] = r == 0 ? NAN : r == 1 ? INFINITY : r == 2 ? -INFINITY
                                                                    : kc_uniform(&rng, -40.0f, 40.0f);
                        g0.p[x] = g1.p[x] = kc_sentinel();
                    }
                    memcpy(s0.p, in.p, (size_t)n * sizeof(float));
                    memcpy(s1.p, in.p, (size_t)n * sizeof(float));
                    memcpy(capped.p, in.p, (size_t)n * sizeof(float));
                    k->transform(n, va, vb, s0.p, cp, inv, slope, rel0, step, want_g ? g0.p : NULL);
                    ref->transform(n, va, vb, s1.p, cp, inv, slope, rel0, step, want_g ? g1.p : NULL);
                    ref->transform(n, va, vb, capped.p, cp, inv, 0.0, 0, 1, NULL); /* cap * tanhf alone */
                    for (int x = 0; x < n && !nf; x++) {
                        const float got = s0.p[x], want = s1.p[x];
                        int ok;
                        if (x < va || x >= vb)
                            ok = got == -INFINITY && kc_is_sentinel(g0.p[x]);
                        else if (isnan(want) || isinf(want) || !(cp > 0.0f))
                            ok = memcmp(&got, &want, 4) == 0 || (isnan(got) && isnan(want));
                        else {
                            const int64_t rel = rel0 + (int64_t)step * x;
                            const double bias = fabs(slope * (double)(rel < 0 ? -rel : rel));
                            const double ct = fabs((double)capped.p[x]);
                            ok = fabs((double)got - (double)want) <= u23 * ((mx + 2.0) * ct + bias);
                        }
                        if (ok && want_g && x >= va && x < vb && cp > 0.0f) {
                            const float gg = g0.p[x], gw = g1.p[x];
                            ok = isnan(gw) ? isnan(gg) : fabs((double)gg - (double)gw) <= (2.0 * (mx + 2.0) + 1.0) * u23;
                        }
                        if (!ok)
                            kc_fail(msg, cap, &nf,
                                    "%s transform n=%d [%d,%d) cap=%g slope=%g rel0=%lld step=%d g=%d: x=%d in %.9g "
                                    "-> %.9g (g %.9g), scalar %.9g (g %.9g)",
                                    k->name, n, va, vb, cp, slope, (long long)rel0, step, want_g, x, in.p[x], got,
                                    g0.p[x], want, g1.p[x]);
                    }
                    kc_free(&in); kc_free(&s0); kc_free(&s1); kc_free(&capped); kc_free(&g0); kc_free(&g1);
                }
    }
    return nf;
}

/* ---- bwd_line: the backward's P and dS of one line ------------------------- */

/*
 * Against the scalar spec on random lines of every tail length, visible
 * intervals empty, whole and partial, per-element and per-line LSE and D
 * (with LSE = -inf on elements outside the interval, as empty query rows have
 * in pass a), with and without the softcap derivative g (NaN sentinels in g
 * outside [va, vb): it must not be read there):
 *   outside [va, vb): P exactly +0 and dS = 0 * (dP - D), bit for bit;
 *   inside: P within the exp bound of the spec's expf, (FA_EXP_MAX_ULP + 1)
 *     ulp; dS = P (dP - D) g adds no rounding the spec does not also do, so
 *     |d dS| <= (FA_EXP_MAX_ULP + 1) 2^-23 |dS| (+ FLT_MIN for flushed P).
 */
static int kc_check_bwd_line(const fa_kernels *k, const fa_kernels *ref, uint64_t seed, char *msg, size_t cap)
{
    int nf = 0;
    uint64_t rng = seed;
    const double tol = (FA_EXP_MAX_ULP + 1.0) * 0x1.0p-23;
    for (int a = 0; a < KC_NSIZES && !nf; a++) {
        const int n = kc_sizes[a];
        const int iv[][2] = {{0, n}, {0, 0}, {n / 3, n - n / 4}, {1 < n ? 1 : n, n}, {0, n - 1}};
        for (int w = 0; w < 5 && !nf; w++)
            for (int mode = 0; mode < 4 && !nf; mode++) {
                const int va = iv[w][0], vb = iv[w][1] > va ? iv[w][1] : va;
                const int per_elem = mode & 1, with_g = mode >> 1;
                kc_buf s0 = kc_alloc((size_t)n), s1 = kc_alloc((size_t)n), d0 = kc_alloc((size_t)n),
                       d1 = kc_alloc((size_t)n), lse = kc_alloc((size_t)n), dd = kc_alloc((size_t)n),
                       g = kc_alloc((size_t)n);
                for (int x = 0; x < n; x++) {
                    const int in = x >= va && x < vb;
                    s0.p[x] = s1.p[x] = in ? kc_uniform(&rng, -20.0f, 5.0f) : -INFINITY;
                    d0.p[x] = d1.p[x] = kc_uniform(&rng, -3.0f, 3.0f);
                    lse.p[x] = (per_elem && !in) ? -INFINITY : kc_uniform(&rng, -2.0f, 6.0f);
                    dd.p[x] = kc_uniform(&rng, -1.0f, 1.0f);
                    g.p[x] = in ? kc_uniform(&rng, 0.0f, 1.0f) : kc_sentinel();
                }
                if (!per_elem) lse.p[0] = kc_uniform(&rng, -2.0f, 6.0f);
                k->bwd_line(n, va, vb, s0.p, d0.p, lse.p, dd.p, per_elem, with_g ? g.p : NULL);
                ref->bwd_line(n, va, vb, s1.p, d1.p, lse.p, dd.p, per_elem, with_g ? g.p : NULL);
                for (int x = 0; x < n && !nf; x++) {
                    const int in = x >= va && x < vb;
                    int ok;
                    if (!in)
                        ok = memcmp(&s0.p[x], &s1.p[x], 4) == 0 && s0.p[x] == 0.0f && !signbit(s0.p[x]) &&
                             memcmp(&d0.p[x], &d1.p[x], 4) == 0;
                    else
                        ok = fabs((double)s0.p[x] - s1.p[x]) <= tol * fabs((double)s1.p[x]) + FLT_MIN &&
                             fabs((double)d0.p[x] - d1.p[x]) <= tol * fabs((double)d1.p[x]) + 8.0 * FLT_MIN;
                    if (!ok)
                        kc_fail(msg, cap, &nf,
                                "%s bwd_line n=%d [%d,%d) per_elem=%d g=%d: x=%d P %.9g dS %.9g, scalar P %.9g dS %.9g",
                                k->name, n, va, vb, per_elem, with_g, x, s0.p[x], d0.p[x], s1.p[x], d1.p[x]);
                }
                kc_free(&s0); kc_free(&s1); kc_free(&d0); kc_free(&d1); kc_free(&lse); kc_free(&dd); kc_free(&g);
            }
    }
    return nf;
}

/* ---- widen: float16 / bfloat16 -> float32 --------------------------------- */

/*
 * Every one of the 65536 bit patterns of both formats, in one call, against
 * the scalar spec: the same float32 bits (conversions are exact), NaN for NaN
 * (the payload may come back quieted); then every length 1..40 with the source
 * and the destination ending at a guard page and a sentinel after the last
 * element (nothing read or written beyond n).
 */
static int kc_check_widen(const fa_kernels *k, const fa_kernels *ref, char *msg, size_t cap)
{
    int nf = 0;
    enum { ALL = 65536 };
    for (int bf = 0; bf < 2 && !nf; bf++) {
        uint16_t *src = malloc(ALL * sizeof(uint16_t));
        float *got = malloc(ALL * sizeof(float)), *want = malloc(ALL * sizeof(float));
        if (!src || !got || !want) abort();
        for (int i = 0; i < ALL; i++) src[i] = (uint16_t)(i * 40503u); /* a permutation: every pattern once */
        k->widen(ALL, src, bf, got);
        ref->widen(ALL, src, bf, want);
        for (int i = 0; i < ALL; i++) {
            const int ok = isnan(want[i]) ? isnan(got[i]) : memcmp(&got[i], &want[i], 4) == 0;
            if (!ok) {
                kc_fail(msg, cap, &nf, "%s widen %s 0x%04x = %.9g, scalar %.9g", k->name, bf ? "bf16" : "f16",
                        src[i], got[i], want[i]);
                break;
            }
        }
        for (int len = 1; len <= 40 && !nf; len++) {
            kc_buf sb = kc_alloc((size_t)(len + 1) / 2), db = kc_alloc((size_t)len + 1);
            uint16_t *s16 = (uint16_t *)(sb.p + (len + 1) / 2) - len; /* ends at the guard page */
            for (int i = 0; i < len; i++) s16[i] = src[(i * 977 + len) % ALL];
            db.p[len] = kc_sentinel();
            k->widen(len, s16, bf, db.p);
            for (int i = 0; i < len && !nf; i++) {
                float w;
                ref->widen(1, &s16[i], bf, &w);
                if (!(isnan(w) ? isnan(db.p[i]) : memcmp(&db.p[i], &w, 4) == 0))
                    kc_fail(msg, cap, &nf, "%s widen %s n=%d: element %d = %.9g, scalar %.9g", k->name,
                            bf ? "bf16" : "f16", len, i, db.p[i], w);
            }
            if (!nf && !kc_is_sentinel(db.p[len]))
                kc_fail(msg, cap, &nf, "%s widen n=%d wrote past the end", k->name, len);
            kc_free(&sb); kc_free(&db);
        }
        free(src); free(got); free(want);
    }
    return nf;
}

/* ---- transpose (optional in the table) ------------------------------------ */

/*
 * kt[c][j] = k[j*ldk + c] exactly, for j < bc and c < d; K rows are unpadded
 * (the last ends at the guard page), Kt columns j >= round16(bc) and any
 * beyond the table's contract keep their sentinel.
 */
static int kc_check_transpose(const fa_kernels *k, uint64_t seed, char *msg, size_t cap)
{
    int nf = 0;
    if (!k->transpose) return 0;
    uint64_t rng = seed;
    for (int b = 0; b < KC_NSIZES && !nf; b++)
        for (int c = 0; c < KC_NSIZES && !nf; c++) {
            const int bc = kc_sizes[b], d = kc_sizes[c];
            const size_t ldk = (size_t)d + (size_t)(b % 2 ? 3 : 0), ldkt = kc_round16(bc) + 16;
            kc_buf kb = kc_alloc((size_t)bc * ldk), ktb = kc_alloc((size_t)d * ldkt);
            for (size_t x = 0; x < (size_t)bc * ldk; x++) kb.p[x] = kc_uniform(&rng, -1.0f, 1.0f);
            for (size_t x = 0; x < (size_t)d * ldkt; x++) ktb.p[x] = kc_sentinel();
            k->transpose(bc, d, kb.p, ldk, ktb.p, ldkt);
            for (int cc = 0; cc < d && !nf; cc++)
                for (size_t j = 0; j < ldkt; j++) {
                    const float got = ktb.p[(size_t)cc * ldkt + j];
                    const int ok = (int)j < bc ? memcmp(&got, &kb.p[j * ldk + (size_t)cc], 4) == 0
                                 : j < kc_round16(bc) ? (kc_is_sentinel(got) || got == 0.0f)
                                                       : kc_is_sentinel(got);
                    if (!ok) {
                        kc_fail(msg, cap, &nf, "%s transpose bc=%d d=%d: Kt[%d][%zu] = %g", k->name, bc, d,
                                cc, j, got);
                        break;
                    }
                }
            kc_free(&kb); kc_free(&ktb);
        }
    return nf;
}

/* ---- a chain of tiles: qk -> softmax -> pv, as the driver runs them -------- */

static int kc_check_chain(const fa_kernels *k, const fa_kernels *ref, uint64_t seed, char *msg, size_t cap)
{
    static const int shapes[][4] = {/* br, bc, d, dv */ {64, 64, 64, 64}, {33, 100, 17, 33},
                                    {100, 256, 128, 128}, {7, 15, 256, 100}, {128, 64, 100, 7}};
    int nf = 0;
    uint64_t rng = seed;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0] && !nf; sh++) {
        const int br = shapes[sh][0], bc = shapes[sh][1], d = shapes[sh][2], dv = shapes[sh][3];
        const int ntiles = 4;
        const size_t ldk = kc_round16(bc);
        kc_buf q = kc_alloc((size_t)br * d), kt = kc_alloc((size_t)d * ldk), v = kc_alloc((size_t)bc * dv);
        kc_buf s[2] = {kc_alloc((size_t)br * ldk), kc_alloc((size_t)br * ldk)};
        kc_buf o[2] = {kc_alloc((size_t)br * dv), kc_alloc((size_t)br * dv)};
        kc_buf m[2] = {kc_alloc((size_t)br), kc_alloc((size_t)br)}, l[2] = {kc_alloc((size_t)br), kc_alloc((size_t)br)};
        kc_buf al[2] = {kc_alloc((size_t)br), kc_alloc((size_t)br)};
        const float scale = 1.0f / sqrtf((float)d);
        for (size_t x = 0; x < (size_t)br * d; x++) q.p[x] = scale * kc_uniform(&rng, -3.0f, 3.0f);
        for (int w = 0; w < 2; w++)
            for (int i = 0; i < br; i++) {
                m[w].p[i] = -INFINITY;
                l[w].p[i] = 0.0f;
                for (int c = 0; c < dv; c++) o[w].p[(size_t)i * dv + c] = 0.0f;
            }
        for (int t = 0; t < ntiles; t++) {
            for (int c = 0; c < d; c++)
                for (size_t j = 0; j < ldk; j++)
                    kt.p[(size_t)c * ldk + j] = (int)j < bc ? kc_uniform(&rng, -3.0f, 3.0f) : 0.0f;
            for (size_t x = 0; x < (size_t)bc * dv; x++) v.p[x] = kc_uniform(&rng, -1.0f, 1.0f);
            for (int w = 0; w < 2; w++) {
                const fa_kernels *kk = w ? ref : k;
                kk->qk(br, bc, d, q.p, (size_t)d, kt.p, ldk, 1.0f, s[w].p, ldk);
                for (int i = 0; i < br; i++) /* causal-like mask; tile 0 hides rows i % 4 == 0 */
                    for (int j = 0; j < bc; j++)
                        if ((t == 0 && i % 4 == 0) || (t == ntiles - 1 && j > i))
                            s[w].p[(size_t)i * ldk + j] = -INFINITY;
                kk->softmax(br, bc, s[w].p, ldk, m[w].p, l[w].p, al[w].p);
                kk->pv(br, bc, dv, s[w].p, ldk, v.p, (size_t)dv, al[w].p, o[w].p, (size_t)dv);
            }
        }
        /* Normalized outputs are convex combinations of V rows (|V| <= 1), so
         * the summation-order bound of pv over all tiles, plus that of l,
         * is absolute here: 2 * 2 * (ntiles * (bc + 2) + 16) * u. */
        const double tol = 4.0 * (ntiles * (bc + 2) + 16) * 0x1.0p-24;
        for (int i = 0; i < br && !nf; i++)
            for (int c = 0; c < dv; c++) {
                const double a = o[0].p[(size_t)i * dv + c] / l[0].p[i];
                const double b = o[1].p[(size_t)i * dv + c] / l[1].p[i];
                if (!(fabs(a - b) <= tol)) {
                    kc_fail(msg, cap, &nf, "%s chain br=%d bc=%d d=%d dv=%d: O[%d][%d]/l = %.9g, scalar %.9g",
                            k->name, br, bc, d, dv, i, c, a, b);
                    break;
                }
            }
        kc_free(&q); kc_free(&kt); kc_free(&v);
        for (int w = 0; w < 2; w++) {
            kc_free(&s[w]); kc_free(&o[w]); kc_free(&m[w]); kc_free(&l[w]); kc_free(&al[w]);
        }
    }
    return nf;
}

/*
 * Cut tiles (kernels.h, cut_cols): a tile whose rows see only keys
 * [0, hi_r), with need = max hi_r, computed over the first
 * n = cut_cols(bc, need) columns must give the bits of the whole tile:
 * qk, the mask, softmax and pv, after a first whole tile so that alpha, l
 * and O are not trivial. l and O are compared bit for bit, m by value (a
 * max of zeros may pick either sign; it changes no output). bc runs past
 * 256, where avx2's pv cuts its key chunks by bc; hi_r is random per row
 * (0 included: a row that sees nothing of the tile). Then cut_lead: pv with
 * alpha = 1 over keys [cut_lead(bc, lead), n) against [0, n) when P is 0
 * before each row's first visible key (>= lead), on top of a non-zero O. Then
 * cut_lead_fwd: the forward's qk, softmax and pv over columns [a', n)
 * against the whole tile, for rows that see [first_r, hi_r) with
 * first_r >= lead as their first tile, and rows that see nothing of it.
 */
static inline int kc_check_cut(const fa_kernels *k, uint64_t seed, char *msg, size_t cap)
{
    static const int bcs[] = {1, 7, 16, 17, 32, 33, 64, 100, 128, 200, 256, 300, 320, 512, 600};
    static const int brs[] = {1, 5, 8, 17};
    int nf = 0;
    if (!k->cut_cols) return 0; /* never cut: nothing to keep */
    uint64_t rng = seed;
    const int d = 24, dv = 20;
    for (size_t bi = 0; bi < sizeof bcs / sizeof bcs[0] && !nf; bi++)
        for (size_t ri = 0; ri < sizeof brs / sizeof brs[0] && !nf; ri++) {
            const int bc = bcs[bi], br = brs[ri];
            const size_t ldk = kc_round16(bc);
            kc_buf q = kc_alloc((size_t)br * d), kt = kc_alloc((size_t)d * ldk), v = kc_alloc((size_t)bc * dv);
            kc_buf s = kc_alloc((size_t)br * ldk), hi = kc_alloc((size_t)br);
            kc_buf o[2] = {kc_alloc((size_t)br * dv), kc_alloc((size_t)br * dv)};
            kc_buf m[2] = {kc_alloc((size_t)br), kc_alloc((size_t)br)}, l[2] = {kc_alloc((size_t)br), kc_alloc((size_t)br)};
            kc_buf al = kc_alloc((size_t)br);
            for (size_t x = 0; x < (size_t)br * d; x++) q.p[x] = kc_uniform(&rng, -1.0f, 1.0f);
            for (int trial = 0; trial < 6 && !nf; trial++) {
                /* the visible ends: one row at `need`, the others anywhere in [0, need] */
                const int need = 1 + (int)(kc_next(&rng) % (uint64_t)bc);
                for (int i = 0; i < br; i++) hi.p[i] = (float)(kc_next(&rng) % (uint64_t)(need + 1));
                hi.p[kc_next(&rng) % (uint64_t)br] = (float)need;
                const int n = k->cut_cols(bc, need);
                if (n < need || n > bc) {
                    kc_fail(msg, cap, &nf, "%s cut_cols(%d, %d) = %d: outside [need, bc]", k->name, bc, need, n);
                    break;
                }
                for (int tile = 0; tile < 2; tile++) {
                    for (int c = 0; c < d; c++)
                        for (size_t j = 0; j < ldk; j++)
                            kt.p[(size_t)c * ldk + j] = (int)j < bc ? kc_uniform(&rng, -2.0f, 2.0f) : 0.0f;
                    for (size_t x = 0; x < (size_t)bc * dv; x++) v.p[x] = kc_uniform(&rng, -1.0f, 1.0f);
                    for (int w = 0; w < 2; w++) {
                        if (tile == 0) { /* a first whole tile, the same for both */
                            for (int i = 0; i < br; i++) {
                                m[w].p[i] = -INFINITY;
                                l[w].p[i] = 0.0f;
                                for (int c = 0; c < dv; c++) o[w].p[(size_t)i * dv + c] = 0.0f;
                            }
                        }
                        const int cols = tile == 1 && w == 1 ? n : bc;
                        k->qk(br, cols, d, q.p, (size_t)d, kt.p, ldk, 0.7f, s.p, ldk);
                        if (tile == 1)
                            for (int i = 0; i < br; i++)
                                for (int j = (int)hi.p[i]; j < cols; j++) s.p[(size_t)i * ldk + j] = -INFINITY;
                        k->softmax(br, cols, s.p, ldk, m[w].p, l[w].p, al.p);
                        k->pv(br, cols, dv, s.p, ldk, v.p, (size_t)dv, al.p, o[w].p, (size_t)dv);
                    }
                }
                for (int i = 0; i < br && !nf; i++) {
                    if (kc_bits(l[0].p[i]) != kc_bits(l[1].p[i]) || !(m[0].p[i] == m[1].p[i])) {
                        kc_fail(msg, cap, &nf, "%s cut bc=%d br=%d need=%d n=%d: row %d l %a vs %a, m %a vs %a",
                                k->name, bc, br, need, n, i, (double)l[0].p[i], (double)l[1].p[i],
                                (double)m[0].p[i], (double)m[1].p[i]);
                        break;
                    }
                    for (int c = 0; c < dv; c++)
                        if (kc_bits(o[0].p[(size_t)i * dv + c]) != kc_bits(o[1].p[(size_t)i * dv + c])) {
                            kc_fail(msg, cap, &nf, "%s cut bc=%d br=%d need=%d n=%d: O[%d][%d] %a vs %a",
                                    k->name, bc, br, need, n, i, c, (double)o[0].p[(size_t)i * dv + c],
                                    (double)o[1].p[(size_t)i * dv + c]);
                            break;
                        }
                }
            }
            /* cut_lead: pv with alpha = 1 over keys [a', n) against [0, n) when P = 0 below each row's
             * first visible key (>= lead), on top of a non-zero O (the backward's dK, dV accumulators) */
            for (int trial = 0; trial < 6 && !nf && k->cut_lead; trial++) {
                const int lead = (int)(kc_next(&rng) % (uint64_t)bc), need = lead + 1 + (int)(kc_next(&rng) % (uint64_t)(bc - lead));
                const int n = k->cut_cols(bc, need), a = k->cut_lead(bc, lead);
                if (a > lead || a < 0 || a % 16) {
                    kc_fail(msg, cap, &nf, "%s cut_lead(%d, %d) = %d: not a multiple of 16 in [0, a]", k->name, bc, lead, a);
                    break;
                }
                for (int i = 0; i < br; i++) {
                    al.p[i] = 1.0f;
                    const int first = lead + (int)(kc_next(&rng) % (uint64_t)(need - lead));
                    for (int j = 0; j < bc; j++) s.p[(size_t)i * ldk + j] = j >= first && j < need ? kc_uniform(&rng, 0.0f, 1.0f) : 0.0f;
                    for (int c = 0; c < dv; c++) o[0].p[(size_t)i * dv + c] = o[1].p[(size_t)i * dv + c] = kc_uniform(&rng, -1.0f, 1.0f);
                }
                for (size_t x = 0; x < (size_t)bc * dv; x++) v.p[x] = kc_uniform(&rng, -1.0f, 1.0f);
                k->pv(br, bc, dv, s.p, ldk, v.p, (size_t)dv, al.p, o[0].p, (size_t)dv);
                k->pv(br, n - a, dv, s.p + a, ldk, v.p + (size_t)a * dv, (size_t)dv, al.p, o[1].p, (size_t)dv);
                for (size_t x = 0; x < (size_t)br * dv; x++)
                    if (kc_bits(o[0].p[x]) != kc_bits(o[1].p[x])) {
                        kc_fail(msg, cap, &nf, "%s cut_lead bc=%d br=%d lead=%d need=%d: [%d, %d): O[%zu] %a vs %a",
                                k->name, bc, br, lead, need, a, n, x, (double)o[1].p[x], (double)o[0].p[x]);
                        break;
                    }
            }
            /* cut_lead_fwd: qk, softmax and pv over columns [cut_lead_fwd(bc, lead), n) against [0, bc),
             * rows seeing [first_r, hi_r) with first_r >= lead (their first tile: O = l = 0, m = -inf)
             * or nothing of the tile (O, l, m from earlier tiles: alpha = 1) */
            for (int trial = 0; trial < 6 && !nf && k->cut_lead_fwd; trial++) {
                const int lead = (int)(kc_next(&rng) % (uint64_t)bc), need = lead + 1 + (int)(kc_next(&rng) % (uint64_t)(bc - lead));
                const int n = k->cut_cols(bc, need), a = k->cut_lead_fwd(bc, lead);
                if (a > lead || a < 0 || a % 16) {
                    kc_fail(msg, cap, &nf, "%s cut_lead_fwd(%d, %d) = %d: not a multiple of 16 in [0, a]", k->name, bc, lead, a);
                    break;
                }
                kc_buf first = kc_alloc((size_t)br);
                for (int i = 0; i < br; i++) {
                    const int sees = i == 0 || kc_next(&rng) % 5 != 0;
                    first.p[i] = sees ? (float)(i == 0 ? lead : lead + (int)(kc_next(&rng) % (uint64_t)(need - lead))) : 0.0f;
                    hi.p[i] = sees ? (float)(i == 0 ? need : (int)first.p[i] + 1 + (int)(kc_next(&rng) % (uint64_t)(need - (int)first.p[i]))) : 0.0f;
                    for (int w = 0; w < 2; w++) {
                        m[w].p[i] = sees ? -INFINITY : 0.5f;
                        l[w].p[i] = sees ? 0.0f : 3.0f;
                    }
                    for (int c = 0; c < dv; c++)
                        o[0].p[(size_t)i * dv + c] = o[1].p[(size_t)i * dv + c] = sees ? 0.0f : kc_uniform(&rng, -1.0f, 1.0f);
                }
                for (int c = 0; c < d; c++)
                    for (size_t j = 0; j < ldk; j++) kt.p[(size_t)c * ldk + j] = (int)j < bc ? kc_uniform(&rng, -2.0f, 2.0f) : 0.0f;
                for (size_t x = 0; x < (size_t)bc * dv; x++) v.p[x] = kc_uniform(&rng, -1.0f, 1.0f);
                for (int w = 0; w < 2; w++) {
                    const int c0 = w ? a : 0, cols = w ? n - a : bc;
                    k->qk(br, cols, d, q.p, (size_t)d, kt.p + c0, ldk, 0.7f, s.p + c0, ldk);
                    for (int i = 0; i < br; i++)
                        for (int j = c0; j < c0 + cols; j++)
                            if (j < (int)first.p[i] || j >= (int)hi.p[i]) s.p[(size_t)i * ldk + j] = -INFINITY;
                    k->softmax(br, cols, s.p + c0, ldk, m[w].p, l[w].p, al.p);
                    k->pv(br, cols, dv, s.p + c0, ldk, v.p + (size_t)c0 * dv, (size_t)dv, al.p, o[w].p, (size_t)dv);
                }
                for (int i = 0; i < br && !nf; i++) {
                    int bad = kc_bits(l[0].p[i]) != kc_bits(l[1].p[i]) || !(m[0].p[i] == m[1].p[i]);
                    for (int c = 0; c < dv; c++) bad |= kc_bits(o[0].p[(size_t)i * dv + c]) != kc_bits(o[1].p[(size_t)i * dv + c]);
                    if (bad)
                        kc_fail(msg, cap, &nf, "%s cut_lead_fwd bc=%d br=%d lead=%d need=%d: [%d, %d): row %d differs (l %a vs %a)",
                                k->name, bc, br, lead, need, a, n, i, (double)l[1].p[i], (double)l[0].p[i]);
                }
                kc_free(&first);
            }
            kc_free(&q); kc_free(&kt); kc_free(&v); kc_free(&s); kc_free(&hi); kc_free(&al);
            for (int w = 0; w < 2; w++) {
                kc_free(&o[w]); kc_free(&m[w]); kc_free(&l[w]);
            }
        }
    return nf;
}

/* ---- decode kernels: dec_qk, dec_pv on rows read in place ------------------ */

/*
 * n rows of `width` elements in format fmt (FA_ROW_*), `ld` elements apart
 * in one buffer whose last row ends at a guard page, handed to the kernel in
 * a shuffled order (rows[j], as the pages of a cache); wide[j] holds row j
 * widened to float32 by the spec's widen (the values the kernel must see).
 */
typedef struct kc_drows {
    kc_buf buf, wide;
    const void **rows;
    const float **wrows;
} kc_drows;

static uint16_t kc_half_bits(uint64_t *rng, int fmt)
{
    const uint64_t z = kc_next(rng);
    const uint16_t sign = (uint16_t)((z & 1u) << 15);
    if (fmt == FA_ROW_BF16) /* exponents 2^-6 .. 2^2, any 7 mantissa bits */
        return (uint16_t)(sign | (uint16_t)((121u + (z >> 1) % 9u) << 7) | (uint16_t)((z >> 8) & 0x7fu));
    /* f16: exponents 2^-6 .. 2^2 (some subnormals too), any 10 mantissa bits */
    const unsigned e = (unsigned)((z >> 1) % 10u); /* 0: subnormal */
    return (uint16_t)(sign | (uint16_t)((e ? e + 8u : 0u) << 10) | (uint16_t)((z >> 8) & 0x3ffu));
}

static kc_drows kc_rows_make(const fa_kernels *ref, int n, int width, int pad, int fmt, float lo, float hi, uint64_t *rng)
{
    kc_drows r;
    const size_t ld = (size_t)width + (size_t)pad, total = (size_t)n * ld - (size_t)pad; /* last row unpadded */
    const size_t esz = fmt == FA_ROW_F32 ? 4 : 2;
    r.buf = kc_alloc((total * esz + 3) / 4);
    char *end = (char *)(r.buf.p + (total * esz + 3) / 4);
    char *base = end - total * esz;
    r.wide = kc_alloc((size_t)n * (size_t)width);
    r.rows = malloc((size_t)n * sizeof *r.rows);
    r.wrows = malloc((size_t)n * sizeof *r.wrows);
    int *perm = malloc((size_t)n * sizeof(int));
    if (!r.rows || !r.wrows || !perm) abort();
    for (int j = 0; j < n; j++) perm[j] = j;
    for (int j = n - 1; j > 0; j--) {
        const int x = (int)(kc_next(rng) % (uint64_t)(j + 1)), t = perm[j];
        perm[j] = perm[x];
        perm[x] = t;
    }
    for (int j = 0; j < n; j++) {
        char *row = base + (size_t)perm[j] * ld * esz;
        float *w = r.wide.p + (size_t)j * (size_t)width;
        for (int c = 0; c < width; c++) {
            if (fmt == FA_ROW_F32) {
                ((float *)row)[c] = w[c] = kc_uniform(rng, lo, hi);
            } else {
                uint16_t h = kc_half_bits(rng, fmt);
                memcpy(row + 2 * (size_t)c, &h, 2);
                ref->widen(1, &h, fmt == FA_ROW_BF16, &w[c]);
            }
        }
        r.rows[j] = row;
        r.wrows[j] = w;
    }
    free(perm);
    return r;
}

static void kc_rows_free(kc_drows *r)
{
    kc_free(&r->buf);
    kc_free(&r->wide);
    free(r->rows);
    free((void *)r->wrows);
}

/* fa_between's fn for kc_dec_case: its calls, their order, and how many scores of the
 * call were already written (not the sentinel) at each. */
typedef struct kc_hook {
    const float *s;
    size_t lds;
    int nr, n;
    long calls, written_first, written_last, written_prev;
    int total, out_of_order;
} kc_hook;

static void kc_hook_fn(void *ctx, int done, int total)
{
    kc_hook *h = ctx;
    long w = 0;
    for (int i = 0; i < h->nr; i++)
        for (int j = 0; j < h->n; j++) w += !kc_is_sentinel(h->s[(size_t)i * h->lds + j]);
    if (h->calls == 0) {
        h->total = total;
        h->written_first = w;
    }
    if (done != h->calls || total != h->total || w < h->written_prev) h->out_of_order = 1;
    h->written_prev = h->written_last = w;
    h->calls++;
}

/*
 * One (nr, n, d, fmt) case of dec_qk and dec_pv (dv = d): against the scalar
 * spec within the qk / pv bounds above; and the table's own promises, bit for
 * bit: a row computed alone (nr = 1) = that row in the tile; a key alone
 * (n = 1) = its score in the tile; a half row = its float32 widening; nothing
 * written past S's n columns or O's dv columns.
 */
static int kc_dec_case(const fa_kernels *k, const fa_kernels *ref, int nr, int n, int d, int fmt, uint64_t *rng,
                       char *msg, size_t cap)
{
    int nf = 0;
    const char *fn = fmt == FA_ROW_F32 ? "f32" : fmt == FA_ROW_F16 ? "f16" : "bf16";
    const size_t ldq = (size_t)d + (size_t)(n % 3), lds = kc_round16(n) + 16, ldo = (size_t)d + (size_t)(nr % 2 ? 5 : 0);
    kc_drows K = kc_rows_make(ref, n, d, n % 2 ? 3 : 0, fmt, -2.0f, 2.0f, rng);
    kc_drows V = kc_rows_make(ref, n, d, n % 2 ? 0 : 7, fmt, -1.0f, 1.0f, rng);
    kc_buf q = kc_alloc((size_t)nr * ldq), s = kc_alloc((size_t)nr * lds), sref = kc_alloc((size_t)nr * lds);
    kc_buf s1 = kc_alloc(lds), al = kc_alloc((size_t)nr);
    kc_buf o = kc_alloc((size_t)nr * ldo), oref = kc_alloc((size_t)nr * ldo), o0 = kc_alloc((size_t)nr * ldo);
    kc_buf ow = kc_alloc((size_t)nr * ldo), o1 = kc_alloc(ldo);
    for (size_t x = 0; x < (size_t)nr * ldq; x++) q.p[x] = kc_uniform(rng, -2.0f, 2.0f);
    for (size_t x = 0; x < (size_t)nr * lds; x++) s.p[x] = sref.p[x] = kc_sentinel();
    const float scale = 1.0f / sqrtf((float)d);

    /* the first call with a caller's hook between key blocks (fa_between): called for every
     * block of at most 16 keys, and nothing computed depends on it (the other calls pass none) */
    kc_hook hk = {s.p, lds, nr, n, 0, 0, 0, 0, 0, 0};
    const fa_between count = {kc_hook_fn, &hk};
    k->dec_qk(nr, n, d, q.p, ldq, K.rows, fmt, scale, s.p, lds, &count);
    /* done = 0 .. total - 1 in order, one block at most 16 keys, before the block it counts:
     * nothing written at the first, not everything at the last */
    if (hk.calls != hk.total || hk.out_of_order || hk.calls < (n + 15) / 16 || hk.written_first != 0 ||
        hk.written_last >= (long)nr * n)
        kc_fail(msg, cap, &nf,
                "%s dec_qk %s nr=%d n=%d d=%d: the hook ran %ld times of %d (out of order %d), %ld and %ld scores "
                "written at the first and last",
                k->name, fn, nr, n, d, hk.calls, hk.total, hk.out_of_order, hk.written_first, hk.written_last);
    ref->dec_qk(nr, n, d, q.p, ldq, K.rows, fmt, scale, sref.p, lds, NULL);
    for (int i = 0; i < nr && !nf; i++)
        for (size_t j = 0; j < lds && !nf; j++) {
            const float a = s.p[(size_t)i * lds + j], b = sref.p[(size_t)i * lds + j];
            if ((int)j >= n) {
                if (!kc_is_sentinel(a))
                    kc_fail(msg, cap, &nf, "%s dec_qk %s nr=%d n=%d d=%d: wrote S[%d][%zu] beyond n", k->name, fn, nr,
                            n, d, i, j);
                continue;
            }
            double mag = 0.0;
            for (int c = 0; c < d; c++) mag += fabs((double)q.p[(size_t)i * ldq + c] * K.wrows[j][c]);
            const double tol = 2.0 * (d + 1) * 0x1.0p-24 * scale * mag + 1e-30;
            if (!(fabs((double)a - b) <= tol))
                kc_fail(msg, cap, &nf, "%s dec_qk %s nr=%d n=%d d=%d: S[%d][%zu] = %.9g, scalar %.9g, tol %.3g",
                        k->name, fn, nr, n, d, i, j, a, b, tol);
        }
    /* bits: each row alone; the first and last key alone; the widened rows */
    for (int i = 0; i < nr && !nf; i++) {
        for (size_t x = 0; x < lds; x++) s1.p[x] = kc_sentinel();
        k->dec_qk(1, n, d, q.p + (size_t)i * ldq, ldq, K.rows, fmt, scale, s1.p, lds, NULL);
        if (memcmp(s1.p, s.p + (size_t)i * lds, (size_t)n * sizeof(float)) != 0)
            kc_fail(msg, cap, &nf, "%s dec_qk %s nr=%d n=%d d=%d: row %d alone gives other bits", k->name, fn, nr, n, d, i);
    }
    for (int e = 0; e < 2 && !nf; e++) {
        const int j = e ? n - 1 : 0;
        k->dec_qk(nr, 1, d, q.p, ldq, K.rows + j, fmt, scale, sref.p, lds, NULL);
        for (int i = 0; i < nr; i++)
            if (memcmp(&sref.p[(size_t)i * lds], &s.p[(size_t)i * lds + j], 4) != 0) {
                kc_fail(msg, cap, &nf, "%s dec_qk %s nr=%d n=%d d=%d: key %d alone gives other bits", k->name, fn, nr,
                        n, d, j);
                break;
            }
    }
    if (fmt != FA_ROW_F32 && !nf) {
        k->dec_qk(nr, n, d, q.p, ldq, (const void *const *)K.wrows, FA_ROW_F32, scale, sref.p, lds, NULL);
        for (int i = 0; i < nr && !nf; i++)
            if (memcmp(&sref.p[(size_t)i * lds], &s.p[(size_t)i * lds], (size_t)n * sizeof(float)) != 0)
                kc_fail(msg, cap, &nf, "%s dec_qk %s nr=%d n=%d d=%d: row %d differs from the float32 widening", k->name,
                        fn, nr, n, d, i);
    }

    /* P V: P in [0, 1] with zeros (masked keys), alpha 1, 0 or in (0, 1) */
    for (int i = 0; i < nr; i++) {
        for (int j = 0; j < n; j++)
            s.p[(size_t)i * lds + j] = kc_next(rng) % 5 == 0 ? 0.0f : kc_uniform(rng, 0.0f, 1.0f);
        al.p[i] = i % 4 == 0 ? 1.0f : i % 4 == 1 ? 0.0f : kc_uniform(rng, 0.0f, 1.0f);
        for (size_t c = 0; c < ldo; c++) o0.p[(size_t)i * ldo + c] = (int)c < d ? kc_uniform(rng, -5.0f, 5.0f) : kc_sentinel();
    }
    memcpy(o.p, o0.p, (size_t)nr * ldo * sizeof(float));
    memcpy(oref.p, o0.p, (size_t)nr * ldo * sizeof(float));
    memcpy(ow.p, o0.p, (size_t)nr * ldo * sizeof(float));
    k->dec_pv(nr, n, d, s.p, lds, V.rows, fmt, al.p, o.p, ldo);
    ref->dec_pv(nr, n, d, s.p, lds, V.rows, fmt, al.p, oref.p, ldo);
    for (int i = 0; i < nr && !nf; i++)
        for (size_t c = 0; c < ldo && !nf; c++) {
            const float a = o.p[(size_t)i * ldo + c], b = oref.p[(size_t)i * ldo + c];
            if ((int)c >= d) {
                if (!kc_is_sentinel(a))
                    kc_fail(msg, cap, &nf, "%s dec_pv %s nr=%d n=%d dv=%d: wrote O[%d][%zu] beyond dv", k->name, fn, nr,
                            n, d, i, c);
                continue;
            }
            double mag = fabs((double)al.p[i] * o0.p[(size_t)i * ldo + c]);
            for (int j = 0; j < n; j++) mag += fabs((double)s.p[(size_t)i * lds + j] * V.wrows[j][c]);
            const double tol = 2.0 * (n + 2) * 0x1.0p-24 * mag + 1e-30;
            if (!(fabs((double)a - b) <= tol))
                kc_fail(msg, cap, &nf, "%s dec_pv %s nr=%d n=%d dv=%d: O[%d][%zu] = %.9g, scalar %.9g, tol %.3g",
                        k->name, fn, nr, n, d, i, c, a, b, tol);
        }
    for (int i = 0; i < nr && !nf; i++) {
        memcpy(o1.p, o0.p + (size_t)i * ldo, ldo * sizeof(float));
        k->dec_pv(1, n, d, s.p + (size_t)i * lds, lds, V.rows, fmt, al.p + i, o1.p, ldo);
        if (memcmp(o1.p, o.p + (size_t)i * ldo, ldo * sizeof(float)) != 0)
            kc_fail(msg, cap, &nf, "%s dec_pv %s nr=%d n=%d dv=%d: row %d alone gives other bits", k->name, fn, nr, n,
                    d, i);
    }
    if (fmt != FA_ROW_F32 && !nf) {
        k->dec_pv(nr, n, d, s.p, lds, (const void *const *)V.wrows, FA_ROW_F32, al.p, ow.p, ldo);
        if (memcmp(ow.p, o.p, (size_t)nr * ldo * sizeof(float)) != 0)
            kc_fail(msg, cap, &nf, "%s dec_pv %s nr=%d n=%d dv=%d: differs from the float32 widening", k->name, fn, nr,
                    n, d);
    }
    kc_rows_free(&K); kc_rows_free(&V);
    kc_free(&q); kc_free(&s); kc_free(&sref); kc_free(&s1); kc_free(&al);
    kc_free(&o); kc_free(&oref); kc_free(&o0); kc_free(&ow); kc_free(&o1);
    return nf;
}

/* dec_qk / dec_pv on every format, row count (1..64: the driver's tile bound), key count and depth tail. */
static int kc_check_dec(const fa_kernels *k, const fa_kernels *ref, uint64_t seed, char *msg, size_t cap)
{
    static const int nrs[] = {1, 2, 3, 4, 5, 8, 9, 17, 64}, ns[] = {1, 5, 16, 17, 33, 100};
    int nf = 0;
    uint64_t rng = seed;
    for (int fmt = FA_ROW_F32; fmt <= FA_ROW_BF16; fmt++)
        for (size_t a = 0; a < sizeof nrs / sizeof nrs[0]; a++)
            for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
                for (int c = 0; c < KC_NSIZES; c++)
                    nf += kc_dec_case(k, ref, nrs[a], ns[b], kc_sizes[c], fmt, &rng, nf ? NULL : msg, cap) != 0;
    /* depths past a kernel's staging of the query rows (AVX-512 permutes rows of d <= 512 once
     * per call, longer ones per key block): the same promises */
    static const int big_nrs[] = {1, 2, 4, 5}, big_ns[] = {3, 17}, big_ds[] = {544, 600};
    for (int fmt = FA_ROW_F32; fmt <= FA_ROW_BF16; fmt++)
        for (size_t a = 0; a < sizeof big_nrs / sizeof big_nrs[0]; a++)
            for (size_t b = 0; b < sizeof big_ns / sizeof big_ns[0]; b++)
                for (size_t c = 0; c < sizeof big_ds / sizeof big_ds[0]; c++)
                    nf += kc_dec_case(k, ref, big_nrs[a], big_ns[b], big_ds[c], fmt, &rng, nf ? NULL : msg, cap) != 0;
    return nf;
}

#endif /* FA_KERNEL_CHECKS_H */
